"""Loading and validating the evaluation task file (SCORING.md §2.1, §2.2).

The checks run per line in the reference's order, so the first error reported is the one the
reference would raise; each is wrapped in :class:`TaskFileError` naming file, line and field.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from typing import Any

from .errors import TaskFileError

__all__ = ["SUPPORTED_METRICS", "CODE_METRICS", "load_tasks", "task_key", "sha256_file"]

# Kept here (not imported from .metrics) so that loading tasks never imports math-verify.
SUPPORTED_METRICS = ("arc", "mmlu", "mmlu_pro", "gpqa", "math", "exact", "python_tests", "evalplus")
CODE_METRICS = ("python_tests", "evalplus")
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


def _read_text(path: str | os.PathLike) -> str:
    data = open(path, "rb").read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise TaskFileError(f"not valid UTF-8: {error.reason}", file=os.fspath(path), line=line) from None


def _validate_record(record: Any, seen: set, where: dict) -> None:
    """Apply the §2.2 checks 1-5 to one parsed line, in the reference's order."""
    if not isinstance(record, dict):
        raise TaskFileError(
            f"each task line must be a JSON object, got {type(record).__name__}", **where
        )
    for field in _IDENTITY_FIELDS:
        if field not in record:
            raise TaskFileError("missing required field (KeyError)", field=field, **where)
    key = task_key(record)
    try:
        duplicate = key in seen
    except TypeError:  # e.g. a list as benchmark: the reference would crash with a TypeError
        raise TaskFileError(
            f"benchmark must be a hashable JSON value, got {type(key[0]).__name__}",
            field="benchmark",
            **where,
        ) from None
    if duplicate:
        raise TaskFileError(f"Duplicate benchmark and task ID {key!r}", field="id", **where)
    seen.add(key)
    metric = record["metric"]
    if metric not in SUPPORTED_METRICS:
        raise TaskFileError(f"Unsupported metric {metric!r}", field="metric", **where)
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or prompt == "":
        raise TaskFileError("Each task needs a fully formatted prompt", field="prompt", **where)
    if metric not in CODE_METRICS and not str(record.get("answer", "")).strip():
        raise TaskFileError("Each scored task needs a reference answer", field="answer", **where)


def load_tasks(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL task file and return its records in file order.

    Blank (whitespace-only) lines are skipped; every other line must be a JSON object passing
    §2.2. Line numbers in errors count every physical line, starting at 1. A file that cannot be
    opened raises the usual ``OSError``.
    """
    file = os.fspath(path)
    text = _read_text(path)
    tasks: list[dict] = []
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
    if not tasks:
        raise TaskFileError("Evaluation input is empty", file=file)
    return tasks
