"""Expected outputs and reference timings of trusted canonical solutions (EvalPlus ground truth).

``alodlm-jax-prepare`` needs, for every EvalPlus input, the output of the benchmark's canonical
solution and how long it took. evalplus computes both with ``evalplus.gen.util.trusted_exec`` (what
its own ``get_groundtruth`` calls); this module calls that same function, but never in the calling
process: each job goes to the scoring pool (:class:`alodlm_scoring.pool.ScoringPool`) and runs
in a worker's code sandbox, the same one generated code runs in (the program is trusted, yet the
machine is protected from it as from any program), several at a time. Inputs and outputs travel as
:mod:`alodlm_scoring.plaindata` (tuples, sets, dicts with non-string keys and complex numbers
survive).

This module imports no JAX, Flax or torch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Callable, Sequence

__all__ = ["Job", "Measured", "GroundTruthError", "measure", "DEFAULT_TIMEOUT_SECONDS"]

# One job is one suite of one task; HumanEval+ and MBPP+ extended suites take seconds, rarely more.
DEFAULT_TIMEOUT_SECONDS = 600.0


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


def measure(jobs: Sequence[Job], *, workers: int | None = None,
            progress: Callable[[int], None] | None = None,
            timeout: float = DEFAULT_TIMEOUT_SECONDS, sandbox: str = "on") -> list[Measured]:
    """Measure every job, ``workers`` sandboxed workers at a time; results in job order.

    ``progress(n)`` is called with 1 after each finished job. The first job found failing
    raises :class:`GroundTruthError` naming its task; the pool is stopped, nothing more is
    waited for.
    """
    from .pool import ScoringPool

    if not jobs:
        return []
    size = max(1, min(len(jobs), workers or min(4, os.cpu_count() or 1)))
    results: list[Measured | None] = [None] * len(jobs)
    with ScoringPool(size, sandbox=sandbox) as pool:
        futures = {pool.submit_groundtruth(f"task {job.task_id!r}", program=job.program,
                                           entry_point=job.entry_point, inputs=job.inputs,
                                           output_not_none=job.output_not_none,
                                           timeout=timeout): index
                   for index, job in enumerate(jobs)}
        for future in concurrent.futures.as_completed(futures):
            job = jobs[futures[future]]
            try:
                outputs, seconds = future.result()
            except RuntimeError as error:
                raise GroundTruthError(str(error)) from None
            if len(outputs) != len(job.inputs) or len(seconds) != len(job.inputs):
                raise GroundTruthError(f"task {job.task_id!r}: the canonical solution gave "
                                       f"{len(outputs)} outputs for {len(job.inputs)} inputs")
            results[futures[future]] = Measured(outputs=outputs, seconds=seconds)
            if progress is not None:
                progress(1)
    return results  # type: ignore[return-value]
