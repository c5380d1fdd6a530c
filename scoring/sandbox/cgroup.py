"""A process-count limit for the sandbox: a ``pids`` cgroup of its own, where one can be made.

The kernel exempts root from ``RLIMIT_NPROC``, so a fork bomb of a program scored as root is
bounded only by a cgroup's ``pids.max``. :func:`enter_pids_limit` makes a child cgroup of the
calling process's ``pids`` cgroup (cgroup v1's ``pids`` hierarchy, or cgroup v2 where the
``pids`` controller is delegated to our cgroup's children), sets its ``pids.max`` and moves the
caller into it, so that the sandbox's host and every program it starts count against the limit
(threads count too). Where the hierarchy is not writable (an unprivileged user without
delegation, most containers) nothing happens and the mechanism is missing.
"""

from __future__ import annotations

import os

__all__ = ["enter_pids_limit", "remove"]

_V1_ROOT = "/sys/fs/cgroup/pids"
_V2_ROOT = "/sys/fs/cgroup"


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup path in the v1 hierarchy of ``controller`` (or v2 when None)."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if controller is None and number == "0" and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return None


def _candidates() -> list[str]:
    places = []
    own = _own_cgroup("pids")
    if own is not None and os.path.isdir(_V1_ROOT):
        places.append(os.path.join(_V1_ROOT, own.lstrip("/")))
    own = _own_cgroup(None)
    if own is not None and os.path.exists(os.path.join(_V2_ROOT, "cgroup.controllers")):
        places.append(os.path.join(_V2_ROOT, own.lstrip("/")))
    return places


def enter_pids_limit(limit: int, name: str) -> str | None:
    """Move this process into a new ``pids`` cgroup ``name`` with ``pids.max = limit``.

    Returns the cgroup's directory (to :func:`remove` once its processes are gone), or None
    when no writable ``pids`` hierarchy exists here.
    """
    for parent in _candidates():
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            with open(os.path.join(path, "pids.max"), "w") as handle:
                handle.write(str(int(limit)))
            with open(os.path.join(path, "cgroup.procs"), "w") as handle:
                handle.write("0")
            return path
        except OSError:
            remove(path)
    return None


def remove(path: str | None) -> None:
    """Remove a cgroup made by :func:`enter_pids_limit` (possible once it holds no process)."""
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass
