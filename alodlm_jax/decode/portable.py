"""The portable engine: jitted prefill and per-pass functions driven by a Python host loop.

This is the portable decoder of MODEL_AND_DECODING.md §6 with fixed shapes (§11):

* the prompt is padded to a length bucket and prefilled in one call (all ``K`` passes);
* a window has ``W = 2 * window_size`` rows (validity mask in :mod:`.state`), its network runs on
  the smallest row bucket holding the valid rows (:func:`row_buckets`, a ``lax.switch``; the cache
  is only read there and the window's K/V are stored after it), and the LM head runs only on the
  ``window_size`` rows that can hold masks (:func:`token_heads`);
* the KV cache is preallocated with ``T_max`` slots (a bucket ``>= prompt bucket + max_new_tokens
  + W``), passed to every call and donated, so XLA updates it in place;
* one compiled call per recurrent pass (:func:`step`: injection, core at depth ``s``, readout,
  heads, decision and, under ``lax.cond`` when the window stops, the cache completion, the §6.5
  bookkeeping and the next window's packing and prelude); the host reads one int32 per pass
  (continue / next window / finished) — no other device-to-host traffic until the end.

Compilation is ahead of time (``jit(...).lower(...).compile()``), keyed by the static shapes, and
always done before a request's timer starts; its seconds are accumulated in
:attr:`PortableEngine.compile_seconds`. The executables live in the process's bounded program
store (:mod:`alodlm_jax.decode.programs`), shared with the other engines.

The decision logic is entirely in :mod:`alodlm_jax.decode.state`; this module only wires the model
functions of :mod:`alodlm_jax.model` to it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax import model as M
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import state as S
from alodlm_jax.decode.programs import PROGRAMS
from alodlm_jax.decode.result import DecodeOutput, work_counters

STOP_ID_SLOTS = 8


def next_bucket(n: int, minimum: int = 16) -> int:
    """The smallest power of two ``>= max(n, minimum)``."""
    n = max(int(n), minimum)
    return 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The static shapes of one request: every compiled function is keyed by these."""

    prompt_bucket: int  # padded prompt length
    rows: int  # W = 2 * window_size
    t_max: int  # cache slots
    capacity: int  # output buffer length (>= max_new_tokens)

    @classmethod
    def for_request(cls, prompt_len: int, decode: DecodeConfig) -> "Shapes":
        prompt_bucket = next_bucket(prompt_len)
        rows = 2 * decode.window_size
        t_max = next_bucket(prompt_bucket + decode.max_new_tokens + rows, minimum=64)
        # The output buffers reuse t_max (>= max_new_tokens) so that they add no shape key.
        return cls(prompt_bucket, rows, t_max, t_max)


# ---------------------------------------------------------------------------------------------
# The model wiring of one request (pure; params and cache are arguments). The portable engine
# jits these one by one; a fully compiled engine can call the same functions inside its loops.
# ---------------------------------------------------------------------------------------------


def prefill(params, cache, ids, cfg):
    """§6.2: one causal forward over the padded prompt, all K passes, K/V into slots 0..P_b-1."""
    positions = jnp.arange(ids.shape[0], dtype=jnp.int32)
    start = jnp.int32(0)
    h, cache = M.prelude(params, cfg, M.embed(params, ids), positions, cache, start)
    for depth in range(cfg.max_depth):
        if depth > 0:
            h = M.carry_norm(params, cfg, h)
        h, cache = M.core_pass(params, cfg, h, positions, cache, start, jnp.int32(depth))
        _, cache = M.readout(params, cfg, h, positions, cache, start)
    return cache


def start_window(params, cache, dstate, consts, cfg, window_size):
    """Finish test + top-up (state.begin_window), packing, embedding and prelude of the window."""
    max_new, stop_ids, penalty = consts["max_new_tokens"], consts["stop_ids"], consts["penalty"]
    dstate = S.begin_window(dstate, window_size=window_size, max_new_tokens=max_new,
                            stop_ids=stop_ids, mask_id=cfg.mask_token_id)
    packed = S.pack_window(dstate.window, dstate.cache_len, mask_id=cfg.mask_token_id)
    pst = S.init_pass_state(packed, penalty)
    cache, h = window_prelude(params, cache, packed, cfg=cfg)
    return cache, dstate, h, packed, pst


def _begin(params, cache, dstate, consts, cfg, window_size):
    cache, dstate, h, packed, pst = start_window(params, cache, dstate, consts, cfg, window_size)
    return cache, dstate, h, packed, pst, dstate.finished


def row_buckets(window_size: int) -> tuple[int, ...]:
    """The row counts a window's forward runs at: ``window_size``, 5/4 and 3/2 of it, and ``W``.

    A window has ``W = 2 * window_size`` rows but usually fewer valid ones (the masks plus the
    committed entries behind the first mask), which come first in packed order; its forward runs
    on the smallest bucket holding them. Never fewer than ``window_size`` rows.
    """
    ws = int(window_size)
    return tuple(sorted({ws, -(-5 * ws // 4), -(-3 * ws // 2), 2 * ws}))


def _on_row_bucket(rows: int, needed, make_branch, *operands):
    """``make_branch(n)(*operands)`` for the smallest row bucket ``n`` holding ``needed`` rows: one
    ``lax.switch`` (``needed`` must not be batched under ``vmap``: a batch passes a shared value)."""
    buckets = row_buckets(rows // 2)
    index = jnp.minimum(jnp.sum((jnp.asarray(buckets, jnp.int32) < needed).astype(jnp.int32)),
                        len(buckets) - 1)
    return jax.lax.switch(index, [make_branch(n) for n in buckets], *operands)


def _pad_rows(x, rows: int, axis: int = 0, fill=None):
    """``x`` grown to ``rows`` along ``axis``: the new rows are zeros, or ``fill``'s rows."""
    if x.shape[axis] == rows:
        return x
    if fill is None:
        shape = x.shape[:axis] + (rows,) + x.shape[axis + 1:]
        fill = jnp.zeros(shape, x.dtype)
    return jax.lax.dynamic_update_slice_in_dim(fill, x, 0, axis=axis)


def _pad_kv(kv, rows: int):
    return tuple(_pad_rows(x, rows, axis=1) for x in kv)


def window_prelude(params, cache, packed, *, cfg, prefix_limit=None, rows_needed=None):
    """Embedding and prelude of a packed window -> ``(cache, h [W, H])``.

    Row buckets and deferred writes: the forward runs on the smallest of :func:`row_buckets` holding
    the window's valid rows (``rows_needed``, default ``packed.num_rows``; a batch passes one shared
    value), reading the cache only (``model.prelude_window``); the window's K/V are stored after
    the ``lax.switch``. XLA copies a buffer that is updated inside a conditional (the whole cache,
    at every layer, when the layers wrote their slots inside the switch), so the writes stay out
    of it. Rows past the bucket are padding (zeros). ``prefix_limit``: see
    ``model.run_window_stack`` (a batch passes one limit shared by its requests).
    """
    h, kv = prelude_rows(params, cache, packed, cfg=cfg, prefix_limit=prefix_limit,
                         rows_needed=rows_needed)
    return M.store_window(cache, packed.start, prelude=kv), h


def prelude_rows(params, cache, packed, *, cfg, prefix_limit=None, rows_needed=None):
    """:func:`window_prelude` without the store: ``(h [W, H], (k, v) [L_pre, W, n_kv, d_h])``."""
    rows = packed.ids.shape[0]

    def branch(n):
        def run(cache):
            h = M.embed(params, packed.ids[:n])
            h, kv = M.prelude_window(params, cfg, h, packed.positions[:n], cache, packed.start,
                                     prefix_limit=prefix_limit)
            return _pad_rows(h, rows), _pad_kv(kv, rows)
        return run

    needed = packed.num_rows if rows_needed is None else rows_needed
    return _on_row_bucket(rows, needed, branch, cache)


def window_pass(params, cache, h, packed, pst, depth, q, tau, *, cfg, mode, prefix_limit=None,
                rows_needed=None, return_core_kv=False):
    """One recurrent pass: inject, core at ``depth``, readout, heads, decision, carry norm.

    The core and coda run on the window's row bucket, reading the cache only, and their K/V are
    stored afterwards (see :func:`window_prelude`). Returns ``(cache, h_next, pst, stop,
    core_input)`` with ``W`` rows; ``core_input`` is the carry after injection, which only a traced
    run reads back. ``return_core_kv`` appends the core K/V the pass stored (``[L_core, W, n_kv,
    d_h]`` pairs), from which a batch completes the cache depths of a window that stops.
    """
    rows = h.shape[0]
    inject, tok = S.injection_rows(pst)
    h = jnp.where(inject[:, None], M.embed(params, tok), h)
    core_input = h

    def branch(n):
        def run(cache, h_in):
            positions = packed.positions[:n]
            h, core_kv = M.core_window(params, cfg, h_in[:n], positions, cache, packed.start, depth,
                                       prefix_limit=prefix_limit)
            r, coda_kv = M.readout_window(params, cfg, h, positions, cache, packed.start,
                                          prefix_limit=prefix_limit)
            return (_pad_rows(h, rows, fill=h_in), _pad_rows(r, rows), _pad_kv(core_kv, rows),
                    _pad_kv(coda_kv, rows))
        return run

    needed = packed.num_rows if rows_needed is None else rows_needed
    h, r, core_kv, coda_kv = _on_row_bucket(rows, needed, branch, cache, h)
    cache = M.store_window(cache, packed.start, depth, core=core_kv, coda=coda_kv)
    pred, entropy = token_heads(params, r, packed, rows // 2)
    hazard = M.gate_hazard(params, r, depth)
    pst, stop = S.decide_pass(pst, pred, entropy, hazard, depth, q=q, tau=tau, mode=mode,
                              max_depth=cfg.max_depth)
    h = M.carry_norm(params, cfg, h)
    if return_core_kv:
        return cache, h, pst, stop, core_input, core_kv
    return cache, h, pst, stop, core_input


def token_heads(params, r, packed, heads: int):
    """Greedy token and entropy (int32[W], float32[W]) of the packed rows that are masks.

    Only mask rows are ever committed, so only they need the LM head. They are contiguous in packed
    order (after the observed rows) and number at most the window size (``heads = W / 2``): the
    head runs on the ``heads`` rows from the first mask row (moved back to fit), which halves the
    pass's largest matrix product. The other rows get token 0 and entropy 0 (never read).
    """
    rows = r.shape[0]
    observed = jnp.sum((packed.valid & ~packed.is_mask).astype(jnp.int32))
    lo = jnp.minimum(observed, rows - heads)
    logits = M.lm_logits(params, jax.lax.dynamic_slice_in_dim(r, lo, heads, axis=0))
    pred = S.greedy_tokens(logits)
    entropy = S.entropy_from_logits(logits)
    return (jax.lax.dynamic_update_slice(jnp.zeros((rows,), jnp.int32), pred, (lo,)),
            jax.lax.dynamic_update_slice(jnp.zeros((rows,), jnp.float32), entropy, (lo,)))


def finish_window(cache, dstate, packed, pst, executed):
    """Complete the cache depths of the window's slots, then §6.5 steps 5-8 (state.end_window)."""
    cache = M.complete_depths(cache, packed.start, packed.ids.shape[0], executed)
    return cache, S.end_window(dstate, packed, pst, executed)


def _advance(params, cache, dstate, packed, pst, executed, consts, cfg, window_size):
    """End the window (complete depths, persist/emit prefix, record commits) and start the next."""
    cache, dstate = finish_window(cache, dstate, packed, pst, executed)
    return _begin(params, cache, dstate, consts, cfg, window_size)


def step(params, cache, dstate, h, packed, pst, depth, q, tau, consts, cfg, mode, window_size):
    """One pass and, if the window stops, its end and the start of the next window (lax.cond).

    Returns ``(cache, dstate, h, packed, pst, flag, core_input)`` with ``flag`` an int32 the host
    reads once per pass: 0 = the window continues with pass ``depth + 1``; 1 = it stopped and the
    next window is ready for its pass 0; 2 = decoding finished.
    """
    cache, h_next, pst, stop, core_input = window_pass(params, cache, h, packed, pst, depth, q, tau,
                                                       cfg=cfg, mode=mode)

    def stopped(operands):
        cache, dstate, h_next, packed, pst = operands
        return _advance(params, cache, dstate, packed, pst, depth + 1, consts, cfg, window_size)

    def continues(operands):
        cache, dstate, h_next, packed, pst = operands
        return cache, dstate, h_next, packed, pst, jnp.zeros((), bool)

    cache, dstate, h, packed, pst, finished = jax.lax.cond(
        stop, stopped, continues, (cache, dstate, h_next, packed, pst))
    flag = jnp.where(finished, 2, jnp.where(stop, 1, 0)).astype(jnp.int32)
    return cache, dstate, h, packed, pst, flag, core_input


_JIT = {
    "prefill": jax.jit(prefill, static_argnames=("cfg",), donate_argnames=("cache",)),
    "begin": jax.jit(_begin, static_argnames=("cfg", "window_size"), donate_argnames=("cache",)),
    "step": jax.jit(step, static_argnames=("cfg", "mode", "window_size"), donate_argnames=("cache",)),
}


# Executables are shared by every engine in the process (alodlm_jax.decode.programs, a bounded
# store), keyed by function, model config, params signature (shapes, dtypes, devices) and the
# static shapes. q and tau are runtime inputs, so engines that differ only in them share everything.


def _signature(tree) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (str(treedef),) + tuple(
        (tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None))) for x in leaves)


def _spec(tree):
    """Abstract values; a NamedSharding (tensor-parallel params, ``alodlm_jax.sharding``) is kept
    so the executables are compiled for it. Single-device values stay unspecified, as before."""
    def spec(x):
        sharding = getattr(x, "sharding", None)
        keep = sharding if isinstance(sharding, jax.sharding.NamedSharding) else None
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=keep)

    return jax.tree_util.tree_map(spec, tree)


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


class PortableEngine:
    """Greedy adaptive decoding of one request at a time with per-pass compiled calls.

    Args:
      cfg: the model's ``ModelConfig`` (hashable; a static argument of every compiled function).
      params: the jax params pytree (``alodlm_jax.params``).
      decode: the decoding configuration.
      stop_ids: the stop token ids (§4.7).
    """

    name = "jax-xla-portable"

    def __init__(self, cfg, params, decode: DecodeConfig, stop_ids: Sequence[int]):
        self.cfg = cfg
        self.params = params
        self.decode = decode
        self.stop_ids = sorted({int(i) for i in stop_ids})
        self.dtype = params["embed"].dtype
        self.compile_seconds = 0.0
        self._params_signature = _signature(params)
        self._warmed: set[Shapes] = set()
        self._cache = None  # reused between requests (same t_max); donated on every call
        self._cache_t_max = None

    # -- compilation ------------------------------------------------------------------------

    def _consts(self) -> dict[str, jax.Array]:
        d = self.decode
        return {
            "max_new_tokens": jnp.asarray(d.max_new_tokens, jnp.int32),
            "stop_ids": S.stop_id_vector(self.stop_ids, STOP_ID_SLOTS),
            "penalty": jnp.asarray(d.effective_position_penalty, jnp.float32),
        }

    def _state_spec(self, shapes: Shapes):
        return jax.eval_shape(lambda: S.DecodeState.initial(
            rows=shapes.rows, capacity=shapes.capacity, mask_id=self.cfg.mask_token_id, cache_len=0))

    # Tensor parallelism hook (alodlm_jax.sharding): a KVCache of NamedShardings, or None for the
    # default device. Set before the first request; the cache is then created in its shards.
    cache_sharding = None

    def _cache_spec(self, t_max: int):
        spec = jax.eval_shape(lambda: M.init_cache(self.cfg, t_max, self.dtype))
        if self.cache_sharding is None:
            return spec
        return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                      spec, self.cache_sharding)

    def _new_cache(self, t_max: int):
        if self.cache_sharding is None:
            return M.init_cache(self.cfg, t_max, self.dtype)
        init = jax.jit(lambda: M.init_cache(self.cfg, t_max, self.dtype), out_shardings=self.cache_sharding)
        return init()

    def _get(self, name: str, key: tuple, make_args) -> Any:
        full_key = ("portable", name, self.cfg, self._params_signature) + key
        exe, seconds = PROGRAMS.get(full_key, _JIT[name], make_args)
        self.compile_seconds += seconds
        return exe

    def compile_for(self, shapes: Shapes) -> dict[str, Any]:
        """Compiles (once) every function a request with these shapes needs; returns them."""
        cfg, ws, mode = self.cfg, self.decode.window_size, self.decode.mode
        params = _spec(self.params)
        cache = self._cache_spec(shapes.t_max)
        dstate = self._state_spec(shapes)
        consts = _spec(self._consts())
        i32 = jax.ShapeDtypeStruct((), jnp.int32)
        f32 = jax.ShapeDtypeStruct((), jnp.float32)
        exes = {}
        exes["prefill"] = self._get("prefill", (shapes.prompt_bucket, shapes.t_max), lambda: (
            (params, cache, jax.ShapeDtypeStruct((shapes.prompt_bucket,), jnp.int32)), {"cfg": cfg}))
        begin_out = jax.eval_shape(functools.partial(_begin, cfg=cfg, window_size=ws),
                                   params, cache, dstate, consts)
        _, _, h, packed, pst, _ = begin_out
        state_key = (shapes.rows, shapes.t_max, shapes.capacity, consts["stop_ids"].shape)
        exes["begin"] = self._get("begin", state_key, lambda: (
            (params, cache, dstate, consts), {"cfg": cfg, "window_size": ws}))
        exes["step"] = self._get("step", state_key + (mode,), lambda: (
            (params, cache, dstate, h, packed, pst, i32, f32, f32, consts),
            {"cfg": cfg, "mode": mode, "window_size": ws}))
        return exes

    def _warm(self, shapes: Shapes, exes: dict[str, Any]) -> None:
        """Runs every executable of these shapes once on throwaway inputs (untimed).

        The first execution of a freshly compiled executable carries one-time costs (on CPU tens
        of milliseconds) that belong to warm-up, not to a request's timing. Slots written here are
        garbage that the next request overwrites before reading (every read slot is written by the
        same request first).
        """
        if shapes in self._warmed:
            return
        depths, q, tau = self._scalars()
        consts = self._consts()
        cache = self._take_cache(shapes.t_max)
        cache = exes["prefill"](self.params, cache, jnp.zeros((shapes.prompt_bucket,), jnp.int32))
        dstate = S.DecodeState.initial(rows=shapes.rows, capacity=shapes.capacity,
                                       mask_id=self.cfg.mask_token_id, cache_len=1)
        cache, dstate, h, packed, pst, _ = exes["begin"](self.params, cache, dstate, consts)
        cache, *rest = exes["step"](self.params, cache, dstate, h, packed, pst, depths[0], q, tau,
                                    consts)
        jax.block_until_ready((cache, rest))
        self._cache = cache
        self._warmed.add(shapes)

    def _scalars(self):
        """Device scalars of a request: depth indices / executed counts ``0..K``, q and tau."""
        depths = [jnp.asarray(s, jnp.int32) for s in range(self.cfg.max_depth + 1)]
        return depths, jnp.asarray(self.decode.q, jnp.float32), jnp.asarray(self.decode.tau, jnp.float32)

    def _take_cache(self, t_max: int):
        if self._cache is None or self._cache_t_max != t_max:
            self._cache = None  # free the old buffers first
            self._cache = self._new_cache(t_max)
            self._cache_t_max = t_max
        cache, self._cache = self._cache, None  # donated below; stored back at the end
        return cache

    # -- one request -------------------------------------------------------------------------

    def check_request(self, prompt_ids: Sequence[int]) -> list[int]:
        """§6.1 request checks (ValueError): non-empty, ids in range, fits the context."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("The prompt must contain at least one token")
        vocab = self.cfg.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"Prompt token ids must be in [0, {vocab})")
        limit = self.cfg.max_position_embeddings
        if len(prompt) + self.decode.max_new_tokens > limit:
            raise ValueError(
                f"Prompt length {len(prompt)} plus max_new_tokens {self.decode.max_new_tokens} "
                f"exceeds max_position_embeddings {limit}")
        return prompt

    def generate(self, prompt_ids: Sequence[int], trace=None) -> DecodeOutput:
        """Decodes one request. Compilation (if any) happens before the timer starts.

        ``trace(event, payload)``, for tests only (it reads device values back every pass):
        ``"window"`` before each window forward (``ids``, ``positions``, ``start`` of the valid
        packed rows) and ``"core_input"`` at each pass (``depth``, ``h``: the valid rows' core
        input after injection, packed order).
        """
        prompt = self.check_request(prompt_ids)
        shapes = Shapes.for_request(len(prompt), self.decode)
        exes = self.compile_for(shapes)
        self._warm(shapes, exes)
        cfg = self.cfg
        depths, q, tau = self._scalars()
        consts = self._consts()
        padded = np.zeros((shapes.prompt_bucket,), np.int32)
        padded[: len(prompt)] = prompt
        dstate = S.DecodeState.initial(rows=shapes.rows, capacity=shapes.capacity,
                                       mask_id=cfg.mask_token_id, cache_len=len(prompt))
        cache = self._take_cache(shapes.t_max)
        params = self.params
        ids = jnp.asarray(padded)
        jax.block_until_ready((cache, dstate, consts, params, ids))

        start = time.perf_counter()
        cache = exes["prefill"](params, cache, ids)
        jax.block_until_ready(cache)
        prefill_seconds = time.perf_counter() - start

        cache, dstate, h, packed, pst, finished = exes["begin"](params, cache, dstate, consts)
        run_step = exes["step"]
        s, flag = 0, 2 if bool(finished) else 1
        while flag != 2:  # one device->host read (the flag) per pass
            if trace is not None and flag == 1:
                n_rows = int(packed.num_rows)
                trace("window", {"ids": np.asarray(packed.ids)[:n_rows].tolist(),
                                 "positions": np.asarray(packed.positions)[:n_rows].tolist(),
                                 "start": int(packed.start)})
            cache, dstate, h, packed, pst, flag, core_input = run_step(
                params, cache, dstate, h, packed, pst, depths[s], q, tau, consts)
            if trace is not None:
                trace("core_input", {"depth": s, "h": np.asarray(core_input)[:n_rows]})
            flag = int(flag)
            s = s + 1 if flag == 0 else 0
        host = jax.device_get(dstate)
        wall_seconds = time.perf_counter() - start
        self._cache = cache
        self.last_cache_len = int(host.cache_len)  # tokens persisted in the cache (tests)

        n = int(host.num_generated)
        tokens = host.out_tokens[:n].tolist()
        exits = host.out_exit[:n].tolist()
        halts = [float(x) for x in host.out_halt[:n]]
        counters = dict(outer_steps=int(host.outer_steps), recurrent_passes=int(host.recurrent_passes),
                        loop_token_passes=int(host.loop_token_passes))
        work = work_counters(prompt_tokens=len(prompt), max_depth=cfg.max_depth,
                             num_prelude=cfg.num_prelude_layers, num_core=cfg.num_core_layers,
                             num_coda=cfg.num_coda_layers, window_rows=int(host.window_rows),
                             **counters)
        return DecodeOutput(
            token_ids=tokens, exit_depths=exits, first_pass_halt_probabilities=halts,
            prompt_tokens=len(prompt), wall_seconds=wall_seconds, prefill_seconds=prefill_seconds,
            stop_reason="eos" if bool(host.hit_stop) else "length", work=work, **counters)
