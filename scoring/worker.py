"""A long-lived code-scoring worker: ``python -m alodlm_scoring.worker`` (SCORING.md §5.5, D6).

The evaluator starts this module in a *fresh* interpreter (never a fork of a process that may have
JAX loaded). Its import chain is the scoring package only, so JAX, Flax and torch never load here.

Protocol, one JSON document per line:

* after start-up the worker writes ``{"ready": true}``;
* each request is ``{"record": <task>, "generation": <text>}``;
* each reply is ``[correct, extracted]`` (``extracted`` is ``null`` for code metrics), or
  ``{"error": <traceback text>, "type": <exception class>, "message": <str(exception)>}`` when
  scoring raised (a validation error of §2.3, for instance).

Why the file-descriptor juggling: generated programs run in children of this process (``python -I
check.py``, evalplus's forked checker). The protocol travels over private duplicates of stdin and
stdout, and descriptors 0 and 1 are pointed at ``/dev/null``, so a program that prints or reads
cannot corrupt or steal protocol lines. After every request all remaining descendants are killed;
the worker makes itself a child subreaper (Linux) so that double-forked or ``setsid`` programs
are re-parented here and cannot outlive their task.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

__all__ = ["main", "handle_request", "kill_descendants"]

_PR_SET_CHILD_SUBREAPER = 36
SCRATCH_VARIABLE = "ALODLM_WORKER_SCRATCH"


def _become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def kill_descendants() -> None:
    """SIGKILL every process below this one, then reap the direct children.

    Between requests the worker has no legitimate children, so anything left is a leftover of the
    program just scored (background processes, a fork bomb's remains, evalplus stragglers).
    """
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a declared dependency
        return
    for _ in range(3):  # a process forking while we kill: repeat until nothing is left
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        if not children:
            return
        for child in children:
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(children, timeout=5)
        _reap_zombies()


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def handle_request(line: bytes | str) -> list | dict:
    """Score one request line; never raises (errors become an error reply)."""
    return _serve(line)[0]


def _serve(line: bytes | str) -> tuple[list | dict, bool]:
    """The reply, and whether the request may have left processes behind (not for math, which
    runs no programs: the ``/proc``-scanning cleanup costs milliseconds)."""
    runs_programs = True
    try:
        from .metrics import score

        request = json.loads(line)
        record = request["record"]
        runs_programs = record.get("metric") != "math"
        correct, extracted = score(record, request["generation"])
        return [bool(correct), extracted], runs_programs
    except Exception as error:  # reported to the parent, which decides what is fatal
        return {
            "error": traceback.format_exc(),
            "type": type(error).__name__,
            "message": str(error),
        }, runs_programs


def main() -> int:
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _become_subreaper()
    from . import metrics  # noqa: F401  - import errors surface before "ready"

    try:
        replies.write(b'{"ready": true}\n')
        replies.flush()
        for line in requests:
            if not line.strip():
                continue
            reply, runs_programs = _serve(line)
            if runs_programs:
                kill_descendants()
            replies.write(json.dumps(reply).encode("utf-8") + b"\n")
            replies.flush()
    except BrokenPipeError:  # the evaluator is gone (killed): nobody wants the reply
        pass
    finally:
        kill_descendants()
        _remove_scratch()
    return 0


def _remove_scratch() -> None:
    """Remove the scratch directory the pool made for this worker (named in the environment).

    Matters when the evaluator was killed and cannot clean up; also removes the pool's (then
    empty) parent directory. Nothing is removed when the variable is unset.
    """
    scratch = os.environ.get(SCRATCH_VARIABLE)
    if not scratch:
        return
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(scratch))
    except OSError:
        pass


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        os._exit(0)
