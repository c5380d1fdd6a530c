"""Batched compiled decoding: ``B`` request slots advance together in one XLA program.

Each slot keeps its own window state (:class:`~alodlm_jax.decode.state.DecodeState`), its own
window in progress and its own KV cache, all with a leading batch axis (:class:`Slots`), and the
per-request functions of :mod:`alodlm_jax.decode.compiled` are ``jax.vmap``-ed over it, so every
matrix product sees the rows of all slots at once. The program is one ``lax.while_loop`` of
*steps*; a step runs exactly one recurrent pass for every live request, each at its own depth:

1. requests whose window is not open yet run its embedding and prelude (the others' prelude rows
   are computed and discarded: their K/V go to the cache's scratch slots, ``Bucket.scratch_start``);
2. every live request runs one pass of its window (§6.4) at its own depth;
3. requests whose window stopped close it (cache completion, §6.5 bookkeeping, the next window's
   top-up) and pack their next window, which opens at the next step.

So windows are not synchronized: a request whose window stops after one pass starts its next
window at the next step instead of waiting for the slowest window of the batch (with adaptive
depth, rounds of synchronized windows ran about twice the passes a request needs). Finished or
empty slots idle: their rows are computed, discarded, and written to the scratch slots, so a
request's real cache is exactly as if it had decoded alone.

Continuous batching (:func:`generate_stream`): the host admits waiting requests into empty slots
(one compiled *admit* program: the request's prefill into its slot of the cache, its initial state,
first top-up and packed first window) and runs the batch program, which returns as soon as a slot
finishes while requests are waiting; the host then collects that slot's result and admits the next
request. Results are yielded in input order as soon as they and every earlier one are complete.

Cache writes and attention: each request writes its window rows with its own in-place
``dynamic_update_slice`` (the batching rule of :func:`alodlm_jax.model.write_slots`; plain ``vmap``
would make it a whole-buffer ``scatter``), and all slots share one row bucket (the largest live
window) and one power-of-two bucket of the cache for the prefix (the longest live prefix,
``prefix_limit``).

Because each request's arithmetic is the single-request arithmetic (up to the shared buckets,
which change only the length of fp32 reductions and the row count of matrix products), each
request's outputs equal decoding it alone (a test checks tokens, exit depths and counters
exactly, hazards to 1e-6).

Performance on a CPU (``scripts/bench_decode.py``, 2 cores): see the README's performance section.
A step's matrix products run near the machine's matmul rate already at batch 1 on the medium bench
model, so a batch gains little there; batching is meant for accelerators, where a pass is bound
by reading the weights and ``B`` requests share one read. It is untested there.

Timing (:data:`BATCH_TIMING`): the host times every program execution. An admit is charged to the
admitted request (its ``prefill_seconds``, also added to its ``wall_seconds``); a batch run's wall
time is divided evenly between the requests live in it. The requests' ``wall_seconds`` therefore
add up to the measured time of all executions.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from alodlm_jax import model as M
from alodlm_jax.decode import compiled as C
from alodlm_jax.decode import portable as P
from alodlm_jax.decode import state as S
from alodlm_jax.decode.layout import Program
from alodlm_jax.decode.result import DecodeOutput

BATCH_TIMING = ("continuous batching: each request's wall_seconds = its own admit (prefill) time "
                "+ each batch run's wall time divided by the requests live in that run")


@struct.dataclass
class Slots:
    """The batch's carry between program executions, every field with a leading ``[B]`` axis.

    ``dstate`` is each request's :class:`~alodlm_jax.decode.state.DecodeState`; the other fields
    are its window in progress: ``packed`` (the current or, while ``is_open`` is false, the next
    window), the carry ``h`` ``[B, W, H]``, the pass state ``pst`` and ``depth``, the pass the
    window runs next. ``live_steps`` counts the steps the request was live in: one pass each, so it
    ends equal to the request's ``recurrent_passes`` (no step is spent waiting for other requests;
    a test checks it).
    """

    dstate: S.DecodeState
    packed: S.Packed
    h: jax.Array
    pst: S.PassState
    depth: jax.Array
    is_open: jax.Array
    live_steps: jax.Array


def _select(mask, new, old):
    """Per-request choice between two pytrees with a leading batch axis."""

    def pick(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - 1))
        return jnp.where(m, a, b)

    return jax.tree_util.tree_map(pick, new, old)


def _run_program(params, cache, slots, consts, stop_early, *, cfg, window_size, mode):
    """Steps of one pass per live request; with ``stop_early`` it returns after the step in which a
    request that was live at entry finishes (so the host can admit a waiting one)."""
    C.TRACE_COUNTS["batch"] += 1
    rows = 2 * window_size
    scratch = jnp.int32(cache.core_k.shape[3] - rows)  # [B, L, K, T_max, ...]
    vm = lambda f, in_axes: jax.vmap(f, in_axes=in_axes)  # noqa: E731
    entry_live = ~slots.dstate.finished
    mask_id = cfg.mask_token_id

    def step(carry):
        cache, slots = carry
        dstate, packed = slots.dstate, slots.packed
        live = ~dstate.finished
        opening = live & ~slots.is_open
        real_start = packed.start
        # One prefix length and one row bucket for the whole batch: the live requests' longest
        # prefix and largest window. Both must be unbatched, or vmap would turn their lax.switch
        # into running every branch.
        prefix_limit = jnp.max(jnp.where(live, real_start, 0))
        rows_needed = jnp.max(jnp.where(live, packed.num_rows, 0))

        # Requests starting a window run its prelude; the others' prelude rows are discarded
        # (their K/V go to the scratch slots).
        h0, kv = vm(lambda c, pk: P.prelude_rows(params, c, pk, cfg=cfg, prefix_limit=prefix_limit,
                                                 rows_needed=rows_needed), (0, 0))(cache, packed)
        cache = vm(lambda c, st, kv: M.store_window(c, st, prelude=kv), (0, 0, 0))(
            cache, jnp.where(opening, real_start, scratch), kv)
        h = jnp.where(opening[:, None, None], h0, slots.h)
        pst = _select(opening, vm(S.init_pass_state, (0, None))(packed, consts["penalty"]), slots.pst)
        depth = jnp.where(opening | ~live, 0, slots.depth)

        # One pass for every live request, each at its own depth; idle rows write to the scratch slots.
        here = packed.replace(start=jnp.where(live, real_start, scratch))
        one_pass = vm(functools.partial(P.window_pass, cfg=cfg, mode=mode, prefix_limit=prefix_limit,
                                        rows_needed=rows_needed, return_core_kv=True),
                      (None, 0, 0, 0, 0, 0, None, None))
        cache, h, pst, stop, _, core_kv = one_pass(params, cache, h, here, pst, depth, consts["q"],
                                                   consts["tau"])
        stop = stop & live

        # Windows that stopped close: their core depths >= executed take this (last) pass's core
        # K/V (§5 completion, written from the pass's own K/V rather than read back from the
        # cache: XLA fused such reads with the pass's writes and then copied the whole cache),
        # then the §6.5 bookkeeping, the next window's top-up and its packing.
        executed = depth + 1
        for d in range(cfg.max_depth):
            target = jnp.where(stop & (d >= executed), real_start, scratch)
            cache = vm(lambda c, st, kv: M.store_window(c, st, d, core=kv), (0, 0, 0))(
                cache, target, core_kv)
        close = functools.partial(C.end_and_begin, cfg=cfg, window_size=window_size)
        closed = vm(close, (0, 0, 0, 0, None))(dstate, packed, pst, executed, consts)
        dstate = _select(stop, closed, dstate)
        next_packed = vm(lambda w, n: S.pack_window(w, n, mask_id=mask_id), (0, 0))(
            dstate.window, dstate.cache_len)
        return cache, Slots(dstate=dstate, packed=_select(stop, next_packed, packed), h=h, pst=pst,
                            depth=executed, is_open=live & ~stop,
                            live_steps=slots.live_steps + live.astype(jnp.int32))

    def keep_going(carry):
        finished = carry[1].dstate.finished
        someone_done = jnp.any(entry_live & finished)
        return jnp.any(~finished) & ~(stop_early & someone_done)

    return jax.lax.while_loop(keep_going, step, (cache, slots))


def _admit_program(params, cache, slots, slot, prompt, prompt_len, consts, *, cfg, window_size,
                   capacity):
    """Prefills ``prompt`` into cache slot ``slot``; the slot gets a fresh, topped-up state whose
    first window is packed and not yet open."""
    C.TRACE_COUNTS["admit"] += 1
    take = lambda x: jax.lax.dynamic_index_in_dim(x, slot, 0, keepdims=False)  # noqa: E731
    member = C.prefill(params, jax.tree_util.tree_map(take, cache), prompt, cfg=cfg)
    cache = jax.tree_util.tree_map(
        lambda x, m: jax.lax.dynamic_update_index_in_dim(x, m, slot, 0), cache, member)
    fresh = _fresh_slot(params, cfg, window_size, capacity, prompt_len, consts)
    slots = jax.tree_util.tree_map(
        lambda x, m: jax.lax.dynamic_update_index_in_dim(x, m, slot, 0), slots, fresh)
    return cache, slots


def _fresh_slot(params, cfg, window_size, capacity, prompt_len, consts, finished=False) -> Slots:
    """One request's :class:`Slots` entry after its prefill (``finished``: an empty slot)."""
    rows = 2 * window_size
    dstate = S.DecodeState.initial(rows=rows, capacity=capacity, mask_id=cfg.mask_token_id,
                                   cache_len=prompt_len)
    if finished:
        dstate = dstate.replace(finished=jnp.bool_(True))
    else:
        dstate = C.begin(dstate, consts, cfg=cfg, window_size=window_size)
    packed = S.pack_window(dstate.window, dstate.cache_len, mask_id=cfg.mask_token_id)
    hidden = params["embed"].shape[1]
    return Slots(dstate=dstate, packed=packed, h=jnp.zeros((rows, hidden), params["embed"].dtype),
                 pst=S.init_pass_state(packed, consts["penalty"]), depth=jnp.int32(0),
                 is_open=jnp.bool_(False), live_steps=jnp.int32(0))


_JIT = {
    "batch": Program(_run_program, ("cfg", "window_size", "mode"), ("cache", "slots"),
                     per_data_shard="batch"),
    "admit": Program(_admit_program, ("cfg", "window_size", "capacity"), ("cache", "slots"),
                     per_data_shard="admit"),
}


def _new_slots(engine, bucket: C.Bucket) -> Slots:
    one = _fresh_slot(engine.params, engine.cfg, bucket.window_size, bucket.capacity, 0,
                      engine.consts(), finished=True)
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (bucket.batch,) + x.shape).copy(), one)


def _empty_slots(engine, bucket: C.Bucket) -> Slots:
    """Every slot empty (finished): the batch's starting state, on the engine's layout (slots
    split over ``data``)."""
    slots = _new_slots(engine, bucket)
    return engine.layout.place(slots, engine.layout.slots_shardings(slots))


def compile_batch(engine, bucket: C.Bucket):
    """The batch and admit programs of ``bucket`` (compiled once per process while they stay in
    the program store, :mod:`alodlm_jax.decode.programs`), for the engine's layout."""
    layout = engine.layout
    params = C._spec(engine.params)
    cache = engine.cache_spec(bucket, batched=True)
    slots = jax.eval_shape(lambda: _new_slots(engine, bucket))
    slots = layout.spec(slots, layout.slots_shardings(slots))
    consts = layout.spec(engine.consts())
    i32 = layout.spec(jax.ShapeDtypeStruct((), jnp.int32))
    mode = engine.decode.mode
    run = engine.get_executable("batch", layout.jit(_JIT["batch"]), (bucket, mode), lambda: (
        (params, cache, slots, consts, layout.spec(jax.ShapeDtypeStruct((), jnp.bool_))),
        dict(cfg=engine.cfg, window_size=bucket.window_size, mode=mode)))
    admit = engine.get_executable("admit", layout.jit(_JIT["admit"]), (bucket,), lambda: (
        (params, cache, slots, i32,
         layout.spec(jax.ShapeDtypeStruct((bucket.prompt_bucket,), jnp.int32)), i32, consts),
        dict(cfg=engine.cfg, window_size=bucket.window_size, capacity=bucket.capacity)))
    return run, admit


def generate_stream(engine, prompts: Sequence[Sequence[int]], batch_size: int) -> Iterator[DecodeOutput]:
    """Decodes ``prompts`` with ``batch_size`` slots and continuous batching (module docstring).

    Yields :class:`DecodeOutput` objects in input order, each as soon as it and all earlier ones
    are complete. One program bucket (from the longest prompt) serves the whole stream.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    checked = [engine.check_request(p) for p in prompts]
    if not checked:
        return
    bucket = engine.bucket_for(max(len(p) for p in checked), batch=batch_size)
    run, admit = compile_batch(engine, bucket)
    layout = engine.layout
    consts = layout.place(engine.consts())
    params = engine.params
    key, cache = engine.take_cache(bucket, batched=True)
    carry = _empty_slots(engine, bucket)
    waiting = collections.deque(range(len(checked)))
    occupant: list[int | None] = [None] * bucket.batch  # request index per slot
    wall = [0.0] * len(checked)
    prefill = [0.0] * len(checked)
    done: dict[int, DecodeOutput] = {}
    next_out = 0
    engine.last_live_steps = {}  # request -> batch steps it was live in (tests)
    engine.last_schedule = schedule = []  # ("admit" | "done", slot, request) in order (tests)
    jax.block_until_ready((cache, carry, consts, params))
    try:
        while waiting or any(i is not None for i in occupant):
            for b in range(bucket.batch):
                if occupant[b] is None and waiting:
                    i = waiting.popleft()
                    ids = np.zeros((bucket.prompt_bucket,), np.int32)
                    ids[: len(checked[i])] = checked[i]
                    ids, slot, length = layout.place((jnp.asarray(ids), jnp.asarray(b, jnp.int32),
                                                      jnp.asarray(len(checked[i]), jnp.int32)))
                    jax.block_until_ready((ids, slot, length))
                    t0 = time.perf_counter()
                    cache, carry = admit(params, cache, carry, slot, ids, length, consts)
                    jax.block_until_ready((cache, carry))
                    prefill[i] = time.perf_counter() - t0
                    wall[i] += prefill[i]
                    occupant[b] = i
                    schedule.append(("admit", b, i))
            live = [b for b in range(bucket.batch) if occupant[b] is not None]
            stop_early = layout.place(jnp.asarray(bool(waiting)))
            t0 = time.perf_counter()
            cache, carry = run(params, cache, carry, consts, stop_early)
            finished = np.asarray(jax.device_get(carry.dstate.finished))
            elapsed = time.perf_counter() - t0
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
                done[i] = engine._output(host, len(checked[i]), wall[i], prefill[i])
                occupant[b] = None
                schedule.append(("done", b, i))
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    finally:
        engine.give_back_cache(key, cache)
