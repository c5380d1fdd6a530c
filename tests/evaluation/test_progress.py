"""What ``alodlm-jax-evaluate`` shows on stderr: a line as each phase starts, then on a terminal a
task bar with the time left, in a log or a pipe plain progress lines (every 5 % of the tasks, at
least every 30 s, the first line before JAX is imported); nothing under ``--quiet``. The closing
table names its times for what they are."""

from __future__ import annotations

import contextlib
import io
import json
import math
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


PLAIN = re.compile(rf"{PROG}: (rescored|evaluated) (\d+)/(\d+) \((\d+) %\), \d+:\d\d elapsed"
                   r"(, about \d+:\d\d left)?")


def test_off_a_terminal_each_phase_then_plain_progress_lines(tmp_path, monkeypatch, capsys):
    status, out, err = _rescore(tmp_path, monkeypatch, capsys)
    assert status == 0, err
    lines = err.splitlines()
    assert lines[0] == f"{PROG}: checking the tasks in {tmp_path / 'tasks.jsonl'}"
    assert lines[1] == f"{PROG}: reading the predictions in {tmp_path / 'predictions.jsonl'}"
    counts = [PLAIN.fullmatch(line) for line in lines[2:]]
    assert all(counts), lines  # no bar, no carriage return: one plain line per line
    assert [(int(m[2]), int(m[3]), int(m[4])) for m in counts] == [
        (0, 3, 0), (1, 3, 33), (2, 3, 66), (3, 3, 100)]  # each task is more than 5 %
    assert out.splitlines()[0].startswith("|benchmark")


@pytest.mark.parametrize("stderr", [Terminal, None])
def test_silent_under_quiet(tmp_path, monkeypatch, capsys, stderr):
    status, out, err = _rescore(tmp_path, monkeypatch, capsys, "--quiet",
                                stderr=stderr() if stderr else None)
    assert status == 0 and err == ""
    assert out.splitlines()[0].startswith("|benchmark")


def test_plain_lines_every_5_percent_and_at_the_end():
    stream = io.StringIO()
    progress = Progress(PROG, stream, label="evaluated", interval=0)
    for done in range(43):
        progress(done, 42)
    progress.close()
    counts = [int(PLAIN.fullmatch(line)[2]) for line in stream.getvalue().splitlines()]
    # A line as the tasks start, then as each multiple of 5 % is reached (42 tasks: 2.1 each).
    assert counts == [0] + [math.ceil(k * 42 / 20) for k in range(1, 21)]


def test_off_a_terminal_a_line_at_least_every_interval():
    """Nothing completes for a while (a long compile, a slow task): a line still comes."""
    stream = io.StringIO()
    progress = Progress(PROG, stream, label="evaluated", interval=0.2)
    progress.phase("loading the model m")
    time.sleep(0.7)
    progress(0, 4)
    time.sleep(0.7)
    with progress_module_compiling(progress):
        time.sleep(0.7)
    time.sleep(0.5)
    progress.close()
    closed = stream.getvalue()
    time.sleep(0.5)
    assert stream.getvalue() == closed  # nothing after close
    lines = closed.splitlines()
    assert lines[0] == f"{PROG}: loading the model m"
    still = re.compile(rf"{PROG}: still loading the model m \(\d+:\d\d so far\)")
    start = lines.index(f"{PROG}: evaluated 0/4 (0 %), 0:00 elapsed")
    assert 1 <= start and all(still.fullmatch(line) for line in lines[1:start]), lines
    begin = lines.index(f"{PROG}: compiling a program")
    assert begin > start + 1 and all(PLAIN.fullmatch(line) for line in lines[start:begin])
    end = next(i for i, line in enumerate(lines) if "ready in" in line)
    assert end > begin + 1 and all(line.startswith(f"{PROG}: still compiling a program (")
                                   for line in lines[begin + 1:end]), lines
    assert len(lines) > end + 1 and all(PLAIN.fullmatch(line) for line in lines[end + 1:])


@contextlib.contextmanager
def progress_module_compiling(progress):
    """:func:`compiling` without JAX's monitoring (nothing is compiled)."""
    from alodlm_jax.cli import progress as progress_module

    saved = progress_module._CompileCounter.register
    progress_module._CompileCounter.register = classmethod(lambda cls: None)
    try:
        with compiling(progress, "a program", None):
            yield
    finally:
        progress_module._CompileCounter.register = saved


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


# Runs the command with a stderr that notes, for each line, whether JAX was imported yet.
_NOTING_STDERR = """
import sys
class Noting:
    def __init__(self, stream):
        self.stream = stream
    def write(self, text):
        for line in text.splitlines(True):
            self.stream.write(("jax " if "jax" in sys.modules else "-   ") + line)
        return len(text)
    def flush(self):
        self.stream.flush()
    def isatty(self):
        return False
sys.stderr = Noting(sys.stderr)
from alodlm_jax.cli import evaluate
sys.exit(evaluate.main(["alodlm-jax-evaluate"] + sys.argv[1:]))
"""


def test_generate_mode_in_a_log_each_phase_first_and_progress_lines(tmp_path):
    """The demo's command on two tasks with stderr to a pipe: the first line is written before
    JAX is imported (the slow start), then loading, tokenizing and compiling, then a progress
    line per task."""
    rows = [json.loads(line) for line in open(BUILTINS["builtin:sample"])][:2]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = subprocess.run(
        [sys.executable, "-c", _NOTING_STDERR, "--model", "builtin:tiny", "--input", str(tasks),
         "--output", str(tmp_path / "out"), "--device", "cpu", "--window-size", "4",
         "--max-new-tokens", "8", "--workers", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    noted = [(line[:4].strip(), line[4:]) for line in done.stderr.splitlines()]
    assert noted[0] == ("-", f"{PROG}: checking the tasks in {tasks}"), noted
    assert all(text.startswith(f"{PROG}: ") for _, text in noted), noted
    words = [text.split(": ", 1)[1].split(" ")[0] for _, text in noted]
    assert words[:4] == ["checking", "loading", "tokenizing", "compiling"], noted
    counts = [PLAIN.fullmatch(text) for _, text in noted[5:]]
    assert all(counts) and [m[2] for m in counts] == ["0", "1", "2"], noted
    assert "time: " in done.stdout
