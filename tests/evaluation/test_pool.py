"""Code scoring in fresh-interpreter workers (SCORING.md §5.5, §10.1 rows 20-21, D3, D6)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from alodlm_scoring import evaluation, metrics, pool as scoring_pool

from . import suites


def test_isolated_scorer_identity_passes():  # §10.1 row 20
    assert scoring_pool.score_isolated(suites.python_task(1), suites.identity_code("x")) == (True, None)


def test_isolated_scorer_identity_fails():  # §10.1 row 21
    assert scoring_pool.score_isolated(suites.python_task(1), suites.identity_code("0")) == (False, None)


def test_worker_import_chain_never_loads_a_framework():
    code = (
        "import sys\n"
        "import alodlm_scoring.worker, alodlm_scoring.pool, alodlm_scoring.evaluation\n"
        "import alodlm_scoring.outputs, alodlm_scoring.metrics, alodlm_scoring.sandbox\n"
        "import alodlm_scoring.sandbox.jobs, alodlm_scoring.sandboxed, alodlm_scoring.strict\n"
        "from alodlm_scoring.worker import handle_request\n"
        "import json\n"
        "record = {'metric': 'evalplus', 'code_tests': {'dataset': 'humaneval',"
        " 'entry_point': 'identity', 'suites': [{'inputs': [[3]], 'expected': [3],"
        " 'reference_seconds': [0.001]}]}}\n"
        "print(handle_request(json.dumps({'record': record,"
        " 'generation': 'def identity(x):\\n    return x\\n'})))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('jax', 'jaxlib', 'flax', 'torch', 'transformers')))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == ["{'nonce': None, 'verdict': [True, None]}", "[]"]


def test_pool_verdicts_equal_in_process_scoring():
    pairs = suites.mixed_suite()
    with scoring_pool.ScoringPool(2) as pool:
        futures = [pool.submit(task, text) for task, text in pairs]
        pooled = [(f.result().correct, f.result().extracted) for f in futures]
    assert pooled == [metrics.score(task, text) for task, text in pairs]
    assert [c for c, _ in pooled[:7]] == [True, False, True, False, True, False, True]


def test_rescore_with_one_and_two_workers_is_byte_identical(tmp_path):
    tasks_path, predictions_path = suites.write_suite(tmp_path, suites.mixed_suite())
    outputs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        evaluation.rescore(tasks_path, predictions_path, out, workers=workers)
        outputs[workers] = (suites.read_bytes(out / "predictions.jsonl"),
                            suites.read_bytes(out / "summary.json"))
    assert outputs[1] == outputs[2]
    summary = json.loads(outputs[2][1])
    assert summary["protocol"]["scoring_failures"] == []
    rows = [json.loads(line) for line in outputs[2][0].decode().splitlines()]
    assert [row["correct"] for row in rows] == [
        True, False, True, False, True, False, True, False, True, True, True, False, True]
    assert rows[0]["extracted"] is None and rows[7]["extracted"] == "C"


def test_worker_validation_error_is_fatal_with_traceback():
    task = suites.python_task(1, tests="   ")
    with pytest.raises(RuntimeError) as caught:
        scoring_pool.score_isolated(task, suites.identity_code())
    message = str(caught.value)
    assert message.startswith("Isolated code scoring failed: ")
    assert "Traceback (most recent call last)" in message
    assert "python_tests requires a nonempty local test program" in message


def test_parent_timeouts():
    assert scoring_pool.parent_timeout(suites.python_task(1)) == 40.0
    assert scoring_pool.parent_timeout(suites.python_task(1, timeout=2.5)) == 32.5
    task = suites.evalplus_task(1)
    task["code_tests"]["suites"] *= 3
    assert scoring_pool.parent_timeout(task) == 30 + 70 * 3


def test_parent_timeout_scores_incorrect_records_and_continues(tmp_path, monkeypatch, capfd):
    """D3: a worker exceeding its (here monkeypatched, small) timeout; the run carries on."""
    monkeypatch.setattr(scoring_pool, "parent_timeout", lambda record: 1.5)
    pairs = [
        (suites.python_task("slow", tests="import time\ntime.sleep(60)", timeout=100),
         suites.identity_code()),
        (suites.python_task("fast"), suites.identity_code()),
        (suites.mc_task(1), "The answer is (B)."),
    ]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    summary = evaluation.rescore(tasks_path, predictions_path, tmp_path / "out", workers=1)
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [(r["id"], r["correct"], r["extracted"]) for r in rows] == [
        ("slow", False, None), ("fast", True, None), (1, True, "B")]
    assert summary["protocol"]["scoring_failures"] == [
        {"benchmark": "mbpp", "id": "slow", "reason": "code_scoring_timeout"}]
    err = capfd.readouterr().err
    assert "code_scoring_timeout" in err and "'slow'" in err


def test_evalplus_timeout_variable_is_removed_with_one_warning(monkeypatch):
    task = suites.evalplus_task(1)
    expected = [scoring_pool.score_isolated(task, suites.identity_code(v)) for v in ("x", "2")]
    monkeypatch.setenv("EVALPLUS_TIMEOUT_PER_TASK", "20")
    stderr = io.StringIO()
    with scoring_pool.ScoringPool(2, stderr=stderr) as pool:
        futures = [pool.submit(task, suites.identity_code(v)) for v in ("x", "2")]
        outcomes = [(f.result().correct, f.result().extracted) for f in futures]
    assert outcomes == expected == [(True, None), (False, None)]
    warnings = stderr.getvalue().splitlines()
    assert len(warnings) == 1
    assert "EVALPLUS_TIMEOUT_PER_TASK" in warnings[0]
    assert "ignored: evalplus 0.3.1 cannot read it; its default 60 s cap applies" in warnings[0]
    assert "EVALPLUS_TIMEOUT_PER_TASK" not in scoring_pool.worker_environment(stderr=io.StringIO())


def test_program_output_cannot_forge_a_verdict():
    """Generated code writing a fake protocol line to descriptor 1 must not be believed."""
    forged = ("import os\nos.write(1, b'[true, null]\\n')\n"
              "def identity(x):\n    return 0\n")
    task = suites.evalplus_task(1)
    assert scoring_pool.score_isolated(task, forged) == (False, None)
    assert scoring_pool.score_isolated(suites.python_task(2), forged) == (False, None)


def test_non_code_errors_from_the_pool_keep_their_type():
    """Math scored in the pool raises the reference's in-process error, not a code failure."""
    with scoring_pool.ScoringPool(1) as pool:
        with pytest.raises(ValueError, match="An evaluation reference is required") as caught:
            pool.score({"metric": "math", "answer": "  "}, "\\boxed{1}")
        assert not isinstance(caught.value, scoring_pool.WorkerError)
        assert pool.score(suites.math_task(1), "\\boxed{42}") == scoring_pool.Outcome(True, "42")


def test_math_goes_to_the_pool_only_with_two_or_more_workers():
    assert evaluation.rescore_pool_metrics(1) == ("python_tests", "evalplus")
    assert evaluation.rescore_pool_metrics(2) == ("python_tests", "evalplus", "math")
    assert evaluation.rescore_pool_metrics(2, math_in_pool=False) == ("python_tests", "evalplus")


@pytest.mark.parametrize("overlap", [False, True])
def test_generate_style_source_and_overlap(tmp_path, overlap):
    """A generator-like rows source: with overlap off, every earlier row is written (scored)
    before the next result is requested; the files are the same either way."""
    pairs = [(suites.python_task(f"p{i}"), suites.identity_code("x" if i % 2 else "0"))
             for i in range(3)] + [(suites.mc_task(1), "(B)")]
    tasks = [task for task, _ in pairs]
    state = evaluation.prepare_output_directory(tmp_path / "out")
    written_before_request = []

    def rows(start):
        for index in range(start, len(pairs)):
            path = tmp_path / "out" / "predictions.jsonl"
            written_before_request.append(
                path.read_text().count("\n") if path.exists() else 0)
            yield {"text": pairs[index][1], "generated_tokens": 3, "wall_seconds": 0.5}

    summary = evaluation.evaluate(
        tasks, state, rows_source=rows, workers=2, overlap=overlap,
        make_protocol=lambda failures: {"scoring_failures": list(failures)},
    )
    if not overlap:
        assert written_before_request == [0, 1, 2, 3]
    lines = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(line)["correct"] for line in lines] == [False, True, False, True]
    assert json.loads(lines[0]) == {"text": pairs[0][1], "generated_tokens": 3,
                                    "wall_seconds": 0.5, "benchmark": "mbpp", "id": "p0",
                                    "correct": False, "extracted": None}
    assert summary["benchmark_count"] == 2


MATH_CASES = [  # a selection of SCORING.md §11.1 rows: (generation, reference)
    ("The answer is 42.", "42"), ("\\boxed{1,024}", "1024"), ("\\boxed{\\dfrac{1}{2}}", "\\frac12"),
    ("\\boxed{}", "0"), ("\\boxed{50\\%}", "50"), ("\\boxed{3.14159}", "3.1416"),
    ("\\boxed{3.1415926}", "3.1415927"), ("\\boxed{x^2+2x+1}", "(x+1)^2"), ("1.5e3", "1500"),
    ("\\boxed{0.333333}", "\\frac{1}{3}"), ("\\boxed{\\pi}", "3.14159265"),
    ("\\boxed{-3}", "\u22123"), ("\\boxed{\\frac{1}{2}", "0.5"), ("\\boxed{12}", "012"),
]


def test_math_in_worker_processes_matches_the_main_thread():
    tasks = [(suites.math_task(i, answer=reference), generation)
             for i, (generation, reference) in enumerate(MATH_CASES)]
    in_process = [metrics.score(task, generation) for task, generation in tasks]
    with scoring_pool.ScoringPool(2) as pool:
        futures = [pool.submit(task, generation) for task, generation in tasks]
        pooled = [(f.result().correct, f.result().extracted) for f in futures]
    assert pooled == in_process
    assert [c for c, _ in pooled] == [True, True, True, False, True, False, True, True, False,
                                      True, True, True, False, True]
