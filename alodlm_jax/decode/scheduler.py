"""The host scheduler of the batch program: continuous batching of a stream of requests.

:func:`generate_stream` admits waiting requests into empty slots (the *admit* program of
:mod:`.batched`: the request's prefill into its slot of the cache, its initial state, first top-up
and packed first window) and runs the batch program, which returns as soon as a slot finishes
while requests are waiting; the host then collects that slot's result and admits the next request.
Results are yielded in input order as soon as they and every earlier one are complete.

Timing (:data:`BATCH_TIMING`): the host times every program execution. An admit is charged to the
admitted request (its ``prefill_seconds``, also added to its ``wall_seconds``); a batch run's wall
time is divided evenly between the requests live in it. The requests' ``wall_seconds`` therefore
add up to the measured time of all executions.
"""

from __future__ import annotations

import collections
import time
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.decode import batched
from alodlm_jax.decode import window as W
from alodlm_jax.decode.batched import Slots
from alodlm_jax.decode.result import DecodeOutput

BATCH_TIMING = ("continuous batching: each request's wall_seconds = its own admit (prefill) time "
                "+ each batch run's wall time divided by the requests live in that run")


def empty_slots(engine, bucket: W.Bucket) -> Slots:
    """Every slot empty (finished): the batch's starting state, on the engine's layout (slots
    split over ``data``)."""
    slots = batched.new_slots(engine, bucket)
    return engine.layout.place(slots, engine.layout.slots_shardings(slots))


def admit_operands(layout, bucket: W.Bucket, slot: int, prompt: Sequence[int]):
    """The admit program's operands for ``prompt`` into slot ``slot``: its ids padded to the
    bucket's prompt length, the slot and the length, placed as ``layout`` places them."""
    ids = np.zeros((bucket.prompt_bucket,), np.int32)
    ids[: len(prompt)] = prompt
    return layout.place((jnp.asarray(ids), jnp.asarray(slot, jnp.int32),
                         jnp.asarray(len(prompt), jnp.int32)))


def generate_stream(engine, prompts: Sequence[Sequence[int]], batch_size: int, *,
                    step_budget: int = W.NO_STEP_BUDGET) -> Iterator[DecodeOutput]:
    """Decodes ``prompts`` with ``batch_size`` slots and continuous batching (module docstring).
    ``step_budget``: the most steps one batch program execution runs before the host looks again
    (:func:`.batched.run_program`); the outputs do not depend on it.

    Yields :class:`DecodeOutput` objects in input order, each as soon as it and all earlier ones
    are complete. One program bucket (from the longest prompt) serves the whole stream.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    checked = [engine.check_request(p) for p in prompts]
    if not checked:
        return
    bucket = engine.bucket_for(max(len(p) for p in checked), batch=batch_size)
    run, admit = batched.compile_batch(engine, bucket)
    layout = engine.layout
    consts = layout.place(engine.consts(step_budget))
    params = engine.params
    key, cache = engine.take_cache(bucket, batched=True)
    carry = empty_slots(engine, bucket)
    waiting = collections.deque(range(len(checked)))
    occupant: list[int | None] = [None] * bucket.batch  # request index per slot
    wall = [0.0] * len(checked)
    prefill = [0.0] * len(checked)
    done: dict[int, DecodeOutput] = {}
    next_out = 0
    engine.last_live_steps = {}  # request -> batch steps it was live in (tests)
    engine.last_schedule = schedule = []  # ("admit" | "done", slot, request) in order (tests)
    # Steps the batch program ran and the seconds its executions took (admits not included):
    # scripts/gpu_check.sh's measured time per step.
    engine.last_batch_steps, engine.last_batch_seconds = 0, 0.0
    slot_steps = np.zeros((bucket.batch,), np.int64)  # each slot's live_steps after the last run
    jax.block_until_ready((cache, carry, consts, params))
    try:
        while waiting or any(i is not None for i in occupant):
            for b in range(bucket.batch):
                if occupant[b] is None and waiting:
                    i = waiting.popleft()
                    ids, slot, length = admit_operands(layout, bucket, b, checked[i])
                    jax.block_until_ready((ids, slot, length))
                    t0 = time.perf_counter()
                    cache, carry = admit(params, cache, carry, slot, ids, length, consts)
                    jax.block_until_ready((cache, carry))
                    prefill[i] = time.perf_counter() - t0
                    wall[i] += prefill[i]
                    occupant[b] = i
                    slot_steps[b] = 0
                    schedule.append(("admit", b, i))
            live = [b for b in range(bucket.batch) if occupant[b] is not None]
            stop_early = layout.place(jnp.asarray(bool(waiting)))
            t0 = time.perf_counter()
            cache, carry = run(params, cache, carry, consts, stop_early)
            finished, now = map(np.asarray, jax.device_get((carry.dstate.finished,
                                                             carry.live_steps)))
            elapsed = time.perf_counter() - t0
            if live:  # every step advances each request live in it by one
                engine.last_batch_steps += int(max(now[b] - slot_steps[b] for b in live))
                engine.last_batch_seconds += elapsed
            slot_steps = now.astype(np.int64)
            for b in live:
                wall[occupant[b]] += elapsed / len(live)
            ended = [b for b in live if finished[b]]
            if ended:
                # Whole arrays to the host, then numpy indexing: indexing a slot-split (data)
                # array on the device would compile a gather with a collective (one hung a
                # multi-process CPU run in gloo).
                states, steps = jax.device_get((carry.dstate, carry.live_steps))
            for b in ended:
                i = occupant[b]
                engine.last_live_steps[i] = int(steps[b])
                host = jax.tree_util.tree_map(lambda x: x[b], states)
                done[i] = W.decode_output(engine.cfg, host, len(checked[i]), wall[i], prefill[i])
                occupant[b] = None
                schedule.append(("done", b, i))
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    finally:
        engine.give_back_cache(key, cache)

