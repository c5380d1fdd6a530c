"""Expected outputs and reference timings of trusted canonical solutions (EvalPlus ground truth).

``alodlm-jax-prepare`` needs, for every EvalPlus input, the output of the benchmark's canonical
solution and how long it took. evalplus computes both with ``evalplus.gen.util.trusted_exec`` (what
its own ``get_groundtruth`` calls); this module calls that same function, but never in the calling
process: each job runs in a fresh ``python -I -m alodlm_scoring.groundtruth`` interpreter, several
at a time. The program is trusted, yet the machine is protected from it as from any program: the
process-running part is one function, :func:`run_child`, so a sandboxed child can replace it.

Protocol of the child: one JSON document on stdin, ``{"task_id", "program", "entry_point",
"inputs", "output_not_none"}`` with ``inputs`` encoded by :mod:`alodlm_scoring.plaindata` (tuples,
sets, dicts with non-string keys and complex numbers survive); one JSON document on stdout,
``{"outputs": <plaindata>, "seconds": [...]}``, or ``{"error": "<exception line>"}``. The child
moves its own stdout aside first, so a program that prints cannot corrupt the reply.

This module imports no JAX, Flax or torch; evalplus is imported only in the child.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import traceback
from typing import Any, Callable, Sequence

from . import plaindata

__all__ = ["Job", "Measured", "GroundTruthError", "measure", "run_child", "DEFAULT_TIMEOUT_SECONDS"]

# One job is one suite of one task; HumanEval+ and MBPP+ extended suites take seconds, rarely more.
DEFAULT_TIMEOUT_SECONDS = 600.0
CHILD_MODULE = "alodlm_scoring.groundtruth"


@dataclasses.dataclass(frozen=True)
class Job:
    """One suite to measure: ``program`` (prompt + canonical solution) called on each input."""

    task_id: str
    program: str
    entry_point: str
    inputs: list  # argument lists, as Python values
    output_not_none: bool = False  # MBPP+ special oracle: record only ``out is not None``


@dataclasses.dataclass(frozen=True)
class Measured:
    """The canonical solution's output for each input, and the seconds each call took."""

    outputs: list
    seconds: list


class GroundTruthError(ValueError):
    """The canonical solution of a task failed (raised, timed out, or returned unrepresentable data)."""


def _request(job: Job) -> bytes:
    return json.dumps({
        "task_id": job.task_id, "program": job.program, "entry_point": job.entry_point,
        "inputs": plaindata.encode(job.inputs), "output_not_none": bool(job.output_not_none),
    }).encode("utf-8")


def run_child(request: bytes, timeout: float) -> bytes:
    """Run one job in a fresh isolated interpreter and return its reply (the swappable part).

    Raises ``subprocess.TimeoutExpired`` when the child runs past ``timeout`` seconds (it is
    killed) and ``RuntimeError`` when it exits without a reply.
    """
    with tempfile.TemporaryDirectory(prefix="alodlm-groundtruth-") as scratch:
        completed = subprocess.run(
            [sys.executable, "-I", "-m", CHILD_MODULE], input=request, capture_output=True,
            timeout=timeout, cwd=scratch, env={**os.environ, "TMPDIR": scratch},
        )
    if not completed.stdout.strip():
        tail = completed.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(f"exit status {completed.returncode}" + (f": {tail[-1]}" if tail else ""))
    return completed.stdout


def _measure_one(job: Job, timeout: float, runner: Callable[[bytes, float], bytes]) -> Measured:
    where = f"task {job.task_id!r}: the canonical solution"
    try:
        reply = json.loads(runner(_request(job), timeout))
    except subprocess.TimeoutExpired:
        raise GroundTruthError(f"{where} ran longer than {timeout:g} s") from None
    except (RuntimeError, ValueError) as error:
        raise GroundTruthError(f"{where} could not be measured ({error})") from None
    if "error" in reply:
        raise GroundTruthError(f"{where} failed: {reply['error']}")
    try:
        outputs = plaindata.decode(reply["outputs"])
    except plaindata.Unrepresentable as error:
        raise GroundTruthError(f"{where} returned a value that is not plain data: {error}") from None
    seconds = [float(s) for s in reply["seconds"]]
    if len(outputs) != len(job.inputs) or len(seconds) != len(job.inputs):
        raise GroundTruthError(f"{where} gave {len(outputs)} outputs for {len(job.inputs)} inputs")
    return Measured(outputs=outputs, seconds=seconds)


def measure(jobs: Sequence[Job], *, workers: int | None = None,
            progress: Callable[[int], None] | None = None,
            timeout: float = DEFAULT_TIMEOUT_SECONDS,
            runner: Callable[[bytes, float], bytes] | None = None) -> list[Measured]:
    """Measure every job, ``workers`` children at a time; results in job order.

    ``progress(n)`` is called with 1 after each finished job. The first failing job (in job
    order) raises :class:`GroundTruthError` naming its task; no later job is waited for.
    """
    runner = runner or run_child
    size = max(1, min(len(jobs), workers or min(4, os.cpu_count() or 1))) if jobs else 1
    results: list[Measured | None] = [None] * len(jobs)
    with concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="groundtruth") as pool:
        futures = {pool.submit(_measure_one, job, timeout, runner): index
                   for index, job in enumerate(jobs)}
        try:
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
                if progress is not None:
                    progress(1)
        except GroundTruthError:
            for future in futures:
                future.cancel()
            raise
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# The child
# --------------------------------------------------------------------------------------------


def _child_reply(request: dict) -> dict:
    from evalplus.gen.util import trusted_exec

    inputs = plaindata.decode(request["inputs"])
    outputs, seconds = trusted_exec(request["program"], inputs, request["entry_point"],
                                    record_time=True,
                                    output_not_none=bool(request["output_not_none"]))
    return {"outputs": plaindata.encode(list(outputs)), "seconds": [float(s) for s in seconds]}


def main() -> int:
    """Child entry point: one request on stdin, one reply on the original stdout.

    The request and reply travel over private duplicates of descriptors 0 and 1, which are then
    pointed at ``/dev/null``: what the program prints or reads never touches the protocol.
    """
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        reply = _child_reply(json.loads(requests.read()))
    except BaseException as error:  # the parent names the task; here only the exception line
        reply = {"error": traceback.format_exception_only(type(error), error)[-1].strip()}
    replies.write(json.dumps(reply))
    replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
