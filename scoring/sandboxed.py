"""Code metrics' programs run through the sandbox, under the reference's or the strict rules.

The scorer (:mod:`alodlm_scoring.metrics`) decides *what* to run and validates the task; this
module runs it in a :class:`~alodlm_scoring.sandbox.Sandbox` and turns the run's end into a
verdict:

* python_tests, reference rules: ``python -I check.py`` in the sandbox's working directory;
  passes on exit status 0 within the timeout (SCORING.md §5.2);
* python_tests, strict rules: the program and the tests in two processes of one run, the
  tests calling the program remotely (:mod:`alodlm_scoring.sandbox.calls`); passes when the
  test process exits with 0 and then the program process, its channel closed, ends with 0 as
  ``check.py`` would after its tests (it can only fail here), both within the timeout;
* evalplus, reference rules: evalplus's ``untrusted_check`` inside the sandbox (job
  ``evalplus_check``), one run per suite, exactly the reference's call;
* evalplus, strict rules: the program's outputs as plain data (job ``evalplus_outputs``),
  compared here.

A run that the sandbox could not start or lost (not the program's doing) raises
:class:`SandboxFailure`: the worker reports it and the task is scored incorrect with that reason.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

from . import plaindata, strict

__all__ = ["SandboxFailure", "SANDBOX_MODES", "RULE_SETS", "python_tests",
           "time_limits", "evalplus_status", "evalplus_outputs", "groundtruth",
           "groundtruth_values", "SANDBOX_FAILURE_REASON"]

SANDBOX_FAILURE_REASON = "code_sandbox_failure"
SANDBOX_MODES = ("on", "off")  # --code_sandbox
RULE_SETS = ("reference", "strict")  # --code_verdicts
# evalplus joins its checker for min(EVALPLUS_TIMEOUT_PER_TASK=60, sum of limits) + 3 s at most;
# the run's own deadline leaves room for that and for the sandbox's start.
_EVALPLUS_CAP_SECONDS = 60.0
_EVALPLUS_SLACK_SECONDS = 10.0

class SandboxFailure(RuntimeError):
    """The sandbox could not run a program (a required mechanism failed, the host was lost)."""


def _ended(result) -> None:
    if result.status in ("setup_failed", "lost"):
        raise SandboxFailure(f"sandbox {result.status}: {result.error or 'no detail'}")


def python_tests(sandbox, program: str, tests: str, timeout: float, *, rules: str) -> bool:
    """A python_tests verdict: check.py = program + blank line + tests (SCORING.md §5.2)."""
    source = program + "\n\n" + tests + "\n"
    python = sys.executable
    if rules == "reference":
        result = sandbox.run_command([python, "-I", "check.py"], timeout=timeout,
                                     files={"check.py": source})
        _ended(result)
        return result.status == "exited" and result.code == 0
    if not strict.tests_intact(program, tests):
        return False
    from .sandbox import calls

    payload = {"tests": tests, "flags": strict.future_flags(program)}
    result = sandbox.run_job("python_tests", payload, timeout=timeout,
                             server=calls.server_command(python),
                             files={calls.PROGRAM_FILE: program})
    _ended(result)
    return result.status == "exited" and result.code == 0 and result.server_code == 0


def time_limits(reference_seconds: Sequence[float], min_time_limit: float,
                time_limit_factor: float) -> list[float]:
    """evalplus's per-input time limits: ``max(min_time_limit, factor * reference time)``."""
    return [max(min_time_limit, time_limit_factor * t) for t in reference_seconds]


def _limits_seconds(time_limits: Sequence[float]) -> float:
    return min(_EVALPLUS_CAP_SECONDS, sum(time_limits))


def evalplus_status(sandbox, *, dataset: str, program: str, inputs: list, entry_point: str,
                    expected: list, atol: float, reference_seconds: list,
                    min_time_limit: float, time_limit_factor: float) -> str:
    """evalplus ``untrusted_check``'s status (``pass``, ``fail``, ``timeout``), in the sandbox."""
    limits = time_limits(reference_seconds, min_time_limit, time_limit_factor)
    payload = {"dataset": dataset, "program": program, "inputs": inputs,
               "entry_point": entry_point, "expected": expected, "atol": atol,
               "reference_seconds": reference_seconds, "min_time_limit": min_time_limit,
               "time_limit_factor": time_limit_factor}
    result = sandbox.run_job("evalplus_check", payload,
                             timeout=_limits_seconds(limits) + _EVALPLUS_SLACK_SECONDS)
    _ended(result)
    for line in result.output.splitlines():
        try:
            status = json.loads(line).get("status")
        except (ValueError, AttributeError):
            continue
        if status in ("pass", "fail", "timeout"):
            return status
    return "fail"


def evalplus_outputs(sandbox, *, program: str, entry_point: str, inputs: list,
                     time_limits: Sequence[float]) -> list[strict.Output] | None:
    """Strict rules: the program's output for each input as plain data, in input order, or
    ``None`` when the program did not define the entry point, ran past the suite's overall
    deadline (evalplus's), or wrote anything but well-formed results."""
    payload = {"program": program, "entry_point": entry_point, "inputs": inputs,
               "time_limits": list(time_limits)}
    result = sandbox.run_job("evalplus_outputs", payload,
                             timeout=_limits_seconds(time_limits) + 3.0)
    _ended(result)
    if result.status != "exited" or result.output_truncated:
        return None
    outputs: list[strict.Output] = []
    done = False
    for line in result.output.splitlines():
        if done:
            return None  # anything after the end is not ours
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if type(record) is not dict:
            return None
        if record.get("done") is True and len(record) == 1:
            done = True
            continue
        if record.get("i") != len(outputs):
            return None
        if "out" in record:
            try:
                outputs.append((True, plaindata.decode(record["out"])))
            except plaindata.Unrepresentable:
                return None
        elif record.get("opaque") is True:
            outputs.append((True, strict.OPAQUE))
        elif record.get("error") in ("timeout", "exception"):
            outputs.append((False, record["error"]))
        else:
            return None
    return outputs if done and len(outputs) == len(inputs) else None


def groundtruth(sandbox, *, program: str, entry_point: str, inputs: list, output_not_none: bool,
                timeout: float) -> dict:
    """evalplus's ``trusted_exec`` of a canonical solution in the sandbox: the job's reply
    (``jobs.groundtruth_reply``: outputs as plain data, seconds, or an error), read by
    :func:`groundtruth_values`. Raises ``RuntimeError`` when the run gave no reply."""
    payload = {"program": program, "entry_point": entry_point, "inputs": inputs,
               "output_not_none": output_not_none}
    result = sandbox.run_job("groundtruth", payload, timeout=timeout)
    _ended(result)
    if result.status == "timeout":
        raise RuntimeError(f"the canonical solution ran longer than {timeout:g} s")
    try:
        reply = json.loads(result.output)
    except ValueError:
        raise RuntimeError(f"the canonical solution's run ended with {result.status} "
                           f"{result.code if result.code is not None else result.signal}") from None
    return reply


def groundtruth_values(reply: dict) -> tuple[list[Any], list[float]]:
    """The outputs and seconds of a ground-truth reply (``jobs.groundtruth_reply``); raises
    ``RuntimeError`` for an error reply (and ``KeyError``, ``TypeError``, ``ValueError`` or
    ``plaindata.Unrepresentable`` for a malformed one)."""
    if "error" in reply:
        raise RuntimeError(f"the canonical solution failed: {reply['error']}")
    return ([plaindata.decode(value) for value in reply["outputs"]],
            [float(seconds) for seconds in reply["seconds"]])
