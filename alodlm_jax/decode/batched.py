"""Batched compiled decoding: ``B`` request slots advance together in one XLA program.

Each slot keeps its own window state (:class:`~alodlm_jax.decode.state.DecodeState`), its own
window in progress and its own KV cache, all with a leading batch axis (:class:`Slots`). The
program is one ``lax.while_loop`` of *steps*; a step (:func:`_step`) runs exactly one recurrent
pass for every live request, each at its own depth, and does only the work its live requests
need:

1. the windows that open this step run their embedding and prelude; only their valid rows are
   computed (none at all when no window opens);
2. every live request runs one pass of its window (§6.4) at its own depth: core, readout, heads,
   decision, exactly the portable engine's :func:`~alodlm_jax.decode.portable.window_pass`;
3. the windows that stopped, and only they, close: cache completion (one in-place write per
   request and depth that needs it, in a loop as long as their count), §6.5 bookkeeping, the next
   window's top-up and packing (skipped when no window stopped), and open at the next step.

Packed rows (:class:`alodlm_jax.model.RowMap`): the network does not run on ``B`` padded windows
of ``W`` rows but on the live requests' valid rows packed into one matrix, whose row count is the
smallest of :func:`alodlm_jax.model.row_totals` (1/4, 1/2, 5/8, 3/4 or all of ``B * W``) holding
them, a ``lax.switch`` over :func:`alodlm_jax.model.step_shapes`. Every row-wise operation
(norms, projections, MLP, RoPE) multiplies each weight once for all of them; attention, which
reads each request's own cache at its own depth, and the heads (token, entropy, hazard) run per
request on the padded layout of the shape's *lanes*, which hold only the requests with rows
(queries, keys and values scattered there and back): a batch that is emptying attends for its
live requests in half the lanes rather than for all ``B`` slots. So a step of ``B`` requests
reads every weight once, as a single pass does: on an accelerator, where a pass is bound by reading the weights, ``B`` requests share one read
(``scripts/gpu_check.sh``'s batch sweep, :func:`step_analysis`).

So windows are not synchronized: a request whose window stops after one pass starts its next
window at the next step instead of waiting for the slowest window of the batch. Finished or
empty slots idle: they contribute no rows, and their cache writes go to the scratch slots
(``Bucket.scratch_start``), so a request's real cache is exactly as if it had decoded alone.

Continuous batching (:func:`generate_stream`): the host admits waiting requests into empty slots
(one compiled *admit* program: the request's prefill into its slot of the cache, its initial state,
first top-up and packed first window) and runs the batch program, which returns as soon as a slot
finishes while requests are waiting; the host then collects that slot's result and admits the next
request. Results are yielded in input order as soon as they and every earlier one are complete.

Cache writes and attention: each request writes its window rows with its own in-place
``dynamic_update_slice`` (the batching rule of :func:`alodlm_jax.model.write_slots`; plain ``vmap``
would make it a whole-buffer ``scatter``), and all slots share one power-of-two bucket of the cache
for the prefix (the longest live prefix, ``prefix_limit``).

Because each request's arithmetic is the single-request arithmetic (up to the shared attention
bucket and the packed row count, which change only the length of fp32 reductions and the row
count of matrix products), each request's outputs equal decoding it alone (tests check tokens,
exit depths and counters exactly, hazards to 1e-6, for several batch sizes and both modes).

Performance: see docs/performance.md (``scripts/bench_decode.py`` on this CPU,
:func:`step_analysis` for one step's cost on the released shapes, ``scripts/gpu_check.sh``).

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
from alodlm_jax.decode import portable as P
from alodlm_jax.decode import state as S
from alodlm_jax.decode import window as Wn
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


def _on_rows(counts, shapes, make_branch, *operands):
    """``make_branch(R, A)(*operands)`` for the first of ``shapes`` (:func:`alodlm_jax.model.step_shapes`,
    ``(0, 0)`` a branch of its own where listed) holding ``counts``' rows and requests with rows
    (one ``lax.switch``)."""
    index = M.step_shape_index(shapes, counts)
    return jax.lax.switch(index, [make_branch(*shape) for shape in shapes], *operands)


def _prelude_rows(params, cache, packed, opening, prefix_limit, *, cfg, rows):
    """Embedding and prelude of the windows that open this step, their rows packed together:
    ``(h [B, W, H], (k, v) [B, L_pre, W, n_kv, d_h])``, zeros for the other requests. Reads the
    cache only (stores follow the switch, :func:`.portable.window_prelude`)."""
    batch = packed.ids.shape[0]
    hidden = params["embed"].shape[1]
    counts = jnp.where(opening, packed.num_rows, 0)
    kv_shape = (batch, cfg.num_prelude_layers, rows) + cache.prelude_k.shape[-2:]

    def branch(size, lanes):
        def run(cache):
            if size == 0:
                zeros = jnp.zeros(kv_shape, cache.prelude_k.dtype)
                return jnp.zeros((batch, rows, hidden), params["embed"].dtype), (zeros, zeros)
            m = M.row_map(counts, size, lanes)
            h = M.embed(params, M.to_rows(packed.ids, m))
            h, k, v = M.run_window_rows(params["prelude"], cfg, h, M.to_rows(packed.positions, m), m,
                                        cache.prelude_k, cache.prelude_v, packed.start,
                                        prefix_limit=prefix_limit, rows=rows)
            return M.from_rows(h, m, rows), (k, v)
        return run

    return _on_rows(counts, ((0, 0),) + M.step_shapes(batch, rows), branch, cache)


def _pass_rows(params, cache, h, packed, depth, live, prefix_limit, *, cfg, rows, heads):
    """Core at each request's depth, readout and heads for every live request, rows packed
    together: ``(h [B, W, H], (pred, entropy, hazard) [B, W], core (k, v), coda (k, v))``
    (``[B, L, W, n_kv, d_h]``); rows outside a live window keep ``h``, requests without rows get
    zeros from the heads. The heads run per request (:func:`.portable.token_heads`, the gate) in
    the lanes of the live requests only. Reads the cache only."""
    batch = packed.ids.shape[0]
    counts = jnp.where(live, packed.num_rows, 0)

    def branch(size, lanes):
        def run(cache, h_in):
            m = M.row_map(counts, size, lanes)
            positions = M.to_rows(packed.positions, m)
            h, *core_kv = M.run_window_rows(params["core"], cfg, M.to_rows(h_in, m), positions, m,
                                            cache.core_k, cache.core_v, packed.start, depth,
                                            prefix_limit=prefix_limit, rows=rows)
            r, *coda_kv = M.run_window_rows(params["coda"], cfg, h, positions, m, cache.coda_k,
                                            cache.coda_v, packed.start, prefix_limit=prefix_limit,
                                            rows=rows)
            r = M.to_lanes(M.rms_norm(r, params["final_norm"], cfg.rms_norm_eps), m, rows)
            lane_packed = jax.tree_util.tree_map(lambda x: x[m.lane], packed)
            pred, entropy = jax.vmap(P.token_heads, (None, 0, 0, None))(params, r, lane_packed,
                                                                        heads)
            hazard = jax.vmap(M.gate_hazard, (None, 0, 0))(params, r, depth[m.lane])
            outputs = tuple(M.lanes_to_batch(x, m) for x in (pred, entropy, hazard))
            return M.from_rows(h, m, rows, fill=h_in), outputs, tuple(core_kv), tuple(coda_kv)
        return run

    return _on_rows(counts, M.step_shapes(batch, rows), branch, cache, h)


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


def _step(params, cache, slots, consts, *, cfg, window_size, mode):
    """One step: one recurrent pass of every live request, each at its own depth (module
    docstring). The network runs on the live requests' valid rows packed together
    (:class:`alodlm_jax.model.RowMap`): the prelude only for the windows that open, core and
    readout for every live window; cache completion and the §6.5 window bookkeeping only for the
    windows that stop."""
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
    h0, prelude_kv = _prelude_rows(params, cache, packed, opening, prefix_limit, cfg=cfg, rows=rows)
    cache = vm(lambda c, st, kv: M.store_window(c, st, prelude=kv))(
        cache, jnp.where(opening, real_start, scratch), prelude_kv)
    h = jnp.where(opening[:, None, None], h0, slots.h)
    pst = _select(opening, vm(S.init_pass_state, (0, None))(packed, consts["penalty"]), slots.pst)
    depth = jnp.where(opening | ~live, 0, slots.depth)

    # One pass for every live request at its own depth (P.window_pass, on packed rows).
    inject, tok = vm(S.injection_rows)(pst)
    h = jnp.where(inject[..., None], M.embed(params, tok), h)
    h, (pred, entropy, hazard), core_kv, coda_kv = _pass_rows(
        params, cache, h, packed, depth, live, prefix_limit, cfg=cfg, rows=rows, heads=window_size)
    here = jnp.where(live, real_start, scratch)
    cache = vm(lambda c, st, d, core, coda: M.store_window(c, st, d, core=core, coda=coda))(
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
        end = functools.partial(Wn.end_and_begin, cfg=cfg, window_size=window_size)
        dstate = _select(stop, vm(end, (0, 0, 0, 0, None))(dstate, packed, pst, executed, consts),
                         dstate)
        nxt = vm(lambda w, n: S.pack_window(w, n, mask_id=cfg.mask_token_id))(dstate.window,
                                                                             dstate.cache_len)
        return dstate, _select(stop, nxt, packed)

    dstate, packed = jax.lax.cond(jnp.any(stop), close, lambda operands: operands, (dstate, packed))
    return cache, Slots(dstate=dstate, packed=packed, h=h, pst=pst, depth=executed,
                        is_open=live & ~stop, live_steps=slots.live_steps + live.astype(jnp.int32))


def _run_program(params, cache, slots, consts, stop_early, *, cfg, window_size, mode):
    """Steps (:func:`_step`) of one pass per live request; with ``stop_early`` it returns after the
    step in which a request that was live at entry finishes (so the host can admit a waiting one)."""
    Wn.TRACE_COUNTS["batch"] += 1
    entry_live = ~slots.dstate.finished

    def keep_going(carry):
        finished = carry[1].dstate.finished
        someone_done = jnp.any(entry_live & finished)
        return jnp.any(~finished) & ~(stop_early & someone_done)

    def step(carry):
        return _step(params, *carry, consts, cfg=cfg, window_size=window_size, mode=mode)

    return jax.lax.while_loop(keep_going, step, (cache, slots))


def _admit_program(params, cache, slots, slot, prompt, prompt_len, consts, *, cfg, window_size,
                   capacity):
    """Prefills ``prompt`` into cache slot ``slot``; the slot gets a fresh, topped-up state whose
    first window is packed and not yet open."""
    Wn.TRACE_COUNTS["admit"] += 1
    take = lambda x: jax.lax.dynamic_index_in_dim(x, slot, 0, keepdims=False)  # noqa: E731
    member = P.prefill(params, jax.tree_util.tree_map(take, cache), prompt, cfg=cfg)
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
        dstate = Wn.begin(dstate, consts, cfg=cfg, window_size=window_size)
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


def _batched_spec(bucket: Wn.Bucket, one):
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((bucket.batch,) + x.shape, x.dtype), one)


def _new_slots(engine, bucket: Wn.Bucket) -> Slots:
    one = _fresh_slot(engine.params, engine.cfg, bucket.window_size, bucket.capacity, 0,
                      engine.consts(), finished=True)
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (bucket.batch,) + x.shape).copy(), one)


def _empty_slots(engine, bucket: Wn.Bucket) -> Slots:
    """Every slot empty (finished): the batch's starting state, on the engine's layout (slots
    split over ``data``)."""
    slots = _new_slots(engine, bucket)
    return engine.layout.place(slots, engine.layout.slots_shardings(slots))


def compile_batch(engine, bucket: Wn.Bucket):
    """The batch and admit programs of ``bucket`` (compiled once per process while they stay in
    the program store, :mod:`alodlm_jax.decode.programs`), for the engine's layout."""
    layout = engine.layout
    params = P._spec(engine.params)
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


def step_analysis(cfg, params, bucket: Wn.Bucket, *, mode: str = "entropy", dtype=None) -> dict:
    """XLA's own cost and memory analysis of one batch step (:func:`_step` compiled alone for
    ``bucket``), beside the step's physical floor; compiles, never decodes.

    ``params`` may be arrays or ``jax.ShapeDtypeStruct``s (the 1.7B and 8B shapes need no memory).
    XLA's cost analysis takes the costliest branch of every ``lax.switch``, so the figures are
    those of the heaviest step the bucket allows: every slot live with a full window, attending
    over the whole cache buffer. The floor is what such a step must move at least: every weight it
    multiplies, once (layer weights, final norm, LM head, gate; the embedding is read by rows),
    plus each request's K/V for the ``cache_slots`` prefix slots at one depth of every layer and
    its window rows written back.

    XLA's cost model charges a gather its whole operand (``bytes accessed0{}`` of ``x[i]`` on a
    4 MiB array is 4 MiB for 8 rows), while the gather reads only the rows it selects. A step
    gathers each request's prefix at its own depth from the batch's cache (two gathers per layer)
    and its window's embeddings from the table (two lookups), so ``gather_overcharge`` computes
    what the model charges beyond the gathered bytes, and ``bytes_moved`` is ``bytes_accessed``
    less it. Returns plain numbers (see the keys).
    """
    dtype = jnp.dtype(dtype or jax.tree_util.tree_leaves(params)[0].dtype)
    window_size = bucket.window_size
    rows = 2 * window_size
    params_spec = P._spec(params)
    cache = _batched_spec(bucket, jax.eval_shape(lambda: M.init_cache(cfg, bucket.t_max, dtype)))
    vocab, hidden = params_spec["embed"].shape
    one = jax.eval_shape(lambda: _fresh_slot(
        {"embed": jnp.zeros((1, hidden), dtype)}, cfg, window_size, bucket.capacity, 0,
        _analysis_consts(), finished=True))
    slots = _batched_spec(bucket, one)
    consts = P._spec(_analysis_consts())
    step = jax.jit(functools.partial(_step, cfg=cfg, window_size=window_size, mode=mode),
                   donate_argnums=(1, 2))
    compiled = step.lower(params_spec, cache, slots, consts).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    memory = compiled.memory_analysis()
    item = dtype.itemsize
    batch, slots_attended = bucket.batch, bucket.t_max
    weights = sum(x.size * jnp.dtype(x.dtype).itemsize
                  for path, x in jax.tree_util.tree_leaves_with_path(params_spec)
                  if jax.tree_util.keystr(path[:1]) != "['embed']")
    row_kv = cfg.num_key_value_heads * cfg.head_dim * item  # one slot of one layer's K (or V)
    layers = cfg.num_prelude_layers + cfg.num_core_layers + cfg.num_coda_layers
    kv = 2 * batch * layers * row_kv * (slots_attended + rows)
    gathered = 2 * batch * slots_attended * row_kv  # one layer's K and V prefix reads
    overcharge = sum(2 * n * (buffer.size * item - gathered // 2) for n, buffer in (
        (cfg.num_prelude_layers, cache.prelude_k), (cfg.num_core_layers, cache.core_k),
        (cfg.num_coda_layers, cache.coda_k)))
    overcharge += 2 * (vocab * hidden - batch * rows * hidden) * item
    accessed = float(cost.get("bytes accessed", 0.0))
    return {"batch": batch, "cache_slots": slots_attended, "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": accessed, "gather_overcharge": float(overcharge),
            "bytes_moved": accessed - overcharge, "temp_bytes": int(memory.temp_size_in_bytes),
            "argument_bytes": int(memory.argument_size_in_bytes), "weight_bytes": int(weights),
            "kv_bytes": int(kv), "floor_bytes": int(weights + kv),
            "moved_over_floor": (accessed - overcharge) / (weights + kv)}


def _analysis_consts() -> dict:
    return {"max_new_tokens": jnp.int32(1), "stop_ids": jnp.full((Wn.STOP_ID_SLOTS,), -1, jnp.int32),
            "penalty": jnp.float32(0), "q": jnp.float32(0.5), "tau": jnp.float32(0.4)}


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
