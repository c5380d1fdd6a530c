"""Exception types of the scoring package.

A bad task file must be reported as one line that says *where* the problem is (file, line number,
field) and *what* it is (the reference scorer's message text), so the command line can print it
and exit with status 2 without a traceback (SCORING.md decision D8).
"""

from __future__ import annotations

__all__ = ["TaskFileError"]


class TaskFileError(ValueError):
    """A task file could not be loaded: bad JSON, a missing field, or a failed validation.

    ``str(error)`` is one line such as
    ``tasks.jsonl:3: field 'metric': Unsupported metric 'foo'``. The parts are also available as
    attributes so callers can build their own report.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = str(file)
        self.line = line
        self.field = field
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.field is not None:
            return f"{where}: field {self.field!r}: {self.message}"
        return f"{where}: {self.message}"
