"""The code sandbox: every program that scoring runs, contained by the kernel's own mechanisms.

Layout (one job per module):

* :mod:`.landlock` — Landlock rulesets (filesystem, TCP, signal and socket scopes);
* :mod:`.linux` — namespaces, mounts, ``prctl`` switches, capabilities, limits;
* :mod:`.mechanisms` — the mechanisms by name, what programs may read, the environment allowlist;
* :mod:`.process` — the sandbox's processes (outer, host, program), written once;
* :mod:`.zygote` — starting the sandbox, the worker's handle on it, the host's serve loop;
* :mod:`.jobs` — functions run inside the sandbox (evalplus's checker, strict output capture,
  canonical-solution ground truth, the test process of strict python_tests);
* :mod:`.calls` — strict python_tests' call channel: the test process's side, and the program
  process's command (:mod:`.program_server`).

:class:`Sandbox` is what a scoring worker uses. It works with whatever the machine allows: a
missing mechanism (an older kernel, a container that refuses namespaces) is left out and named in
:attr:`Sandbox.missing`; nothing is silently assumed. ``ALODLM_SANDBOX_DISABLE`` (a comma list of
mechanism groups: ``user-namespace``, ``mount-namespace``, ``pid-namespace``,
``network-namespace``, ``ipc-namespace``, ``landlock``, ``capabilities``, ``hard-rlimits``,
``no-new-privileges``) turns mechanisms off, to test the fallbacks.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping, Sequence

from .records import Limits, Result, Run

__all__ = ["Sandbox", "Limits", "Result", "DISABLE_VARIABLE", "disabled_from_environment"]

DISABLE_VARIABLE = "ALODLM_SANDBOX_DISABLE"

def disabled_from_environment(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Mechanism groups turned off through ``ALODLM_SANDBOX_DISABLE``."""
    environ = os.environ if environ is None else environ
    text = environ.get(DISABLE_VARIABLE, "")
    return frozenset(part.strip() for part in text.split(",") if part.strip())


class Sandbox:
    """A started zygote plus the two ways to use it: a command or a job."""

    def __init__(self, *, scratch: str | None = None, disabled: frozenset[str] | None = None,
                 limits: Limits | None = None) -> None:
        from .zygote import Zygote

        self._own_scratch = scratch is None
        self.scratch = scratch or tempfile.mkdtemp(prefix="alodlm-sandbox-")
        disabled = disabled_from_environment() if disabled is None else disabled
        self._zygote = Zygote(self.scratch, disabled=frozenset(disabled),
                              limits=Limits.for_machine() if limits is None else limits)

    def start(self) -> "Sandbox":
        self._zygote.start()
        return self

    @property
    def pid(self) -> int | None:
        """The sandbox's outer process id (None before ``start``); the runs are below it."""
        return self._zygote.pid

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms in force for every run (see :mod:`.mechanisms`)."""
        return self._zygote.mechanisms

    @property
    def missing(self) -> tuple[str, ...]:
        """The mechanisms this machine (or the settings) did not allow."""
        return self._zygote.missing

    def run_command(self, argv: Sequence[str], *, timeout: float,
                    files: Mapping[str, str] | None = None) -> Result:
        """``exec`` ``argv`` in the sandbox (working directory holding ``files``)."""
        return self._zygote.run(Run(timeout=timeout, argv=tuple(argv), files=dict(files or {})))

    def run_job(self, job: str, payload: Any, *, timeout: float,
                server: Sequence[str] | None = None,
                files: Mapping[str, str] | None = None) -> Result:
        """Call ``jobs.JOBS[job](payload, ...)`` in a sandboxed fork of the zygote; with
        ``server``, that command runs beside it (working directory holding ``files``) as the
        run's second program process, connected to the job by a channel (:class:`Run`)."""
        return self._zygote.run(Run(timeout=timeout, job=job, payload=payload,
                                    server=None if server is None else tuple(server),
                                    files=dict(files or {})))

    def close(self) -> None:
        self._zygote.close()
        if self._own_scratch:
            from .process import remove_tree

            remove_tree(self.scratch)

    def __enter__(self) -> "Sandbox":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
