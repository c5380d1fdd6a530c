"""The bundled sample suite's prepared slice is what alodlm-jax-prepare writes from the fixtures."""

from __future__ import annotations

import json

from alodlm_jax.cli import evaluate
from alodlm_jax.data import BUILTINS
from alodlm_prepare.sample_slice import GUIDE_NAMES, SLICE_ROWS, prepare_slice, sample_prediction

from .helpers import read_rows


def _without_timings(rows):
    """Rows with each ``reference_seconds`` list replaced by its length (timings are measured)."""
    rows = json.loads(json.dumps(rows))
    for row in rows:
        for suite in row.get("code_tests", {}).get("suites", []):
            suite["reference_seconds"] = len(suite["reference_seconds"])
    return rows


def _slice(path):
    return [row for row in read_rows(path) if row["benchmark"] in GUIDE_NAMES]


def test_bundled_slice_equals_a_fresh_preparation(tmp_path):
    prepared = prepare_slice(tmp_path, str(BUILTINS["builtin:tiny"]))
    bundled = _slice(BUILTINS["builtin:sample"])
    assert len(bundled) == SLICE_ROWS * len(GUIDE_NAMES)
    assert _without_timings(bundled) == _without_timings(prepared.rows)
    assert all(row["prompt"].startswith("user ") and row["prompt"].endswith(" </s> assistant ")
               for row in bundled)  # wrapped in the bundled checkpoint's chat template


def test_bundled_predictions_answer_each_benchmark_right_then_wrong(tmp_path, capsys):
    tasks = _slice(BUILTINS["builtin:sample"])
    predictions = _slice(BUILTINS["builtin:sample-predictions"])
    assert predictions == [sample_prediction(task, index % SLICE_ROWS)
                           for index, task in enumerate(tasks)]
    status = evaluate.main(["alodlm-jax-evaluate", "--input", str(BUILTINS["builtin:sample"]),
                            "--predictions", str(BUILTINS["builtin:sample-predictions"]),
                            "--output", str(tmp_path / "rescored")])
    assert status == 0, capsys.readouterr().err
    verdicts = {}
    for row in read_rows(tmp_path / "rescored" / "predictions.jsonl"):
        if row["benchmark"] in GUIDE_NAMES:
            verdicts.setdefault(row["benchmark"], []).append(row["correct"])
    assert verdicts == {name: [True, False] for name in GUIDE_NAMES}
