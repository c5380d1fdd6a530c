"""The sandbox's mechanisms by name, what programs may read, and the environment they see.

``protocol.code_sandbox.mechanisms`` lists the names below that were in force (in this order);
``missing`` lists those this machine did not allow. Each name is one kernel mechanism:

=============================  ===================================================================
``user-namespace``             the program's capabilities mean nothing outside the sandbox
``mount-namespace``            mounts below are private to the run
``pid-namespace``              the program sees only its own processes; all die with the run
``network-namespace``          no network interface at all (not even the machine's loopback)
``ipc-namespace``              no System V IPC or POSIX message queue shared with the machine
``pids-cgroup``                at most 512 processes and threads in the whole sandbox (a cgroup's
                               ``pids.max``; the bound for root, whom ``RLIMIT_NPROC`` exempts)
``minimal-root``               the filesystem is a fresh tree holding only the allowed paths,
                               read-only: the machine's sockets, secrets and file names are not
                               in it; ``/tmp`` is private
``read-only-filesystem``       (where no minimal root can be built) every mount read-only
``private-workdir``            the working directory is a fresh size-bounded tmpfs
``private-dev-shm``            ``/dev/shm`` is a fresh size-bounded tmpfs
``private-tmp``                ``/tmp`` is a fresh size-bounded tmpfs (in a minimal root)
``private-run``                ``/run`` (sockets of the machine's services) is hidden
``private-proc``               ``/proc`` shows only the sandbox's processes
``closed-file-descriptors``    only stdin, stdout, stderr and the result pipe are open
``hard-rlimits``               address space, file size, open files, core dumps (hard limits)
``no-new-privileges``          ``PR_SET_NO_NEW_PRIVS``: no set-uid or file-capability gains
``capabilities-dropped``       no capability, now or after ``exec``
``landlock-filesystem``        reads only beneath the Python installation and system libraries,
                               writes only in the working directory
``landlock-ptrace-scope``      no tracing or memory or descriptor access of outside processes
``landlock-tcp``               no TCP bind or connect
``landlock-signal-scope``      no signals to processes outside the sandbox
``landlock-abstract-unix-scope``  no connecting to abstract Unix sockets outside the sandbox
``environment-allowlist``      the program sees only the variables of :data:`ALLOWED_VARIABLES`
=============================  ===================================================================

``capabilities-dropped`` is listed only where there were capabilities to drop (root, or inside
a user namespace); an unprivileged process without a user namespace has none.
"""

from __future__ import annotations

import os
import site
import sys
from typing import Iterable, Mapping

__all__ = ["ALL", "ALLOWED_VARIABLES", "read_paths", "environment", "ordered", "missing",
           "worker_allowlist"]

ALL = (
    "user-namespace", "mount-namespace", "pid-namespace", "network-namespace", "ipc-namespace",
    "pids-cgroup",
    "minimal-root", "read-only-filesystem", "private-workdir", "private-dev-shm", "private-tmp", "private-run", "private-proc",
    "closed-file-descriptors", "hard-rlimits", "no-new-privileges", "capabilities-dropped",
    "landlock-filesystem", "landlock-ptrace-scope", "landlock-tcp", "landlock-signal-scope",
    "landlock-abstract-unix-scope", "environment-allowlist",
)
# Mechanisms a machine may legitimately lack without it being a gap worth a warning.
_OPTIONAL = {"capabilities-dropped", "private-run", "private-tmp", "pids-cgroup"}

# Variables a program may see (their values are copied from the worker's environment);
# EVALPLUS_MAX_MEMORY_BYTES because it changes evalplus's verdicts.
ALLOWED_VARIABLES = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME",
                     "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES", "TZ", "TERM",
                     "EVALPLUS_MAX_MEMORY_BYTES")
# Variables the scoring worker itself needs besides those (never secrets): how to find the
# project's packages, and evalplus's memory setting, which changes verdicts.
_WORKER_VARIABLES = ("PYTHONPATH", "PYTHONHASHSEED", "ALODLM_SANDBOX_DISABLE",
                     "ALODLM_WORKER_SCRATCH", "TMPDIR", "HOME")
_SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin",
                      "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
                      "/etc/timezone", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
                      "/etc/hosts", "/etc/host.conf", "/etc/gai.conf", "/etc/mime.types",
                      "/etc/ssl", "/etc/alternatives", "/etc/os-release", "/dev/null",
                      "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/proc",
                      "/sys/devices/system/cpu")


def read_paths() -> tuple[str, ...]:
    """Directories and files a program may read and execute from: the system's libraries and
    the Python installation (prefixes, the interpreter's directory, site-packages). Not the
    project's checkout, not the task files, not ``$HOME``."""
    paths: list[str] = list(_SYSTEM_READ_PATHS)
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    try:
        candidates += site.getsitepackages()
    except AttributeError:  # pragma: no cover - virtualenv's old site.py
        pass
    candidates += [entry for entry in sys.path if entry and os.path.isdir(entry)
                   and ("site-packages" in entry or "dist-packages" in entry
                        or entry.startswith(sys.base_prefix) or entry.startswith(sys.prefix))]
    for path in candidates:
        real = os.path.realpath(path)
        for item in (path, real):
            if item and item not in paths:
                paths.append(item)
    return tuple(paths)


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The program's environment: the allowed variables that are set (HOME and TMPDIR are set
    to the run's working directory when the run starts)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in ALLOWED_VARIABLES if name in environ}


def worker_allowlist(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a scoring worker starts with when the sandbox is on: the program's
    allowlist plus the few variables the worker itself needs. Tokens and keys never reach it."""
    names = ALLOWED_VARIABLES + _WORKER_VARIABLES
    return {name: environ[name] for name in names if name in environ}


def ordered(names: Iterable[str]) -> list[str]:
    names = set(names)
    return [name for name in ALL if name in names] + sorted(names - set(ALL))


def missing(found: Iterable[str]) -> list[str]:
    """The mechanisms of :data:`ALL` not in ``found`` (not allowed here, or disabled)."""
    found = set(found)
    if "minimal-root" in found:  # there is no /run in it at all
        found |= {"private-run"}
    return [name for name in ALL if name not in found and name not in _OPTIONAL]
