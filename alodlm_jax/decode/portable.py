"""The portable engine: one request at a time, jitted per-pass functions driven by a Python loop.

The portable decoder of MODEL_AND_DECODING.md §6 with fixed shapes (§11), built from the window
pieces of :mod:`.window` (prefill, begin, open, pass, close; the shapes are a
:class:`~.window.Bucket`):

* the prompt is padded to a length bucket and prefilled in one call (all ``K`` passes);
* the KV cache is preallocated with ``t_max`` slots, passed to every call and donated, so XLA
  updates it in place;
* one compiled call per recurrent pass (:func:`step`: the pass and, under ``lax.cond`` when the
  window stops, its close and the next window's open); the host reads one int32 per pass
  (continue / next window / finished), no other device-to-host traffic until the end.

Compilation is ahead of time (``jit(...).lower(...).compile()``), keyed by the static shapes, and
always done before a request's timer starts; its seconds are accumulated in
:attr:`PortableEngine.compile_seconds`. The executables live in the process's bounded program
store (:mod:`alodlm_jax.decode.programs`), shared with the other engines.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.network import cache as KC
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import state as S
from alodlm_jax.decode import window as W
from alodlm_jax.decode.programs import PROGRAMS
from alodlm_jax.decode.result import DecodeOutput


# ---------------------------------------------------------------------------------------------
# The portable programs (pure; params and cache are arguments)
# ---------------------------------------------------------------------------------------------


def begin(params, cache, dstate, consts, cfg, window_size):
    """The first window: finish test, top-up, packing, embedding and prelude; also returns
    ``finished``."""
    dstate = W.begin(dstate, consts, cfg=cfg, window_size=window_size)
    cache, h, packed, pst = W.open_window(params, cache, dstate, consts, cfg=cfg)
    return cache, dstate, h, packed, pst, dstate.finished


def _advance(params, cache, dstate, packed, pst, executed, consts, cfg, window_size):
    """End the window (complete depths, persist/emit prefix, record commits) and start the next."""
    cache, dstate = W.close_window(cache, dstate, packed, pst, executed, consts, cfg=cfg,
                                   window_size=window_size)
    cache, h, packed, pst = W.open_window(params, cache, dstate, consts, cfg=cfg)
    return cache, dstate, h, packed, pst, dstate.finished


def step(params, cache, dstate, h, packed, pst, depth, consts, cfg, mode, window_size):
    """One pass and, if the window stops, its end and the start of the next window (lax.cond).

    Returns ``(cache, dstate, h, packed, pst, flag, core_input)`` with ``flag`` an int32 the host
    reads once per pass: 0 = the window continues with pass ``depth + 1``; 1 = it stopped and the
    next window is ready for its pass 0; 2 = decoding finished.
    """
    cache, h_next, pst, stop, core_input = W.window_pass(
        params, cache, h, packed, pst, depth, consts["q"], consts["tau"], cfg=cfg, mode=mode)

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
    "prefill": jax.jit(W.prefill, static_argnames=("cfg",), donate_argnames=("cache",)),
    "begin": jax.jit(begin, static_argnames=("cfg", "window_size"), donate_argnames=("cache",)),
    "step": jax.jit(step, static_argnames=("cfg", "mode", "window_size"), donate_argnames=("cache",)),
}


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


class PortableEngine:
    """Greedy adaptive decoding of one request at a time with per-pass compiled calls.

    Args:
      cfg: the model's ``ModelConfig`` (hashable; a static argument of every compiled function).
      params: the jax params pytree (``alodlm_jax.network.params``).
      decode: the decoding configuration.
      stop_ids: the stop token ids (§4.7).
      cache_sharding: a ``KVCache`` of NamedShardings the cache is created in (tensor
        parallelism, :func:`alodlm_jax.network.sharding.cache_shardings`), or None for the default device.
    """

    name = "jax-xla-portable"

    def __init__(self, cfg, params, decode: DecodeConfig, stop_ids: Sequence[int], *,
                 cache_sharding=None):
        self.cfg = cfg
        self.params = params
        self.decode = decode
        self.stop_ids = sorted({int(i) for i in stop_ids})
        self.dtype = params["embed"].dtype
        self.compile_seconds = 0.0
        self.cache_sharding = cache_sharding
        self._params_signature = W.signature(params)
        self._warmed: set[W.Bucket] = set()
        self._cache = None  # reused between requests (same t_max); donated on every call
        self._cache_t_max = None

    # -- compilation ------------------------------------------------------------------------

    def consts(self) -> dict[str, jax.Array]:
        """The runtime decoding inputs (:func:`.window.consts`)."""
        return W.consts(self.decode, self.stop_ids)

    def _state_spec(self, shapes: W.Bucket):
        return jax.eval_shape(lambda: S.DecodeState.initial(
            rows=shapes.rows, capacity=shapes.capacity, mask_id=self.cfg.mask_token_id, cache_len=0))

    def _cache_spec(self, t_max: int):
        spec = jax.eval_shape(lambda: KC.init_cache(self.cfg, t_max, self.dtype))
        if self.cache_sharding is None:
            return spec
        return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                      spec, self.cache_sharding)

    def _new_cache(self, t_max: int):
        if self.cache_sharding is None:
            return KC.init_cache(self.cfg, t_max, self.dtype)
        init = jax.jit(lambda: KC.init_cache(self.cfg, t_max, self.dtype), out_shardings=self.cache_sharding)
        return init()

    def _get(self, name: str, key: tuple, make_args) -> Any:
        full_key = ("portable", name, self.cfg, self._params_signature) + key
        exe, seconds = PROGRAMS.get(full_key, _JIT[name], make_args)
        self.compile_seconds += seconds
        return exe

    def compile_for(self, shapes: W.Bucket) -> dict[str, Any]:
        """Compiles (once) every function a request with these shapes needs; returns them."""
        cfg, ws, mode = self.cfg, self.decode.window_size, self.decode.mode
        params = W.abstract(self.params)
        cache = self._cache_spec(shapes.t_max)
        dstate = self._state_spec(shapes)
        consts = W.abstract(self.consts())
        i32 = jax.ShapeDtypeStruct((), jnp.int32)
        exes = {}
        exes["prefill"] = self._get("prefill", (shapes.prompt_bucket, shapes.t_max), lambda: (
            (params, cache, jax.ShapeDtypeStruct((shapes.prompt_bucket,), jnp.int32)), {"cfg": cfg}))
        begin_out = jax.eval_shape(functools.partial(begin, cfg=cfg, window_size=ws),
                                   params, cache, dstate, consts)
        _, _, h, packed, pst, _ = begin_out
        state_key = (shapes.rows, shapes.t_max, shapes.capacity, consts["stop_ids"].shape)
        exes["begin"] = self._get("begin", state_key, lambda: (
            (params, cache, dstate, consts), {"cfg": cfg, "window_size": ws}))
        exes["step"] = self._get("step", state_key + (mode,), lambda: (
            (params, cache, dstate, h, packed, pst, i32, consts),
            {"cfg": cfg, "mode": mode, "window_size": ws}))
        return exes

    def _warm(self, shapes: W.Bucket, exes: dict[str, Any]) -> None:
        """Runs every executable of these shapes once on throwaway inputs (untimed).

        The first execution of a freshly compiled executable carries one-time costs (on CPU tens
        of milliseconds) that belong to warm-up, not to a request's timing. Slots written here are
        garbage that the next request overwrites before reading (every read slot is written by the
        same request first).
        """
        if shapes in self._warmed:
            return
        depths = self._depths()
        consts = self.consts()
        cache = self._take_cache(shapes.t_max)
        cache = exes["prefill"](self.params, cache, jnp.zeros((shapes.prompt_bucket,), jnp.int32))
        dstate = S.DecodeState.initial(rows=shapes.rows, capacity=shapes.capacity,
                                       mask_id=self.cfg.mask_token_id, cache_len=1)
        cache, dstate, h, packed, pst, _ = exes["begin"](self.params, cache, dstate, consts)
        cache, *rest = exes["step"](self.params, cache, dstate, h, packed, pst, depths[0], consts)
        jax.block_until_ready((cache, rest))
        self._cache = cache
        self._warmed.add(shapes)

    def _depths(self):
        """Device scalars of a request: depth indices / executed counts ``0..K``."""
        return [jnp.asarray(s, jnp.int32) for s in range(self.cfg.max_depth + 1)]

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
        return W.check_request(self.cfg, self.decode, prompt_ids)

    def generate(self, prompt_ids: Sequence[int], trace=None) -> DecodeOutput:
        """Decodes one request. Compilation (if any) happens before the timer starts.

        ``trace(event, payload)``, for tests only (it reads device values back every pass):
        ``"window"`` before each window forward (``ids``, ``positions``, ``start`` of the valid
        packed rows) and ``"core_input"`` at each pass (``depth``, ``h``: the valid rows' core
        input after injection, packed order).
        """
        prompt = self.check_request(prompt_ids)
        shapes = W.Bucket.for_request(len(prompt), self.decode)
        exes = self.compile_for(shapes)
        self._warm(shapes, exes)
        cfg = self.cfg
        depths = self._depths()
        consts = self.consts()
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
                params, cache, dstate, h, packed, pst, depths[s], consts)
            if trace is not None:
                trace("core_input", {"depth": s, "h": np.asarray(core_input)[:n_rows]})
            flag = int(flag)
            s = s + 1 if flag == 0 else 0
        host = jax.device_get(dstate)
        wall_seconds = time.perf_counter() - start
        self._cache = cache
        self.last_cache_len = int(host.cache_len)  # tokens persisted in the cache (tests)

        return W.decode_output(cfg, host, len(prompt), wall_seconds, prefill_seconds)
