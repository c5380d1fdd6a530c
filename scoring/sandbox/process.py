"""The sandbox's processes, written once, in the order they happen.

Start-up, once per scoring worker, before the worker reads its first request
(:mod:`alodlm_scoring.sandbox.zygote` drives it):

1. **Outer** (forked from the worker). Dies with the worker (``PR_SET_PDEATHSIG``), closes
   every descriptor but the worker's socket, enters fresh namespaces (:func:`enter_namespaces`:
   user, mount, pid, network, IPC, as many as the machine allows), forks the host and waits
   for it.
2. **Host** (pid 1 of the new pid namespace; the *zygote* every run is forked from). Dies with
   the outer process, builds the program's filesystem (:meth:`Host.setup`: a minimal read-only
   root holding only the allowed paths, ``pivot_root`` into it, its own ``/proc``), imports the
   jobs' libraries, and serves runs one at a time. Its memory never holds a secret (the pool
   starts workers with an environment allowlist) and, under strict rules, never an expected
   output (the jobs never receive them).

Each run (:meth:`Host.run`):

3. The host gives the run fresh size-bounded tmpfs's on the working directory, ``/tmp`` and
   ``/dev/shm`` (the previous run's are gone), writes the task's files, enters a fresh IPC
   namespace and forks the program process. It reads the result pipe while it waits for the
   program with the run's deadline, and when the program has ended (or the deadline has
   passed) it kills every other process of the namespace (``kill(-1)`` from pid 1) and reaps
   until none is left, so that whatever the program did (``setsid``, double forks, ignoring
   SIGTERM) nothing of it outlives the run, before the result goes back. Without a pid
   namespace the host is a child subreaper and kills its children until none is left.
4. **Program process** (forked from the host). Gets descriptors 0, 1 and 2 (``/dev/null``)
   and 3 (the result pipe) and nothing else, leads its own session, works in the working
   directory, sets hard resource limits, sets ``PR_SET_NO_NEW_PRIVS``, drops every capability,
   applies Landlock (read and execute beneath the allowed paths, write only in its tmpfs's, no
   TCP, no signals or ptrace outside its domain), reports which mechanisms it applied, and then
   either ``exec``\\ s the run's command (with the environment allowlist) or calls a job of
   :mod:`alodlm_scoring.sandbox.jobs`.
5. **A run with a server** (strict python_tests, :mod:`alodlm_scoring.sandbox.calls`): the host
   also makes a socket pair and forks two program processes set up as above: the server's
   (which ``exec``\\ s the server command with one end as descriptor 3 and the working directory
   as usual) and then the job's (the test process, which gets the other end as descriptor 5,
   works in ``/`` and may write nowhere but ``/dev/null``-like devices). Each applies its own
   Landlock domain, so neither can signal or trace the other, and the host's forks are not
   dumpable, so without Landlock the server's program still cannot read the test process's
   memory or descriptors. The host waits for the job; when it exited with 0 it gives the server
   the rest of the deadline to end by itself (``Result.server_code``); then ``kill(-1)`` ends
   both, as any run.

A mechanism the probe run found working is *required* in every later run: if it fails to apply,
the program is not started and the run reports ``setup_failed`` (fail closed).

Here: the outer process's namespaces and the host; the program process is
:mod:`alodlm_scoring.sandbox.program`, the records all stages share
:mod:`alodlm_scoring.sandbox.records`.
"""


from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import socket
import time
from typing import Callable, Mapping, Sequence

from . import linux
from .program import attempt, start
from .records import Policy, Result, Run, SetupFailed

__all__ = ["Host", "enter_namespaces", "remove_tree"]

_NAMESPACES = (("mount-namespace", linux.CLONE_NEWNS), ("pid-namespace", linux.CLONE_NEWPID),
               ("network-namespace", linux.CLONE_NEWNET), ("ipc-namespace", linux.CLONE_NEWIPC))


# --------------------------------------------------------------------------------------------
# Outer process: namespaces
# --------------------------------------------------------------------------------------------


def enter_namespaces(policy: Policy) -> list[str]:
    """Unshare as many namespaces as allowed (the caller's next child is pid 1 of the new pid
    namespace); returns the names of those entered."""
    wanted = [(name, flag) for name, flag in _NAMESPACES if name not in policy.disabled]
    flags = 0
    for _, flag in wanted:
        flags |= flag
    uid, gid = os.geteuid(), os.getegid()
    if flags and "user-namespace" not in policy.disabled:
        try:
            linux.unshare(linux.CLONE_NEWUSER | flags)
            linux.map_to_root(uid, gid)
            return ["user-namespace"] + [name for name, _ in wanted]
        except OSError:
            pass
    if flags and uid == 0:  # root without user namespaces (some containers allow this)
        try:
            linux.unshare(flags)
            return [name for name, _ in wanted]
        except OSError:
            pass
    return []


# --------------------------------------------------------------------------------------------
# Host: the filesystem, once; then one run at a time
# --------------------------------------------------------------------------------------------


class Host:
    """Pid 1 of the sandbox (or, without a pid namespace, a subreaper): builds the program's
    filesystem once and runs programs in it."""

    def __init__(self, policy: Policy, jobs: Mapping[str, Callable], namespaces: Sequence[str],
                 scratch: str) -> None:
        self.policy = policy
        self.jobs = jobs
        self.namespaces = set(namespaces)  # and "pids-cgroup" when the outer process made one
        self.mechanisms: list[str] = list(namespaces)  # in force in every run (host-level)
        self.scratch = scratch
        self.workdir = os.path.join(scratch, "run")
        self._fresh = False  # whether the working directory, /tmp, /dev/shm are tmpfs's of ours
        self._below_tmp: list[tuple[str, str]] = []  # (kept-aside copy, allowed path below /tmp)

    # -- once ----------------------------------------------------------------------------------

    def setup(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        if "mount-namespace" in self.namespaces:
            linux.make_mounts_private()
            root = os.path.join(self.scratch, "root")
            os.makedirs(root, exist_ok=True)
            if not attempt(self.mechanisms, self.policy, "minimal-root",
                           lambda: self._minimal_root(root)):
                self._read_only_machine()
        if "pid-namespace" not in self.namespaces:
            linux.set_child_subreaper()

    def _minimal_root(self, root: str) -> None:
        """A fresh root holding only the allowed paths (read-only binds at their own absolute
        paths) and mount points for the run's tmpfs's; the rest of the machine (its sockets,
        its secrets, even its file names) is not in the program's filesystem at all."""
        linux.mount_tmpfs(root, 16 * 1024**2, 0o755)
        bound: list[str] = []
        for path in sorted(set(self.policy.read_paths), key=lambda item: (item.count("/"), item)):
            if path == "/proc" or not os.path.lexists(path) or any(
                    path == done or path.startswith(done.rstrip("/") + "/") for done in bound):
                continue
            if path == "/tmp" or path.startswith("/tmp/"):
                # Below the run's fresh /tmp: kept aside here, bound again into each new /tmp.
                aside = f"{_ASIDE}/{len(self._below_tmp)}"
                self._below_tmp.append((aside, path))
                _replicate(path, root + aside)
            else:
                _replicate(path, root + path)
            bound.append(path)
        for path in ("/proc", "/tmp", "/dev/shm", self.workdir):
            os.makedirs(root + path, exist_ok=True)
        proc = []
        if "pid-namespace" in self.namespaces:  # its own /proc (the machine's is still visible)
            attempt(proc, self.policy, "private-proc", lambda: linux.mount_proc(root + "/proc"))
        if not proc:
            linux.bind_mount("/proc", root + "/proc")
        linux.remount_read_only(root)
        linux.pivot_to(root)
        self.mechanisms += ["read-only-filesystem"] + proc
        self._fresh = True

    def _read_only_machine(self) -> None:
        """Where no minimal root can be built: the machine's mounts, all read-only, with
        private tmpfs's on the working directory, ``/tmp``-less, ``/dev/shm`` and ``/run``."""
        attempt(self.mechanisms, self.policy, "read-only-filesystem", linux.make_mounts_read_only)
        if os.path.isdir("/run"):
            attempt(self.mechanisms, self.policy, "private-run",
                    lambda: linux.mount_tmpfs("/run", 1 << 20, 0o755))
        if "pid-namespace" in self.namespaces:
            attempt(self.mechanisms, self.policy, "private-proc", linux.mount_proc)
        self._fresh = "read-only-filesystem" in self.mechanisms

    def _fresh_directories(self) -> list[str]:
        """Fresh tmpfs's for this run (the previous run's contents are gone with them)."""
        if not self._fresh:  # no mount namespace: a new directory on the machine's disk
            remove_tree(self.workdir)
            os.makedirs(self.workdir)
            return []
        limits = self.policy.limits
        places = [("/dev/shm", limits.tmp_bytes, 0o1777, "private-dev-shm"),
                  (self.workdir, limits.workdir_bytes, 0o700, "private-workdir")]
        if "minimal-root" in self.mechanisms:  # first: the working directory may be below it
            places.insert(0, ("/tmp", limits.tmp_bytes, 0o1777, "private-tmp"))
        names = []
        for path, size, mode, name in places:
            linux.unmount_if_mounted(path)
            os.makedirs(path, exist_ok=True)
            linux.mount_tmpfs(path, size, mode)
            if path == "/tmp":  # allowed paths below it (a virtual environment in /tmp, say)
                for aside, target in self._below_tmp:
                    _replicate(aside, target)
            names.append(name)
        return names

    # -- each run ------------------------------------------------------------------------------

    def run(self, run: Run, max_output: int = 64 * 1024**2) -> Result:
        """Run ``run`` as the module describes and return its :class:`Result`."""
        started = time.monotonic()
        try:
            fresh = self._fresh_directories()
            for name, text in run.files.items():
                with open(os.path.join(self.workdir, name), "w") as handle:
                    handle.write(text)
            os.makedirs(os.path.join(self.workdir, "tmp"), exist_ok=True)
            if "ipc-namespace" in self.namespaces:  # no IPC object survives into the next run
                linux.unshare(linux.CLONE_NEWIPC)
        except (OSError, SetupFailed) as error:
            return Result("setup_failed", error=f"{type(error).__name__}: {error}")
        if run.server is not None and run.job is None:
            return Result("setup_failed", error="only a job can have a server")
        mechanisms = self.mechanisms + fresh
        channel = server_control = server = None
        if run.server is not None:  # first: its interpreter starts while the job's process forks
            channel, served = (end.detach() for end in socket.socketpair())
            server_control, server_control_write = os.pipe()
            server = os.fork()
            if server == 0:  # ---- the server's program process
                try:
                    start(Run(timeout=run.timeout, argv=run.server), self.policy, self.jobs,
                          self.workdir, list(mechanisms), served, server_control_write)
                finally:
                    os._exit(126)
            os.close(served)
            os.close(server_control_write)
        result_read, result_write = os.pipe()
        control_read, control_write = os.pipe()
        program = os.fork()
        if program == 0:  # ---- program process (with a server: the job's, the test process)
            try:
                start(run, self.policy, self.jobs, self.workdir, list(mechanisms),
                      result_write, control_write, channel)
            finally:
                os._exit(126)
        for fd in (result_write, control_write, channel):
            if fd is not None:
                os.close(fd)
        deadline = time.monotonic() + max(run.timeout, 0.0)
        server_code = None
        try:
            output, truncated, wait_status, timed_out = self._collect(
                program, result_read, run.timeout, max_output)
            if server is not None and not timed_out and wait_status == 0:
                server_code = _exit_code(server, deadline)  # it ends as its channel closed
        finally:
            self._end_everything()
            os.close(result_read)
        reports = _read_all(control_read)
        if server_control is not None:
            failed = [r for r in _read_all(server_control) if "setup_error" in r]
            if failed:  # the job's own verdict means nothing without its server
                return Result("setup_failed", error="server: " + failed[0]["setup_error"],
                              elapsed=time.monotonic() - started)
        result = _result(reports, wait_status, timed_out, output, truncated,
                         time.monotonic() - started)
        return dataclasses.replace(result, server_code=server_code)

    def _collect(self, program: int, result_read: int, timeout: float,
                 max_output: int) -> tuple[bytes, bool, int | None, bool]:
        """Drain the result pipe until the program exits or the deadline passes."""
        deadline = time.monotonic() + max(timeout, 0.0)
        pidfd = os.pidfd_open(program)
        output = bytearray()
        truncated = False
        wait_status = None
        watched = [result_read, pidfd]
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                readable, _, _ = select.select(watched, [], [], remaining)
                if result_read in readable:
                    chunk = os.read(result_read, 1 << 16)
                    if not chunk:
                        watched = [pidfd]  # every writer closed it; the program may still run
                    elif len(output) + len(chunk) > max_output:
                        truncated = True  # keep draining: the program must not block on it
                    else:
                        output += chunk
                        continue
                if pidfd in readable:
                    _, wait_status = os.waitpid(program, 0)
                    break
        finally:
            os.close(pidfd)
        timed_out = wait_status is None
        if timed_out:
            os.kill(program, signal.SIGKILL)
            _, wait_status = os.waitpid(program, 0)
        # What the program wrote just before it ended (its descendants are killed next).
        os.set_blocking(result_read, False)
        while True:
            try:
                chunk = os.read(result_read, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            if len(output) + len(chunk) > max_output:
                truncated = True
                break
            output += chunk
        return bytes(output), truncated, wait_status, timed_out

    def _end_everything(self) -> None:
        """Kill every process the run left and reap them all: none outlives the run."""
        if "pid-namespace" not in self.namespaces:
            linux.kill_children()
            return
        for _ in range(100):
            try:
                os.kill(-1, signal.SIGKILL)  # pid 1: every other process of the namespace
            except ProcessLookupError:
                pass
            try:
                while os.waitpid(-1, 0):
                    pass
            except ChildProcessError:
                return


def _exit_code(pid: int, deadline: float) -> int | None:
    """``pid``'s exit status if it exits by itself before ``deadline``, else ``None``."""
    pidfd = os.pidfd_open(pid)
    try:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([pidfd], [], [], remaining)[0]:
            return None
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else None


_ASIDE = "/.alodlm-below-tmp"


def _replicate(source: str, target: str) -> None:
    """``source`` also at ``target``: the same symbolic link, or a read-only bind mount."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(source):
        if not os.path.lexists(target):
            os.symlink(os.readlink(source), target)
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "a").close()
    linux.bind_mount(source, target)


def remove_tree(path: str) -> None:
    """Remove a run's directory even where the program took its own permissions away."""
    def unlock(function, name, _):
        for item in (os.path.dirname(name), name):
            try:
                os.chmod(item, 0o700)
            except OSError:
                pass
        try:
            function(name)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=unlock)


def _read_all(fd: int) -> list[dict]:
    data = b""
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    os.close(fd)
    reports = []
    for line in data.splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:
            continue
    return reports


def _result(reports: list[dict], wait_status: int, timed_out: bool, output: bytes,
            truncated: bool, elapsed: float) -> Result:
    setup = next((r for r in reports if "applied" in r or "setup_error" in r), {})
    mechanisms = tuple(setup.get("applied", ()))
    common = {"output": output, "output_truncated": truncated, "elapsed": elapsed,
              "mechanisms": mechanisms}
    if "setup_error" in setup:
        return Result("setup_failed", error=setup["setup_error"], **common)
    if timed_out:
        return Result("timeout", **common)
    if not setup:
        return Result("lost", error="the program process ended before its setup report",
                      **common)
    if os.WIFSIGNALED(wait_status):
        return Result("signaled", signal=os.WTERMSIG(wait_status), **common)
    return Result("exited", code=os.WEXITSTATUS(wait_status), **common)

