"""The zygote: the process every sandboxed run is forked from.

A scoring worker forks its zygote at start-up, before it reads its first request, so the zygote's
memory holds no task (no expected output, no other task's program) and, because the pool starts
workers with a short environment allowlist, no secret. The zygote imports what the jobs need
(evalplus, numpy), probes which sandbox mechanisms this machine allows, and then serves runs one
at a time: for each, :func:`alodlm_scoring.sandbox.process.execute` forks the supervisor / init /
program tree and the zygote relays the result.

The worker talks to its zygote over a private socket pair with length-prefixed pickles (both ends
are trusted code; no sandboxed process holds the socket). The zygote dies with its worker
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import signal
import socket
import struct
import sys
import tempfile
from typing import Any

from . import linux, mechanisms
from .process import Limits, Policy, Result, Run

__all__ = ["Zygote", "ZygoteError"]

_HEADER = struct.Struct("!Q")


class ZygoteError(RuntimeError):
    """The zygote could not start, or died."""


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
    """The worker's handle on its zygote: ``start()``, then ``run(Run) -> Result``."""

    def __init__(self, scratch: str, *, disabled: frozenset[str] = frozenset(),
                 limits: Limits = Limits()) -> None:
        self.scratch = scratch
        self.disabled = frozenset(disabled)
        self.limits = limits
        self.mechanisms: tuple[str, ...] = ()
        self.missing: tuple[str, ...] = ()
        self._sock: socket.socket | None = None
        self._pid: int | None = None
        self._runs = 0

    @property
    def pid(self) -> int | None:
        return self._pid

    def start(self) -> "Zygote":
        """Fork the zygote (the caller must be single-threaded) and wait for its probe."""
        if not sys.platform.startswith("linux"):
            raise ZygoteError("the code sandbox needs Linux")
        parent, child = socket.socketpair()
        worker = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                parent.close()
                _serve(child, worker, self.scratch, self.disabled, self.limits)
            finally:
                os._exit(0)
        child.close()
        self._sock, self._pid = parent, pid
        try:
            hello = _receive(parent)
        except (EOFError, OSError) as error:
            self.close()
            raise ZygoteError(f"the sandbox zygote did not start: {error}") from None
        if "error" in hello:
            self.close()
            raise ZygoteError(hello["error"])
        self.mechanisms = tuple(hello["mechanisms"])
        self.missing = tuple(hello["missing"])
        return self

    def run(self, run: Run) -> Result:
        """Execute one run (``run.workdir`` is filled in here) and return its result."""
        if self._sock is None:
            raise ZygoteError("the sandbox zygote is not running")
        try:
            _send(self._sock, run)
            reply = _receive(self._sock)
        except (EOFError, OSError) as error:
            self.close()
            raise ZygoteError(f"the sandbox zygote died: {error}") from None
        return reply

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._pid = None


# --------------------------------------------------------------------------------------------
# The zygote process
# --------------------------------------------------------------------------------------------


def _serve(sock: socket.socket, worker: int, scratch: str, disabled: frozenset[str],
           limits: Limits) -> None:
    try:
        linux.close_fds_except([sock.fileno(), 2])
        linux.set_parent_death_signal()
        if os.getppid() != worker:
            return
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from . import jobs  # evalplus and numpy load here, once, before any fork
        from .process import execute

        policy = Policy(read_paths=mechanisms.read_paths(), environment=mechanisms.environment(),
                        limits=limits, disabled=disabled)
        found = _probe(policy, jobs.JOBS, scratch, execute)
        policy = Policy(policy.read_paths, policy.environment, limits, disabled, frozenset(found))
        _send(sock, {"mechanisms": found, "missing": mechanisms.missing(found)})
    except BaseException as error:  # noqa: BLE001 - reported to the worker
        try:
            _send(sock, {"error": f"the sandbox zygote failed to start: "
                                  f"{type(error).__name__}: {error}"})
        finally:
            return
    private = "private-workdir" in found or "minimal-root" in found
    mountpoint = os.path.join(scratch, "run")
    root = os.path.join(scratch, "root")
    os.makedirs(mountpoint, exist_ok=True)
    os.makedirs(root, exist_ok=True)
    count = 0
    while True:
        try:
            run = _receive(sock)
        except (EOFError, OSError):
            return
        count += 1
        workdir = mountpoint if private else os.path.join(scratch, f"run-{count}")
        if not private:
            os.makedirs(workdir)
        run = dataclasses.replace(run, workdir=workdir, root=root)
        try:
            result = execute(run, policy, jobs.JOBS)
        except BaseException as error:  # noqa: BLE001
            result = Result("setup_failed", error=f"{type(error).__name__}: {error}")
        finally:
            if not private:
                _remove_tree(workdir)
        try:
            _send(sock, result)
        except OSError:
            return


def _probe(policy: Policy, jobs: dict, scratch: str, execute) -> list[str]:
    """One best-effort run of the probe job; the mechanisms it applied become required."""
    workdir = tempfile.mkdtemp(prefix="probe-", dir=scratch)
    root = tempfile.mkdtemp(prefix="probe-root-", dir=scratch)
    try:
        result = execute(Run(timeout=60.0, workdir=workdir, job="probe", root=root), policy, jobs)
    finally:
        _remove_tree(workdir)
        _remove_tree(root)
    if result.status != "exited" or result.code != 0 or b'"probe": "ok"' not in result.output:
        raise RuntimeError(f"the sandbox probe run failed ({result.status}"
                           f"{': ' + result.error if result.error else ''})")
    return mechanisms.ordered(result.mechanisms)


def _remove_tree(path: str) -> None:
    """Remove a run's directory even where the program took its own permissions away."""
    def unlock(function, name, _):
        try:
            os.chmod(os.path.dirname(name), 0o700)
            os.chmod(name, 0o700)
        except OSError:
            pass
        try:
            function(name)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)
