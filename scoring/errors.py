"""Exception types of the scoring package.

A bad input file must be reported as one line that says *where* the problem is (file, line number,
field) and *what* it is (the reference scorer's message text), so the command line can print it
and exit with status 2 without a traceback (SCORING.md decisions D8, D9).
"""

from __future__ import annotations

__all__ = ["InputFileError", "TaskFileError", "PredictionFileError"]


class InputFileError(ValueError):
    """Bad user input, located: ``str(error)`` is one line such as
    ``tasks.jsonl:3: field 'metric': Unsupported metric 'foo'``.

    Every part is optional (a problem may concern a whole file, or a field of no file); the parts
    are also available as attributes so callers can build their own report.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = None if file is None else str(file)
        self.line = line
        self.field = field
        super().__init__(self._format())

    def _format(self) -> str:
        where = ""
        if self.file is not None:
            where = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.field is not None:
            where = f"{where}: field {self.field!r}" if where else f"field {self.field!r}"
        return f"{where}: {self.message}" if where else self.message


class TaskFileError(InputFileError):
    """A task file could not be loaded: bad JSON, a missing field, a wrong JSON type, or a failed
    check of §2.2 / §2.3 (or a prompt the model cannot decode)."""

    def __init__(self, message: str, *, file: str, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message, file=file, line=line, field=field)


class PredictionFileError(InputFileError):
    """A predictions file (``predictions.jsonl``) could not be read: bad JSON, a missing or
    mistyped field, a duplicate row, or rows that do not match the tasks."""

    def __init__(self, message: str, *, file: str, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message, file=file, line=line, field=field)
