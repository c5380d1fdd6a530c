"""The run record (``run.json``): what a resumed run must share with the run it continues.

A run writes its record into the output directory when its work starts, before the first row:

* ``bound``: every setting that can change a row, keyed by the flag a user sets it with
  (``--q``, ``--input`` as the task file's SHA-256, ``--model`` as the resolved directory and
  ``--model files`` as each weight and config file's digest, ...). ``--resume`` compares them with
  the new command's before any work and refuses the first that differs, in one line naming the
  flag, its recorded and its new value;
* ``parts``: one entry per start of the run, the row it started at and the settings that change
  no row and may differ between parts (engine, batch size, mesh). When the parts that wrote rows
  differ in them, the summary's protocol lists them (``protocol.parts``), so it never claims one
  setting for rows another one wrote.

The summary's protocol is written at the end, so it cannot be this record: a run killed before its
end has rows and a record, no summary.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from .files import write_atomically

__all__ = ["RECORD_FILE", "RunSettings", "ResumeMismatch", "check", "begin", "discard",
           "protocol_parts", "file_digest"]

RECORD_FILE = "run.json"
FORMAT = "alodlm-jax-run/1"


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """``bound``: flag -> JSON value that must not change on resume (``None``: not given);
    ``free``: protocol key -> JSON value that may (recorded per part)."""

    bound: Mapping[str, Any]
    free: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class ResumeMismatch(ValueError):
    """``--resume`` with a setting that differs from the run's record (one line)."""


def file_digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file's bytes."""
    from .tasks import sha256_file

    return "sha256:" + sha256_file(path)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _show(value: Any) -> str:
    if value is None:
        return "(not given)"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _difference(flag: str, recorded: Any, new: Any) -> str:
    """``FLAG was X when the run started, now Y``; for a mapping, its first differing entry."""
    if isinstance(recorded, dict) and isinstance(new, dict):
        for key in sorted(set(recorded) | set(new)):
            if _canonical(recorded.get(key)) != _canonical(new.get(key)):
                return (f"{flag}: {key} was {_show(recorded.get(key))} when the run started, "
                        f"now {_show(new.get(key))}")
    return f"{flag} was {_show(recorded)} when the run started, now {_show(new)}"


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot resume: {path}: unreadable run record ({error})") from None
    if (not isinstance(record, dict) or record.get("format") != FORMAT
            or not isinstance(record.get("bound"), dict) or not isinstance(record.get("parts"), list)):
        raise ValueError(f"cannot resume: {path}: not a run record of this version "
                         f"(format {FORMAT!r} expected)")
    return record


def check(path: str | os.PathLike, settings: RunSettings, *, has_rows: bool) -> dict | None:
    """Before any work of a ``--resume``: the record a run with rows left at ``path`` must bind
    the same value to every flag of ``settings.bound``; returns it (``None`` when there are no
    rows to continue, whatever the record says). Raises :class:`ResumeMismatch` naming the first
    flag that differs, and ``ValueError`` when rows have no record to check them against."""
    path = os.fspath(path)
    if not has_rows:
        return None
    if not os.path.exists(path):
        raise ValueError(f"cannot resume {os.path.dirname(path) or '.'}: it holds rows but no "
                         f"{os.path.basename(path)} to show they were written with this command's "
                         "settings; start a fresh --output")
    record = _read(path)
    for flag, value in settings.bound.items():
        if flag not in record["bound"]:
            message = f"{flag} was not recorded when the run started, now {_show(value)}"
        elif _canonical(record["bound"][flag]) != _canonical(value):
            message = _difference(flag, record["bound"][flag], value)
        else:
            continue
        raise ResumeMismatch(f"cannot resume {os.path.dirname(path) or '.'}: {message} "
                             f"({os.path.basename(path)}); resume with the recorded value, or "
                             "start a fresh --output")
    return record


def begin(path: str | os.PathLike, settings: RunSettings, previous: Mapping[str, Any] | None,
          first_row: int) -> bool:
    """Write the record as the run's work starts: ``previous`` (from :func:`check`) with a new
    part from ``first_row``, or a new record. Returns whether the file did not exist before (so a
    run that fails before its first row can :func:`discard` it)."""
    path = os.fspath(path)
    created = not os.path.exists(path)
    parts = list(previous["parts"]) if previous is not None else []
    parts.append({"first_row": int(first_row), **dict(settings.free)})
    record = {"format": FORMAT, "bound": dict(settings.bound), "parts": parts}
    write_atomically(path, json.dumps(record, indent=2) + "\n")
    return created


def discard(path: str | os.PathLike) -> None:
    """Remove a record :func:`begin` created, when its run wrote nothing."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def protocol_parts(path: str | os.PathLike, total_rows: int) -> list[dict] | None:
    """``protocol.parts``: the row ranges ``[first, end)`` of the parts that wrote rows, each with
    its free settings, when those differ between them; ``None`` when every row was written with
    the same ones (a run resumed with the same command has the protocol of an uninterrupted one)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        return None
    parts = _read(path)["parts"]
    spans: list[dict] = []
    for index, part in enumerate(parts):
        first = part["first_row"]
        end = parts[index + 1]["first_row"] if index + 1 < len(parts) else total_rows
        if end > first:
            free = {key: value for key, value in part.items() if key != "first_row"}
            spans.append({"rows": [first, end], **free})
    settings = {_canonical({k: v for k, v in span.items() if k != "rows"}) for span in spans}
    return spans if len(settings) > 1 else None

