"""One sandboxed run: the process tree, written once, in the order it happens.

A run starts in the zygote (a forked copy of a scoring worker that never held a task's expected
outputs or any secret; see :mod:`alodlm_scoring.sandbox.zygote`) and has three processes:

1. **Supervisor** (forked from the zygote). Closes every descriptor it does not need, dies with
   the zygote (``PR_SET_PDEATHSIG``), enters fresh namespaces (user, mount, pid, network, IPC:
   as many as the machine allows), and in the mount namespace makes every mount private and
   read-only, puts a fresh size-bounded tmpfs on the working directory (the task's files are
   written into it), on ``/dev/shm`` and on ``/run``. It forks the init process and waits for
   it with the run's deadline; on expiry it kills it. Then it writes one status line for the
   zygote and exits.
2. **Init** (pid 1 of the new pid namespace). Mounts a ``/proc`` that shows only the sandbox,
   makes itself non-dumpable, forks the program process, reaps whatever is re-parented to it,
   and when the program process exits reports its wait status to the supervisor and exits.
   The kernel then kills every process left in the namespace and the supervisor's ``wait``
   returns only after they are gone: whatever the program did (``setsid``, double forks,
   ignoring SIGTERM), nothing of it outlives the run. Without a pid namespace, init and the
   supervisor are child subreapers and kill their children until none is left.
3. **Program process** (forked from init). Gets descriptors 0 (the run's stdin or
   ``/dev/null``), 1 and 2 (``/dev/null``) and 3 (the result pipe) and nothing else, leads its
   own session, works in the working directory, sets hard resource limits, sets
   ``PR_SET_NO_NEW_PRIVS``, drops every capability, applies Landlock (read and execute beneath
   the Python installation and the system's library paths, write only in the working
   directory, no TCP, no signals or ptrace outside the sandbox), reports which mechanisms it
   applied, and then either ``exec``\\ s the run's command (with the short environment
   allowlist) or calls a job of :mod:`alodlm_scoring.sandbox.jobs`.

A mechanism the probe found working is *required* in every later run: if it fails to apply, the
run is not started and reports ``setup_failed`` (fail closed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import select
import signal
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from . import landlock, linux

__all__ = ["Run", "Limits", "Policy", "Result", "JobContext", "execute", "write_paths",
           "nested_landlock", "RESULT_FD"]

RESULT_FD = 3
_CONTROL_FD = 4
_MAX_STDIN = 60 * 1024  # fits in a pipe buffer: written before the fork, never blocks
_RESTORED_SIGNALS = ("SIGPIPE", "SIGXFSZ", "SIGXFZ", "SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD",
                     "SIGALRM", "SIGUSR1", "SIGUSR2")


@dataclasses.dataclass(frozen=True)
class Limits:
    """Hard limits of a run's processes (each per process, except the tmpfs sizes)."""

    address_space_bytes: int = 4 * 1024**3
    file_size_bytes: int = 512 * 1024**2
    open_files: int = 1024
    processes: int = 512  # enforced by the kernel for non-root users only
    core_bytes: int = 0
    workdir_bytes: int = 512 * 1024**2
    shm_bytes: int = 256 * 1024**2


@dataclasses.dataclass(frozen=True)
class Policy:
    """What every run of one zygote applies, decided once (see ``zygote.probe``)."""

    read_paths: tuple[str, ...]
    environment: Mapping[str, str]
    limits: Limits = Limits()
    disabled: frozenset[str] = frozenset()  # mechanisms not to try (tests, --code_sandbox)
    required: frozenset[str] = frozenset()  # mechanisms a run must apply or not start


@dataclasses.dataclass(frozen=True)
class Run:
    """One command (``argv``) or job (``job`` name + ``payload``) to run in the sandbox."""

    timeout: float
    workdir: str
    argv: Sequence[str] | None = None
    job: str | None = None
    payload: Any = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stdin: bytes = b""
    private_workdir: bool = True  # mount a tmpfs on workdir (when a mount namespace exists)
    root: str = ""  # an empty directory where the minimal root is built (set by the zygote)


@dataclasses.dataclass(frozen=True)
class JobContext:
    """What a job (a function run in the program process) knows of its sandbox."""

    read_paths: tuple[str, ...]
    write_paths: tuple[str, ...]
    result_fd: int


@dataclasses.dataclass(frozen=True)
class Result:
    """How a run ended. ``status``: ``exited`` (``code``), ``signaled`` (``signal``),
    ``timeout``, ``setup_failed`` or ``lost`` (the supervisor died)."""

    status: str
    code: int | None = None
    signal: int | None = None
    output: bytes = b""
    output_truncated: bool = False
    elapsed: float = 0.0
    mechanisms: tuple[str, ...] = ()
    error: str | None = None


# --------------------------------------------------------------------------------------------
# The zygote's side: start a supervisor, collect the result
# --------------------------------------------------------------------------------------------


def execute(run: Run, policy: Policy, jobs: Mapping[str, Callable], *,
            max_output: int = 64 * 1024**2) -> Result:
    """Run ``run`` as the module describes and return its :class:`Result`."""
    if len(run.stdin) > _MAX_STDIN:
        raise ValueError("sandbox stdin is limited to 60 KiB")
    result_read, result_write = os.pipe()
    status_read, status_write = os.pipe()
    stdin_read = None
    if run.stdin:
        stdin_read, stdin_write = os.pipe()
        os.write(stdin_write, run.stdin)
        os.close(stdin_write)
    zygote = os.getpid()
    supervisor = os.fork()
    if supervisor == 0:  # ---- supervisor
        try:
            os.close(result_read)
            os.close(status_read)
            _supervise(run, policy, jobs, zygote, result_write, status_write, stdin_read)
        finally:
            os._exit(70)
    for fd in (result_write, status_write, stdin_read):
        if fd is not None:
            os.close(fd)
    try:
        output, truncated, status_text = _collect(supervisor, result_read, status_read,
                                                  run.timeout + 30.0, max_output)
    finally:
        os.close(result_read)
        os.close(status_read)
    return _result(status_text, output, truncated)


def _collect(supervisor: int, result_read: int, status_read: int, backstop: float,
             max_output: int) -> tuple[bytes, bool, bytes]:
    """Read the result pipe and the status pipe until the supervisor is done."""
    deadline = time.monotonic() + backstop
    output = bytearray()
    status = bytearray()
    truncated = False
    open_fds = {result_read, status_read}
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            os.kill(supervisor, signal.SIGKILL)  # init dies with it (parent death signal)
            break
        readable, _, _ = select.select(list(open_fds), [], [], remaining)
        for fd in readable:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
            elif fd == status_read:
                status += chunk[: 65536 - len(status)]
            elif len(output) + len(chunk) > max_output:
                truncated = True  # keep draining so the program is not blocked on a full pipe
            else:
                output += chunk
    os.waitpid(supervisor, 0)
    return bytes(output), truncated, bytes(status)


def _result(status_text: bytes, output: bytes, truncated: bool) -> Result:
    try:
        status = json.loads(status_text)
    except ValueError:
        return Result("lost", output=output, output_truncated=truncated,
                      error="the sandbox supervisor ended without a status")
    return Result(status["status"], status.get("code"), status.get("signal"), output, truncated,
                  status.get("elapsed", 0.0), tuple(status.get("mechanisms", ())),
                  status.get("error"))


# --------------------------------------------------------------------------------------------
# Supervisor
# --------------------------------------------------------------------------------------------


class _SetupFailed(Exception):
    pass


def _report(fd: int, **fields: Any) -> None:
    data = (json.dumps(fields) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _default_signals() -> None:
    for name in _RESTORED_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass


def _attempt(applied: list[str], policy: Policy, name: str, action: Callable[[], Any]) -> bool:
    """Apply one mechanism unless disabled; a failure is fatal only for a required mechanism."""
    if name in policy.disabled:
        return False
    try:
        action()
    except OSError as error:
        if name in policy.required:
            raise _SetupFailed(f"{name}: {error}") from None
        return False
    applied.append(name)
    return True


def _enter_namespaces(applied: list[str], policy: Policy) -> set[str]:
    """Unshare as many namespaces as allowed; returns the names that took effect."""
    wanted = [("mount-namespace", linux.CLONE_NEWNS), ("pid-namespace", linux.CLONE_NEWPID),
              ("network-namespace", linux.CLONE_NEWNET), ("ipc-namespace", linux.CLONE_NEWIPC)]
    wanted = [(name, flag) for name, flag in wanted if name not in policy.disabled]
    flags = 0
    for _, flag in wanted:
        flags |= flag
    uid, gid = os.geteuid(), os.getegid()
    entered: set[str] = set()
    if flags and "user-namespace" not in policy.disabled:
        try:
            linux.unshare(linux.CLONE_NEWUSER | flags)
            linux.map_to_root(uid, gid)
            entered = {"user-namespace"} | {name for name, _ in wanted}
        except OSError:
            entered = set()
            if "user-namespace" in policy.required:
                raise _SetupFailed("user-namespace: unshare failed") from None
    if not entered and flags and uid == 0:  # root without user namespaces (some containers)
        try:
            linux.unshare(flags)
            entered = {name for name, _ in wanted}
        except OSError:
            entered = set()
    missing = (policy.required & ({name for name, _ in wanted} | {"user-namespace"})) - entered
    if missing:
        raise _SetupFailed(f"{', '.join(sorted(missing))}: unshare failed")
    applied.extend(name for name in ("user-namespace", "mount-namespace", "pid-namespace",
                                     "network-namespace", "ipc-namespace") if name in entered)
    return entered


def _prepare_filesystem(run: Run, policy: Policy, applied: list[str], entered: set[str]) -> None:
    if "mount-namespace" in entered:
        linux.make_mounts_private()
        if not _attempt(applied, policy, "minimal-root",
                        lambda: _minimal_root(run, policy, entered, applied)):
            _readonly_machine_root(run, policy, applied, entered)
    for name, text in run.files.items():
        with open(os.path.join(run.workdir, name), "w") as handle:
            handle.write(text)
    os.makedirs(os.path.join(run.workdir, "tmp"), exist_ok=True)


def _minimal_root(run: Run, policy: Policy, entered: set[str], mechanisms: list[str]) -> None:
    """Build a fresh root holding only the allowed paths (read-only binds at their own
    absolute paths), private tmpfs's for ``/tmp``, ``/dev/shm`` and the working directory, and
    pivot into it: the rest of the machine (its sockets, its secrets, even its file names) is
    not in the program's filesystem at all."""
    root = run.root
    limits = policy.limits
    linux.mount_tmpfs(root, 16 * 1024**2, 0o755)
    bound: list[str] = []
    for path in sorted(set(policy.read_paths), key=lambda item: (item.count("/"), item)):
        if path == "/proc" or any(path == done or path.startswith(done.rstrip("/") + "/")
                                  for done in bound):
            continue
        if not os.path.lexists(path):
            continue
        target = root + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(path):
            if not os.path.lexists(target):
                os.symlink(os.readlink(path), target)
            continue
        if os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
        else:
            open(target, "a").close()
        linux.bind_mount(path, target)
        bound.append(path)
    os.makedirs(root + "/proc", exist_ok=True)
    if "pid-namespace" in entered:  # its own /proc (the machine's is still visible here)
        _attempt(mechanisms, policy, "private-proc", lambda: linux.mount_proc(root + "/proc"))
    if "private-proc" not in mechanisms:  # the machine's, read-only
        linux.bind_mount("/proc", root + "/proc")
    for path, size, mode in (("/tmp", limits.shm_bytes, 0o1777), ("/dev/shm", limits.shm_bytes, 0o1777)):
        os.makedirs(root + path, exist_ok=True)
        linux.mount_tmpfs(root + path, size, mode)
    os.makedirs(root + run.workdir, exist_ok=True)
    linux.mount_tmpfs(root + run.workdir, limits.workdir_bytes)
    linux.remount_read_only(root)
    linux.pivot_to(root)
    mechanisms.extend(["read-only-filesystem", "private-workdir", "private-dev-shm", "private-tmp"])


def _readonly_machine_root(run: Run, policy: Policy, applied: list[str],
                           entered: set[str]) -> None:
    """Where a new root cannot be built: the machine's mounts, all read-only, with private
    tmpfs's on the working directory, ``/dev/shm`` and ``/run``."""
    limits = policy.limits
    _attempt(applied, policy, "read-only-filesystem", linux.make_mounts_read_only)
    if run.private_workdir:
        _attempt(applied, policy, "private-workdir",
                 lambda: linux.mount_tmpfs(run.workdir, limits.workdir_bytes))
    _attempt(applied, policy, "private-dev-shm",
             lambda: linux.mount_tmpfs("/dev/shm", limits.shm_bytes, 0o1777))
    if os.path.isdir("/run"):
        _attempt(applied, policy, "private-run", lambda: linux.mount_tmpfs("/run", 1 << 20, 0o755))
    if "pid-namespace" in entered:
        _attempt(applied, policy, "private-proc", linux.mount_proc)


def _supervise(run: Run, policy: Policy, jobs: Mapping[str, Callable], zygote: int,
               result_write: int, status_write: int, stdin_read: int | None) -> None:
    started = time.monotonic()
    applied: list[str] = []
    try:
        linux.close_fds_except([fd for fd in (result_write, status_write, stdin_read) if fd])
        linux.set_parent_death_signal()
        if os.getppid() != zygote:
            os._exit(71)
        _default_signals()
        entered = _enter_namespaces(applied, policy)
        if "pid-namespace" not in entered:
            linux.set_child_subreaper()
        control_read, control_write = os.pipe()
        init = os.fork()
        if init == 0:  # ---- init
            try:
                os.close(control_read)
                os.close(status_write)
                _init(run, policy, jobs, entered, result_write, control_write, stdin_read)
            finally:
                os._exit(70)
        os.close(control_write)
        os.close(result_write)
        if stdin_read is not None:
            os.close(stdin_read)
        timed_out = _wait_with_deadline(init, run.timeout)
        if "pid-namespace" not in entered:
            linux.kill_children()
        reports = _read_all(control_read)
        elapsed = time.monotonic() - started
        status = _status_from(reports, timed_out)
        applied.extend(status.pop("program_mechanisms", []))
        _report(status_write, elapsed=elapsed, mechanisms=applied, **status)
    except _SetupFailed as error:
        _report(status_write, status="setup_failed", error=str(error), mechanisms=applied,
                elapsed=time.monotonic() - started)
    except BaseException as error:  # noqa: BLE001 - reported, never raised into the zygote
        _report(status_write, status="setup_failed", error=f"{type(error).__name__}: {error}",
                mechanisms=applied, elapsed=time.monotonic() - started)
    os._exit(0)


def _wait_with_deadline(pid: int, timeout: float) -> bool:
    """Wait for child ``pid`` at most ``timeout`` seconds; kill it at the deadline. Returns
    whether it timed out. Killing init takes its whole pid namespace with it, and ``waitpid``
    returns only once every process of the namespace is gone."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        timed_out = not poller.poll(max(timeout, 0.0) * 1000.0)
    finally:
        os.close(pidfd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return timed_out


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


def _status_from(reports: list[dict], timed_out: bool) -> dict:
    setup = next((r for r in reports if "applied" in r or "setup_error" in r), {})
    if "setup_error" in setup:
        return {"status": "setup_failed", "error": setup["setup_error"],
                "program_mechanisms": setup.get("applied", [])}
    mechanisms = setup.get("applied", [])
    if timed_out:
        return {"status": "timeout", "program_mechanisms": mechanisms}
    final = next((r for r in reports if "wait_status" in r), None)
    if final is None:
        return {"status": "lost", "error": "the sandbox init process ended without a status",
                "program_mechanisms": mechanisms}
    wait_status = final["wait_status"]
    if os.WIFSIGNALED(wait_status):
        return {"status": "signaled", "signal": os.WTERMSIG(wait_status),
                "program_mechanisms": mechanisms}
    return {"status": "exited", "code": os.WEXITSTATUS(wait_status),
            "program_mechanisms": mechanisms}


# --------------------------------------------------------------------------------------------
# Init
# --------------------------------------------------------------------------------------------


def _init(run: Run, policy: Policy, jobs: Mapping[str, Callable], entered: set[str],
          result_write: int, control_write: int, stdin_read: int | None) -> None:
    supervisor = os.getppid()
    linux.set_parent_death_signal()
    if os.getppid() != supervisor:
        os._exit(71)
    mechanisms: list[str] = []
    try:  # here, not in the supervisor: only a process of the new pid namespace can mount its /proc
        _prepare_filesystem(run, policy, mechanisms, entered)
    except BaseException as error:  # noqa: BLE001 - reported; the program never starts
        _report(control_write, setup_error=str(error) if isinstance(error, _SetupFailed)
                else f"filesystem: {type(error).__name__}: {error}", applied=mechanisms)
        os._exit(0)
    if "pid-namespace" not in entered:
        linux.set_child_subreaper()
    linux.set_dumpable(False)
    program = os.fork()
    if program == 0:  # ---- program process
        try:
            _program(run, policy, jobs, mechanisms, result_write, control_write, stdin_read)
        finally:
            os._exit(126)
    os.close(result_write)
    if stdin_read is not None:
        os.close(stdin_read)
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == program:
            break
    if "pid-namespace" not in entered:
        linux.kill_children()
    _report(control_write, wait_status=wait_status)
    os._exit(0)


# --------------------------------------------------------------------------------------------
# Program process
# --------------------------------------------------------------------------------------------


def _limits(policy: Policy) -> dict[int, int]:
    limits = policy.limits
    table = {
        resource.RLIMIT_AS: limits.address_space_bytes,
        resource.RLIMIT_FSIZE: limits.file_size_bytes,
        resource.RLIMIT_NOFILE: limits.open_files,
        resource.RLIMIT_CORE: limits.core_bytes,
    }
    if os.geteuid() != 0:  # root is exempt from RLIMIT_NPROC; a low value would only mislead
        table[resource.RLIMIT_NPROC] = limits.processes
    return table


def _program(run: Run, policy: Policy, jobs: Mapping[str, Callable], mechanisms: list[str],
             result_write: int, control_write: int, stdin_read: int | None) -> None:
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(stdin_read if stdin_read is not None else null, 0)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.dup2(result_write, RESULT_FD)
        os.dup2(control_write, _CONTROL_FD)
        linux.close_fds_except([RESULT_FD, _CONTROL_FD])
        mechanisms.append("closed-file-descriptors")
        _default_signals()
        os.chdir(run.workdir)
        os.umask(0o022)
        _attempt(mechanisms, policy, "hard-rlimits", lambda: linux.hard_limits(_limits(policy)))
        _attempt(mechanisms, policy, "no-new-privileges", linux.set_no_new_privs)
        if "capabilities" not in policy.disabled:
            try:
                if linux.drop_capabilities():
                    mechanisms.append("capabilities-dropped")
            except OSError as error:
                if "capabilities-dropped" in policy.required:
                    raise _SetupFailed(f"capabilities-dropped: {error}") from None
        _apply_landlock(run, policy, mechanisms)
        environment = dict(policy.environment)
        environment.update(HOME=run.workdir, TMPDIR=os.path.join(run.workdir, "tmp"))
        mechanisms.append("environment-allowlist")
    except BaseException as error:  # noqa: BLE001
        _report(_CONTROL_FD if _fd_open(_CONTROL_FD) else control_write,
                setup_error=str(error) if isinstance(error, _SetupFailed)
                else f"{type(error).__name__}: {error}", applied=mechanisms)
        os._exit(126)
    _report(_CONTROL_FD, applied=mechanisms)
    os.close(_CONTROL_FD)
    if run.argv is not None:
        try:
            os.execve(run.argv[0], list(run.argv), environment)
        finally:
            os._exit(127)
    os.environ.clear()
    os.environ.update(environment)
    tempfile.tempdir = environment["TMPDIR"]  # the zygote's cached choice is not ours
    try:
        jobs[run.job](run.payload, JobContext(policy.read_paths, tuple(write_paths(run.workdir, mechanisms)),
                                              RESULT_FD))
    except BaseException:  # noqa: BLE001 - the job's own failure: the verdict reads the output
        os._exit(1)
    os._exit(0)


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def write_paths(workdir: str, mechanisms: Sequence[str]) -> list[str]:
    """Where a sandboxed program may write: its working directory (with its temporary
    directory), the harmless devices, ``/dev/shm`` (multiprocessing's semaphores; a private
    tmpfs when a mount namespace exists, else the machine's) and, in a minimal root, its
    private ``/tmp``."""
    paths = [workdir, os.devnull, "/dev/zero", "/dev/full", "/dev/shm"]
    if "minimal-root" in mechanisms:
        paths.append("/tmp")
    return paths


def _apply_landlock(run: Run, policy: Policy, mechanisms: list[str]) -> None:
    if "landlock" in policy.disabled:
        return
    abi = landlock.abi_version()
    if abi < 1:
        if policy.required & set(landlock.features(1)):
            raise _SetupFailed("landlock: not available")
        return
    try:
        landlock.restrict(policy.read_paths, write_paths(run.workdir, mechanisms), abi=abi)
    except OSError as error:
        if policy.required & set(landlock.features(1)):
            raise _SetupFailed(f"landlock: {error}") from None
        return
    mechanisms.extend(landlock.features(abi))


def nested_landlock(context: JobContext) -> None:
    """Called in a process forked inside the sandbox: a nested Landlock domain with the same
    rules, so the forked process can no longer signal or trace the one that forked it."""
    abi = landlock.abi_version()
    if abi >= 1:
        landlock.restrict(context.read_paths, context.write_paths, abi=abi)
