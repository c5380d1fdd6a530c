"""The engine loop: one thread owns the batch program and serves requests as they arrive.

The loop (:class:`EngineLoop`) holds the compiled engine's batch and admit programs for one
bucket (the server's longest prompt, its ``--batch_size`` slots), the batch's cache and slots. It
admits waiting requests into free slots (the admit program: a request's prefill), then runs the
batch program (:func:`alodlm_jax.decode.batched.run_program`) with a step budget: one execution
returns when a request finishes while others wait, and in any case after ``step_budget`` steps, so
a request that arrives while every running request is mid-window starts within that many steps of
the slot being free, and the committed tokens of every request reach its listener after every
execution (streaming). A request's tokens are the ones the batch program decodes for it, which
equal decoding it alone (:mod:`alodlm_jax.decode.batched`): neither the budget nor the other
requests of the batch moves them (tests/decode_compiled, tests/serve).

Listeners (:class:`Request`) get events from the loop's thread through their ``notify`` callable:
``("tokens", ids)`` (all committed ids so far, after each execution that committed some),
``("done", DecodeOutput)`` and ``("error", message)``. A cancelled request (a client gone, a stop
string seen) frees its slot at the loop's next turn: the slot is marked finished, the batch
program skips it, and its partial result is reported as ``done``.

An exception while a program runs fails the requests in the batch (``error``), and the loop
starts again from empty slots and a fresh cache; the server goes on.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.decode import batched, scheduler
from alodlm_jax.decode import window as W


class QueueFull(Exception):
    """More requests wait than the server accepts (``--max_waiting``)."""


class Stopped(Exception):
    """The loop is draining or stopped: it takes no new request."""


_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class Request:
    """One request's prompt and its listener ``notify(kind, payload)`` (called from the loop's
    thread)."""

    prompt_ids: Sequence[int]
    notify: Callable[[str, object], None]
    number: int = dataclasses.field(default_factory=lambda: next(_ids))
    arrived: float = dataclasses.field(default_factory=time.monotonic)
    cancelled: bool = False
    admitted: float | None = None


class EngineLoop:
    """Continuous batching of requests that arrive over time (module docstring).

    ``engine``: a :class:`~alodlm_jax.decode.compiled.CompiledEngine`; ``max_prompt_tokens``
    fixes the bucket; ``step_budget``: the most steps of one batch execution; ``max_waiting``: the
    most requests waiting for a slot when every slot is taken (:class:`QueueFull` beyond).
    ``on_change(waiting, running)`` is called whenever they change, ``on_finished(output)`` with
    every request's :class:`~alodlm_jax.decode.result.DecodeOutput` (partial for a cancelled
    one; metrics). Construction compiles both programs.
    """

    def __init__(self, engine, *, batch_size: int, max_prompt_tokens: int, step_budget: int,
                 max_waiting: int, on_change: Callable[[int, int], None] | None = None,
                 on_finished: Callable[[object], None] | None = None):
        self.engine = engine
        self.bucket = engine.bucket_for(max_prompt_tokens, batch=batch_size)
        self.max_prompt_tokens = max_prompt_tokens
        self.step_budget = step_budget
        self.max_waiting = max_waiting
        self._on_change = on_change or (lambda waiting, running: None)
        self._on_finished = on_finished or (lambda output: None)
        self._run, self._admit = batched.compile_batch(engine, self.bucket)
        self._consts = engine.layout.place(engine.consts(step_budget))
        self._waiting: collections.deque[Request] = collections.deque()
        self._occupant: list[Request | None] = [None] * self.bucket.batch
        self._sent = [0] * self.bucket.batch  # committed ids already reported, per slot
        self._ran = [False] * self.bucket.batch  # the slot ran since its admission
        self._cond = threading.Condition()
        self._accepting = True
        self._stop = False
        self._reset()
        self.executions = 0  # batch program executions (tests)
        self._thread = threading.Thread(target=self._serve, name="alodlm-engine", daemon=True)

    # -- the server's side ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: Request) -> None:
        """Queues ``request`` (:class:`QueueFull`, :class:`Stopped`)."""
        with self._cond:
            if not self._accepting:
                raise Stopped("the server is shutting down")
            pending = len(self._waiting) + sum(r is not None for r in self._occupant)
            if pending >= self.bucket.batch + self.max_waiting:
                raise QueueFull(f"every slot is taken and {len(self._waiting)} requests are "
                                "waiting (--max_waiting)")
            self._waiting.append(request)
            self._changed()
            self._cond.notify()

    def cancel(self, request: Request) -> None:
        """Frees ``request``'s slot (or takes it off the queue) at the loop's next turn."""
        with self._cond:
            request.cancelled = True
            self._cond.notify()

    def drain(self, timeout: float | None = None) -> bool:
        """Takes no new request, finishes the queued and running ones (for at most ``timeout``
        seconds; then the rest are failed) and stops the thread. True if it stopped in time."""
        with self._cond:
            self._accepting = False
            self._cond.notify()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._busy() and self._thread.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(0.1 if left is None else min(left, 0.1))
            self._stop = True
            self._cond.notify()
        if self._thread.ident is not None:  # started
            self._thread.join(None if deadline is None else max(1.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return sum(r is not None for r in self._occupant)

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the loop's thread ---------------------------------------------------------------------

    def _busy(self) -> bool:
        return bool(self._waiting) or any(r is not None for r in self._occupant)

    def _changed(self) -> None:
        self._on_change(len(self._waiting), sum(r is not None for r in self._occupant))

    def _reset(self) -> None:
        """Empty slots and a fresh cache (at start, and after an engine error)."""
        _, self._cache = self.engine.take_cache(self.bucket, batched=True)
        self._carry = scheduler.empty_slots(self.engine, self.bucket)
        self._host = None  # the slots' DecodeState on the host, read after an execution

    def _serve(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._busy():
                        self._cond.wait()
                    if self._stop:
                        break
                    admits = self._take_admits()
                    self._changed()
                try:
                    self._turn(admits)
                except Exception as error:  # noqa: BLE001 - an engine error fails its requests
                    self._fail_all(f"engine error: {type(error).__name__}: {error}")
                with self._cond:
                    self._changed()
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._stop = True
                self._accepting = False
                leftover = list(self._waiting) + [r for r in self._occupant if r is not None]
                self._waiting.clear()
                self._occupant = [None] * self.bucket.batch
                self._changed()
                self._cond.notify_all()
            for request in leftover:
                request.notify("error", "the server stopped before the request finished")

    def _take_admits(self) -> list[tuple[int, Request]]:
        """Free slots paired with waiting requests (cancelled ones dropped); called locked."""
        admits = []
        for b in range(self.bucket.batch):
            if self._occupant[b] is None:
                while self._waiting and self._waiting[0].cancelled:
                    self._waiting.popleft()
                if not self._waiting:
                    break
                request = self._waiting.popleft()
                self._occupant[b] = request
                admits.append((b, request))
        return admits

    def _turn(self, admits) -> None:
        engine, layout = self.engine, self.engine.layout
        for b, request in admits:
            ids, slot, length = scheduler.admit_operands(layout, self.bucket, b,
                                                         request.prompt_ids)
            self._cache, self._carry = self._admit(engine.params, self._cache, self._carry, slot,
                                                   ids, length, self._consts)
            request.admitted = time.monotonic()
            self._sent[b] = 0
            self._ran[b] = False
        self._release_cancelled()
        if not any(r is not None for r in self._occupant):
            return
        with self._cond:
            stop_early = bool(self._waiting)
        self._cache, self._carry = self._run(engine.params, self._cache, self._carry,
                                             self._consts, layout.place(jnp.asarray(stop_early)))
        self.executions += 1
        self._host = None  # the whole state is read back only when a request ends
        d = self._carry.dstate
        finished, generated, tokens = jax.device_get((d.finished, d.num_generated, d.out_tokens))
        for b, request in enumerate(self._occupant):
            if request is None:
                continue
            self._ran[b] = True
            n = int(generated[b])
            if n > self._sent[b]:
                self._sent[b] = n
                request.notify("tokens", np.asarray(tokens[b, :n]).tolist())
            if bool(finished[b]):
                self._finish(b)
        self._release_cancelled()

    def _finish(self, b: int) -> None:
        request = self._occupant[b]
        if self._host is None:  # the slots' state after the last execution, on the host
            self._host = jax.device_get(self._carry.dstate)
        one = jax.tree_util.tree_map(lambda x: x[b], self._host)
        out = W.decode_output(self.engine.cfg, one, len(request.prompt_ids), 0.0, 0.0)
        with self._cond:
            self._occupant[b] = None
        self._on_finished(out)
        request.notify("done", out)

    def _release_cancelled(self) -> None:
        """Cancelled requests' slots marked finished (the batch program skips them); each gets
        its partial result."""
        cancelled = [b for b, r in enumerate(self._occupant) if r is not None and r.cancelled]
        if not cancelled:
            return
        finished = self._carry.dstate.finished.at[jnp.asarray(cancelled)].set(True)
        self._carry = self._carry.replace(dstate=self._carry.dstate.replace(finished=finished))
        for b in cancelled:
            if self._ran[b]:
                self._finish(b)
            else:  # admitted and cancelled before it ran: nothing decoded
                request = self._occupant[b]
                with self._cond:
                    self._occupant[b] = None
                request.notify("done", None)

    def _fail_all(self, message: str) -> None:
        with self._cond:
            failed = [r for r in self._occupant if r is not None]
            self._occupant = [None] * self.bucket.batch
        for request in failed:
            request.notify("error", message)
        self._reset()
