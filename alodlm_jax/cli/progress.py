"""What a long command is doing, for a person watching its terminal: phase lines and a task bar.

Everything goes to stderr, and only when stderr is a terminal and the command was not given
``--quiet`` (the convention of tqdm's ``disable=None`` and of lm-eval's bars): logs, pipes and
tests see none of it, and stdout stays the command's result. A phase line says what starts now
(``alodlm-jax-evaluate: loading the model builtin:tiny``); the task bar is tqdm's, with the count,
the elapsed time, the estimated time left and the rate.

:class:`Progress` is also the ``progress(done, total)`` callback of
``alodlm_scoring.evaluation.evaluate``. :func:`compiling` wraps a compile step: a phase line before
it and, after it, how many XLA programs were compiled and how many read from JAX's persistent
compilation cache (counted from JAX's monitoring events). No JAX is imported here until a compile
step is wrapped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Iterator, TextIO

__all__ = ["Progress", "compiling", "is_terminal"]


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes and captures)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """Phase lines and one task bar on ``stream`` (stderr), shown only on a terminal and when not
    ``quiet``; otherwise every method does nothing."""

    def __init__(self, prog: str, stream: TextIO | None = None, *, quiet: bool = False,
                 label: str = "tasks") -> None:
        self.prog = prog
        self.stream = sys.stderr if stream is None else stream
        self.enabled = not quiet and is_terminal(self.stream)
        self.label = label
        self._bar = None

    def phase(self, text: str) -> None:
        """One line: ``<prog>: <text>`` (above the bar while one is shown)."""
        if not self.enabled:
            return
        line = f"{self.prog}: {text}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def __call__(self, done: int, total: int) -> None:
        """The evaluation's callback: ``done`` of ``total`` tasks are complete."""
        if not self.enabled:
            return
        if self._bar is None:
            from tqdm import tqdm

            if done:
                self.phase(f"resuming after {done}/{total} rows")
            try:
                width, height = os.get_terminal_size(self.stream.fileno())
            except (AttributeError, ValueError, OSError):
                width = height = 0
            # A terminal that reports no size (some pseudo-terminals) would hide tqdm's bar.
            size = ({"dynamic_ncols": True} if width > 0 and height > 0
                    else {"ncols": 100, "nrows": 24})
            self._bar = tqdm(total=total, initial=done, desc=self.label, unit="task",
                             file=self.stream, leave=True, **size)
            return
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def exclude_pause(self) -> None:
        """Leaves the time since the bar's last update out of its elapsed time and rate (a compile
        step ran meanwhile), so that the time left is estimated from the tasks alone."""
        if self._bar is not None:
            self._bar.unpause()
            self._bar.refresh()

    def close(self) -> None:
        """Ends the bar (its last state stays on the terminal)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class _CompileCounter:
    """Counts, from JAX's monitoring events, the XLA programs this process compiled or read back
    from the persistent compilation cache. Listeners are registered once per process."""

    _lock = threading.Lock()
    _registered = False
    programs = 0  # every backend compile request (compiled or read from the cache)
    cache_hits = 0

    @classmethod
    def register(cls) -> None:
        with cls._lock:
            if cls._registered:
                return
            import jax.monitoring

            def on_duration(event: str, duration: float, **kwargs) -> None:
                if event == "/jax/core/compile/backend_compile_duration":
                    cls.programs += 1

            def on_event(event: str, **kwargs) -> None:
                if event == "/jax/compilation_cache/cache_hits":
                    cls.cache_hits += 1

            jax.monitoring.register_event_duration_secs_listener(on_duration)
            jax.monitoring.register_event_listener(on_event)
            cls._registered = True


@contextlib.contextmanager
def compiling(progress: Progress, what: str, cache_dir: str | None) -> Iterator[None]:
    """Wraps a compile step (imports JAX): says it starts, then how it went.

    ``what`` names the programs (``the decoding programs for 42 prompts``); ``cache_dir`` is the
    persistent compilation cache in use, or None when it is off.
    """
    if not progress.enabled:
        yield
        return
    _CompileCounter.register()
    programs, hits = _CompileCounter.programs, _CompileCounter.cache_hits
    if cache_dir:
        progress.phase(f"compiling {what} (or reading them from the compilation cache in "
                       f"{cache_dir})")
    else:
        progress.phase(f"compiling {what}")
    start = time.monotonic()
    yield
    seconds = time.monotonic() - start
    progress.exclude_pause()
    programs = _CompileCounter.programs - programs
    hits = _CompileCounter.cache_hits - hits
    if programs == 0:
        progress.phase(f"programs ready in {seconds:.1f} s (already compiled in this process)")
    elif hits == 0:
        progress.phase(f"{programs} XLA program(s) compiled in {seconds:.1f} s")
    elif hits == programs:
        progress.phase(f"{programs} XLA program(s) read from the compilation cache in "
                       f"{seconds:.1f} s")
    else:
        progress.phase(f"{programs} XLA program(s) ready in {seconds:.1f} s: {programs - hits} "
                       f"compiled, {hits} read from the compilation cache")
