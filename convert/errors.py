"""The one error type of the converter.

Checkpoint problems are user-facing bad input: they must name the file and the field and, when
several things are wrong, report all of them at once so that a user fixes a checkpoint in one
round trip instead of one error per run. The message is a single line (problems joined with
``"; "``) so that command-line tools can print it as one line on stderr.
"""

from __future__ import annotations

from typing import Iterable


class CheckpointError(ValueError):
    """A checkpoint (or converted directory) that cannot be used, with every problem found."""

    def __init__(self, problems: Iterable[str] | str, *, where: str | None = None):
        if isinstance(problems, str):
            problems = [problems]
        self.problems: list[str] = list(problems)
        self.where = where
        prefix = f"invalid checkpoint {where}: " if where else ""
        count = f"{len(self.problems)} problems: " if len(self.problems) > 1 else ""
        super().__init__(prefix + count + "; ".join(self.problems))


def raise_if_problems(problems: list[str], where: str | None = None) -> None:
    """Raises one :class:`CheckpointError` carrying every collected problem, if there are any."""
    if problems:
        raise CheckpointError(problems, where=where)
