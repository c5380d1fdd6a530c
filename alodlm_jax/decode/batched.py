"""The batch program: ``B`` request slots advance together in one XLA program.

Each slot keeps its own window state (:class:`~alodlm_jax.decode.state.DecodeState`), its own
window in progress and its own KV cache, all with a leading batch axis (:class:`Slots`). The
program (:func:`run_program`) is one ``lax.while_loop`` of *steps*; a step (:func:`batch_step`)
runs exactly one recurrent pass for every live request, each at its own depth, and does only the
work its live requests need:

1. the windows that open this step run their embedding and prelude (only their valid rows);
2. every live request runs one pass of its window (§6.4) at its own depth: core, readout, heads,
   decision, the arithmetic of :func:`.window.window_pass`;
3. the windows that stopped close: cache completion (theirs only), §6.5 bookkeeping, the next
   window's top-up and packing (:func:`.window.end_and_begin`: only in a step where a window
   stops; on an NVIDIA GPU every step, on every slot's small state, kept where the window
   stopped, since XLA:GPU copied that state around the conditional), and open at the next step.

The network runs on the live requests' valid rows packed into one matrix (:mod:`alodlm_jax.network.rows`:
a ``lax.switch`` over :func:`alodlm_jax.network.rows.step_shapes`; one shape, every row, under the
accelerators' :data:`~alodlm_jax.network.rows.FIXED` policy); attention, which reads each request's own
cache at its own depth, and the heads run per request in the *lanes* of the requests with rows
(lane ``b`` is request ``b`` under ``FIXED``). Windows are not synchronized: a request whose
window stops starts its next window at the next step. Finished or empty slots idle: they
contribute no rows, and their cache writes go to the scratch slots (``Bucket.scratch_start``), so
a request's real cache is exactly as if it had decoded alone. Each request's arithmetic is the single-request arithmetic up to the shared
attention bucket and the packed row count (which change only the length of fp32 reductions and
the row count of matrix products), so each request's outputs equal decoding it alone.

The *admit* program (:func:`admit_program`) prefills one request into its slot and gives it a
fresh, topped-up state; :mod:`.scheduler` admits requests and runs the batch program.
"""

from __future__ import annotations

import concurrent.futures
import functools

import jax
import jax.numpy as jnp
from flax import struct

from alodlm_jax.network import model as M
from alodlm_jax.network import cache as KC
from alodlm_jax.network import layers as L
from alodlm_jax.network import window_layers as WL
from alodlm_jax.network import rows as R
from alodlm_jax.decode import state as S
from alodlm_jax.decode import window as W
from alodlm_jax.decode.layout import Program
from alodlm_jax.kernels import select


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


def _on_rows(counts, shapes, make_branch, *operands):
    """``make_branch(R, A)(*operands)`` for the first of ``shapes`` (:func:`alodlm_jax.network.rows.step_shapes`,
    ``(0, 0)`` a branch of its own where listed) holding ``counts``' rows and requests with rows
    (one ``lax.switch``)."""
    index = R.step_shape_index(shapes, counts)
    return jax.lax.switch(index, [make_branch(*shape) for shape in shapes], *operands)


def _prelude_rows(params, cache, packed, opening, prefix_limit, *, cfg, rows, shapes):
    """Embedding and prelude of the windows that open this step, their rows packed together:
    ``(h [B, W, H], (k, v) [B, L_pre, W, n_kv, d_h])``, zeros for the other requests. Reads the
    cache only (stores follow the switch, :func:`.window.window_prelude`). ``shapes``: the
    :mod:`alodlm_jax.network.rows` policy (a step in which no window opens skips the prelude in both)."""
    batch = packed.ids.shape[0]
    hidden = params["embed"].shape[1]
    counts = jnp.where(opening, packed.num_rows, 0)
    kv_shape = (batch, cfg.num_prelude_layers, rows) + cache.prelude_k.shape[-2:]

    def branch(size, lanes):
        def run(cache):
            if size == 0:
                zeros = jnp.zeros(kv_shape, cache.prelude_k.dtype)
                return jnp.zeros((batch, rows, hidden), params["embed"].dtype), (zeros, zeros)
            m = R.row_map(counts, size, lanes, in_order=fixed)
            h = M.embed(params, R.to_rows(packed.ids, m))
            h, k, v = WL.run_window_rows(params["prelude"], cfg, h, R.to_rows(packed.positions, m), m,
                                        cache.prelude_k, cache.prelude_v, packed.start,
                                        prefix_limit=prefix_limit, rows=rows, **attend)
            return R.from_rows(h, m, rows), (k, v)
        return run

    fixed = R.is_fixed(shapes)
    attend = select.attention_options(shapes)
    return _on_rows(counts, ((0, 0),) + R.step_shapes(batch, rows, shapes), branch, cache)


def _pass_rows(params, cache, h, packed, depth, live, prefix_limit, *, cfg, rows, heads, shapes):
    """Core at each request's depth, readout and heads for every live request, rows packed
    together: ``(h [B, W, H], (pred, entropy, hazard) [B, W], core (k, v), coda (k, v))``
    (``[B, L, W, n_kv, d_h]``); rows outside a live window keep ``h``, requests without rows get
    zeros from the heads. The heads run per request (:func:`.window.token_heads`, the gate) in
    the lanes of the live requests only. Reads the cache only."""
    batch = packed.ids.shape[0]
    counts = jnp.where(live, packed.num_rows, 0)

    def branch(size, lanes):
        def run(cache, h_in):
            m = R.row_map(counts, size, lanes, in_order=fixed)
            positions = R.to_rows(packed.positions, m)
            h, *core_kv = WL.run_window_rows(params["core"], cfg, R.to_rows(h_in, m), positions, m,
                                            cache.core_k, cache.core_v, packed.start, depth,
                                            prefix_limit=prefix_limit, rows=rows, **attend)
            r, *coda_kv = WL.run_window_rows(params["coda"], cfg, h, positions, m, cache.coda_k,
                                            cache.coda_v, packed.start, prefix_limit=prefix_limit,
                                            rows=rows, **attend)
            r = R.to_lanes(L.rms_norm(r, params["final_norm"], cfg.rms_norm_eps), m, rows)
            lane_packed = jax.tree_util.tree_map(lambda x: R.by_lane(x, m), packed)
            pred, entropy = jax.vmap(W.token_heads, (None, 0, 0, None))(params, r, lane_packed,
                                                                        heads)
            hazard = jax.vmap(M.gate_hazard, (None, 0, 0))(params, r, R.by_lane(depth, m))
            outputs = tuple(R.lanes_to_batch(x, m) for x in (pred, entropy, hazard))
            return R.from_rows(h, m, rows, fill=h_in), outputs, tuple(core_kv), tuple(coda_kv)
        return run

    fixed = R.is_fixed(shapes)
    attend = select.attention_options(shapes)
    return _on_rows(counts, R.step_shapes(batch, rows, shapes), branch, cache, h)


def _complete_stopped(cache, core_kv, start, stop, executed, max_depth: int):
    """§5 completion for the windows that stopped, and only for them: core depths ``>= executed``
    of their window slots take the last pass's K/V (``core_kv`` ``[B, L_core, W, n_kv, d_h]``).
    One in-place write per (request, depth) that needs it, in a loop whose length is their count,
    so a step in which no window stops writes nothing."""
    batch = stop.shape[0]
    need = stop[:, None] & (jnp.arange(max_depth, dtype=jnp.int32)[None, :] >= executed[:, None])
    (flat,) = jnp.nonzero(need.reshape(-1), size=batch * max_depth, fill_value=0)
    zero = jnp.int32(0)

    def write(j, cache):
        b, d = flat[j] // max_depth, flat[j] % max_depth

        def put(buf, new):
            block = jax.lax.dynamic_index_in_dim(new, b, 0, keepdims=True)[:, :, None]
            return jax.lax.dynamic_update_slice(buf, block.astype(buf.dtype),
                                                (b, zero, d, start[b], zero, zero))

        return cache.replace(core_k=put(cache.core_k, core_kv[0]), core_v=put(cache.core_v, core_kv[1]))

    if cache.core_k.shape[1] == 0:
        return cache
    return jax.lax.fori_loop(0, jnp.sum(need.astype(jnp.int32)), write, cache)


def batch_step(params, cache, slots, consts, *, cfg, window_size, mode, shapes=R.BUCKETED):
    """One step: one recurrent pass of every live request, each at its own depth (module
    docstring). The network runs on the live requests' valid rows packed together
    (:class:`alodlm_jax.network.rows.RowMap`): the prelude only for the windows that open, core and
    readout for every live window; cache completion only for the windows that stop, and their §6.5
    window bookkeeping."""
    rows = 2 * window_size
    scratch = jnp.int32(cache.core_k.shape[3] - rows)  # [B, L, K, T_max, ...]
    vm = jax.vmap
    dstate, packed = slots.dstate, slots.packed
    live = ~dstate.finished
    opening = live & ~slots.is_open
    real_start = packed.start
    # One attention bucket for the whole batch: the live requests' longest prefix (it must be
    # unbatched, or vmap would turn its lax.switch into running every branch).
    prefix_limit = jnp.max(jnp.where(live, real_start, 0))

    # Windows that open run their embedding and prelude; the other requests' prelude K/V (zeros)
    # go to the scratch slots.
    h0, prelude_kv = _prelude_rows(params, cache, packed, opening, prefix_limit, cfg=cfg, rows=rows,
                                   shapes=shapes)
    cache = vm(lambda c, st, kv: KC.store_window(c, st, prelude=kv))(
        cache, jnp.where(opening, real_start, scratch), prelude_kv)
    h = jnp.where(opening[:, None, None], h0, slots.h)
    pst = _select(opening, vm(S.init_pass_state, (0, None))(packed, consts["penalty"]), slots.pst)
    depth = jnp.where(opening | ~live, 0, slots.depth)

    # One pass for every live request at its own depth (.window.window_pass, on packed rows).
    inject, tok = vm(S.injection_rows)(pst)
    h = jnp.where(inject[..., None], M.embed(params, tok), h)
    h, (pred, entropy, hazard), core_kv, coda_kv = _pass_rows(
        params, cache, h, packed, depth, live, prefix_limit, cfg=cfg, rows=rows, heads=window_size,
        shapes=shapes)
    here = jnp.where(live, real_start, scratch)
    cache = vm(lambda c, st, d, core, coda: KC.store_window(c, st, d, core=core, coda=coda))(
        cache, here, depth, core_kv, coda_kv)
    decide = functools.partial(S.decide_pass, q=consts["q"], tau=consts["tau"], mode=mode,
                               max_depth=cfg.max_depth)
    pst, stop = vm(decide)(pst, pred, entropy, hazard, depth)
    h = M.carry_norm(params, cfg, h)
    stop = stop & live
    executed = depth + 1

    # Windows that stopped: completion (written from this pass's own K/V rather than read back
    # from the cache: XLA fused such reads with the pass's writes and then copied the whole cache),
    # the §6.5 bookkeeping, the next window's top-up and its packing.
    cache = _complete_stopped(cache, core_kv, real_start, stop, executed, cfg.max_depth)

    def close(operands):
        dstate, packed = operands
        end = functools.partial(W.end_and_begin, cfg=cfg, window_size=window_size)
        dstate = _select(stop, vm(end, (0, 0, 0, 0, None))(dstate, packed, pst, executed, consts),
                         dstate)
        nxt = vm(lambda w, n: S.pack_window(w, n, mask_id=cfg.mask_token_id))(dstate.window,
                                                                             dstate.cache_len)
        return dstate, _select(stop, nxt, packed)

    def when_stopped(operands):  # a step in which no window stops skips the work
        return jax.lax.cond(jnp.any(stop), close, lambda operands: operands, operands)

    # On NVIDIA GPUs on every slot's state (a few small arrays), kept where the window stopped:
    # XLA:GPU copied that state into and out of the conditional, 23 of the 563 kernels of the
    # 1.7B's batch-32 step, whose 32 requests stop a window nearly every step. Elsewhere the
    # conditional pays (the CPU's small steps; the TPU's batch-32 steps: fewer operations).
    dstate, packed = jax.lax.platform_dependent((dstate, packed), cuda=close,
                                                default=when_stopped)
    return cache, Slots(dstate=dstate, packed=packed, h=h, pst=pst, depth=executed,
                        is_open=live & ~stop, live_steps=slots.live_steps + live.astype(jnp.int32))


def run_program(params, cache, slots, consts, stop_early, *, cfg, window_size, mode,
                shapes=R.BUCKETED):
    """Steps (:func:`batch_step`) of one pass per live request; with ``stop_early`` it returns
    after the step in which a request that was live at entry finishes (so the host can admit a
    waiting one), and in any case after ``consts["step_budget"]`` steps (so that a server admits
    a request that arrives while no slot finishes, and streams what committed). Returning early
    moves no token: the next execution continues from the carry, step for step.
    ``shapes``: the :mod:`alodlm_jax.network.rows` policy."""
    W.TRACE_COUNTS["batch"] += 1
    entry_live = ~slots.dstate.finished
    budget = consts["step_budget"]

    def keep_going(carry):
        finished = carry[1].dstate.finished
        someone_done = jnp.any(entry_live & finished)
        return jnp.any(~finished) & ~(stop_early & someone_done) & (carry[2] < budget)

    def step(carry):
        cache, slots = batch_step(params, carry[0], carry[1], consts, cfg=cfg,
                                  window_size=window_size, mode=mode, shapes=shapes)
        return cache, slots, carry[2] + 1

    cache, slots, _ = jax.lax.while_loop(keep_going, step, (cache, slots, jnp.int32(0)))
    return cache, slots


def admit_program(params, cache, slots, slot, prompt, prompt_len, consts, *, cfg, window_size,
                  capacity, shapes=R.BUCKETED):
    """Prefills ``prompt`` into cache slot ``slot``; the slot gets a fresh, topped-up state whose
    first window is packed and not yet open."""
    W.TRACE_COUNTS["admit"] += 1
    take = lambda x: jax.lax.dynamic_index_in_dim(x, slot, 0, keepdims=False)  # noqa: E731
    member = W.prefill(params, jax.tree_util.tree_map(take, cache), prompt, cfg=cfg, shapes=shapes)
    cache = jax.tree_util.tree_map(
        lambda x, m: jax.lax.dynamic_update_index_in_dim(x, m, slot, 0), cache, member)
    fresh = fresh_slot(params, cfg, window_size, capacity, prompt_len, consts)
    slots = jax.tree_util.tree_map(
        lambda x, m: jax.lax.dynamic_update_index_in_dim(x, m, slot, 0), slots, fresh)
    return cache, slots


def fresh_slot(params, cfg, window_size, capacity, prompt_len, consts, finished=False) -> Slots:
    """One request's :class:`Slots` entry after its prefill (``finished``: an empty slot)."""
    rows = 2 * window_size
    dstate = S.DecodeState.initial(rows=rows, capacity=capacity, mask_id=cfg.mask_token_id,
                                   cache_len=prompt_len)
    if finished:
        dstate = dstate.replace(finished=jnp.bool_(True))
    else:
        dstate = W.begin(dstate, consts, cfg=cfg, window_size=window_size)
    packed = S.pack_window(dstate.window, dstate.cache_len, mask_id=cfg.mask_token_id)
    hidden = params["embed"].shape[1]
    return Slots(dstate=dstate, packed=packed, h=jnp.zeros((rows, hidden), params["embed"].dtype),
                 pst=S.init_pass_state(packed, consts["penalty"]), depth=jnp.int32(0),
                 is_open=jnp.bool_(False), live_steps=jnp.int32(0))


# The batch programs by name, for a layout to jit (alodlm_jax.plan compiles them too).
JIT = {
    "batch": Program(run_program, ("cfg", "window_size", "mode", "shapes"), ("cache", "slots"),
                     per_data_shard="batch"),
    "admit": Program(admit_program, ("cfg", "window_size", "capacity", "shapes"),
                     ("cache", "slots"),
                     per_data_shard="admit"),
}


def batched_spec(bucket: W.Bucket, one):
    """Abstract values of ``one`` request's pytree with a leading ``[B]`` axis."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((bucket.batch,) + x.shape, x.dtype), one)


def new_slots(engine, bucket: W.Bucket) -> Slots:
    """Every slot of ``bucket`` empty (finished), on the default device."""
    one = fresh_slot(engine.params, engine.cfg, bucket.window_size, bucket.capacity, 0,
                     engine.consts(), finished=True)
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (bucket.batch,) + x.shape).copy(), one)


def compile_batch(engine, bucket: W.Bucket):
    """The batch and admit programs of ``bucket`` (compiled once per process while they stay in
    the program store, :mod:`alodlm_jax.decode.programs`), for the engine's layout. The admit
    program compiles in a second thread while the batch program compiles (XLA compiles without
    the GIL), so a first run waits for the longer of the two rather than their sum."""
    layout = engine.layout
    params = W.abstract(engine.params)
    cache = engine.cache_spec(bucket, batched=True)
    slots = jax.eval_shape(lambda: new_slots(engine, bucket))
    slots = layout.spec(slots, layout.slots_shardings(slots))
    consts = layout.spec(engine.consts())
    i32 = layout.spec(jax.ShapeDtypeStruct((), jnp.int32))
    mode = engine.decode.mode
    shapes = engine.shapes
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        admit = pool.submit(
            engine.get_executable, "admit", layout.jit(JIT["admit"]), (bucket, shapes), lambda: (
                (params, cache, slots, i32,
                 layout.spec(jax.ShapeDtypeStruct((bucket.prompt_bucket,), jnp.int32)), i32,
                 consts),
                dict(cfg=engine.cfg, window_size=bucket.window_size, capacity=bucket.capacity,
                     shapes=shapes)))
        run = engine.get_executable("batch", layout.jit(JIT["batch"]), (bucket, mode, shapes),
                                    lambda: (
            (params, cache, slots, consts, layout.spec(jax.ShapeDtypeStruct((), jnp.bool_))),
            dict(cfg=engine.cfg, window_size=bucket.window_size, mode=mode, shapes=shapes)))
        return run, admit.result()


