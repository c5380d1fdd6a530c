"""Output files of the evaluate command: prediction rows, ``summary.json`` and its protocol block.

Layout, key orders and number formatting follow SCORING.md §7 exactly (decision D4), so files
written here are byte-comparable with the reference's. Sums follow Python 3.12's built-in ``sum``
(decision D5, :func:`python312_sum`), so the files do not depend on which Python writes them.

This module is pure bookkeeping: it imports neither the scorers nor any framework. Installed
package versions are read through ``importlib.metadata`` without importing the packages.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
from typing import Any, Iterable, Mapping, Sequence

from .files import write_atomically

__all__ = [
    "GENERATE_TIMING",
    "RESCORE_TIMING",
    "RESCORE_DECODER",
    "VERSIONED_DISTRIBUTIONS",
    "prediction_row",
    "row_line",
    "python312_sum",
    "aggregate",
    "installed_versions",
    "protocol_block",
    "with_code_scoring",
    "summary_text",
    "write_summary",
    "RowWriter",
]

GENERATE_TIMING = "prompt prefill plus decoding; excludes tokenization, warmup, and scoring"
RESCORE_TIMING = "copied from supplied predictions; generation protocol not verified"
RESCORE_DECODER = "supplied-predictions"
VERSIONED_DISTRIBUTIONS = ("jax", "jaxlib", "flax", "transformers", "math-verify", "evalplus")

# A C ``long`` on Linux and macOS (LP64): integers in this range are added to a float total as
# ``float(n)`` without compensation by CPython 3.12's ``sum``.
_C_LONG_MIN = -(2**63)
_C_LONG_MAX = 2**63 - 1


# --------------------------------------------------------------------------------------------
# predictions.jsonl
# --------------------------------------------------------------------------------------------


def prediction_row(result: Mapping[str, Any], task: Mapping[str, Any], correct: bool,
                   extracted: str | None) -> dict[str, Any]:
    """One ``predictions.jsonl`` row (§7.1).

    The decoder's result (generate mode) or the supplied prediction (rescore mode) keeps its keys
    and order; ``benchmark``, ``id``, ``correct`` and ``extracted`` are overwritten in place when
    present and appended in that order otherwise — ``dict.update`` semantics, as the reference.
    """
    row = dict(result)
    row.update(benchmark=task["benchmark"], id=task["id"], correct=bool(correct), extracted=extracted)
    return row


def _default_format_encoder():
    """``json.dumps`` with default settings, minus its per-call encoder construction.

    ``json.dumps`` builds a new C encoder for every call; rescoring writes one row per task, so
    a reused encoder is a measurable share of the multiple-choice throughput. The C encoder is a
    private interface, so it is used only if it exists and reproduces ``json.dumps`` exactly on a
    probe; otherwise ``json.dumps`` itself is used.
    """
    try:
        from json import encoder as json_encoder

        make = json_encoder.c_make_encoder
        if make is None:
            return json.dumps
        encode = make(None, None, json_encoder.encode_basestring_ascii, None, ": ", ", ",
                      False, False, True)

        def dumps(value: Any) -> str:
            return "".join(encode(value, 0))

        probe = {"text": "caf\u00e9 \u2212 \"q\"\n", "id": 7, "x": [1.0, 0.1, 1e300, -0.0,
                 float("nan"), float("inf"), 2**70, True, None], "nested": {"a": []}}
        if dumps(probe) != json.dumps(probe):
            return json.dumps
        return dumps
    except Exception:  # pragma: no cover - any surprise: the public function
        return json.dumps


_dumps = _default_format_encoder()


def row_line(row: Mapping[str, Any]) -> str:
    """A row in Python's default JSON format (``", "``/``": "``, ASCII escapes) plus newline."""
    return _dumps(row) + "\n"


class RowWriter:
    """Appends prediction rows to ``predictions.jsonl``, one line per ``write`` system call.

    A fresh file is opened with exclusive create (``O_EXCL``, the reference's ``"x"`` mode);
    ``append=True`` is used only by ``--resume``, after the caller has checked and truncated the
    existing rows. With ``lazy=True`` the file is opened by the first ``write``, so a run that
    fails before its first row leaves no empty file. Rows go straight to the descriptor (no
    user-space buffer), so each row is on disk as soon as ``write`` returns — the "flush per row"
    of the reference, at lower cost.
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = False, lazy: bool = False) -> None:
        self.path = os.fspath(path)
        self._flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (0 if append else os.O_EXCL)
        self._fd = -1
        self._closed = False
        if not lazy:
            self._open()

    def _open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: write after close")
        self._fd = os.open(self.path, self._flags, 0o666)

    def write(self, row: Mapping[str, Any]) -> None:
        if self._fd < 0:
            self._open()
        data = row_line(row).encode("utf-8")
        while data:
            written = os.write(self._fd, data)
            data = data[written:]

    def close(self) -> None:
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Summation (D5)
# --------------------------------------------------------------------------------------------


def python312_sum(values: Iterable[Any]) -> int | float:
    """``sum(values)`` with CPython 3.12 semantics (SCORING.md §7.3), on any Python version.

    Integers (and booleans) are added exactly until the first float. From then on floats are added
    with Neumaier compensation, while integers that fit in a C ``long`` are added as ``float(n)``
    to the running total without touching the compensation (CPython 3.12 does exactly this; some
    later versions compensate them too). The compensation is applied once at the end, only if it is
    non-zero and finite.
    """
    iterator = iter(values)
    int_total = 0
    for item in iterator:
        if isinstance(item, int):  # bool is an int subclass: counts as 0/1
            int_total += item
            continue
        if not isinstance(item, float):
            raise TypeError(f"cannot sum a value of type {type(item).__name__}")
        return _float_phase(float(int_total) + item, iterator)
    return int_total


def _float_phase(total: float, iterator) -> float:
    compensation = 0.0
    for item in iterator:
        if isinstance(item, float):
            t = total + item
            if abs(total) >= abs(item):
                compensation += (total - t) + item
            else:
                compensation += (item - t) + total
            total = t
        elif isinstance(item, int) and _C_LONG_MIN <= item <= _C_LONG_MAX:
            total += float(item)
        elif isinstance(item, int):
            # CPython leaves the fast path for huge ints: it finishes the sum with generic
            # ``+`` (``total + c`` first, when the compensation is usable), no compensation.
            return _generic_phase(_finish(total, compensation) + item, iterator)
        else:
            raise TypeError(f"cannot sum a value of type {type(item).__name__}")
    return _finish(total, compensation)


def _generic_phase(total: float, iterator) -> float:
    for item in iterator:
        if not isinstance(item, (int, float)):
            raise TypeError(f"cannot sum a value of type {type(item).__name__}")
        total = total + item
    return total


def _finish(total: float, compensation: float) -> float:
    if compensation != 0.0 and math.isfinite(compensation):
        return total + compensation
    return total


# --------------------------------------------------------------------------------------------
# summary.json
# --------------------------------------------------------------------------------------------


def aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-benchmark and suite aggregates of prediction rows (§7.2), without the protocol block.

    Each row needs ``benchmark``, ``correct``, ``wall_seconds`` and ``generated_tokens``; rows are
    taken in task order. Keys and their order are exactly the reference's.
    """
    grouped: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["benchmark"], []).append(row)
    benchmarks: dict[Any, dict[str, Any]] = {}
    for name in sorted(grouped):
        group = grouped[name]
        examples = len(group)
        correct = sum(1 for row in group if row["correct"])
        wall = python312_sum(row["wall_seconds"] for row in group)
        if not wall > 0:
            raise ValueError(f"Evaluation timing must be positive (benchmark {name!r})")
        tokens = python312_sum(row["generated_tokens"] for row in group)
        benchmarks[name] = {
            "examples": examples,
            "correct": correct,
            "score_percent": (100 * correct) / examples,
            "wall_seconds": wall,
            "generated_tokens": tokens,
            "tokens_per_second": tokens / wall,
        }
    if not benchmarks:
        raise ValueError("Evaluation input is empty")
    values = list(benchmarks.values())
    suite_wall = python312_sum(b["wall_seconds"] for b in values)
    suite_tokens = python312_sum(b["generated_tokens"] for b in values)
    return {
        "benchmarks": benchmarks,
        "benchmark_count": len(benchmarks),
        "macro_score_percent": python312_sum(b["score_percent"] for b in values) / len(values),
        "suite_wall_seconds": suite_wall,
        "suite_tokens_per_second": suite_tokens / suite_wall,
    }


def installed_versions(distributions: Sequence[str] = VERSIONED_DISTRIBUTIONS) -> dict[str, str]:
    """Installed versions of ``distributions``, in order; missing ones are omitted (§7.4)."""
    versions: dict[str, str] = {}
    for name in distributions:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def protocol_block(
    *,
    decoder: str,
    input_sha256: str,
    decode: Mapping[str, Any] | None,
    precision: str | None,
    device: str | None,
    timing: str,
    predictions_sha256: str | None = None,
    gpu: str | None = None,
    device_kind: str | None = None,
    compile_seconds: float | None = None,
    scoring_failures: Sequence[Mapping[str, Any]] = (),
    python_version: str | None = None,
    versions: Mapping[str, str] | None = None,
    suite_manifest: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``protocol`` object (§7.4): the reference's keys in its order, then the project's.

    ``predictions_sha256`` and ``gpu`` are conditional, as in the reference: included only when
    given. ``device_kind``, ``compile_seconds`` and ``scoring_failures`` are always present;
    ``suite_manifest`` (the task file's manifest, :mod:`alodlm_scoring.manifest`) follows them
    only when the task file has one.
    """
    block: dict[str, Any] = {
        "decoder": decoder,
        "input_sha256": input_sha256,
        "decode": None if decode is None else dict(decode),
        "precision": precision,
        "device": device,
        "python": python_version if python_version is not None else platform.python_version(),
        "versions": dict(versions) if versions is not None else installed_versions(),
        "timing": timing,
        "score_unit": "percent",
    }
    if predictions_sha256 is not None:
        block["predictions_sha256"] = predictions_sha256
    if gpu is not None:
        block["gpu"] = gpu
    block["device_kind"] = device_kind
    block["compile_seconds"] = compile_seconds
    block["scoring_failures"] = [
        {"benchmark": f["benchmark"], "id": f["id"], "reason": f["reason"]} for f in scoring_failures
    ]
    if suite_manifest is not None:
        block["suite_manifest"] = dict(suite_manifest)
    return block


def with_code_scoring(block: Mapping[str, Any], *, verdicts: str,
                      sandbox: Mapping[str, Any]) -> dict[str, Any]:
    """``block`` with the code-scoring keys after ``scoring_failures`` (project keys, D10):
    ``code_verdicts`` (the rule set: ``reference`` or ``strict``) and ``code_sandbox``
    (``mode``, the ``mechanisms`` in force and those ``missing``; ``null`` lists for a suite
    without code tasks)."""
    result: dict[str, Any] = {}
    for key, value in block.items():
        if key in ("code_verdicts", "code_sandbox"):
            continue
        result[key] = value
        if key == "scoring_failures":
            result["code_verdicts"] = verdicts
            result["code_sandbox"] = dict(sandbox)
    if "code_verdicts" not in result:
        result["code_verdicts"] = verdicts
        result["code_sandbox"] = dict(sandbox)
    return result


def summary_text(summary: Mapping[str, Any]) -> str:
    """``summary.json``'s exact text: ``indent=2`` plus a trailing newline."""
    return json.dumps(summary, indent=2) + "\n"


def write_summary(path: str | os.PathLike, summary: Mapping[str, Any]) -> None:
    """Write ``summary.json`` atomically (temporary file in the same directory, then replace),
    with the umask's permissions.

    A run killed while writing therefore never leaves a half-written summary behind (D8).
    """
    write_atomically(path, summary_text(summary))
