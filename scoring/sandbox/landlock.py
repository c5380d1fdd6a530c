"""Landlock, the Linux kernel's unprivileged access control, through its three system calls.

A process builds a *ruleset* (the access rights it wants to control), adds rules (which rights are
allowed beneath which directories), and restricts itself: from then on it and every process it
starts can use a controlled right only where a rule allows it. Nothing here needs privileges.
Rights not known to the running kernel's ABI are left out, so one ruleset works on every kernel
that has Landlock at all (ABI 1, Linux 5.13, and later).

What a sandboxed program gets (see :func:`restrict`):

* filesystem: reading and executing beneath the read-only paths, everything beneath the
  writable paths, nothing elsewhere (``stat`` and path lookup are not controlled by Landlock);
* network (ABI 4): no TCP ``bind`` and no TCP ``connect``;
* scopes (ABI 6): no signals to processes outside the sandbox, no connecting to abstract Unix
  sockets created outside it;
* ptrace (every ABI): a sandboxed process can never trace, or read the memory or the
  ``/proc/<pid>/fd`` entries of, a process outside its domain.

Restricting again inside the sandbox creates a nested domain: its processes can no longer signal
or trace the outer domain's processes (used to separate evalplus's forked checker from the
process that reports its verdict).
"""

from __future__ import annotations

import ctypes
import os
import stat
from typing import Iterable

from .linux import libc

__all__ = ["abi_version", "restrict", "LandlockError", "features"]

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# Filesystem rights, by the ABI version that introduced them.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
              5: (1 << 16) - 1}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR
# Network rights (ABI 4) and scopes (ABI 6).
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1


class LandlockError(OSError):
    """A Landlock system call failed."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall():
    return libc().syscall


def abi_version() -> int:
    """The running kernel's Landlock ABI version; 0 when Landlock is missing or disabled."""
    if not os.uname().sysname == "Linux":
        return 0
    try:
        version = _syscall()(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                             ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def features(abi: int) -> list[str]:
    """The mechanism names a ruleset gives on a kernel with Landlock ABI ``abi``."""
    if abi < 1:
        return []
    names = ["landlock-filesystem", "landlock-ptrace-scope"]
    if abi >= 4:
        names.append("landlock-tcp")
    if abi >= 6:
        names += ["landlock-signal-scope", "landlock-abstract-unix-scope"]
    return names


def _fs_rights(abi: int) -> int:
    return _FS_BY_ABI.get(abi, _FS_BY_ABI[5])


def restrict(read_paths: Iterable[str], write_paths: Iterable[str], *, abi: int | None = None) -> int:
    """Restrict the calling thread's process (and its future children) as the module describes.

    Paths that do not exist are skipped. The caller must have set ``PR_SET_NO_NEW_PRIVS`` (or
    hold ``CAP_SYS_ADMIN``). Returns the ABI version used; raises :class:`LandlockError`.
    """
    abi = abi_version() if abi is None else abi
    if abi < 1:
        raise LandlockError(0, "Landlock is not available")
    syscall = _syscall()
    handled = _fs_rights(abi)
    attr = _RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr),
                      ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        error = ctypes.get_errno()
        raise LandlockError(error, f"landlock_create_ruleset: {os.strerror(error)}")
    try:
        for paths, rights in ((read_paths, READ_RIGHTS), (write_paths, handled)):
            for path in paths:
                _add_path_rule(syscall, ruleset, path, rights & handled)
        if syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            error = ctypes.get_errno()
            raise LandlockError(error, f"landlock_restrict_self: {os.strerror(error)}")
    finally:
        os.close(ruleset)
    return abi


def _add_path_rule(syscall, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path this machine does not have
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        if syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset),
                   ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
            error = ctypes.get_errno()
            raise LandlockError(error, f"landlock_add_rule({path!r}): {os.strerror(error)}")
    finally:
        os.close(fd)
