"""A long-lived code-scoring worker: ``python -m alodlm_scoring.worker`` (SCORING.md §5.5, D6, D10).

The evaluator starts this module in a *fresh* interpreter (never a fork of a process that may have
JAX loaded). Its import chain is the scoring package only, so JAX, Flax and torch never load here.
Flags: ``--sandbox on|off`` (default on) and ``--rules reference|strict`` (default reference).

With the sandbox on, the worker forks its zygote (:mod:`alodlm_scoring.sandbox.zygote`) before it
reads any request, and every program of every task runs in a sandboxed fork of it; the worker
itself never runs a program. The pool starts sandboxed workers with a short environment allowlist,
so no secret is in this process either.

Protocol, one JSON document per line:

* after start-up the worker writes ``{"ready": true, "sandbox": {"mode", "mechanisms",
  "missing", "error"}}``;
* each request is ``{"nonce": <hex>, "record": <task>, "generation": <text>}``;
* each reply carries the request's nonce and one of ``"verdict": [correct, extracted]``
  (``extracted`` is ``null`` for code metrics), ``"failure": <reason>`` (the sandbox could not run
  the program: the task is scored incorrect with that reason) or ``"error": <traceback text>``
  with ``"type"`` and ``"message"`` (scoring raised: a validation error, a failed grader
  self-check).

The protocol travels over private duplicates of stdin and stdout; descriptors 0 and 1 are pointed
at ``/dev/null``. Without the sandbox (``--sandbox off``, today's behaviour) programs run as this
worker's children: after every request all remaining descendants are killed and the worker is a
child subreaper (Linux), so double-forked or ``setsid`` programs are re-parented here; a program
can still reach this process there, which the nonce only detects.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

__all__ = ["main", "handle_request", "kill_descendants", "parse_arguments"]

SCRATCH_VARIABLE = "ALODLM_WORKER_SCRATCH"


def _become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    from .sandbox import linux

    try:
        linux.set_child_subreaper()
    except (OSError, AttributeError):
        pass


def kill_descendants(keep: int | None = None) -> None:
    """SIGKILL every process below this one (except ``keep``, the zygote, and the processes
    below it), then reap the direct children.

    Between requests the worker has no legitimate children but its zygote, so anything else
    left is a leftover of the program just scored (background processes, a fork bomb's
    remains, evalplus stragglers).
    """
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a declared dependency
        return
    for _ in range(3):  # a process forking while we kill: repeat until nothing is left
        try:
            me = psutil.Process()
            spared = set()
            if keep is not None:
                try:
                    zygote = psutil.Process(keep)
                    spared = {keep} | {child.pid for child in zygote.children(recursive=True)}
                except psutil.Error:
                    pass
            children = [c for c in me.children(recursive=True) if c.pid not in spared]
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


def parse_arguments(argv: list[str]) -> tuple[str, str]:
    """``--sandbox on|off`` and ``--rules reference|strict`` (``=`` or a separate value)."""
    from .sandboxed import RULE_SETS, SANDBOX_MODES

    values = {"--sandbox": "on", "--rules": "reference"}
    allowed = {"--sandbox": SANDBOX_MODES, "--rules": RULE_SETS}
    items = list(argv)
    while items:
        item = items.pop(0)
        name, _, value = item.partition("=")
        if name not in values:
            raise SystemExit(f"alodlm_scoring.worker: unknown argument {item!r}")
        if not _:
            value = items.pop(0) if items else ""
        if value not in allowed[name]:
            raise SystemExit(f"alodlm_scoring.worker: {name} must be one of {allowed[name]}")
        values[name] = value
    return values["--sandbox"], values["--rules"]


def handle_request(line: bytes | str, *, rules: str = "reference", sandbox=None) -> dict:
    """Score one request line; never raises (errors become an error reply)."""
    return _serve(line, rules, sandbox)[0]


def _serve(line: bytes | str, rules: str, sandbox) -> tuple[dict, bool]:
    """The reply, and whether the request may have left processes behind (not for math, which
    runs no programs, nor with the sandbox, whose runs never outlive themselves)."""
    runs_programs = sandbox is None
    nonce = None
    try:
        from .metrics import score
        from .sandboxed import SandboxFailure

        request = json.loads(line)
        nonce = request.get("nonce")
        if "groundtruth" in request:
            return {"nonce": nonce,
                    "groundtruth": _groundtruth(request["groundtruth"], sandbox)}, runs_programs
        record = request["record"]
        runs_programs = runs_programs and record.get("metric") != "math"
        try:
            correct, extracted = score(record, request["generation"], rules=rules,
                                       sandbox=sandbox)
        except SandboxFailure as failure:
            return {"nonce": nonce, "failure": "code_sandbox_failure",
                    "detail": str(failure)}, runs_programs
        return {"nonce": nonce, "verdict": [bool(correct), extracted]}, runs_programs
    except Exception as error:  # reported to the parent, which decides what is fatal
        return {
            "nonce": nonce,
            "error": traceback.format_exc(),
            "type": type(error).__name__,
            "message": str(error),
        }, runs_programs


def _groundtruth(job: dict, sandbox) -> dict:
    """A canonical solution's outputs (plain data, passed on as they are) and timings, by
    evalplus's ``trusted_exec``: in the sandbox, or, with the sandbox off, in a fresh child of
    this worker; the pool reads the reply (``sandboxed.groundtruth_values``)."""
    from . import plaindata, sandboxed

    timeout = float(job["timeout"])
    if sandbox is None:
        return _groundtruth_unsandboxed(job, timeout)
    return sandboxed.groundtruth(sandbox, program=job["program"], entry_point=job["entry_point"],
                                 inputs=plaindata.decode(job["inputs"]),
                                 output_not_none=bool(job["output_not_none"]), timeout=timeout)


def _groundtruth_unsandboxed(job: dict, timeout: float) -> dict:
    """The sandbox's ground-truth job, run in a fresh child interpreter instead."""
    import subprocess

    code = ("import json, os, sys\n"
            "from alodlm_scoring import plaindata\n"
            "from alodlm_scoring.sandbox.jobs import groundtruth_reply\n"
            "reply = os.fdopen(os.dup(1), 'w')\n"
            "os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # what the solution prints\n"
            "job = json.loads(sys.stdin.read())\n"
            "job['inputs'] = plaindata.decode(job['inputs'])\n"
            "reply.write(json.dumps(groundtruth_reply(job)))\n")
    try:
        completed = subprocess.run([sys.executable, "-c", code], input=json.dumps(job),
                                   capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the canonical solution ran longer than {timeout:g} s") from None
    try:
        return json.loads(completed.stdout)
    except ValueError:
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the canonical solution's run failed: {last}") from None


def _start_sandbox(mode: str, rules: str) -> tuple[object | None, dict]:
    """The worker's sandbox (started before any request is read) and its description."""
    if mode == "off":
        return None, {"mode": "off", "mechanisms": [], "missing": [], "error": None}
    from .sandbox import Sandbox, mechanisms
    from .sandbox.zygote import ZygoteError

    scratch = os.environ.get(SCRATCH_VARIABLE) or None
    sandbox = Sandbox(scratch=scratch)
    try:
        sandbox.start()
    except ZygoteError as error:
        if rules == "strict":
            raise SystemExit(f"strict code verdicts need the code sandbox, which could not "
                             f"start: {error}") from None
        return None, {"mode": "on", "mechanisms": [], "missing": list(mechanisms.ALL),
                      "error": str(error)}
    return sandbox, {"mode": "on", "mechanisms": list(sandbox.mechanisms),
                     "missing": list(sandbox.missing), "error": None}


def main(argv: list[str] | None = None) -> int:
    mode, rules = parse_arguments(sys.argv[1:] if argv is None else argv)
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _become_subreaper()
    from . import metrics  # noqa: F401  - import errors surface before "ready"

    sandbox, description = _start_sandbox(mode, rules)
    zygote = sandbox.pid if sandbox is not None else None
    try:
        replies.write(json.dumps({"ready": True, "sandbox": description}).encode() + b"\n")
        replies.flush()
        for line in requests:
            if not line.strip():
                continue
            reply, runs_programs = _serve(line, rules, sandbox)
            if runs_programs:
                kill_descendants(keep=zygote)
            replies.write(json.dumps(reply).encode("utf-8") + b"\n")
            replies.flush()
    except BrokenPipeError:  # the evaluator is gone (killed): nobody wants the reply
        pass
    finally:
        if sandbox is not None:
            sandbox.close()
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
