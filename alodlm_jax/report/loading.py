"""Reading an evaluation output directory (SCORING.md §7) for the report.

The report never trusts a directory blindly: ``summary.json`` must have the §7.2 shape, and
``predictions.jsonl`` is read with the evaluate command's reader (``alodlm_scoring.predictions``).
Problems are :class:`ReportInputError` / ``PredictionFileError`` (both ``ValueError``) whose
message names the file, the line and the field, so the command can print one line and exit 2.
Prediction rows are streamed, never held all at once: a full suite with 4096-token generations
would otherwise cost gigabytes for the per-token lists.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterator, Mapping

from alodlm_scoring.errors import InputFileError
from alodlm_scoring.predictions import read_prediction_rows

__all__ = [
    "SUMMARY_FILE",
    "PREDICTIONS_FILE",
    "ReportInputError",
    "read_summary",
    "iter_prediction_rows",
    "predictions_path",
]

SUMMARY_FILE = "summary.json"
PREDICTIONS_FILE = "predictions.jsonl"
_BENCHMARK_KEYS = ("examples", "correct", "score_percent", "wall_seconds", "generated_tokens",
                   "tokens_per_second")
_SUITE_KEYS = ("benchmark_count", "macro_score_percent", "suite_wall_seconds",
               "suite_tokens_per_second")


class ReportInputError(InputFileError):
    """A malformed or missing evaluation output; the message names file, line and field."""

    def __init__(self, message: str, *, file: str, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message, file=file, line=line, field=field)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_summary(directory: str | os.PathLike) -> dict[str, Any]:
    """``summary.json`` of an evaluation directory, checked for the §7.2 keys the report uses."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ReportInputError("not a directory (expected an evaluation output directory)",
                               file=directory)
    path = os.path.join(directory, SUMMARY_FILE)
    if not os.path.exists(path):
        partial = os.path.exists(os.path.join(directory, PREDICTIONS_FILE))
        hint = ("the run is unfinished; complete it with alodlm-jax-evaluate --resume"
                if partial else "is this an evaluation output directory?")
        raise ReportInputError(f"no {SUMMARY_FILE} ({hint})", file=path)
    try:
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
    except json.JSONDecodeError as error:
        raise ReportInputError(f"invalid JSON: {error.msg}", file=path, line=error.lineno) from None
    except UnicodeDecodeError as error:
        raise ReportInputError(f"not valid UTF-8: {error.reason}", file=path) from None
    if not isinstance(summary, dict):
        raise ReportInputError("summary must be a JSON object", file=path)
    benchmarks = summary.get("benchmarks")
    if not isinstance(benchmarks, dict):
        raise ReportInputError("missing or not an object", file=path, field="benchmarks")
    for name, values in benchmarks.items():
        if not isinstance(values, dict):
            raise ReportInputError("not an object", file=path, field=f"benchmarks.{name}")
        for key in _BENCHMARK_KEYS:
            if not _is_number(values.get(key)):
                raise ReportInputError("missing or not a finite number", file=path,
                                       field=f"benchmarks.{name}.{key}")
    for key in _SUITE_KEYS:
        if not _is_number(summary.get(key)):
            raise ReportInputError("missing or not a finite number", file=path, field=key)
    protocol = summary.get("protocol")
    if protocol is not None and not isinstance(protocol, dict):
        raise ReportInputError("not an object", file=path, field="protocol")
    return summary


def iter_prediction_rows(directory: str | os.PathLike) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(line_number, row)`` for each line of ``predictions.jsonl``; nothing if the file is absent.

    Read with the evaluate command's own reader (``alodlm_scoring.predictions``): every line must
    be a JSON object (a blank line is an error); the fields are checked by the consumer
    (:class:`~alodlm_jax.report.stats.StatsAccumulator`).
    """
    path = predictions_path(directory)
    if not os.path.exists(path):
        return
    yield from read_prediction_rows(path)


def predictions_path(directory: str | os.PathLike) -> str:
    return os.path.join(os.fspath(directory), PREDICTIONS_FILE)
