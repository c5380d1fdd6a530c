"""The records every stage of the sandbox shares (:mod:`alodlm_scoring.sandbox.process` describes
the stages): a run, its limits and policy, what a job knows of its sandbox, how a run ended, and
the descriptor numbers a program process gets."""

from __future__ import annotations

import dataclasses
import os
import resource
from typing import Any, Mapping, Sequence

__all__ = ["Run", "Limits", "Policy", "Result", "JobContext", "SetupFailed", "RESULT_FD",
           "CONTROL_FD", "CHANNEL_FD"]

RESULT_FD = 3
CONTROL_FD = 4
CHANNEL_FD = 5  # a job's end of the channel to its run's server


@dataclasses.dataclass(frozen=True)
class Limits:
    """Hard limits of a run's processes (each per process, except the tmpfs sizes)."""

    address_space_bytes: int = 4 * 1024**3
    file_size_bytes: int = 512 * 1024**2
    open_files: int = 1024
    processes: int = 512  # RLIMIT_NPROC (non-root users) and the pids cgroup's pids.max
    core_bytes: int = 0
    workdir_bytes: int = 512 * 1024**2
    tmp_bytes: int = 256 * 1024**2

    @classmethod
    def for_machine(cls, environ: Mapping[str, str] | None = None) -> "Limits":
        """The defaults with the address-space cap the reference's children get: python_tests'
        4 GiB and evalplus's ``EVALPLUS_MAX_MEMORY_BYTES`` (default 4 GiB; ``-1``: none), each
        at most the machine's memory. The hard cap is the larger of the two, so that neither
        program's own limit can fail against it."""
        environ = os.environ if environ is None else environ
        default = 4 * 1024**3
        try:
            physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            physical = None
        at_most = (lambda value: min(value, physical)) if physical else (lambda value: value)
        try:
            setting = int(environ.get("EVALPLUS_MAX_MEMORY_BYTES", default))
        except ValueError:
            setting = default
        evalplus = resource.RLIM_INFINITY if setting == -1 else at_most(setting)
        cap = (resource.RLIM_INFINITY if evalplus == resource.RLIM_INFINITY
               else max(at_most(default), evalplus))
        return cls(address_space_bytes=cap)


@dataclasses.dataclass(frozen=True)
class Policy:
    """What every run of one host applies."""

    read_paths: tuple[str, ...]
    environment: Mapping[str, str]
    limits: Limits = Limits()
    disabled: frozenset[str] = frozenset()  # mechanisms not to try (tests, fallbacks)
    required: frozenset[str] = frozenset()  # mechanisms a run must apply or not start


@dataclasses.dataclass(frozen=True)
class Run:
    """One command (``argv``) or job (``job`` name + ``payload``) to run in the sandbox.

    A job may have a ``server``: a command run beside it, as a second program process of the
    same run, with one end of a socket pair as its descriptor 3 and the other end as the job's
    :attr:`JobContext.channel_fd`. The run's result is the job's, with the server's own exit
    status (:attr:`Result.server_code`) when it ended by itself after the job."""

    timeout: float
    argv: Sequence[str] | None = None
    job: str | None = None
    payload: Any = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    server: Sequence[str] | None = None


@dataclasses.dataclass(frozen=True)
class JobContext:
    """What a job (a function run in the program process) knows of its sandbox."""

    read_paths: tuple[str, ...]
    write_paths: tuple[str, ...]
    result_fd: int
    channel_fd: int | None = None  # the channel to the run's server, when it has one


@dataclasses.dataclass(frozen=True)
class Result:
    """How a run ended. ``status``: ``exited`` (``code``), ``signaled`` (``signal``),
    ``timeout``, ``setup_failed`` or ``lost`` (the sandbox itself failed). With a server:
    ``server_code``, the server's exit status when the job exited with 0 and the server then
    exited by itself before the deadline (``None`` otherwise: it was killed)."""

    status: str
    code: int | None = None
    signal: int | None = None
    output: bytes = b""
    output_truncated: bool = False
    elapsed: float = 0.0
    mechanisms: tuple[str, ...] = ()
    error: str | None = None
    server_code: int | None = None


class SetupFailed(Exception):
    """A required mechanism could not be applied."""

