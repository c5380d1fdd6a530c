"""``--resume``: a killed rescoring run continued to files byte-identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from alodlm_jax.cli import evaluate

from . import suites

PROG = "alodlm-jax-evaluate"
SLOW_TESTS = "import time\ntime.sleep(0.3)\nassert identity(3) == 3"


def _slow_suite(directory, count=8):
    pairs = []
    for i in range(count):
        pairs.append((suites.python_task(f"slow{i}", tests=SLOW_TESTS),
                      suites.identity_code("x" if i % 3 else "0")))
        pairs.append((suites.mc_task(i), "The answer is (B)." if i % 2 else "(A)"))
    return suites.write_suite(directory, pairs)


def _argv(tasks_path, predictions_path, output, *extra):
    return [PROG, "--input", tasks_path, "--predictions", predictions_path, "--output",
            str(output), "--workers", "1", *extra]


def _files(output):
    return (suites.read_bytes(os.path.join(output, "predictions.jsonl")),
            suites.read_bytes(os.path.join(output, "summary.json")))


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reference")
    tasks_path, predictions_path = _slow_suite(directory)
    output = directory / "reference"
    assert evaluate.main(_argv(tasks_path, predictions_path, output)) == 0
    return tasks_path, predictions_path, _files(output), output / "run.json"


def _started(output, reference_record):
    """``output`` as the reference run left it when it started: its directory and run record."""
    output.mkdir()
    shutil.copy(reference_record, output / "run.json")
    return output


def test_sigkill_mid_run_then_resume_is_byte_identical(tmp_path, reference_run, capsys):
    tasks_path, predictions_path, expected, record = reference_run
    output = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-m", "alodlm_jax.cli.evaluate", *_argv(tasks_path, predictions_path,
                                                                  output)[1:]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    predictions = output / "predictions.jsonl"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if predictions.exists() and predictions.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL
    written = predictions.read_bytes()
    assert 5 <= written.count(b"\n") < 16, "the run was not killed part way through"
    assert not (output / "summary.json").exists()
    assert expected[0].startswith(written[: written.rfind(b"\n") + 1])

    # Without --resume the directory is refused, as in the reference.
    assert evaluate.main(_argv(tasks_path, predictions_path, output)) == 2
    assert "Use a fresh evaluation output directory" in capsys.readouterr().err

    assert evaluate.main(_argv(tasks_path, predictions_path, output, "--resume")) == 0
    assert _files(output) == expected


def test_torn_last_line_is_dropped(tmp_path, reference_run):
    tasks_path, predictions_path, expected, record = reference_run
    output = _started(tmp_path / "torn", record)
    lines = expected[0].splitlines(keepends=True)
    (output / "predictions.jsonl").write_bytes(b"".join(lines[:4]) + lines[4][:17])
    assert evaluate.main(_argv(tasks_path, predictions_path, output, "--resume")) == 0
    assert _files(output) == expected


def test_resume_of_a_finished_run_rewrites_the_same_summary(tmp_path, reference_run):
    tasks_path, predictions_path, expected, record = reference_run
    output = _started(tmp_path / "done", record)
    (output / "predictions.jsonl").write_bytes(expected[0])
    (output / "summary.json").write_bytes(expected[1])
    assert evaluate.main(_argv(tasks_path, predictions_path, output, "--resume")) == 0
    assert _files(output) == expected
    (output / "summary.json").unlink()  # killed after the last row, before the summary
    assert evaluate.main(_argv(tasks_path, predictions_path, output, "--resume")) == 0
    assert _files(output) == expected


def test_resume_refuses_rows_of_another_run(tmp_path, reference_run, capsys):
    tasks_path, predictions_path, expected, record = reference_run
    lines = expected[0].splitlines(keepends=True)
    cases = {
        "other_task": lines[1] + lines[0],  # rows out of order
        "tampered_verdict": lines[0] + lines[1].replace(b'"extracted": "A"', b'"extracted": "B"'),
        "tampered_timing": lines[0].replace(b'"wall_seconds": 0.1', b'"wall_seconds": 9.0'),
    }
    for name, content in cases.items():
        output = _started(tmp_path / name, record)
        (output / "predictions.jsonl").write_bytes(content)
        status = evaluate.main(_argv(tasks_path, predictions_path, output, "--resume"))
        err = capsys.readouterr().err
        assert status == 2, name
        assert "cannot resume" in suites.error_after_phases(err), err
        assert (output / "predictions.jsonl").read_bytes() == content  # untouched
        assert not (output / "summary.json").exists()


def test_resume_keeps_scoring_failures_of_the_first_part(tmp_path, monkeypatch, capsys):
    from alodlm_scoring import pool as scoring_pool

    monkeypatch.setattr(scoring_pool, "parent_timeout", lambda record: 1.0)
    pairs = [(suites.python_task("hang", tests="import time\ntime.sleep(30)"), suites.identity_code()),
             (suites.mc_task(1), "B"), (suites.mc_task(2), "C")]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    reference = tmp_path / "reference"
    assert evaluate.main(_argv(tasks_path, predictions_path, reference)) == 0
    expected = _files(reference)
    assert json.loads(expected[1])["protocol"]["scoring_failures"] == [
        {"benchmark": "mbpp", "id": "hang", "reason": "code_scoring_timeout"}]
    output = tmp_path / "partial"
    shutil.copytree(reference, output)
    (output / "summary.json").unlink()
    lines = expected[0].splitlines(keepends=True)
    (output / "predictions.jsonl").write_bytes(lines[0] + lines[1][:5])
    assert evaluate.main(_argv(tasks_path, predictions_path, output, "--resume")) == 0
    assert _files(output) == expected


def _directory_files(directory):
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.mark.parametrize("change, flag", [
    ("predictions", "--predictions"),
    ("tasks", "--input"),
    ("verdicts", "--code_verdicts"),
    ("sandbox", "--code_sandbox"),
])
def test_resume_refuses_another_rescore_run(tmp_path, reference_run, capsys, change, flag):
    """Rescoring, the same run means the same task and prediction files (their contents) and
    the same code-scoring settings; anything else is refused before any work."""
    tasks_path, predictions_path, expected, record = reference_run
    output = _started(tmp_path / "partial", record)
    (output / "predictions.jsonl").write_bytes(b"".join(expected[0].splitlines(keepends=True)[:3]))
    extra = []
    if change in ("predictions", "tasks"):  # same rows and ids, another file content
        source = predictions_path if change == "predictions" else tasks_path
        lines = open(source, encoding="utf-8").read().splitlines(keepends=True)
        last = json.loads(lines[-1])
        last["text" if change == "predictions" else "prompt"] += " (changed)"  # after the prefix
        copy = tmp_path / os.path.basename(source)
        copy.write_text("".join(lines[:-1]) + json.dumps(last) + "\n", encoding="utf-8")
        if change == "predictions":
            predictions_path = str(copy)
        else:
            tasks_path = str(copy)
    elif change == "verdicts":
        extra = ["--code_verdicts", "strict"]
    else:
        extra = ["--code_sandbox", "off"]
    before = _directory_files(output)
    assert evaluate.main(_argv(tasks_path, predictions_path, output, "--resume", *extra)) == 2
    err = capsys.readouterr().err
    assert f"cannot resume {output}: {flag} was " in suites.error_after_phases(err), err
    assert _directory_files(output) == before


def test_resume_with_other_workers_is_the_same_run(tmp_path, reference_run):
    tasks_path, predictions_path, expected, record = reference_run
    output = _started(tmp_path / "partial", record)
    (output / "predictions.jsonl").write_bytes(b"".join(expected[0].splitlines(keepends=True)[:3]))
    argv = _argv(tasks_path, predictions_path, output, "--resume")
    argv[argv.index("--workers") + 1] = "2"
    assert evaluate.main(argv) == 0
    assert _files(output) == expected
