"""Batched compiled decoding: ``B`` requests advance together in one XLA program.

Each request keeps its own window state (:class:`~alodlm_jax.decode.state.DecodeState`) and its own
KV cache; both carry a leading batch axis and the per-request functions of
:mod:`alodlm_jax.decode.compiled` are ``jax.vmap``-ed over it, so every matrix product sees
``B * W`` rows instead of ``W``. The loops are written out here (not a vmapped ``while_loop``, which
would select the whole carry, cache included, at every iteration):

* the outer loop runs while any request is unfinished; a window round opens a window for every
  live request;
* the inner loop runs while any live request's window has not stopped; a request whose window
  already stopped (or that is finished) is *idle*: its pass is computed but discarded, and its
  K/V writes are redirected to the cache's scratch slots (``Bucket.scratch_start``), so its real
  cache stays exactly as if it had decoded alone;
* finished requests stay idle until the whole batch ends (no replacement by waiting requests).

Because each request's arithmetic is the single-request arithmetic, each request's outputs equal
decoding it alone (a test checks this).

Cache writes and attention: each request writes its window rows with its own in-place
``dynamic_update_slice`` (the batching rule of :func:`alodlm_jax.model.write_slots`; plain ``vmap``
would make it a whole-buffer ``scatter``), and all requests attend over one shared power-of-two
bucket of the cache, the one holding the highest live window (``kv_limit``).

Performance on a CPU (``scripts/bench_decode.py``, 2 cores): a pass is compute-bound already at
batch 1 (the small bench model runs its matmuls at ~75 % of the machine's rate for 32 rows), so a
batch gains only what larger matrix products gain (the measured matmul rate at 256 rows is ~1.8x
the rate at 32 rows), and a batch waits for its slowest request in every window. Batching is for
accelerators, where a pass is bound by reading the weights and ``B`` requests share one read.

Timing: a batch is one program execution, so only the batch's wall time is observable. Each
request's ``wall_seconds`` is the batch wall time divided by the number of real requests in the
batch (their sum is the true elapsed time); ``prefill_seconds`` is the batch's measured prefill time
divided the same way.
"""

from __future__ import annotations

import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax import model as M
from alodlm_jax.decode import compiled as C
from alodlm_jax.decode import portable as P
from alodlm_jax.decode import state as S
from alodlm_jax.decode.result import DecodeOutput

BATCH_TIMING = "each request's wall_seconds = batch wall time / requests in the batch"


def _select(mask, new, old):
    """Per-request choice between two pytrees with a leading batch axis."""

    def pick(a, b):
        m = mask.reshape(mask.shape + (1,) * (a.ndim - 1))
        return jnp.where(m, a, b)

    return jax.tree_util.tree_map(pick, new, old)


def _batch_program(params, cache, prompts, prompt_lens, live, consts, *, cfg, window_size, mode,
                   capacity):
    """Prefill + window rounds for ``B`` requests. ``live[b]`` False marks a padding request."""
    C.TRACE_COUNTS["batch"] += 1
    rows = 2 * window_size
    scratch = jnp.int32(cache.core_k.shape[3] - rows)  # [B, L, K, T_max, ...]
    vm = lambda f, in_axes: jax.vmap(f, in_axes=in_axes)  # noqa: E731

    cache = vm(functools.partial(C.prefill, cfg=cfg), (None, 0, 0))(params, cache, prompts)
    init = lambda n: S.DecodeState.initial(rows=rows, capacity=capacity,  # noqa: E731
                                           mask_id=cfg.mask_token_id, cache_len=n)
    dstate = jax.vmap(init)(prompt_lens)
    dstate = dstate.replace(finished=~live)
    begin = functools.partial(C.begin, cfg=cfg, window_size=window_size)
    dstate = vm(begin, (0, None))(dstate, consts)

    def window_round(carry):
        cache, dstate = carry
        active = ~dstate.finished
        packed = vm(lambda w, n: S.pack_window(w, n, mask_id=cfg.mask_token_id), (0, 0))(
            dstate.window, dstate.cache_len)
        real_start = packed.start
        packed = packed.replace(start=jnp.where(active, real_start, scratch))
        pst = vm(S.init_pass_state, (0, None))(packed, consts["penalty"])
        # One attention length and one row bucket for the whole batch: the live requests' highest
        # slot and largest window (idle requests write to the scratch slots past every live one,
        # and their discarded rows may attend anywhere).
        kv_limit = jnp.max(jnp.where(active, real_start, 0)) + rows
        rows_needed = jnp.max(jnp.where(active, packed.num_rows, 0))
        cache, h = vm(lambda c, pk: P.window_prelude(params, c, pk, cfg=cfg, kv_limit=kv_limit,
                                                     rows_needed=rows_needed), (0, 0))(cache, packed)
        one_pass = vm(functools.partial(C.window_pass, cfg=cfg, mode=mode, kv_limit=kv_limit,
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

    return jax.lax.while_loop(lambda carry: jnp.any(~carry[1].finished), window_round,
                              (cache, dstate))


def _batch_prefill_program(params, cache, prompts, *, cfg):
    C.TRACE_COUNTS["batch_prefill"] += 1
    return jax.vmap(functools.partial(C.prefill, cfg=cfg), in_axes=(None, 0, 0))(params, cache,
                                                                                  prompts)


_JIT = {
    "batch": jax.jit(_batch_program, static_argnames=("cfg", "window_size", "mode", "capacity"),
                     donate_argnames=("cache",)),
    "batch_prefill": jax.jit(_batch_prefill_program, static_argnames=("cfg",),
                             donate_argnames=("cache",)),
}


def _batched_cache_spec(engine, bucket: C.Bucket):
    one = jax.eval_shape(lambda: M.init_cache(engine.cfg, bucket.t_max, engine.dtype))
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct((bucket.batch,) + x.shape, x.dtype), one)


def compile_batch(engine, bucket: C.Bucket):
    """The batched program of ``bucket`` (compiled once per process), plus its prefill time."""
    params = C._spec(engine.params)
    cache = _batched_cache_spec(engine, bucket)
    prompts = jax.ShapeDtypeStruct((bucket.batch, bucket.prompt_bucket), jnp.int32)
    vec_i32 = jax.ShapeDtypeStruct((bucket.batch,), jnp.int32)
    vec_bool = jax.ShapeDtypeStruct((bucket.batch,), jnp.bool_)
    consts = C._spec(engine.consts())
    mode = engine.decode.mode
    statics = dict(cfg=engine.cfg, window_size=bucket.window_size, mode=mode,
                   capacity=bucket.capacity)
    exe = engine.get_executable("batch", _JIT["batch"], (bucket, mode), lambda: (
        (params, cache, prompts, vec_i32, vec_bool, consts), statics))
    if engine.measure_prefill and bucket not in engine._prefill_seconds:
        pre = engine.get_executable(
            "batch_prefill", _JIT["batch_prefill"], (bucket.batch, bucket.prompt_bucket, bucket.t_max),
            lambda: ((params, cache, prompts), {"cfg": engine.cfg}))
        engine._prefill_seconds[bucket] = engine.median_prefill_seconds(
            pre, bucket, jnp.zeros((bucket.batch, bucket.prompt_bucket), jnp.int32), batched=True)
    return exe


def generate_batched(engine, prompts: Sequence[Sequence[int]], batch_size: int) -> list[DecodeOutput]:
    """Decodes ``prompts`` in groups of ``batch_size`` (the last group padded with idle requests)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    checked = [engine.check_request(p) for p in prompts]
    # One prompt bucket for the whole call, so every group reuses the same program.
    longest = max((len(p) for p in checked), default=1)
    outs: list[DecodeOutput] = []
    for lo in range(0, len(checked), batch_size):
        group = checked[lo: lo + batch_size]
        bucket = engine.bucket_for(longest, batch=batch_size)
        outs.extend(_run_group(engine, bucket, group))
    return outs


def _run_group(engine, bucket: C.Bucket, group: list[list[int]]) -> list[DecodeOutput]:
    exe = compile_batch(engine, bucket)
    b = bucket.batch
    ids = np.zeros((b, bucket.prompt_bucket), np.int32)
    lens = np.ones((b,), np.int32)
    live = np.zeros((b,), bool)
    for i, prompt in enumerate(group):
        ids[i, : len(prompt)] = prompt
        lens[i] = len(prompt)
        live[i] = True
    ids, lens, live = jnp.asarray(ids), jnp.asarray(lens), jnp.asarray(live)
    consts = engine.consts()
    key, cache = engine.take_cache(bucket, batched=True)
    jax.block_until_ready((cache, ids, lens, live, consts, engine.params))

    start = time.perf_counter()
    cache, dstate = exe(engine.params, cache, ids, lens, live, consts)
    host = jax.device_get(dstate)
    wall = time.perf_counter() - start
    engine.give_back_cache(key, cache)

    n = len(group)
    prefill = engine._prefill_seconds.get(bucket, 0.0) / n
    return [engine._output(jax.tree_util.tree_map(lambda x: x[i], host), len(group[i]), wall / n,
                           prefill) for i in range(n)]
