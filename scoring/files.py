"""Writing files so that a reader never sees half of one (a temporary file next to the target,
then a rename), with the permissions an ordinary ``open`` would give: ``0o666`` less the umask.

``tempfile.mkstemp`` makes its files ``0o600`` so that nobody else can read them while they are
written; a file renamed into place from there would stay private, where an output directory on a
shared mount must be readable by the other users the umask admits.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["current_umask", "temporary_next_to", "write_atomically"]


def current_umask() -> int:
    """This process's umask, read without changing it where the kernel reports it."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not atomic, but no thread writes here)
    os.umask(mask)
    return mask


def temporary_next_to(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to a new hidden temporary file in ``path``'s
    directory, flushed to disk, with the mode ``open(path, "w")`` would give, and return its name;
    the caller renames or removes it."""
    path = os.fspath(path)
    fd, temporary = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                     dir=os.path.dirname(os.path.abspath(path)))
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
