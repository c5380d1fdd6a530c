"""What ``alodlm-jax-evaluate`` shows a person at a terminal: a line as each phase starts and a
task bar with the time left, on stderr; nothing under ``--quiet`` or when stderr is not a
terminal. The closing table names its times for what they are."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from alodlm_jax.cli import evaluate
from alodlm_jax.data import BUILTINS
from alodlm_jax.cli.progress import Progress, compiling

from . import suites

PROG = "alodlm-jax-evaluate"
BAR = re.compile(r"(rescored|evaluated): +100%\|.*\| (\d+)/\2 \[\d\d:\d\d<\d\d:\d\d")


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _suite(directory):
    pairs = [(suites.mc_task(1), "The answer is (B)."), (suites.exact_task("1"), "one ."),
             (suites.math_task("m"), "\\boxed{42}")]
    return suites.write_suite(directory, pairs)


def _rescore(tmp_path, monkeypatch, capsys, *extra, stderr=None):
    tasks, predictions = _suite(tmp_path)
    if stderr is not None:
        monkeypatch.setattr(sys, "stderr", stderr)
    status = evaluate.main([PROG, "--input", tasks, "--predictions", predictions, "--output",
                            str(tmp_path / "out"), "--workers", "1", *extra])
    captured = capsys.readouterr()
    return status, captured.out, captured.err if stderr is None else stderr.getvalue()


def test_on_a_terminal_each_phase_then_a_bar_with_the_time_left(tmp_path, monkeypatch, capsys):
    status, out, err = _rescore(tmp_path, monkeypatch, capsys, stderr=Terminal())
    assert status == 0, err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[0] == f"{PROG}: checking the tasks in {tmp_path / 'tasks.jsonl'}"
    assert lines[1] == f"{PROG}: reading the predictions in {tmp_path / 'predictions.jsonl'}"
    assert any(BAR.match(line) for line in lines[2:]), err
    assert "time: " in out and f"{PROG}:" not in out  # stdout is the table alone


@pytest.mark.parametrize("how", ["quiet", "not a terminal"])
def test_silent_under_quiet_and_off_a_terminal(tmp_path, monkeypatch, capsys, how):
    if how == "quiet":
        status, out, err = _rescore(tmp_path, monkeypatch, capsys, "--quiet", stderr=Terminal())
    else:
        status, out, err = _rescore(tmp_path, monkeypatch, capsys)
    assert status == 0 and err == ""
    assert out.splitlines()[0].startswith("|benchmark")


def test_a_resumed_run_says_where_it_resumes():
    stream = Terminal()
    progress = Progress(PROG, stream, label="evaluated")
    progress(2, 5)
    progress(5, 5)
    text = stream.getvalue().replace("\r", "\n")
    assert text.startswith(f"{PROG}: resuming after 2/5 rows\n")
    assert "5/5" in text


@pytest.mark.jax_backend
def test_compiling_says_what_was_compiled():
    import jax
    import jax.numpy as jnp

    stream = Terminal()
    progress = Progress(PROG, stream)
    with compiling(progress, "a test program", None):
        jax.jit(lambda x: x * 3 + 1).lower(jnp.arange(7.0)).compile()
    lines = stream.getvalue().splitlines()
    assert lines[0] == f"{PROG}: compiling a test program"
    assert re.fullmatch(rf"{PROG}: [1-9]\d* XLA program\(s\) compiled in \d+\.\d s", lines[1])


def _run_on_a_terminal(argv, timeout=600):
    """Runs the command with stderr on a pseudo-terminal; returns (status, stdout, stderr)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, text=False)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the command closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    os.close(leader)
    out = process.stdout.read().decode()
    status = process.wait(timeout=60)
    return status, out, b"".join(chunks).decode(errors="replace")


def test_generate_mode_phases_on_a_terminal_and_quiet(tmp_path):
    """The demo's command on two tasks with stderr on a terminal: loading, tokenizing and compiling
    each announced, then the bar; with --quiet the terminal gets nothing."""
    rows = [json.loads(line) for line in open(BUILTINS["builtin:sample"])][:2]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = [sys.executable, "-m", "alodlm_jax.cli.evaluate", "--model", "builtin:tiny", "--input",
            str(tasks), "--device", "cpu", "--precision", "fp32", "--q", "0.5", "--tau", "0.4",
            "--window-size", "4", "--max-new-tokens", "8", "--workers", "1"]
    status, out, err = _run_on_a_terminal(argv + ["--output", str(tmp_path / "a")])
    assert status == 0, err
    lines = [line.strip() for line in err.replace("\r", "\n").splitlines() if line.strip()]
    phases = [line for line in lines if line.startswith(f"{PROG}: ")]
    assert [line.split(": ", 1)[1].split(" ")[0] for line in phases[:4]] == [
        "checking", "loading", "tokenizing", "compiling"]
    assert re.search(r"XLA program\(s\) (compiled|read from the compilation cache|ready)",
                     phases[4]), phases
    assert any(BAR.match(line) for line in lines), err
    assert re.search(r"^suite: 2 example\(s\), .* tokens/s over a generation wall time of "
                     r"\d+\.\d{3} s \(the tasks' wall_seconds summed\)$", out, re.M), out
    assert re.search(r"^time: \d+\.\d s elapsed \(the whole command\), \d+\.\d s of it "
                     r"compiling$", out, re.M), out
    status, out, err = _run_on_a_terminal(argv + ["--output", str(tmp_path / "b"), "--quiet"])
    assert status == 0 and err == "", err
    assert "time: " in out


def test_a_compile_step_under_the_bar_is_left_out_of_its_clock(monkeypatch):
    """The batched engine compiles after the bar appears; the bar's elapsed time (and so its
    estimate of the time left) leaves the compile step out."""
    from alodlm_jax.cli import progress as progress_module

    stream = Terminal()
    progress = Progress(PROG, stream)
    progress(0, 4)
    bar = progress._bar
    monkeypatch.setattr(progress_module._CompileCounter, "register", classmethod(lambda cls: None))
    before = bar.format_dict["elapsed"]
    with compiling(progress, "nothing", None):
        time.sleep(0.3)
    assert bar.format_dict["elapsed"] - before < 0.2
    progress(4, 4)
