"""Starting the sandbox and talking to it: the worker's side and the host's serve loop.

A scoring worker calls :meth:`Zygote.start` before it reads its first request: it forks the
outer process, which enters the namespaces and forks the host (pid 1 of the sandbox, the zygote
every run is forked from; :mod:`alodlm_scoring.sandbox.process` describes both). The host imports
the jobs' libraries (evalplus, numpy) before it builds the program's filesystem (the project's own
files are not in it), probes which mechanisms work with one run, and serves runs one at a time.

The worker talks to the host over a private socket pair with length-prefixed pickles (both ends
are trusted code; no program process holds the socket). The host dies with the outer process and
the outer process with the worker (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import sys
import time
from typing import Any

from . import cgroup, linux, mechanisms
from .records import Limits, Policy, Result, Run

__all__ = ["Zygote", "ZygoteError"]

_HEADER = struct.Struct("!Q")


class ZygoteError(RuntimeError):
    """The sandbox could not start, or died."""


def _send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _receive(sock: socket.socket) -> Any:
    header = _exactly(sock, _HEADER.size)
    return pickle.loads(_exactly(sock, _HEADER.unpack(header)[0]))


def _exactly(sock: socket.socket, size: int) -> bytes:
    parts, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the socket")
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


class Zygote:
    """The worker's handle on its sandbox: ``start()``, then ``run(Run) -> Result``."""

    def __init__(self, scratch: str, *, disabled: frozenset[str] = frozenset(),
                 limits: Limits = Limits()) -> None:
        self.scratch = scratch
        self.disabled = frozenset(disabled)
        self.limits = limits
        self.mechanisms: tuple[str, ...] = ()
        self.missing: tuple[str, ...] = ()
        self._sock: socket.socket | None = None
        self._pid: int | None = None
        self._cgroup: str | None = None

    @property
    def pid(self) -> int | None:
        """The outer process's id (the host is its only child)."""
        return self._pid

    def start(self) -> "Zygote":
        """Fork the sandbox (the caller must be single-threaded) and wait for its probe."""
        if not sys.platform.startswith("linux"):
            raise ZygoteError("the code sandbox needs Linux")
        parent, child = socket.socketpair()
        worker = os.getpid()
        pid = os.fork()
        if pid == 0:  # ---- outer process
            try:
                parent.close()
                _outer(child, worker, self.scratch, self.disabled, self.limits)
            finally:
                os._exit(0)
        child.close()
        self._sock, self._pid = parent, pid
        try:
            hello = _receive(parent)
        except (EOFError, OSError) as error:
            self.close()
            raise ZygoteError(f"the code sandbox did not start: {error}") from None
        if "error" in hello:
            self.close()
            raise ZygoteError(hello["error"])
        self.mechanisms = tuple(hello["mechanisms"])
        self.missing = tuple(hello["missing"])
        self._cgroup = hello.get("cgroup")
        return self

    def run(self, run: Run) -> Result:
        """Execute one run and return its result; a sandbox that died gives ``lost``."""
        if self._sock is None:
            return Result("lost", error="the code sandbox is not running")
        try:
            _send(self._sock, run)
            return _receive(self._sock)
        except (EOFError, OSError) as error:
            self.close()
            return Result("lost", error=f"the code sandbox died: {error}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)  # the host dies with it
                os.waitpid(self._pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._pid = None
        if self._cgroup is not None:  # empty once the host is gone (it dies with the outer)
            for _ in range(50):
                cgroup.remove(self._cgroup)
                if not os.path.exists(self._cgroup):
                    break
                time.sleep(0.02)
            self._cgroup = None


# --------------------------------------------------------------------------------------------
# The outer process and the host
# --------------------------------------------------------------------------------------------


def _outer(sock: socket.socket, worker: int, scratch: str, disabled: frozenset[str],
           limits: Limits) -> None:
    from .process import enter_namespaces

    linux.close_fds_except([sock.fileno(), 2])
    linux.set_parent_death_signal()
    if os.getppid() != worker:
        return
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    policy = Policy(read_paths=mechanisms.read_paths(), environment=mechanisms.environment(),
                    limits=limits, disabled=disabled)
    pids = None
    if "pids-cgroup" not in disabled:  # before the namespaces: the hierarchy is the machine's
        pids = cgroup.enter_pids_limit(limits.processes, f"alodlm-sandbox-{os.getpid()}")
    namespaces = enter_namespaces(policy) + (["pids-cgroup"] if pids else [])
    host = os.fork()
    if host == 0:
        try:
            _host(sock, os.getppid(), scratch, policy, namespaces, pids)
        finally:
            os._exit(0)
    sock.close()  # the worker sees the host's end of the socket close when the host dies
    os.waitpid(host, 0)


def _host(sock: socket.socket, outer: int, scratch: str, policy: Policy,
          namespaces: list[str], pids_cgroup: str | None) -> None:
    linux.set_parent_death_signal()
    if os.getppid() != outer:
        return
    try:
        from . import jobs  # evalplus and numpy load here, before the filesystem is built
        from .process import Host
        from .program import default_signals

        default_signals()
        host = Host(policy, jobs.JOBS, namespaces, scratch)
        host.setup()
        linux.set_dumpable(False)
        probe = host.run(Run(timeout=60.0, job="probe"))
        if probe.status != "exited" or probe.code != 0 or b'"probe": "ok"' not in probe.output:
            raise RuntimeError(f"the probe run failed ({probe.status}"
                               f"{': ' + probe.error if probe.error else ''})")
        found = mechanisms.ordered(probe.mechanisms)
        host.policy = Policy(policy.read_paths, policy.environment, policy.limits,
                             policy.disabled, frozenset(found))
        _send(sock, {"mechanisms": found, "missing": mechanisms.missing(found),
                     "cgroup": pids_cgroup})
    except BaseException as error:  # noqa: BLE001 - reported to the worker
        try:
            _send(sock, {"error": f"the code sandbox failed to start: "
                                  f"{type(error).__name__}: {error}"})
        finally:
            return
    while True:
        try:
            run = _receive(sock)
        except (EOFError, OSError):
            return
        try:
            result = host.run(run)
        except BaseException as error:  # noqa: BLE001
            result = Result("lost", error=f"{type(error).__name__}: {error}")
        try:
            _send(sock, result)
        except OSError:
            return
