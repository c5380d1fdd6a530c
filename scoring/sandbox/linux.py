"""The Linux system calls the sandbox uses that Python 3.11's ``os`` module does not offer.

Namespaces (``unshare``), mounts (``mount``, ``mount_setattr``), ``prctl`` switches, capability
dropping and file-descriptor hygiene, each a small function that raises ``OSError`` with the
failing call named. Everything is a no-op or an ``OSError`` on other systems; callers decide what
a failure means (the sandbox runs with what the machine allows and says what is missing).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
from typing import Iterable

__all__ = [
    "CLONE_NEWNS", "CLONE_NEWIPC", "CLONE_NEWUSER", "CLONE_NEWPID", "CLONE_NEWNET",
    "unshare", "map_to_root", "make_mounts_private", "make_mounts_read_only", "mount_tmpfs",
    "bind_mount", "remount_read_only", "unmount_if_mounted", "pivot_to",
    "mount_proc", "set_parent_death_signal", "set_no_new_privs", "set_dumpable",
    "set_child_subreaper", "drop_capabilities", "hard_limits", "close_fds_except",
    "kill_children", "libc",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4

_MNT_DETACH = 2
_SYS_MOUNT_SETATTR = 442
_MOUNT_ATTR_RDONLY = 0x1
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = None


def libc():
    """The C library, with ``errno`` kept (``ctypes.get_errno``) and ``syscall`` returning a long."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc


def _check(result: int, call: str) -> int:
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{call}: {os.strerror(error)}")
    return result


def unshare(flags: int) -> None:
    _check(libc().unshare(ctypes.c_int(flags)), "unshare")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def map_to_root(uid: int, gid: int) -> None:
    """In a fresh user namespace: this process's own uid and gid become 0 inside.

    The one mapping an unprivileged process may write for itself. Files keep their owners (root
    stays root), so the interpreter and the libraries stay readable; capabilities held inside the
    namespace apply only to what the namespace owns.
    """
    try:
        _write("/proc/self/setgroups", "deny")
    except FileNotFoundError:  # kernels before 3.19
        pass
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc().mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags),
                      encode(data)), f"mount({target!r})")


def make_mounts_private() -> None:
    """No mount or unmount here propagates back to the machine (nor from it)."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def make_mounts_read_only(target: str = "/") -> None:
    """Every mount at or below ``target`` becomes read-only (files, permissions, timestamps).

    ``mount_setattr(AT_RECURSIVE)`` (Linux 5.12); on older kernels each mount of
    ``/proc/self/mountinfo`` at or below ``target`` is remounted read-only, deepest first.
    """
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    result = libc().syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(_AT_FDCWD),
                          target.encode(), ctypes.c_uint(_AT_RECURSIVE), ctypes.byref(attr),
                          ctypes.c_size_t(ctypes.sizeof(attr)))
    if result == 0:
        return
    if ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL):
        _check(result, "mount_setattr")
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4].replace("\\040", " ") for line in handle]
    prefix = target.rstrip("/") + "/"
    for point in sorted(set(points), key=len, reverse=True):
        if point == target or point.startswith(prefix) or target == "/":
            _mount(None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)


def unmount_if_mounted(target: str) -> None:
    """Detach the mount at ``target``, if there is one (its files go when nothing uses them)."""
    if libc().umount2(target.encode(), ctypes.c_int(_MNT_DETACH)) < 0:
        error = ctypes.get_errno()
        if error not in (errno.EINVAL, errno.ENOENT):  # not a mount point, or no such path
            raise OSError(error, f"umount2({target!r}): {os.strerror(error)}")


def remount_read_only(target: str) -> None:
    """The one mount at ``target`` (not those below it) becomes read-only."""
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)


def bind_mount(source: str, target: str) -> None:
    """``source`` (and the mounts below it) also at ``target``, read-only."""
    _mount(source, target, None, _MS_BIND | _MS_REC)
    make_mounts_read_only(target)


# pivot_root has no C library wrapper; its number differs between architectures.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203,
                   "s390x": 217, "armv7l": 218, "i686": 217}


def pivot_to(new_root: str) -> None:
    """Make the mount at ``new_root`` this mount namespace's root; the old root is detached
    (nothing of it stays reachable)."""
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown system call number on {os.uname().machine}")
    os.chdir(new_root)
    _check(libc().syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    _check(libc().umount2(b".", ctypes.c_int(_MNT_DETACH)), "umount2(old root)")
    os.chdir("/")


def mount_tmpfs(target: str, size_bytes: int, mode: int = 0o700) -> None:
    """A fresh, size-bounded tmpfs at ``target`` (its old content is hidden, not touched)."""
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"size={int(size_bytes)},mode={mode:o}")


def mount_proc(target: str = "/proc") -> None:
    """A read-only ``/proc`` of the current pid namespace (it shows only the sandbox)."""
    _mount("proc", target, "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)


def _prctl(option: int, arg: int = 0, call: str = "prctl") -> None:
    _check(libc().prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                      ctypes.c_ulong(0), ctypes.c_ulong(0)), call)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    _prctl(_PR_SET_PDEATHSIG, sig, "prctl(PR_SET_PDEATHSIG)")


def set_no_new_privs() -> None:
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")


def set_dumpable(flag: bool) -> None:
    _prctl(_PR_SET_DUMPABLE, int(flag), "prctl(PR_SET_DUMPABLE)")


def set_child_subreaper() -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1, "prctl(PR_SET_CHILD_SUBREAPER)")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 40


def drop_capabilities() -> bool:
    """Give up every capability, now and across ``exec`` (bounding set, ambient, the three sets).

    Returns whether the process held any capability to give up (root, or inside a user
    namespace). A process without ``CAP_SETPCAP`` cannot shrink its bounding set; with no
    permitted capabilities it has nothing to drop either.
    """
    c = libc()
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    current = (_CapData * 2)()
    _check(c.capget(ctypes.byref(header), current), "capget")
    held = any(data.permitted or data.effective or data.inheritable for data in current)
    if not held:
        return False
    try:
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, "prctl(PR_CAP_AMBIENT)")
    except OSError:
        pass
    for cap in range(_last_capability() + 1):
        try:
            _prctl(_PR_CAPBSET_DROP, cap, "prctl(PR_CAPBSET_DROP)")
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    _check(c.capset(ctypes.byref(header), (_CapData * 2)()), "capset")
    return True


def hard_limits(limits: dict[int, int]) -> None:
    """Set each resource limit as soft and hard (never above an existing hard limit)."""
    for name, value in limits.items():
        _, hard = resource.getrlimit(name)
        if value == resource.RLIM_INFINITY:
            value = hard
        elif hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(name, (value, value))


def close_fds_except(keep: Iterable[int]) -> None:
    """Close every descriptor of this process above 2 except ``keep``."""
    keep = sorted({fd for fd in keep if fd > 2})
    low = 3
    for fd in keep + [None]:
        high = fd if fd is not None else _max_fd()
        if high > low:
            os.closerange(low, high)
        if fd is not None:
            low = fd + 1


def _max_fd() -> int:
    try:
        return max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def _children(pid: int) -> list[int]:
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(name))
    return found


def kill_children(rounds: int = 100) -> None:
    """SIGKILL and reap every child of this process until none is left.

    Used by a child subreaper when no pid namespace is available: orphaned descendants (a
    double fork, a ``setsid``) are re-parented here, so killing children until none remain
    removes the whole tree, one generation per round. A tree that keeps forking is fought for
    ``rounds`` rounds.
    """
    me = os.getpid()
    for _ in range(rounds):
        children = _children(me)
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
