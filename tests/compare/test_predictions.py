"""Predictions-level comparison: exact deltas, flips, first divergence, tokens/s ratio, exit codes."""

from __future__ import annotations

import json
import math

import pytest

from alodlm_jax import compare
from alodlm_jax.cli.compare import main

# (benchmark, id, text, token_ids, correct) for A and B. Known differences:
#   gsm8k 1 identical; gsm8k 2 diverges at token 2 and flips correct -> incorrect;
#   gsm8k 3: B extends A (prefix, divergence 1) and flips incorrect -> correct;
#   arc "a" diverges at 0, both correct; arc "b" identical, both incorrect;
#   math 7 diverges at 0 and flips incorrect -> correct.
ROWS_A = [
    ("gsm8k", 1, "a b c", [1, 2, 3], True),
    ("gsm8k", 2, "x y z", [5, 6, 7], True),
    ("gsm8k", 3, "p", [4], False),
    ("arc", "a", "A", [10], True),
    ("arc", "b", "C", [12], False),
    ("math", 7, "1", [20], False),
]
ROWS_B = [
    ("gsm8k", 1, "a b c", [1, 2, 3], True),
    ("gsm8k", 2, "x y w", [5, 6, 9], False),
    ("gsm8k", 3, "p q", [4, 8], True),
    ("arc", "a", "B", [11], True),
    ("arc", "b", "C", [12], False),
    ("math", 7, "2", [21], True),
]


def _row(benchmark, id_, text, token_ids, correct, wall, with_tokens=True):
    row = {"text": text}
    if with_tokens:
        row["token_ids"] = token_ids
    row.update(generated_tokens=len(token_ids), wall_seconds=wall, benchmark=benchmark, id=id_,
               correct=correct, extracted=None)
    return row


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def pair(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row(*r, wall=1.0) for r in ROWS_A])
    # B in a different order: matching is by (benchmark, str(id)), A's order is kept.
    b = _write(tmp_path / "b.jsonl", [_row(*r, wall=0.5) for r in reversed(ROWS_B)])
    return a, b


def _report(a, b, **kw):
    tol = compare.default_tolerances("fp32")
    rows_a = compare.load_prediction_rows(a, require_correct=True)
    rows_b = compare.load_prediction_rows(b, require_correct=True)
    return compare.compare_predictions(rows_a, rows_b, tolerances=tol, **kw)


def test_first_divergence():
    assert compare.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert compare.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert compare.first_divergence([1, 2], [1, 2, 3]) == 2
    assert compare.first_divergence([], [7]) == 0
    assert compare.first_divergence("abc", "abd") == 2


def test_known_pair_exact_numbers(pair):
    report = _report(*pair)
    assert report["divergence_unit"] == "tokens"
    assert report["correctness_source"] == "rows"
    assert list(report["benchmarks"]) == ["arc", "gsm8k", "math"]

    gsm = report["benchmarks"]["gsm8k"]
    assert (gsm["examples"], gsm["correct_a"], gsm["correct_b"]) == (3, 2, 2)
    assert gsm["score_percent_a"] == (100 * 2) / 3 and gsm["score_delta_points"] == 0.0
    assert gsm["identical_texts"] == 1 and gsm["exact_text_agreement"] == 1 / 3
    assert gsm["diverging"] == 2 and gsm["mean_first_divergence"] == 1.5
    assert gsm["flips"] == {"correct_to_incorrect": [2], "incorrect_to_correct": [3]}
    # A: 7 tokens in 3 s; B: 8 tokens in 1.5 s.
    assert gsm["tokens_per_second_a"] == 7 / 3.0
    assert gsm["tokens_per_second_b"] == 8 / 1.5
    assert math.isclose(gsm["tokens_per_second_ratio"], 16 / 7, rel_tol=1e-12)

    arc = report["benchmarks"]["arc"]
    assert (arc["correct_a"], arc["correct_b"], arc["score_delta_points"]) == (1, 1, 0.0)
    assert arc["exact_text_agreement"] == 0.5 and arc["mean_first_divergence"] == 0.0
    assert arc["flips"] == {"correct_to_incorrect": [], "incorrect_to_correct": []}

    math_row = report["benchmarks"]["math"]
    assert (math_row["score_percent_a"], math_row["score_percent_b"], math_row["score_delta_points"]) == (0.0, 100.0, 100.0)

    overall = report["overall"]
    assert overall["examples"] == 6 and overall["identical_texts"] == 2
    assert overall["diverging"] == 4 and overall["mean_first_divergence"] == 0.75
    macro_a = math.fsum([50.0, 200 / 3, 0.0]) / 3
    macro_b = math.fsum([50.0, 200 / 3, 100.0]) / 3
    assert overall["macro_score_percent_a"] == macro_a and overall["macro_score_percent_b"] == macro_b
    assert math.isclose(overall["macro_score_delta_points"], 100 / 3, rel_tol=1e-12)

    assert report["flips"] == [
        {"benchmark": "gsm8k", "id": 2, "correct_a": True, "correct_b": False, "first_divergence": 2},
        {"benchmark": "gsm8k", "id": 3, "correct_a": False, "correct_b": True, "first_divergence": 1},
        {"benchmark": "math", "id": 7, "correct_a": False, "correct_b": True, "first_divergence": 0},
    ]
    assert not report["passed"]
    failed = [c["name"] for c in report["checks"] if not c["passed"]]
    assert failed == ["exact_text_agreement"]


def test_characters_when_token_ids_missing(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row(*r, wall=1.0) for r in ROWS_A])
    b_rows = [_row(*r, wall=1.0) for r in ROWS_B]
    del b_rows[0]["token_ids"]  # one row without token ids -> characters for every example
    b = _write(tmp_path / "b.jsonl", b_rows)
    report = _report(a, b)
    assert report["divergence_unit"] == "characters"
    by_id = {(e["benchmark"], e["id"]): e["first_divergence"] for e in report["examples"]}
    assert by_id[("gsm8k", 2)] == 4  # "x y z" vs "x y w"
    assert by_id[("gsm8k", 3)] == 1  # "p" vs "p q"
    assert by_id[("gsm8k", 1)] is None


def test_identical_files_pass(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row(*r, wall=1.0) for r in ROWS_A])
    report = _report(a, a)
    assert report["passed"] and report["flips"] == []
    assert report["overall"]["exact_text_agreement"] == 1.0
    assert report["overall"]["mean_first_divergence"] is None
    assert report["overall"]["tokens_per_second_ratio"] == 1.0


def test_identical_texts_scored_differently_fail(tmp_path):
    a = _write(tmp_path / "a.jsonl", [_row(*r, wall=1.0) for r in ROWS_A])
    flipped = [list(r) for r in ROWS_A]
    flipped[0][4] = False  # same text, different verdict
    b = _write(tmp_path / "b.jsonl", [_row(*r, wall=1.0) for r in flipped])
    report = _report(a, b)
    names = [c["name"] for c in report["checks"] if not c["passed"]]
    assert names == ["identical_text_correctness_mismatches"]  # texts all agree; verdicts do not


def test_rescore_with_input_ignores_row_verdicts(tmp_path):
    tasks = [{"benchmark": b, "id": i, "metric": "exact", "prompt": "p", "answer": ans}
             for (b, i, *_), ans in zip(ROWS_A, ["a b c", "x y z", "p q", "A", "D", "2"])]
    task_file = _write(tmp_path / "tasks.jsonl", tasks)
    # Every supplied verdict is wrong on purpose; rescoring must replace them.
    a = _write(tmp_path / "a.jsonl", [_row(b, i, t, ids, None, wall=1.0) for b, i, t, ids, _ in ROWS_A])
    b = _write(tmp_path / "b.jsonl", [_row(b, i, t, ids, "yes", wall=1.0) for b, i, t, ids, _ in ROWS_B])
    out = tmp_path / "report.json"
    status = main(["--predictions-a", a, "--predictions-b", b, "--input", task_file, "--output", str(out)])
    report = json.loads(out.read_text())
    assert status == 1
    assert report["correctness_source"] == "rescored"
    got = {(e["benchmark"], e["id"]): (e["correct_a"], e["correct_b"]) for e in report["examples"]}
    assert got == {("gsm8k", 1): (True, True), ("gsm8k", 2): (True, False), ("gsm8k", 3): (False, True),
                   ("arc", "a"): (True, False), ("arc", "b"): (False, False), ("math", 7): (False, True)}


def test_cli_exit_codes_and_report(pair, tmp_path, capsys):
    a, b = pair
    out = tmp_path / "sub" / "report.json"
    assert main(["--predictions_a", a, "--predictions_b", b, "--output", str(out)]) == 1
    stdout = capsys.readouterr().out
    assert "gsm8k" in stdout and "FAIL exact_text_agreement" in stdout and "flips" in stdout
    assert json.loads(out.read_text())["overall"]["identical_texts"] == 2
    # Tolerance loosened below the measured agreement: passes.
    assert main(["--predictions-a", a, "--predictions-b", b, "--min-token-agreement", "0.3"]) == 0
    assert main(["--predictions-a", a, "--predictions-b", a]) == 0


def _bad(tmp_path, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_bad_inputs_exit_2(pair, tmp_path, capsys):
    a, b = pair
    missing = tmp_path / "missing.jsonl"
    assert "missing.jsonl" in _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", str(missing)])

    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(_row(*ROWS_A[0], wall=1.0)) + "\n{not json\n")
    assert "broken.jsonl:2: invalid JSON" in _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", str(broken)])

    no_text = tmp_path / "no_text.jsonl"
    no_text.write_text(json.dumps({"benchmark": "gsm8k", "id": 1, "correct": True}) + "\n")
    assert "no_text.jsonl:1: field 'text'" in _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", str(no_text)])

    no_correct = tmp_path / "no_correct.jsonl"
    no_correct.write_text(json.dumps({"benchmark": "gsm8k", "id": 1, "text": "t"}) + "\n")
    assert "field 'correct'" in _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", str(no_correct)])

    dup = _write(tmp_path / "dup.jsonl", [_row(*ROWS_A[0], wall=1.0), _row("gsm8k", "1", "t", [1], True, wall=1.0)])
    assert "dup.jsonl:2" in _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", dup])

    subset = _write(tmp_path / "subset.jsonl", [_row(*r, wall=1.0) for r in ROWS_A[:-1]])
    assert "same examples" in _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", subset])

    _bad(tmp_path, capsys, ["--predictions_a", a])
    _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", b, "--precision", "fp16"])
    _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", b, "--no_such_flag"])
    _bad(tmp_path, capsys, ["--predictions_a", a, "--predictions_b", b, "--atol", "-1"])
    _bad(tmp_path, capsys, [])


def test_predictions_path_imports_neither_jax_nor_torch(pair):
    """Rescoring may run generated code (SCORING.md D6): the predictions comparison stays JAX-free."""
    import subprocess
    import sys

    a, b = pair
    code = ("import sys; from alodlm_jax.cli.compare import main; "
            f"rc = main(['--predictions-a', {a!r}, '--predictions-b', {b!r}]); "
            "print(rc, sorted(m for m in ('jax', 'torch', 'flax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "1 []"


def test_one_reader_for_compare_report_and_rescore(tmp_path):
    """The same bad row gets the same one-line error from every command that reads predictions."""
    from alodlm_jax.report.stats import collect_run_stats
    from alodlm_scoring.errors import PredictionFileError
    from alodlm_scoring.evaluation import load_predictions

    rows = [_row(*r, wall=1.0) for r in ROWS_A]
    rows[1]["wall_seconds"] = 0
    run = tmp_path / "run"
    run.mkdir()
    path = _write(run / "predictions.jsonl", rows)
    tasks = [{"benchmark": b, "id": i, "metric": "exact", "prompt": "p", "answer": "x"}
             for b, i, *_ in ROWS_A]
    expected = f"{path}:2: field 'wall_seconds': Invalid timing or token count in prediction"
    for read in (lambda: compare.load_prediction_rows(path, require_correct=True),
                 lambda: collect_run_stats(run),
                 lambda: load_predictions(path, tasks)):
        with pytest.raises(PredictionFileError) as caught:
            read()
        assert str(caught.value) == expected
