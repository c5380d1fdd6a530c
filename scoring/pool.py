"""A pool of fresh-interpreter workers that score code tasks (SCORING.md §5.5, D3, D6, D10).

Each worker is ``python -m alodlm_scoring.worker`` started with ``subprocess.Popen`` of
``sys.executable`` — a new interpreter, never a fork of the evaluator, which may have JAX loaded.
Workers are long-lived (one import of the scorers per worker instead of one per task) and lead their
own session, so a worker and everything it started can be killed as one process group.

With ``sandbox="on"`` (the default) each worker runs every program in the code sandbox
(:mod:`alodlm_scoring.sandbox`) and starts with a short environment allowlist
(:func:`alodlm_scoring.sandbox.mechanisms.worker_allowlist`): tokens and keys of the evaluator's
environment never reach a worker or a program. ``rules`` selects the verdict rules
(``reference`` or ``strict``, :mod:`alodlm_scoring.strict`). :attr:`ScoringPool.code_sandbox`
describes the mechanisms in force (``protocol.code_sandbox``); missing ones are named in one
warning.

Verdicts equal sequential scoring: every task is scored by the same ``score`` function, each
program still runs in its own child, and only the scheduling differs. Results are returned as
futures; the caller writes rows in task order.

The verdict channel (a worker's stdout) is checked, not trusted: every request carries a fresh
nonce that its reply must echo, a reply must be one well-formed JSON line, and nothing may arrive
outside a request. Failure handling, per SCORING.md:

* a worker exceeding the parent-side timeout (evalplus ``30 + 70 * suites`` s, python_tests
  ``30 + timeout_seconds`` s) is killed with its process group, the task scores ``correct: false,
  extracted: null`` with reason ``"code_scoring_timeout"``, a warning goes to stderr, and a new
  worker replaces it (D3);
* a worker that dies while scoring is handled the same way with reason
  ``"code_scoring_worker_died"``; a reply that is not the worker's (garbage, a wrong nonce, a
  second reply, data between requests) with reason ``"code_scoring_protocol_error"``; a program
  the sandbox could not run with ``"code_sandbox_failure"`` (a fresh worker gets a fresh
  sandbox);
* an exception inside the worker (a failed grader self-check, a validation error of a task that
  reached scoring unvalidated) is fatal: ``RuntimeError`` "Isolated code scoring failed: " + the
  worker's traceback;
* ``EVALPLUS_TIMEOUT_PER_TASK`` is removed from the workers' environment with one warning (D3).

The pool can also score math (rescore mode, for throughput): a worker scores on its own main
thread, where math-verify's ``SIGALRM`` timeouts work; its validation errors are re-raised with
their own type, as in-process scoring raises them.

One worker's process and its checked channel: :mod:`alodlm_scoring.worker_process`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable, Mapping, TextIO

from .sandboxed import RULE_SETS, SANDBOX_FAILURE_REASON, SANDBOX_MODES
from .tasks import CODE_METRICS
from .worker_process import (ProtocolViolation, WorkerDied, WorkerError, WorkerProcess,
                             WorkerTimeout)

__all__ = [
    "Outcome",
    "ScoringPool",
    "WorkerError",
    "parent_timeout",
    "score_isolated",
    "worker_environment",
    "TIMEOUT_REASON",
    "DIED_REASON",
    "PROTOCOL_REASON",
    "SANDBOX_MODES",
    "RULE_SETS",
]

TIMEOUT_REASON = "code_scoring_timeout"
DIED_REASON = "code_scoring_worker_died"
PROTOCOL_REASON = "code_scoring_protocol_error"
NON_CODE_TIMEOUT_REASON = "scoring_timeout"
# Non-code tasks sent to the pool (math, when rescoring in parallel): math-verify bounds each
# parse and comparison with 5 s alarms, so a minute means the worker is stuck.
NON_CODE_TIMEOUT_SECONDS = 60.0
# Exceptions of non-code scoring re-raised with their own type (they are the reference's
# validation errors, raised in-process by the reference), not wrapped as isolated-code failures.
_RERAISED = {"ValueError": ValueError, "KeyError": KeyError, "TypeError": TypeError}
EVALPLUS_TIMEOUT_VARIABLE = "EVALPLUS_TIMEOUT_PER_TASK"
EVALPLUS_TIMEOUT_WARNING = (
    "warning: {name}={value!r} ignored: evalplus 0.3.1 cannot read it; its default 60 s cap applies"
)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A scored task: the verdict, and the D3 reason when it was scored incorrect by force."""

    correct: bool
    extracted: str | None
    failure: str | None = None



def parent_timeout(record: Mapping[str, Any]) -> float:
    """Parent-side timeout of one code task: evalplus ``30 + 70 * suites``; python_tests
    ``30 + timeout_seconds`` (default 10).

    Malformed values fall back to the defaults; the worker then reports the validation error.
    Non-code tasks (math scored in the pool) get ``NON_CODE_TIMEOUT_SECONDS``.
    """
    if record.get("metric") not in CODE_METRICS:
        return NON_CODE_TIMEOUT_SECONDS
    if record.get("metric") == "evalplus":
        try:
            suites = len(record["code_tests"]["suites"])
        except (KeyError, TypeError):
            suites = 1
        return 30.0 + 70.0 * max(suites, 1)
    try:
        seconds = float(record.get("timeout_seconds", 10))
    except (TypeError, ValueError):
        seconds = 10.0
    if not math.isfinite(seconds) or seconds <= 0:
        seconds = 10.0
    return 30.0 + seconds


def worker_environment(environ: Mapping[str, str] | None = None,
                       stderr: TextIO | None = None) -> dict[str, str]:
    """The workers' environment: ``environ`` without ``EVALPLUS_TIMEOUT_PER_TASK`` (D3).

    Prints the one start-up warning when the variable was set.
    """
    env = dict(os.environ if environ is None else environ)
    value = env.pop(EVALPLUS_TIMEOUT_VARIABLE, None)
    if value is not None:
        print(EVALPLUS_TIMEOUT_WARNING.format(name=EVALPLUS_TIMEOUT_VARIABLE, value=value),
              file=stderr or sys.stderr, flush=True)
    return env



class ScoringPool:
    """Scores tasks in ``workers`` fresh-interpreter workers; ``submit`` returns a future.

    Workers start lazily, on the first submission. Use as a context manager (or call ``close``) so
    that no worker outlives the evaluation. ``sandbox`` (``on``/``off``) and ``rules``
    (``reference``/``strict``) configure how the workers run and judge programs.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        sandbox: str = "on",
        rules: str = "reference",
        environ: Mapping[str, str] | None = None,
        stderr: TextIO | None = None,
        timeout_for: Callable[[Mapping[str, Any]], float] | None = None,
    ) -> None:
        size = (os.cpu_count() or 1) if workers is None else int(workers)
        if size < 1:
            raise ValueError("The number of scoring workers must be at least 1")
        if sandbox not in SANDBOX_MODES:
            raise ValueError(f"--code_sandbox must be on or off, got {sandbox!r}")
        if rules not in RULE_SETS:
            raise ValueError(f"--code_verdicts must be reference or strict, got {rules!r}")
        if rules == "strict" and sandbox == "off":
            raise ValueError("--code_verdicts=strict needs the code sandbox (--code_sandbox=on)")
        self.size = size
        self.sandbox_mode = sandbox
        self.rules = rules
        self._stderr = stderr
        env = worker_environment(environ, stderr)
        if sandbox == "on":
            from .sandbox.mechanisms import worker_allowlist

            env = worker_allowlist(env)
        self._env = env
        self._arguments = ("--sandbox", sandbox, "--rules", rules)
        self._timeout_for = timeout_for
        self._scratch = None
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: set[WorkerProcess] = set()
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._sandbox_description: dict | None = None

    # -- public API ----------------------------------------------------------------------------

    @property
    def code_sandbox(self) -> dict:
        """``protocol.code_sandbox``: the mode, the mechanisms in force and those missing (with
        the sandbox off: none in force, ``missing`` null). Starts a worker to find out when no
        task has started one yet, so the description never depends on the suite."""
        if self.sandbox_mode == "off":
            return {"mode": "off", "mechanisms": [], "missing": None}
        if self._sandbox_description is None:
            if self._scratch is None:
                self._scratch = tempfile.mkdtemp(prefix="alodlm-scoring-")
            worker = WorkerProcess(self._scratch, self._env, self._arguments)
            try:
                worker._await_ready()
                self._describe(worker)
            finally:
                worker.close()
        described = self._sandbox_description or {}
        return {"mode": self.sandbox_mode, "mechanisms": described.get("mechanisms"),
                "missing": described.get("missing")}

    @property
    def unused_code_sandbox(self) -> dict:
        """``protocol.code_sandbox`` of a suite without code tasks: the mode, no mechanisms
        looked for (``null``)."""
        if self.sandbox_mode == "off":
            return self.code_sandbox
        return {"mode": self.sandbox_mode, "mechanisms": None, "missing": None}

    def submit(self, record: Mapping[str, Any], generation: str) -> concurrent.futures.Future:
        """Queue one task; the future yields an :class:`Outcome` or raises ``WorkerError``."""
        return self._running_executor().submit(self._score, record, generation)

    def score(self, record: Mapping[str, Any], generation: str) -> Outcome:
        """Score one task and wait for it."""
        return self.submit(record, generation).result()

    def submit_groundtruth(self, name: str, *, program: str, entry_point: str, inputs: list,
                           output_not_none: bool, timeout: float) -> concurrent.futures.Future:
        """Run a trusted canonical solution (evalplus's ``trusted_exec``) in a worker's sandbox;
        the future yields ``(outputs, seconds)`` or raises ``RuntimeError`` naming ``name``."""
        from . import plaindata

        job = {"program": program, "entry_point": entry_point,
               "inputs": plaindata.encode(inputs), "output_not_none": output_not_none,
               "timeout": timeout}
        return self._running_executor().submit(self._groundtruth, name, job)

    def close(self, *, kill: bool = False) -> None:
        """Stop every worker and remove the scratch directory.

        Idle workers exit on end of input; with ``kill`` (used when the evaluation failed) busy
        workers are killed at once instead of being waited for.
        """
        if self._closed:
            return
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            workers, self._workers = list(self._workers), set()
        for worker in workers:
            if kill:
                worker.kill()
            else:
                worker.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> "ScoringPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(kill=exc_type is not None)

    # -- internals -----------------------------------------------------------------------------

    def _running_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._closed:
            raise RuntimeError("the scoring pool is closed")
        if self._executor is None:
            self._start()
        return self._executor

    def _start(self) -> None:
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="alodlm-scoring-")
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.size, thread_name_prefix="alodlm-scoring"
        )
        for _ in range(self.size):
            self._idle.put(self._new_worker())

    def _new_worker(self) -> WorkerProcess:
        worker = WorkerProcess(self._scratch, self._env, self._arguments)
        with self._lock:
            self._workers.add(worker)
        return worker

    def _retire(self, worker: WorkerProcess) -> None:
        with self._lock:
            self._workers.discard(worker)
        worker.kill()

    def _warn(self, text: str) -> None:
        print(f"warning: {text}", file=self._stderr or sys.stderr, flush=True)

    def _describe(self, worker: WorkerProcess) -> None:
        """Keep the first worker's sandbox description; warn once about what is missing."""
        with self._lock:
            if self._sandbox_description is not None or worker.sandbox is None:
                return
            self._sandbox_description = worker.sandbox
        missing = worker.sandbox.get("missing") or []
        if worker.sandbox.get("error"):
            self._warn(f"the code sandbox could not start ({worker.sandbox['error']}); "
                       "generated code runs without containment")
        elif missing:
            self._warn("the code sandbox runs without " + ", ".join(missing)
                       + " (not allowed on this machine); see docs/scoring.md")

    def _score(self, record: Mapping[str, Any], generation: str) -> Outcome:
        worker = self._idle.get()
        replacement = worker
        try:
            if worker._ready and worker._stray_data():
                self._retire(worker)
                self._warn("a scoring worker's channel carried data between requests; "
                           "the worker was replaced")
                worker = replacement = self._new_worker()
            timeout_for = self._timeout_for or parent_timeout
            timeout = timeout_for(record)
            try:
                reply = worker.request({"record": record, "generation": generation}, timeout)
            except WorkerTimeout:
                reason = TIMEOUT_REASON if is_code_task(record) else NON_CODE_TIMEOUT_REASON
                detail = f"exceeded the parent-side timeout of {timeout:g} s"
            except WorkerDied:
                reason = DIED_REASON
                try:
                    status = worker.process.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    status = None
                detail = f"ended its scoring worker (exit status {status})"
            except ProtocolViolation as error:
                reason = PROTOCOL_REASON
                detail = f"received {error} on the verdict channel"
            else:
                self._describe(worker)
                outcome = self._outcome(record, reply)
                if outcome is not None and outcome.failure is None:
                    return outcome
                if outcome is not None:  # the sandbox failed: a fresh worker gets a fresh one
                    reason = outcome.failure
                    detail = f"could not be run: {reply.get('detail')}"
                else:
                    reason = PROTOCOL_REASON
                    detail = "received a malformed verdict on the verdict channel"
            self._retire(worker)
            if self._closed:
                replacement = None
                return Outcome(False, None, reason)
            replacement = self._new_worker()
            self._warn(f"code scoring of benchmark {record.get('benchmark')!r} id "
                       f"{record.get('id')!r} {detail}; scored incorrect ({reason})")
            return Outcome(False, None, reason)
        finally:
            if replacement is not None:
                self._idle.put(replacement)

    def _groundtruth(self, name: str, job: dict) -> tuple[list, list[float]]:
        from . import plaindata, sandboxed

        worker = self._idle.get()
        replacement = worker
        try:
            try:
                reply = worker.request({"groundtruth": job}, job["timeout"] + 30.0)
            except (WorkerTimeout, WorkerDied, ProtocolViolation) as error:
                self._retire(worker)
                replacement = None if self._closed else self._new_worker()
                raise RuntimeError(f"{name}: the scoring worker failed while measuring the "
                                   f"canonical solution ({type(error).__name__.strip('_')})") from None
            self._describe(worker)
            if "error" in reply:
                raise RuntimeError(f"{name}: {reply.get('message')}")
            try:
                return sandboxed.groundtruth_values(reply.get("groundtruth") or {})
            except RuntimeError as error:
                raise RuntimeError(f"{name}: {error}") from None
            except (KeyError, TypeError, ValueError, plaindata.Unrepresentable):
                raise RuntimeError(f"{name}: a malformed ground-truth reply") from None
        finally:
            if replacement is not None:
                self._idle.put(replacement)

    @staticmethod
    def _outcome(record: Mapping[str, Any], reply: dict) -> Outcome | None:
        """The reply as an outcome; ``None`` when it is not a well-formed reply. Raises the
        worker's exception (fatal) for an error reply."""
        if "error" in reply:
            error_type = _RERAISED.get(reply.get("type"))
            if error_type is not None and not is_code_task(record):
                raise error_type(reply.get("message"))
            raise WorkerError(str(reply["error"]), reply.get("type"), reply.get("message"))
        if reply.get("failure") == SANDBOX_FAILURE_REASON:
            return Outcome(False, None, SANDBOX_FAILURE_REASON)
        verdict = reply.get("verdict")
        if (type(verdict) is list and len(verdict) == 2 and type(verdict[0]) is bool
                and (verdict[1] is None or type(verdict[1]) is str)):
            return Outcome(verdict[0], verdict[1])
        return None


def is_code_task(record: Mapping[str, Any]) -> bool:
    return record.get("metric") in CODE_METRICS


def score_isolated(record: Mapping[str, Any], generation: str, *, sandbox: str = "on",
                   rules: str = "reference") -> tuple[bool, str | None]:
    """Score one task in a fresh interpreter and return ``(correct, extracted)``.

    The single-task counterpart of the reference's isolated scorer (SCORING.md §10.1 rows 20/21).
    A D3 timeout returns ``(False, None)``; a worker exception raises :class:`WorkerError`.
    """
    with ScoringPool(1, sandbox=sandbox, rules=rules) as pool:
        outcome = pool.score(record, generation)
    return outcome.correct, outcome.extracted
