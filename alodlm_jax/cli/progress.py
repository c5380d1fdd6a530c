"""What a long command is doing, for a person watching its terminal or reading its log: phase
lines and the tasks' progress, on stderr (stdout stays the command's result); ``--quiet``: none.

A phase line says what starts now (``alodlm-jax-evaluate: loading the model builtin:tiny``), on a
terminal and in a log alike. The tasks' progress depends on where stderr goes:

* a terminal: tqdm's task bar, with the count, the elapsed time, the estimated time left and the
  rate;
* anything else (a log file, a pipe: ``nohup``, a scheduler, ``| tee``): plain lines
  (``alodlm-jax-evaluate: evaluated 12/42 (28 %), 0:31 elapsed, about 1:17 left``), one as the
  tasks start, then one each time another 5 % of the tasks is done and at the end; and whenever
  30 s pass without a line (a long compile, a slow task), a line saying what is still running.

:class:`Progress` is also the ``progress(done, total)`` callback of
``alodlm_scoring.evaluation.evaluate``. :func:`compiling` wraps a compile step: a phase line before
it and, after it, how many XLA programs were compiled and how many read from JAX's persistent
compilation cache (counted from JAX's monitoring events). No JAX is imported here until a compile
step is wrapped.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from typing import Iterator, TextIO

__all__ = ["Progress", "compiling", "is_terminal", "LOG_INTERVAL_SECONDS", "LOG_STEP"]

LOG_INTERVAL_SECONDS = 30.0  # off a terminal: the longest time without a line
LOG_STEP = 0.05  # off a terminal: a progress line each time this fraction more tasks is done


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes and captures)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on) of a duration, rounded down to the second."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Phase lines and the tasks' progress on ``stream`` (stderr), unless ``quiet``: a task bar on
    a terminal, plain lines elsewhere (module docstring). Off a terminal, a line is written at
    least every ``interval`` seconds from the first phase line until :meth:`close`, and a progress
    line each time another ``step`` of the tasks is done. Every write is flushed."""

    def __init__(self, prog: str, stream: TextIO | None = None, *, quiet: bool = False,
                 label: str = "tasks", interval: float = LOG_INTERVAL_SECONDS,
                 step: float = LOG_STEP) -> None:
        self.prog = prog
        self.stream = sys.stderr if stream is None else stream
        self.enabled = not quiet
        self.terminal = self.enabled and is_terminal(self.stream)
        self.label = label
        self.interval = interval
        self.step = step
        self._bar = None
        # Off a terminal: the plain lines' state, shared with the heartbeat thread.
        self._lock = threading.Lock()
        self._created = self._last_line = time.monotonic()
        self._phase: tuple[str, float] | None = None  # the running phase and when it started
        self._counts: tuple[int, int] | None = None  # (done, total) once the tasks have started
        self._initial = 0
        self._started = 0.0  # when the tasks started, moved on by exclude_pause
        self._last_update = 0.0
        self._logged_steps = -1
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _write(self, line: str) -> None:
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = time.monotonic()

    def phase(self, text: str) -> None:
        """One line: ``<prog>: <text>`` (above the bar while one is shown)."""
        if not self.enabled:
            return
        line = f"{self.prog}: {text}"
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
            return
        if not self.terminal:
            self._phase = (text, time.monotonic())
            self._start_heartbeat()
        self._write(line)

    def phase_done(self, text: str) -> None:
        """One line saying how the running phase went (``<prog>: <text>``); off a terminal, what
        follows is no longer that phase."""
        self.phase(text)
        self._phase = None

    def __call__(self, done: int, total: int) -> None:
        """The evaluation's callback: ``done`` of ``total`` tasks are complete."""
        if not self.enabled:
            return
        if not self.terminal:
            self._log(done, total)
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

    def _log(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._counts is None:  # the tasks start (or resume)
            if done:
                self.phase(f"resuming after {done}/{total} rows")
            self._initial, self._started = done, now
            self._start_heartbeat()
        self._counts, self._last_update, self._phase = (done, total), now, None
        steps = math.floor(done / total / self.step) if total else 0
        if steps > self._logged_steps or done >= total:
            self._logged_steps = steps
            self._write(self._progress_line(now))

    def _progress_line(self, now: float) -> str:
        done, total = self._counts
        percent = 100 * done // total if total else 100
        elapsed = now - self._started
        line = (f"{self.prog}: {self.label} {done}/{total} ({percent} %), "
                f"{clock(elapsed)} elapsed")
        if done > self._initial and done < total:
            left = elapsed / (done - self._initial) * (total - done)
            line += f", about {clock(left)} left"
        return line

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None and self.interval > 0:
            self._heartbeat = threading.Thread(target=self._beat, name="progress-heartbeat",
                                               daemon=True)
            self._heartbeat.start()

    def _beat(self) -> None:
        """Off a terminal: a line whenever ``interval`` seconds pass without one."""
        while True:
            with self._lock:
                wait = self._last_line + self.interval - time.monotonic()
            if self._stop.wait(max(wait, 0.0)):
                return
            with self._lock:
                due = time.monotonic() - self._last_line >= self.interval
            if not due:
                continue
            now = time.monotonic()
            phase = self._phase
            if phase is not None:
                line = f"{self.prog}: still {phase[0]} ({clock(now - phase[1])} so far)"
            elif self._counts is not None:
                line = self._progress_line(now)
            else:
                line = f"{self.prog}: still working ({clock(now - self._created)} elapsed)"
            self._write(line)

    def exclude_pause(self) -> None:
        """Leaves the time since the tasks' last update out of their elapsed time and rate (a
        compile step ran meanwhile), so that the time left is estimated from the tasks alone."""
        if self._bar is not None:
            self._bar.unpause()
            self._bar.refresh()
        elif self._counts is not None:
            now = time.monotonic()
            self._started += now - self._last_update
            self._last_update = now

    def close(self) -> None:
        """Ends the bar (its last state stays on the terminal) and the plain lines."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._stop.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join()
            self._heartbeat = None


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
        progress.phase_done(f"programs ready in {seconds:.1f} s (already compiled in this process)")
    elif hits == 0:
        progress.phase_done(f"{programs} XLA program(s) compiled in {seconds:.1f} s")
    elif hits == programs:
        progress.phase_done(f"{programs} XLA program(s) read from the compilation cache in "
                            f"{seconds:.1f} s")
    else:
        progress.phase_done(f"{programs} XLA program(s) ready in {seconds:.1f} s: "
                            f"{programs - hits} compiled, {hits} read from the compilation cache")
