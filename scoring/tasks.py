"""Loading and validating the evaluation task file (SCORING.md §2.1-§2.3, decisions D8, D9).

Per line: the §2.2 checks in the reference's order (so the first error reported is the one the
reference would raise), with the JSON types of ``benchmark`` and ``id`` checked right after the
identity fields exist; then every check scoring would make on the task
(:func:`alodlm_scoring.validation.check_task`: gold label, ``tests``/``timeout_seconds``, every
evalplus suite, the other fields' JSON types). Each failure is a :class:`TaskFileError` naming
file, line and field. The records come back as a :class:`TaskList`, which remembers each task's
line so that later checks (generate mode's prompt checks) can name it too.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from typing import Any, Iterable

from . import validation
from .errors import TaskFileError
from .validation import CODE_METRICS

__all__ = ["SUPPORTED_METRICS", "CODE_METRICS", "TaskList", "load_tasks", "task_key", "where_is",
           "sha256_file", "first_of_each_benchmark", "subset_record"]

# Kept here (not imported from .metrics) so that loading tasks never imports math-verify.
SUPPORTED_METRICS = ("arc", "mmlu", "mmlu_pro", "gpqa", "math", "exact", "python_tests", "evalplus")
_IDENTITY_FIELDS = ("benchmark", "id", "metric")
_HASH_BLOCK_BYTES = 1 << 20


def task_key(record: dict) -> tuple[Any, str]:
    """The uniqueness key ``(benchmark, str(id))``: the ids ``1`` and ``"1"`` collide."""
    return (record["benchmark"], str(record["id"]))


def sha256_file(path: str | os.PathLike) -> str:
    """Lowercase hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_HASH_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


class TaskList(list):
    """The task records in file order (a plain ``list`` of dicts), plus where each came from:
    ``file`` and ``lines[i]``, the 1-based line of ``self[i]``."""

    def __init__(self, records: Iterable[dict] = (), *, file: str = "<tasks>",
                 lines: Iterable[int] | None = None) -> None:
        super().__init__(records)
        self.file = file
        self.lines = list(range(1, len(self) + 1)) if lines is None else list(lines)

    def where(self, index: int) -> dict:
        """``{"file": ..., "line": ...}`` of task ``index``, for :class:`TaskFileError`."""
        return {"file": self.file, "line": self.lines[index]}


def where_is(tasks: Any, index: int) -> dict:
    """:meth:`TaskList.where` for any task sequence (a plain list names no file: line = index + 1)."""
    if isinstance(tasks, TaskList):
        return tasks.where(index)
    return {"file": "<tasks>", "line": index + 1}


def _read_text(path: str | os.PathLike) -> str:
    data = open(path, "rb").read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise TaskFileError(f"not valid UTF-8: {error.reason}", file=os.fspath(path), line=line) from None


def _reporter(where: dict) -> validation.Report:
    def report(field: str, error: BaseException):
        raise TaskFileError(validation.error_text(error), field=field, **where) from None

    return report


def _validate_record(record: Any, seen: set, where: dict) -> None:
    """Apply the §2.2 checks 1-5 to one parsed line, in the reference's order, then every check
    scoring would make (D9)."""
    if not isinstance(record, dict):
        raise TaskFileError(
            f"each task line must be a JSON object, got {validation.json_type(record)}", **where
        )
    for field in _IDENTITY_FIELDS:
        if field not in record:
            raise TaskFileError("missing required field (KeyError)", field=field, **where)
    report = _reporter(where)
    validation.check_identity_types(record, report)
    key = task_key(record)
    if key in seen:
        raise TaskFileError(f"Duplicate benchmark and task ID {key!r}", field="id", **where)
    seen.add(key)
    metric = record["metric"]
    if metric not in SUPPORTED_METRICS:
        raise TaskFileError(f"Unsupported metric {metric!r}", field="metric", **where)
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or prompt == "":
        raise TaskFileError("Each task needs a fully formatted prompt", field="prompt", **where)
    if metric not in CODE_METRICS and not validation.reference_answer(record):
        raise TaskFileError("Each scored task needs a reference answer", field="answer", **where)
    validation.check_task(record, report)


def load_tasks(path: str | os.PathLike) -> TaskList:
    """Read a JSONL task file and return its records in file order.

    Blank (whitespace-only) lines are skipped; every other line must be a JSON object passing
    §2.2 and every check of §2.3 (module docstring). Line numbers in errors count every physical
    line, starting at 1. A file that cannot be opened raises the usual ``OSError``.
    """
    file = os.fspath(path)
    text = _read_text(path)
    tasks: list[dict] = []
    lines: list[int] = []
    seen: set = set()
    for line_number, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():
            continue
        where = {"file": file, "line": line_number}
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskFileError(f"invalid JSON: {error}", **where) from None
        _validate_record(record, seen, where)
        tasks.append(record)
        lines.append(line_number)
    if not tasks:
        raise TaskFileError("Evaluation input is empty", file=file)
    return TaskList(tasks, file=file, lines=lines)


def first_of_each_benchmark(tasks: TaskList, limit: int) -> TaskList:
    """The first ``limit`` tasks of each benchmark, in file order (as lm-eval's ``--limit``): a
    :class:`TaskList` that still names each task's line of the file."""
    if limit < 1:
        raise ValueError("--limit must be at least 1")
    kept: list[int] = []
    counts: dict[Any, int] = {}
    for index, task in enumerate(tasks):
        benchmark = json.dumps(task["benchmark"])
        if counts.get(benchmark, 0) < limit:
            counts[benchmark] = counts.get(benchmark, 0) + 1
            kept.append(index)
    lines = [where_is(tasks, index)["line"] for index in kept]
    return TaskList((tasks[index] for index in kept), file=getattr(tasks, "file", "<tasks>"),
                    lines=lines)


def subset_record(limit: int, kept: int, total: int) -> dict:
    """The summary's record of a run on a subset (``protocol.subset``): the limit per benchmark,
    how many tasks ran and how many the file holds."""
    return {"limit_per_benchmark": int(limit), "tasks": int(kept), "tasks_in_file": int(total)}
