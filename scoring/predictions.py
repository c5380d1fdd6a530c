"""Reading and validating ``predictions.jsonl`` files (SCORING.md §6.3, §7.1): one reader for every
command that takes predictions — the evaluate command's rescore mode, ``alodlm-jax-compare``'s
predictions level, the report and the sweep.

Each field has one rule (:data:`FIELD_RULES`); each caller says which fields it requires and which
optional ones it checks when present:

* rescoring (:func:`load_predictions`): every line is parsed (a blank line is a JSON error, as in
  the reference); ``benchmark``, ``id``, ``text``, ``generated_tokens`` and ``wall_seconds`` are
  required; keys ``(benchmark, str(id))`` are unique and equal the task set exactly; every row is
  checked before anything is written (D8). Other fields are copied verbatim, never checked;
* :data:`COMPARE_FIELDS` / :data:`REPORT_FIELDS` name what compare and the report need.

Every error is a :class:`~alodlm_scoring.errors.PredictionFileError` naming file, line and field,
with the reference's message text where the reference has one ("Invalid timing or token count in
prediction", "Duplicate prediction", "Prediction IDs must match the complete task set").

Field rules (a value of another type is refused with the rule's message): ``benchmark`` a string;
``id`` a string or a number; ``text`` a string; ``generated_tokens`` an integer >= 0 and
``wall_seconds`` a finite number > 0 (JSON booleans pass both, as in the reference); ``correct`` a
boolean; ``token_ids`` an array of integers or ``null``; ``exit_depths`` an array of integers >= 0;
``first_pass_halt_probabilities`` an array of finite numbers; ``outer_steps``,
``recurrent_passes``, ``loop_token_passes`` integers >= 0. An optional field that is ``null`` counts
as absent.

No JAX here: rescoring must not load an accelerator runtime.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from typing import Any, Callable, Iterator, Mapping, Sequence

from .errors import PredictionFileError
from .tasks import task_key, where_is
from .validation import is_number, json_type

__all__ = [
    "INVALID_TIMING_MESSAGE",
    "RESCORE_FIELDS",
    "COMPARE_FIELDS",
    "REPORT_FIELDS",
    "FieldSet",
    "FIELD_RULES",
    "read_prediction_rows",
    "check_fields",
    "index_rows",
    "check_task_set",
    "load_predictions",
]

INVALID_TIMING_MESSAGE = "Invalid timing or token count in prediction"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and value >= 0  # JSON booleans pass, as in the reference


def _is_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _is_strict_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_finite_number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def _array_of(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(item(x) for x in value)


# name -> (rule, message when the rule fails)
FIELD_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "benchmark": (lambda value: isinstance(value, str), "must be a string"),
    "id": (lambda value: isinstance(value, str) or is_number(value), "must be a string or a number"),
    "text": (lambda value: isinstance(value, str), "prediction text must be a string"),
    "generated_tokens": (_is_count, INVALID_TIMING_MESSAGE),
    "wall_seconds": (_is_seconds, INVALID_TIMING_MESSAGE),
    "correct": (lambda value: isinstance(value, bool), "must be true or false"),
    "token_ids": (_array_of(lambda t: isinstance(t, int) and not isinstance(t, bool)),
                  "must be an array of integers"),
    "exit_depths": (_array_of(_is_strict_count), "must be an array of non-negative integers"),
    "first_pass_halt_probabilities": (_array_of(_is_finite_number),
                                      "must be an array of finite numbers"),
    "outer_steps": (_is_strict_count, "must be a non-negative integer"),
    "recurrent_passes": (_is_strict_count, "must be a non-negative integer"),
    "loop_token_passes": (_is_strict_count, "must be a non-negative integer"),
}


@dataclasses.dataclass(frozen=True)
class FieldSet:
    """The fields a caller requires in every row and the optional ones it checks when present."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()


RESCORE_FIELDS = FieldSet(required=("benchmark", "id", "text", "generated_tokens",
                                    "wall_seconds"))
COMPARE_FIELDS = FieldSet(required=("benchmark", "id", "text"),
                          optional=("token_ids", "generated_tokens", "wall_seconds"))
REPORT_FIELDS = FieldSet(required=("benchmark",),
                         optional=("generated_tokens", "wall_seconds", "exit_depths",
                                   "first_pass_halt_probabilities", "outer_steps",
                                   "recurrent_passes", "loop_token_passes"))
_IDENTITY = FieldSet(required=("benchmark", "id"))


def _utf8_error(path: str, error: UnicodeDecodeError) -> PredictionFileError:
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as located:
        line = data[: located.start].count(b"\n") + 1
        return PredictionFileError(f"not valid UTF-8: {located.reason}", file=path, line=line)
    return PredictionFileError(f"not valid UTF-8: {error.reason}", file=path)  # pragma: no cover


def _parse(line: str, file: str, number: int) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise PredictionFileError(f"invalid JSON: {error}", file=file, line=number) from None
    if type(row) is not dict:
        raise PredictionFileError(
            f"each prediction line must be a JSON object, got {json_type(row)}",
            file=file, line=number)
    return row


def read_prediction_rows(path: str | os.PathLike, *, skip_blank_lines: bool = False
                         ) -> Iterator[tuple[int, dict]]:
    """``(line_number, row)`` for each line of a predictions file, streamed (rows are not kept).

    Lines are read as Python's text mode reads them (universal newlines); each must be valid
    UTF-8 and a JSON object. A blank line is a JSON error unless ``skip_blank_lines``. A file
    that cannot be opened raises the usual ``OSError``.
    """
    file = os.fspath(path)
    with open(file, encoding="utf-8", newline=None) as handle:
        try:
            for number, line in enumerate(handle, start=1):
                if skip_blank_lines and not line.strip():
                    continue
                yield number, _parse(line, file, number)
        except UnicodeDecodeError as error:
            raise _utf8_error(file, error) from None


def check_fields(row: Mapping[str, Any], fields: FieldSet, *, file: str, line: int) -> None:
    """Raise for the first field of ``fields`` that is missing (required) or breaks its rule."""
    for name in fields.required:
        if name not in row:
            raise PredictionFileError("missing required field (KeyError)", field=name, file=file,
                                      line=line)
    for names, required in ((fields.required, True), (fields.optional, False)):
        for name in names:
            value = row.get(name)
            if not required and value is None:
                continue
            rule, message = FIELD_RULES[name]
            if not rule(value):
                raise PredictionFileError(message, field=name, file=file, line=line)


def index_rows(numbered_rows: Iterator[tuple[int, dict]], *, file: str,
               fields: FieldSet = _IDENTITY) -> dict[tuple[str, str], tuple[int, dict]]:
    """``{(benchmark, str(id)): (line, row)}`` in file order; ``fields`` are checked per row (the
    identity fields at least) and a repeated key is "Duplicate prediction"."""
    rows: dict[tuple[str, str], tuple[int, dict]] = {}
    for number, row in numbered_rows:
        check_fields(row, fields, file=file, line=number)
        key = task_key(row)
        if key in rows:
            raise PredictionFileError(f"Duplicate prediction {key!r} (first on line "
                                      f"{rows[key][0]})", field="id", file=file, line=number)
        rows[key] = (number, row)
    return rows


def check_task_set(rows: Mapping[tuple, tuple[int, dict]], tasks: Sequence[Mapping[str, Any]], *,
                   file: str, extra_rows: bool = False) -> None:
    """The prediction keys must equal the task keys exactly: the first row without a task is
    named by its line, a task without a row by its task-file line. ``extra_rows``: rows without
    a task are allowed (``tasks`` is a subset, ``--limit``); every task still needs its row."""
    task_keys = [task_key(task) for task in tasks]
    if len(task_keys) == len(rows) and all(key in rows for key in task_keys):
        return
    wanted = set(task_keys)
    missing = [index for index, key in enumerate(task_keys) if key not in rows]
    extra = [] if extra_rows else [(number, key) for key, (number, _) in rows.items()
                                   if key not in wanted]
    if not missing and not extra:
        return
    message = "Prediction IDs must match the complete task set"
    counts = f"{len(missing)} task(s) without a prediction, {len(extra)} prediction(s) without a task"
    if extra:
        number, key = extra[0]
        raise PredictionFileError(f"{message}: no task has the key {key!r} ({counts})",
                                  field="id", file=file, line=number)
    where = where_is(tasks, missing[0])
    raise PredictionFileError(
        f"{message}: no prediction for task {task_keys[missing[0]]!r} of "
        f"{where['file']}:{where['line']} ({counts})", file=file)


def _rescore_row_ok(row: Mapping[str, Any]) -> bool:
    """The common case of :data:`RESCORE_FIELDS` at speed (this loop is hot when rescoring);
    :func:`check_fields` explains a failure."""
    try:
        seconds, tokens, text = row["wall_seconds"], row["generated_tokens"], row["text"]
        benchmark, identity = row["benchmark"], row["id"]
    except KeyError:
        return False
    return (
        type(text) is str and type(benchmark) is str
        and (type(identity) is str or type(identity) is int)
        and isinstance(tokens, int) and tokens >= 0
        and isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)
    )


def _lines(text: str) -> list[str]:
    """Lines as Python's text mode reads them (universal newlines), without the final empty
    string of a file that ends with a newline. ``split`` is the fast path for ``\\n`` files."""
    if "\r" in text:
        return list(io.StringIO(text, newline=None))
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def load_predictions(path: str | os.PathLike, tasks: Sequence[Mapping[str, Any]], *,
                     extra_rows: bool = False) -> list[dict]:
    """Read and validate a predictions file for rescoring; return its rows in task order.

    In the reference's order: every line parsed, identity fields present, no duplicate key, the
    key set equal to the tasks' (with ``extra_rows``, the tasks a subset of it: ``--limit``);
    then — unlike the reference, whose per-row checks are lazy — every row's ``text``,
    ``generated_tokens`` and ``wall_seconds`` of the tasks', before any output is written.
    """
    file = os.fspath(path)
    with open(file, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise PredictionFileError(f"not valid UTF-8: {error.reason}", file=file,
                                  line=line) from None
    numbered = ((number, _parse(line, file, number))
                for number, line in enumerate(_lines(text), start=1))
    rows = index_rows(numbered, file=file)
    check_task_set(rows, tasks, file=file, extra_rows=extra_rows)
    ordered = []
    for key in map(task_key, tasks):
        number, row = rows[key]
        if not _rescore_row_ok(row):
            check_fields(row, RESCORE_FIELDS, file=file, line=number)
        ordered.append(row)
    return ordered
