"""Strict verdict rules against the grader tricks, under both rule sets; the protocol's record of
the sandbox; the library ``Scorer``; and what happens where mechanisms are missing."""

from __future__ import annotations

import json

import pytest

from alodlm_scoring import Scorer, evaluation
from alodlm_scoring.pool import ScoringPool
from alodlm_scoring.sandbox import mechanisms
from evaluation import suites

from . import hostile
from .conftest import require


def _trick_pairs():
    pairs = []
    for index, case in enumerate(hostile.TRICKS):
        task_id = f"{index:02d}_{case.name}"
        task = (suites.python_task(task_id, tests=case.tests, timeout=case.timeout)
                if case.metric == "python_tests"
                else suites.evalplus_task(task_id, inputs=((3,), (4,)), expected=(3, 4)))
        pairs.append((task, "```python\n" + case.program + "```"))
        # Honest canaries right after each trick: a verdict it shifted or forged shows here.
        pairs.append((suites.python_task(f"{index:02d}_canary_pass"), suites.identity_code("x")))
        pairs.append((suites.python_task(f"{index:02d}_canary_fail"), suites.identity_code("0")))
    pairs.append((suites.python_task("honest_pass"), suites.identity_code("x")))
    pairs.append((suites.evalplus_task("honest_evalplus"), suites.identity_code("x")))
    return pairs


@pytest.fixture(scope="module")
def trick_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tricks")
    tasks_path, predictions_path = suites.write_suite(base, _trick_pairs())
    runs = {}
    for rules in ("reference", "strict"):
        summary = evaluation.rescore(tasks_path, predictions_path, base / rules, workers=2,
                                     code_verdicts=rules)
        rows = [json.loads(line) for line in (base / rules / "predictions.jsonl").read_text().splitlines()]
        runs[rules] = ({row["id"]: row["correct"] for row in rows}, summary)
    return runs


@pytest.mark.parametrize("rules", ["reference", "strict"])
@pytest.mark.parametrize("case", hostile.TRICKS, ids=[case.name for case in hostile.TRICKS])
def test_grader_tricks_under_both_rule_sets(case, rules, trick_runs):
    verdicts, _ = trick_runs[rules]
    index = hostile.TRICKS.index(case)
    expected = case.verdict if rules == "reference" else case.strict_verdict
    verdict = verdicts[f"{index:02d}_{case.name}"]
    if expected is None:  # the trick's success depends on the machine: any verdict, never a crash
        assert verdict in (True, False)
    else:
        assert verdict is expected
    assert verdicts[f"{index:02d}_canary_pass"] is True
    assert verdicts[f"{index:02d}_canary_fail"] is False
    assert verdicts["honest_pass"] is True and verdicts["honest_evalplus"] is True


@pytest.mark.parametrize("rules", ["reference", "strict"])
def test_protocol_names_the_rule_set_and_the_mechanisms(rules, trick_runs, sandbox_mechanisms):
    protocol = trick_runs[rules][1]["protocol"]
    keys = list(protocol)
    assert keys[keys.index("scoring_failures") + 1:keys.index("scoring_failures") + 3] == [
        "code_verdicts", "code_sandbox"]
    assert protocol["code_verdicts"] == rules
    sandbox = protocol["code_sandbox"]
    assert sandbox["mode"] == "on"
    assert set(sandbox["mechanisms"]) == set(sandbox_mechanisms) - {"process-limit"}
    assert sandbox["missing"] == mechanisms.missing(sandbox["mechanisms"])
    assert protocol["scoring_failures"] == []


def test_strict_rules_need_the_sandbox():
    with pytest.raises(ValueError, match="--code_verdicts=strict needs the code sandbox"):
        ScoringPool(1, sandbox="off", rules="strict")


def test_sandbox_off_is_recorded(tmp_path):
    pairs = [(suites.python_task("p"), suites.identity_code("x"))]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    summary = evaluation.rescore(tasks_path, predictions_path, tmp_path / "out", workers=1,
                                 code_sandbox="off")
    assert summary["protocol"]["code_sandbox"] == {"mode": "off", "mechanisms": [], "missing": None}
    assert summary["protocol"]["code_verdicts"] == "reference"


def test_scorer_gives_rewards_under_both_rules(sandbox_mechanisms):
    require(sandbox_mechanisms, needs=("environment-allowlist",))
    record = suites.evalplus_task("e")
    trick = "```python\n" + hostile.TRICKS[4].program + "```"  # __eq__ always true
    with Scorer(workers=1) as reference, Scorer(workers=1, verdicts="strict") as strict:
        assert reference.score(record, trick) == (True, None)
        assert strict.score(record, trick) == (False, None)
        honest = suites.identity_code("x")
        futures = [strict.submit(record, honest), strict.submit(suites.mc_task(1), "(B)")]
        assert [future.result() for future in futures] == [(True, None), (True, "B")]
        assert strict.code_sandbox["mode"] == "on"


def test_missing_mechanisms_are_named_in_one_warning_and_the_run_goes_on(tmp_path, monkeypatch,
                                                                          capsys):
    monkeypatch.setenv("ALODLM_SANDBOX_DISABLE",
                       "user-namespace,mount-namespace,pid-namespace,network-namespace,"
                       "ipc-namespace,landlock")
    pairs = [(suites.python_task(f"p{i}"), suites.identity_code("x" if i % 2 else "0"))
             for i in range(4)]
    pairs.append((suites.evalplus_task("e"), suites.identity_code("x")))
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    summary = evaluation.rescore(tasks_path, predictions_path, tmp_path / "out", workers=2)
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [row["correct"] for row in rows] == [False, True, False, True, True]
    sandbox = summary["protocol"]["code_sandbox"]
    for name in ("user-namespace", "pid-namespace", "network-namespace", "landlock-filesystem"):
        assert name in sandbox["missing"] and name not in sandbox["mechanisms"]
    assert {"hard-rlimits", "environment-allowlist", "closed-file-descriptors"} <= set(
        sandbox["mechanisms"])
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if "code sandbox runs without" in line]
    assert len(warnings) == 1
    assert "user-namespace" in warnings[0] and "landlock-filesystem" in warnings[0]


def test_a_lost_sandbox_scores_its_task_incorrect_and_a_fresh_worker_goes_on():
    import psutil

    task = suites.python_task("p")
    with ScoringPool(1) as pool:
        assert pool.score(task, suites.identity_code("x")).correct is True
        (worker,) = pool._workers
        for child in psutil.Process(worker.process.pid).children():
            child.kill()  # the sandbox's outer process: the host dies with it
        lost = pool.score(task, suites.identity_code("x"))
        assert (lost.correct, lost.extracted, lost.failure) == (False, None, "code_sandbox_failure")
        assert pool.score(task, suites.identity_code("x")).correct is True


def test_strict_without_the_sandbox_is_a_flag_error(tmp_path, capsys):
    from alodlm_jax.cli import evaluate

    pairs = [(suites.python_task("p"), suites.identity_code("x"))]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    status = evaluate.main(["alodlm-jax-evaluate", f"--input={tasks_path}",
                            f"--predictions={predictions_path}", f"--output={tmp_path / 'out'}",
                            "--code_verdicts=strict", "--code_sandbox=off"])
    line = suites.error_after_phases(capsys.readouterr().err)
    assert status == 2
    assert "--code_verdicts=strict needs the code sandbox (--code_sandbox=on)" in line
    assert not (tmp_path / "out" / "predictions.jsonl").exists()


def test_the_command_records_strict_rules(tmp_path, capsys):
    from alodlm_jax.cli import evaluate

    pairs = [(suites.python_task("p"), "```python\n" + hostile.TRICKS[0].program + "```")]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    status = evaluate.main(["alodlm-jax-evaluate", f"--input={tasks_path}",
                            f"--predictions={predictions_path}", f"--output={tmp_path / 'out'}",
                            "--code_verdicts=strict", "--workers=1"])
    assert status == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["protocol"]["code_verdicts"] == "strict"
    assert summary["benchmarks"]["mbpp"]["correct"] == 0  # the early sys.exit(0) is not a pass


@pytest.mark.parametrize("mode", ["on", "off"])
def test_groundtruth_of_a_canonical_solution(mode):
    """Expected outputs and timings measured by evalplus's trusted_exec in a worker (its sandbox
    when on), as plain data: tuples and sets survive; a failing solution is named."""
    program = "def f(a, b):\n    return (a, {b}), [a] * 2\n"
    with ScoringPool(1, sandbox=mode) as pool:
        outputs, seconds = pool.submit_groundtruth(
            "HumanEval/0", program=program, entry_point="f", inputs=[[1, 2], [3, "x"]],
            output_not_none=False, timeout=30).result()
        assert outputs == [((1, {2}), [1, 1]), ((3, {"x"}), [3, 3])]
        assert len(seconds) == 2 and all(0 <= s < 5 for s in seconds)
        assert pool.submit_groundtruth("MbppPlus/1", program="def g(x):\n    return None\n",
                                       entry_point="g", inputs=[[1]], output_not_none=True,
                                       timeout=30).result()[0] == [False]
        failing = pool.submit_groundtruth("HumanEval/1", program="def f(a):\n    return 1 / a\n",
                                          entry_point="f", inputs=[[0]], output_not_none=False,
                                          timeout=30)
        with pytest.raises(RuntimeError, match="HumanEval/1: .*ZeroDivisionError"):
            failing.result()
