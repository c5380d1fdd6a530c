"""What a benchmark's builder makes of one source row: an :class:`Item`, before rendering.

An item carries the row's id, the variables its template renders, the task fields that follow the
prompt in the suite row (answer, options, tests, ...), and, for EvalPlus tasks, the ground-truth
jobs whose measured outputs become the ``code_tests`` suites.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from alodlm_scoring.groundtruth import Job

__all__ = ["Item", "EvalPlusTask", "BuildContext", "ItemError"]


class ItemError(ValueError):
    """A source row that cannot become a task (a gold label outside the options, say)."""


@dataclasses.dataclass(frozen=True)
class EvalPlusTask:
    """The parts of an EvalPlus ``code_tests`` object known before measuring: one job per suite."""

    dataset: str
    entry_point: str
    atol: float
    jobs: tuple[Job, ...]


@dataclasses.dataclass(frozen=True)
class Item:
    id: Any
    context: dict[str, Any]
    fields: dict[str, Any]
    evalplus: EvalPlusTask | None = None


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What builders need besides the rows: the seed (GPQA's permutations) and few-shot rows."""

    seed: int = 0
    shots: tuple[dict[str, Any], ...] = ()
    source_name: str = ""
