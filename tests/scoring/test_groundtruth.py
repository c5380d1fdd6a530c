"""alodlm_scoring.groundtruth: canonical solutions measured in the scoring pool's sandbox."""

from __future__ import annotations

import pytest

from alodlm_scoring.groundtruth import GroundTruthError, Job, measure

NOISY = (
    "import sys\n"
    "def pair(a, b):\n"
    "    print('noise on stdout')\n"
    "    sys.stdout.write('{\"outputs\": [1]}')\n"
    "    return (a, {b}), {a: b}\n"
)


def test_outputs_keep_exact_types_and_timings_are_per_input():
    inputs = [[1, 2], [(3,), "x"]]
    [result] = measure([Job("t/1", NOISY, "pair", inputs)])
    assert result.outputs == [((1, {2}), {1: 2}), (((3,), {"x"}), {(3,): "x"})]
    assert type(result.outputs[1][0][0]) is tuple  # a tuple input stays a tuple
    assert len(result.seconds) == 2 and all(s >= 0 for s in result.seconds)


def test_output_not_none_records_evalplus_convention():
    program = "import re\ndef check(s):\n    return re.search('^a', s)\n"
    [result] = measure([Job("Mbpp/737", program, "check", [["abc"], ["xyz"]],
                            output_not_none=True)])
    assert result.outputs == [True, False]


def test_results_come_back_in_job_order_with_several_workers():
    jobs = [Job(f"t/{i}", f"def f(x):\n    return x * {i}\n", "f", [[i]]) for i in range(6)]
    results = measure(jobs, workers=3)
    assert [r.outputs for r in results] == [[i * i] for i in range(6)]


def test_a_failing_canonical_solution_names_the_task():
    with pytest.raises(GroundTruthError, match=r"task 'HumanEval/9 \(plus_input\)'.*"
                                               r"ZeroDivisionError"):
        measure([Job("HumanEval/9 (plus_input)", "def f(x):\n    return 1 / x\n", "f", [[0]])])


def test_a_missing_entry_point_names_the_task():
    with pytest.raises(GroundTruthError, match="task 'x/1'.*KeyError"):
        measure([Job("x/1", "def g():\n    pass\n", "f", [[]])])


def test_a_hanging_solution_times_out():
    with pytest.raises(GroundTruthError, match="task 'loop/1'.*longer than 2 s"):
        measure([Job("loop/1", "def f():\n    while True:\n        pass\n", "f", [[]])], timeout=2)


def test_the_solution_runs_in_the_sandbox_and_loads_no_framework(monkeypatch):
    from alodlm_scoring.sandbox import mechanisms

    monkeypatch.setenv("ALODLM_TEST_SECRET", "s3cret")
    program = ("import os, sys\n"
               "def probe():\n"
               "    return [sorted(os.environ), sorted(m for m in ('jax', 'torch', 'flax')"
               " if m in sys.modules)]\n")
    [result] = measure([Job("probe", program, "probe", [[]])])
    [[variables, frameworks]] = result.outputs
    assert frameworks == []
    assert set(variables) <= set(mechanisms.ALLOWED_VARIABLES) | {"HOME", "TMPDIR"}
