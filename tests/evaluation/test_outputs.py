"""Output files: row and summary layout (SCORING.md §7), Python 3.12 summation (§7.3, D5)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from alodlm_scoring import outputs

GENERATE_RESULT_KEYS = [
    "text", "token_ids", "prompt_tokens", "generated_tokens", "wall_seconds", "prefill_seconds",
    "tokens_per_second", "mean_exit_depth", "loop_token_passes",
    "loop_token_passes_per_output_token", "outer_steps", "recurrent_passes", "exit_depths",
    "first_pass_halt_probabilities", "stop_reason",
]


def _row(benchmark, correct, seconds, tokens):
    return {"benchmark": benchmark, "correct": correct, "wall_seconds": seconds,
            "generated_tokens": tokens}


# --- §10.1 row 19 ------------------------------------------------------------------------------


def test_macro_average_reference_case_exact_output():
    summary = outputs.aggregate(
        [_row("a", True, 2, 10), _row("b", False, 3, 20), _row("b", False, 5, 30)]
    )
    assert summary == {
        "benchmarks": {
            "a": {"examples": 1, "correct": 1, "score_percent": 100.0, "wall_seconds": 2,
                  "generated_tokens": 10, "tokens_per_second": 5.0},
            "b": {"examples": 2, "correct": 0, "score_percent": 0.0, "wall_seconds": 8,
                  "generated_tokens": 50, "tokens_per_second": 6.25},
        },
        "benchmark_count": 2,
        "macro_score_percent": 50.0,
        "suite_wall_seconds": 10,
        "suite_tokens_per_second": 6.0,
    }
    text = outputs.summary_text(summary)
    assert text == (
        '{\n  "benchmarks": {\n    "a": {\n      "examples": 1,\n      "correct": 1,\n'
        '      "score_percent": 100.0,\n      "wall_seconds": 2,\n      "generated_tokens": 10,\n'
        '      "tokens_per_second": 5.0\n    },\n    "b": {\n      "examples": 2,\n'
        '      "correct": 0,\n      "score_percent": 0.0,\n      "wall_seconds": 8,\n'
        '      "generated_tokens": 50,\n      "tokens_per_second": 6.25\n    }\n  },\n'
        '  "benchmark_count": 2,\n  "macro_score_percent": 50.0,\n  "suite_wall_seconds": 10,\n'
        '  "suite_tokens_per_second": 6.0\n}\n'
    )
    assert type(summary["suite_wall_seconds"]) is int  # integer inputs stay integers


def test_summary_key_orders_and_sorted_benchmarks():
    summary = outputs.aggregate([_row("zeta", True, 1.5, 3), _row("Alpha", False, 0.5, 1),
                                 _row("beta", True, 1.0, 2)])
    assert list(summary) == ["benchmarks", "benchmark_count", "macro_score_percent",
                             "suite_wall_seconds", "suite_tokens_per_second"]
    assert list(summary["benchmarks"]) == ["Alpha", "beta", "zeta"]  # code-point order
    assert list(summary["benchmarks"]["beta"]) == [
        "examples", "correct", "score_percent", "wall_seconds", "generated_tokens",
        "tokens_per_second"]


def test_score_percent_multiplies_before_dividing():
    summary = outputs.aggregate([_row("a", True, 1, 1), _row("a", False, 1, 1),
                                 _row("a", False, 1, 1)])
    assert summary["benchmarks"]["a"]["score_percent"] == 33.333333333333336
    assert json.dumps(summary["benchmarks"]["a"]["score_percent"]) == "33.333333333333336"


def test_non_positive_timing_is_refused():
    with pytest.raises(ValueError, match="Evaluation timing must be positive"):
        outputs.aggregate([_row("a", True, 0, 1)])
    with pytest.raises(ValueError, match="Evaluation timing must be positive"):
        outputs.aggregate([_row("a", True, 1.0, 1), _row("a", True, -1.0, 1)])


def test_suite_sums_use_compensated_summation():
    rows = [_row(f"b{i:02d}", True, 0.1, 1) for i in range(10)]
    summary = outputs.aggregate(rows)
    assert summary["suite_wall_seconds"] == 1.0  # plain left-to-right gives 0.9999999999999999
    assert summary["suite_tokens_per_second"] == 10.0


# --- §7.3 summation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values, expected",
    [
        ([], 0),
        ([True, True, 3], 5),
        ([2**70, 1], 2**70 + 1),  # integer phase is exact
        ([0.1] * 10, 1.0),  # left-to-right: 0.9999999999999999
        ([1e100, 1.0, -1e100], 1.0),  # left-to-right: 0.0
        ([2**53, 1, 0.0], 9007199254740992.0),  # float(int total) + first float
        # Integers in the float phase are added uncompensated (3.12): the 0.1 absorbed by
        # 2**60 is lost for good. Compensating them too (later Pythons) would give 0.1.
        ([0.1, 2**60, -(2**60)], 0.0),
        # float(1) + 0.1, then 2 and 3 added uncompensated: 6.300000000000001 (not math.fsum's 6.3)
        ([1, 0.1, 2, 0.2, 3], 6.300000000000001),
    ],
)
def test_python312_sum_cases(values, expected):
    result = outputs.python312_sum(values)
    assert result == expected and type(result) is type(expected)


def test_python312_sum_differs_from_plain_left_to_right():
    values = [0.1] * 10
    plain = 0
    for value in values:
        plain = plain + value
    assert plain != 1.0
    assert outputs.python312_sum(values) == 1.0 == math.fsum(values)


def test_python312_sum_compensation_not_applied_when_infinite():
    assert outputs.python312_sum([1e308, 1e308, -1e308]) == math.inf
    assert outputs.python312_sum([math.inf, 1.0]) == math.inf


_CROSS_CHECK = r"""
import importlib.util, json, random, sys
spec = importlib.util.spec_from_file_location("outputs", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
generator = random.Random(0)
cases = [[1, 0.1, 2, 0.2, 3], [0.1, 2**60, -(2**60)], [0.1, 2**70, 0.5], [2**64, 0.5, 0.1]]
for _ in range(3000):
    cases.append([generator.choice([generator.random() * 10 ** generator.randint(-5, 20),
                                    -generator.random() * 10 ** generator.randint(-3, 18),
                                    generator.randint(-10**6, 10**6), 0.1, True])
                  for _ in range(generator.randint(0, 25))])
bad = [c for c in cases if repr(module.python312_sum(c)) != repr(sum(c))]
print(json.dumps({"cases": len(cases), "bad": len(bad)}))
"""


def test_matches_the_builtin_sum_of_a_python_312_interpreter():
    """Cross-check against CPython 3.12's own ``sum`` when such an interpreter is installed."""
    import shutil
    import subprocess

    import glob

    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    python312 = candidates[0] if candidates else shutil.which("python3.12")
    if python312 is None:
        pytest.skip("no python3.12 interpreter found")
    completed = subprocess.run([python312, "-c", _CROSS_CHECK, outputs.__file__],
                               capture_output=True, text=True, timeout=60)
    if completed.returncode != 0:
        pytest.skip(f"python3.12 unusable: {completed.stderr.strip()[-200:]}")
    report = json.loads(completed.stdout)
    assert report == {"cases": 3004, "bad": 0}


# --- §7.1 rows ----------------------------------------------------------------------------------


def test_generate_mode_row_key_order():
    result = {key: i for i, key in enumerate(GENERATE_RESULT_KEYS)}
    task = {"benchmark": "gsm8k", "id": 7, "metric": "math", "prompt": "p", "answer": "1"}
    row = outputs.prediction_row(result, task, True, "1")
    assert list(row) == GENERATE_RESULT_KEYS + ["benchmark", "id", "correct", "extracted"]
    assert row["id"] == 7 and row["correct"] is True


def test_rescore_mode_row_overwrites_in_place_and_appends_missing():
    supplied = {"id": "x", "text": "B", "correct": True, "generated_tokens": 3,
                "wall_seconds": 1, "benchmark": "arc", "note": 1}
    task = {"benchmark": "arc", "id": "x"}
    row = outputs.prediction_row(supplied, task, False, "B")
    assert list(row) == ["id", "text", "correct", "generated_tokens", "wall_seconds", "benchmark",
                         "note", "extracted"]
    assert row["correct"] is False
    assert supplied["correct"] is True  # the input is not modified


def test_row_line_uses_default_json_format():
    row = {"text": "caf\u00e9 \u2212", "x": 1.0, "y": [1, 2]}
    assert outputs.row_line(row) == '{"text": "caf\\u00e9 \\u2212", "x": 1.0, "y": [1, 2]}\n'


def test_lazy_row_writer_creates_the_file_with_its_first_row(tmp_path):
    path = tmp_path / "predictions.jsonl"
    with outputs.RowWriter(path, lazy=True):
        pass
    assert not path.exists()  # a run that fails before its first row leaves no empty file
    writer = outputs.RowWriter(path, lazy=True)
    writer.write({"a": 1})
    assert path.read_text() == '{"a": 1}\n'
    writer.close()
    with pytest.raises(FileExistsError):
        outputs.RowWriter(path, lazy=True).write({"a": 2})


def test_row_writer_is_exclusive_and_flushes(tmp_path):
    path = tmp_path / "predictions.jsonl"
    writer = outputs.RowWriter(path)
    writer.write({"a": 1})
    assert path.read_text() == '{"a": 1}\n'  # visible before close: flushed per row
    writer.close()
    with pytest.raises(FileExistsError):
        outputs.RowWriter(path)


# --- §7.4 protocol ----------------------------------------------------------------------------


def test_protocol_rescore_key_order():
    block = outputs.protocol_block(
        decoder=outputs.RESCORE_DECODER, input_sha256="aa", decode=None, precision=None,
        device=None, timing=outputs.RESCORE_TIMING, predictions_sha256="bb",
        scoring_failures=[{"benchmark": "m", "id": 1, "reason": "code_scoring_timeout", "x": 0}],
    )
    assert list(block) == ["decoder", "input_sha256", "decode", "precision", "device", "python",
                           "versions", "timing", "score_unit", "predictions_sha256",
                           "device_kind", "compile_seconds", "scoring_failures"]
    assert block["decoder"] == "supplied-predictions"
    assert block["timing"] == "copied from supplied predictions; generation protocol not verified"
    assert block["scoring_failures"] == [{"benchmark": "m", "id": 1, "reason": "code_scoring_timeout"}]
    assert block["device_kind"] is None and block["compile_seconds"] is None


def test_protocol_generate_key_order_with_gpu():
    block = outputs.protocol_block(
        decoder="jax-xla-portable", input_sha256="aa",
        decode={"q": 0.5, "tau": 0.4, "window_size": 16, "max_new_tokens": 4096,
                "position_penalty": None, "mode": "entropy"},
        precision="bf16", device="cuda", timing=outputs.GENERATE_TIMING, gpu="NVIDIA H200",
        device_kind="NVIDIA H200", compile_seconds=12.5,
    )
    assert list(block) == ["decoder", "input_sha256", "decode", "precision", "device", "python",
                           "versions", "timing", "score_unit", "gpu", "device_kind",
                           "compile_seconds", "scoring_failures"]
    assert block["scoring_failures"] == []
    assert block["score_unit"] == "percent"


def test_versions_order_without_importing(monkeypatch):
    for name in ("jax", "flax", "transformers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    versions = outputs.installed_versions()
    order = ["jax", "jaxlib", "flax", "transformers", "math-verify", "evalplus"]
    assert list(versions) == [name for name in order if name in versions]
    assert "torch" not in versions
    assert versions["math-verify"] == "0.8.0" and versions["evalplus"] == "0.3.1"
    assert "jax" not in sys.modules and "flax" not in sys.modules


def test_write_summary_is_atomic_and_exact(tmp_path):
    summary = outputs.aggregate([_row("a", True, 2, 10)])
    path = tmp_path / "summary.json"
    outputs.write_summary(path, summary)
    assert path.read_text() == json.dumps(summary, indent=2) + "\n"
    assert sorted(os.listdir(tmp_path)) == ["summary.json"]  # no temporary file left behind


def test_row_line_equals_json_dumps_on_assorted_rows():
    import random

    generator = random.Random(3)
    alphabet = ["a", "\u00e9", "\u2212", '"', "\\", "\n", "\t", "\x00", "\U0001f600", " "]
    for _ in range(300):
        row = {
            "text": "".join(generator.choice(alphabet) for _ in range(generator.randint(0, 20))),
            "token_ids": [generator.randint(0, 10**6) for _ in range(generator.randint(0, 4))],
            "wall_seconds": generator.choice([generator.random() * 10, 1, 2**63, 1e-310]),
            "mean_exit_depth": generator.choice([None, 1.5, float("inf")]),
            "correct": generator.choice([True, False]),
            "extracted": generator.choice([None, "B", ""]),
            "nested": {"k": [1.0, {"z": None}]},
        }
        assert outputs.row_line(row) == json.dumps(row) + "\n"
