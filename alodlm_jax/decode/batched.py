"""Batched compiled decoding: ``B`` request slots advance together in one XLA program.

Each slot keeps its own window state (:class:`~alodlm_jax.decode.state.DecodeState`) and its own KV
cache; both carry a leading batch axis and the per-request functions of
:mod:`alodlm_jax.decode.compiled` are ``jax.vmap``-ed over it, so every matrix product sees the
rows of all slots at once. The loops are written out here (not a vmapped ``while_loop``, which
would select the whole carry, cache included, at every iteration):

* the outer loop runs window rounds while any slot is unfinished; a round opens a window for every
  live slot;
* the inner loop runs while any live slot's window has not stopped; a slot whose window already
  stopped (or that is finished or empty) is *idle*: its pass is computed but discarded, and its K/V
  writes are redirected to the cache's scratch slots (``Bucket.scratch_start``), so its real cache
  stays exactly as if it had decoded alone.

Continuous batching (:func:`generate_stream`): the host admits waiting requests into empty slots
(one compiled *admit* program: the request's prefill into its slot of the cache, its initial state
and first top-up) and runs the batch program, which returns as soon as a slot finishes while
requests are waiting; the host then collects that slot's result and admits the next request. So a
finished request is replaced by a waiting one instead of idling until its batch ends. Results are
yielded in input order as soon as they and every earlier one are complete.

Cache writes and attention: each request writes its window rows with its own in-place
``dynamic_update_slice`` (the batching rule of :func:`alodlm_jax.model.write_slots`; plain ``vmap``
would make it a whole-buffer ``scatter``), and all slots share one row bucket (the largest live
window) and one power-of-two bucket of the cache for the prefix (the longest live prefix,
``prefix_limit``).

Because each request's arithmetic is the single-request arithmetic (up to the shared attention
bucket, which changes only the length of fp32 reductions), each request's outputs equal decoding it alone (a test
checks tokens, exit depths and counters exactly, hazards to 1e-6).

Performance on a CPU (``scripts/bench_decode.py``, 2 cores): batching does not pay off there yet
(batch 8 gives about half the tokens/s of one request at a time on the small bench model, two
thirds on the medium one). On the small model the batch's matrix products do run near the machine's
matmul rate, but every other operation of a pass grows with the rows of all slots, and slots whose
window already stopped still compute their rows until the batch's slowest window stops. Batching is
meant for accelerators, where a pass is bound by reading the weights and ``B`` requests share one
read; it is untested there.

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

from alodlm_jax import model as M
from alodlm_jax.decode import compiled as C
from alodlm_jax.decode import portable as P
from alodlm_jax.decode import state as S
from alodlm_jax.decode.result import DecodeOutput

BATCH_TIMING = ("continuous batching: each request's wall_seconds = its own admit (prefill) time "
                "+ each batch run's wall time divided by the requests live in that run")


def _select(mask, new, old):
    """Per-request choice between two pytrees with a leading batch axis."""

    def pick(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - 1))
        return jnp.where(m, a, b)

    return jax.tree_util.tree_map(pick, new, old)


def _run_program(params, cache, dstate, consts, stop_early, *, cfg, window_size, mode):
    """Window rounds for every unfinished slot; with ``stop_early`` it returns after the round in
    which a slot that was unfinished at entry finishes (so the host can admit a waiting request)."""
    C.TRACE_COUNTS["batch"] += 1
    rows = 2 * window_size
    scratch = jnp.int32(cache.core_k.shape[3] - rows)  # [B, L, K, T_max, ...]
    vm = lambda f, in_axes: jax.vmap(f, in_axes=in_axes)  # noqa: E731
    entry_live = ~dstate.finished

    def window_round(carry):
        cache, dstate = carry
        active = ~dstate.finished
        packed = vm(lambda w, n: S.pack_window(w, n, mask_id=cfg.mask_token_id), (0, 0))(
            dstate.window, dstate.cache_len)
        real_start = packed.start
        packed = packed.replace(start=jnp.where(active, real_start, scratch))
        pst = vm(S.init_pass_state, (0, None))(packed, consts["penalty"])
        # One prefix length and one row bucket for the whole batch: the live requests' longest
        # prefix and largest window (idle requests write to the scratch slots past every live
        # one, and their discarded rows may attend anywhere). Both must be unbatched, or vmap
        # would turn their lax.switch into running every branch.
        prefix_limit = jnp.max(jnp.where(active, real_start, 0))
        rows_needed = jnp.max(jnp.where(active, packed.num_rows, 0))
        cache, h = vm(lambda c, pk: P.window_prelude(params, c, pk, cfg=cfg, prefix_limit=prefix_limit,
                                                     rows_needed=rows_needed), (0, 0))(cache, packed)
        one_pass = vm(functools.partial(C.window_pass, cfg=cfg, mode=mode, prefix_limit=prefix_limit,
                                        rows_needed=rows_needed),
                      (None, 0, 0, 0, 0, None, None))

        def pass_round(inner):
            # Every running request started this window with the others and advanced with each
            # round, so they all run pass `depth` now: one shared (unbatched) depth index keeps the
            # cache reads plain slices instead of per-request gathers.
            depth, executed, cache, h, pst, running = inner
            here = packed.replace(start=jnp.where(running, real_start, scratch))
            cache, h_new, pst_new, stop = one_pass(params, cache, h, here, pst, depth, consts)
            h = _select(running, h_new, h)
            pst = _select(running, pst_new, pst)
            executed = executed + running.astype(jnp.int32)
            return depth + 1, executed, cache, h, pst, running & ~stop

        _, executed, cache, h, pst, _ = jax.lax.while_loop(
            lambda inner: jnp.any(inner[5]), pass_round,
            (jnp.int32(0), jnp.zeros_like(real_start), cache, h, pst, active))
        # Idle requests complete the (discarded) scratch slots; live ones their window.
        close = functools.partial(C.close_window, cfg=cfg, window_size=window_size)
        cache, new_state = vm(close, (0, 0, 0, 0, 0, None))(
            cache, dstate, packed, pst, jnp.maximum(executed, 1), consts)
        return cache, _select(active, new_state, dstate)

    def keep_going(carry):
        finished = carry[1].finished
        someone_done = jnp.any(entry_live & finished)
        return jnp.any(~finished) & ~(stop_early & someone_done)

    return jax.lax.while_loop(keep_going, window_round, (cache, dstate))


def _admit_program(params, cache, dstate, slot, prompt, prompt_len, consts, *, cfg, window_size,
                   capacity):
    """Prefills ``prompt`` into cache slot ``slot`` and gives the slot a fresh, topped-up state."""
    C.TRACE_COUNTS["admit"] += 1
    take = lambda x: jax.lax.dynamic_index_in_dim(x, slot, 0, keepdims=False)  # noqa: E731
    member = C.prefill(params, jax.tree_util.tree_map(take, cache), prompt, cfg=cfg)
    cache = jax.tree_util.tree_map(
        lambda x, m: jax.lax.dynamic_update_index_in_dim(x, m, slot, 0), cache, member)
    fresh = S.DecodeState.initial(rows=2 * window_size, capacity=capacity,
                                  mask_id=cfg.mask_token_id, cache_len=prompt_len)
    fresh = C.begin(fresh, consts, cfg=cfg, window_size=window_size)
    dstate = jax.tree_util.tree_map(
        lambda x, m: jax.lax.dynamic_update_index_in_dim(x, m, slot, 0), dstate, fresh)
    return cache, dstate


_JIT = {
    "batch": jax.jit(_run_program, static_argnames=("cfg", "window_size", "mode"),
                     donate_argnames=("cache", "dstate")),
    "admit": jax.jit(_admit_program, static_argnames=("cfg", "window_size", "capacity"),
                     donate_argnames=("cache", "dstate")),
}


def _batched_spec(bucket: C.Bucket, one):
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((bucket.batch,) + x.shape, x.dtype), one)


def _empty_state(engine, bucket: C.Bucket):
    """Every slot empty (finished): the batch's starting state."""
    one = S.DecodeState.initial(rows=bucket.rows, capacity=bucket.capacity,
                                mask_id=engine.cfg.mask_token_id, cache_len=0)
    one = one.replace(finished=jnp.bool_(True))
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (bucket.batch,) + x.shape).copy(), one)


def compile_batch(engine, bucket: C.Bucket):
    """The batch and admit programs of ``bucket`` (compiled once per process)."""
    params = C._spec(engine.params)
    cache = _batched_spec(bucket, jax.eval_shape(
        lambda: M.init_cache(engine.cfg, bucket.t_max, engine.dtype)))
    dstate = jax.eval_shape(lambda: _empty_state(engine, bucket))
    consts = C._spec(engine.consts())
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    mode = engine.decode.mode
    run = engine.get_executable("batch", _JIT["batch"], (bucket, mode), lambda: (
        (params, cache, dstate, consts, jax.ShapeDtypeStruct((), jnp.bool_)),
        dict(cfg=engine.cfg, window_size=bucket.window_size, mode=mode)))
    admit = engine.get_executable("admit", _JIT["admit"], (bucket,), lambda: (
        (params, cache, dstate, i32, jax.ShapeDtypeStruct((bucket.prompt_bucket,), jnp.int32), i32,
         consts),
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
    consts = engine.consts()
    params = engine.params
    key, cache = engine.take_cache(bucket, batched=True)
    dstate = _empty_state(engine, bucket)
    waiting = collections.deque(range(len(checked)))
    slots: list[int | None] = [None] * bucket.batch
    wall = [0.0] * len(checked)
    prefill = [0.0] * len(checked)
    done: dict[int, DecodeOutput] = {}
    next_out = 0
    engine.last_schedule = schedule = []  # ("admit" | "done", slot, request) in order (tests)
    jax.block_until_ready((cache, dstate, consts, params))
    try:
        while waiting or any(i is not None for i in slots):
            for b in range(bucket.batch):
                if slots[b] is None and waiting:
                    i = waiting.popleft()
                    ids = np.zeros((bucket.prompt_bucket,), np.int32)
                    ids[: len(checked[i])] = checked[i]
                    ids = jnp.asarray(ids)
                    slot, length = jnp.asarray(b, jnp.int32), jnp.asarray(len(checked[i]), jnp.int32)
                    jax.block_until_ready((ids, slot, length))
                    t0 = time.perf_counter()
                    cache, dstate = admit(params, cache, dstate, slot, ids, length, consts)
                    jax.block_until_ready((cache, dstate))
                    prefill[i] = time.perf_counter() - t0
                    wall[i] += prefill[i]
                    slots[b] = i
                    schedule.append(("admit", b, i))
            live = [b for b in range(bucket.batch) if slots[b] is not None]
            stop_early = jnp.asarray(bool(waiting))
            t0 = time.perf_counter()
            cache, dstate = run(params, cache, dstate, consts, stop_early)
            finished = np.asarray(jax.device_get(dstate.finished))
            elapsed = time.perf_counter() - t0
            for b in live:
                wall[slots[b]] += elapsed / len(live)
            for b in live:
                if finished[b]:
                    i = slots[b]
                    host = jax.device_get(jax.tree_util.tree_map(lambda x: x[b], dstate))
                    done[i] = engine._output(host, len(checked[i]), wall[i], prefill[i])
                    slots[b] = None
                    schedule.append(("done", b, i))
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    finally:
        engine.give_back_cache(key, cache)
