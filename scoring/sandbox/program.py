"""The program process of a run (step 4 of :mod:`alodlm_scoring.sandbox.process`), forked from the
host: its descriptors, session, resource limits, privileges and Landlock domain, then the run's
command or job; and the helpers the host's own set-up shares with it (:func:`attempt`: one
mechanism, fatal only when required)."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import tempfile
from typing import Any, Callable, Mapping, Sequence

from . import landlock, linux
from .records import CHANNEL_FD, CONTROL_FD, RESULT_FD, JobContext, Policy, Run, SetupFailed

__all__ = ["start", "attempt", "report", "default_signals", "write_paths", "nested_landlock"]

_DEVICES = (os.devnull, "/dev/zero", "/dev/full")
_RESTORED_SIGNALS = ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM", "SIGHUP", "SIGCHLD", "SIGALRM",
                     "SIGUSR1", "SIGUSR2")


def report(fd: int, **fields: Any) -> None:
    data = (json.dumps(fields) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def default_signals() -> None:
    """Default dispositions (Python ignores SIGPIPE and SIGXFSZ and handles SIGINT)."""
    for name in _RESTORED_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass


def attempt(applied: list[str], policy: Policy, name: str, action: Callable[[], Any]) -> bool:
    """Apply one mechanism unless disabled; a failure is fatal only for a required mechanism."""
    if name in policy.disabled:
        return False
    try:
        action()
    except OSError as error:
        if name in policy.required:
            raise SetupFailed(f"{name}: {error}") from None
        return False
    applied.append(name)
    return True



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


def start(run: Run, policy: Policy, jobs: Mapping[str, Callable], workdir: str,
          mechanisms: list[str], result_write: int, control_write: int,
          channel: int | None = None) -> None:
    """A program process. With a ``channel`` it is a server's client (the test process of
    strict python_tests): it works in ``/`` and may write nowhere but the harmless devices, so
    that nothing the server's program writes is where it reads, and nothing it holds is where
    the server's program may write."""
    try:
        os.setsid()
        # Out of the way of the numbers they get below, whatever numbers the host gave them.
        result_write, control_write = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
                                       for fd in (result_write, control_write))
        if channel is not None:
            channel = fcntl.fcntl(channel, fcntl.F_DUPFD, 10)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.dup2(result_write, RESULT_FD)
        os.dup2(control_write, CONTROL_FD)
        kept = [RESULT_FD, CONTROL_FD]
        if channel is not None:
            os.dup2(channel, CHANNEL_FD)
            kept.append(CHANNEL_FD)
        linux.close_fds_except(kept)
        mechanisms.append("closed-file-descriptors")
        default_signals()
        os.chdir(workdir if channel is None else "/")
        os.umask(0o022)
        attempt(mechanisms, policy, "hard-rlimits", lambda: linux.hard_limits(_limits(policy)))
        attempt(mechanisms, policy, "no-new-privileges", linux.set_no_new_privs)
        if "capabilities" not in policy.disabled:
            try:
                if linux.drop_capabilities():
                    mechanisms.append("capabilities-dropped")
            except OSError as error:
                if "capabilities-dropped" in policy.required:
                    raise SetupFailed(f"capabilities-dropped: {error}") from None
        writable = write_paths(workdir, mechanisms) if channel is None else list(_DEVICES)
        _apply_landlock(policy, writable, mechanisms)
        environment = dict(policy.environment)
        environment.update(HOME=workdir, TMPDIR=os.path.join(workdir, "tmp"))
        mechanisms.append("environment-allowlist")
        missing = sorted(policy.required - set(mechanisms))
        if missing:
            raise SetupFailed(f"{', '.join(missing)}: not applied")
    except BaseException as error:  # noqa: BLE001 - reported; the program never starts
        message = str(error) if isinstance(error, SetupFailed) else f"{type(error).__name__}: {error}"
        try:
            report(CONTROL_FD, setup_error=message, applied=mechanisms)
        except OSError:
            report(control_write, setup_error=message, applied=mechanisms)
        os._exit(126)
    report(CONTROL_FD, applied=mechanisms)
    os.close(CONTROL_FD)
    if run.argv is not None:
        try:
            os.execve(run.argv[0], list(run.argv), environment)
        finally:
            os._exit(127)
    os.environ.clear()
    os.environ.update(environment)
    tempfile.tempdir = environment["TMPDIR"]  # the host's cached choice is not ours
    try:
        jobs[run.job](run.payload, JobContext(policy.read_paths, tuple(writable), RESULT_FD,
                                              None if channel is None else CHANNEL_FD))
    except BaseException:  # noqa: BLE001 - the job's own failure: the verdict reads the output
        os._exit(1)
    os._exit(0)


def write_paths(workdir: str, mechanisms: Sequence[str]) -> list[str]:
    """Where a sandboxed program may write: its working directory (with its temporary
    directory), the harmless devices, ``/dev/shm`` (multiprocessing's semaphores; a private
    tmpfs when a mount namespace exists, else the machine's) and, in a minimal root, its
    private ``/tmp``."""
    paths = [workdir, *_DEVICES, "/dev/shm"]
    if "minimal-root" in mechanisms:
        paths.append("/tmp")
    return paths


def _apply_landlock(policy: Policy, writable: Sequence[str], mechanisms: list[str]) -> None:
    if "landlock" in policy.disabled:
        return
    abi = landlock.abi_version()
    if abi < 1:
        return
    try:
        landlock.restrict(policy.read_paths, writable, abi=abi)
    except OSError:
        return  # reported as missing; fatal when required (checked by the caller)
    mechanisms.extend(landlock.features(abi))


def nested_landlock(context: JobContext) -> None:
    """Called in a process forked inside the sandbox: a nested Landlock domain with the same
    rules, so the forked process can no longer signal or trace the one that forked it."""
    abi = landlock.abi_version()
    if abi >= 1:
        landlock.restrict(context.read_paths, context.write_paths, abi=abi)
