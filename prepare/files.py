"""Writing files so that a reader never sees half of one: a temporary file next to the target,
then a rename."""

from __future__ import annotations

import os
import tempfile

__all__ = ["temporary_next_to", "write_atomically"]


def temporary_next_to(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to a new hidden temporary file in ``path``'s
    directory, flushed to disk, and return its name; the caller renames or removes it."""
    path = os.fspath(path)
    fd, temporary = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                     dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        os.unlink(temporary)
        raise
    return temporary


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` by a file holding ``text``, in one rename."""
    temporary = temporary_next_to(path, text)
    try:
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
