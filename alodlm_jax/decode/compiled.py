"""The compiled engine: a whole generation is one XLA program per static shape bucket.

The program (:func:`_single_program`) runs, with no host round trip until the result is complete:

1. the prompt prefill (all ``K`` passes, MODEL_AND_DECODING.md §6.2);
2. an outer ``lax.while_loop`` over windows (§6.5) whose body packs the window, runs the embedding
   and prelude, then
3. an inner ``lax.while_loop`` over recurrent passes (§6.4: injection, core at depth ``s``, readout,
   heads, decision), stopping on the device-side stop flag;
4. the cache completion, prefix persistence and the next window's finish test / top-up.

The per-request pieces (begin, open, pass, close) and the shape bucket live in
:mod:`alodlm_jax.decode.window`, which the batch program (:mod:`.batched`) shares; this module
imports :mod:`.batched`, never the other way round.

All decisions are :mod:`alodlm_jax.decode.state`'s pure functions, called exactly as the portable
engine calls them (same functions, same order, same arguments), and the network is
:mod:`alodlm_jax.model`'s; that is what makes the two engines' outputs identical.

Static shape bucket (:class:`Bucket`): prompt-length bucket (power of two), window size (rows
``W = 2 * window_size``), output capacity (``next_pow2(max_new_tokens)``), cache size (the portable
engine's, from the prompt bucket and the budget), the model config (depth cap ``K`` included), the
decoding mode and the batch size. The prompt, ``max_new_tokens``, ``q``, ``tau``, the position
penalty and the stop ids are runtime inputs, so every request of an evaluation run (one decoding
configuration) whose prompt falls in one length bucket shares one executable. Params and cache are
arguments; the cache is donated and handed back, so XLA updates it in place and the next request of
the bucket reuses the buffers. Inside a bucket, a window's forward runs on the smallest row bucket
holding its valid rows and attention reads the smallest power-of-two part of the cache holding
the prefix, runtime choices made on the device with ``lax.switch``
(:func:`alodlm_jax.decode.portable.row_buckets`, :func:`alodlm_jax.model.kv_buckets`; the
portable engine makes the same ones, so the arithmetic stays identical).

Cache slots (:attr:`Bucket.t_max`, the portable engine's size): a window's rows live at
``cache_len + packed_row < prompt_len + max_new_tokens + W``. A batched program adds ``W`` scratch
slots where an idle request (see :mod:`alodlm_jax.decode.batched`) writes its discarded K/V.

Linear time: every write inside the loops is a small ``dynamic_update_slice``/scatter into a
carried buffer (cache slots of one window, ``W`` output entries). On XLA:CPU such writes can
degrade to whole-buffer copies per iteration (jax issue 40101, a 0.11.1 regression; this project
pins 0.10.2); ``tests/decode_compiled`` and ``scripts/bench_decode.py`` measure time against
``max_new_tokens`` with a fixed cache size to catch it.

Timing: the program has no host synchronization inside, so ``prefill_seconds`` cannot be taken
from the request itself. It is the measured, synchronized wall time of the bucket's prefill run on
its own (the same computation: the padded prompt length fixes it, not the prompt's content),
measured once per bucket at compile time (median of three runs). ``wall_seconds`` is the request's
true synchronized wall time (prefill included).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax import model as M
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import state as S
from alodlm_jax.decode import batched
from alodlm_jax.decode.layout import ONE_DEVICE, Layout, Program
from alodlm_jax.decode.portable import _signature, _spec, prefill  # shared with the portable engine
from alodlm_jax.decode.programs import PROGRAMS, enable_persistent_cache
from alodlm_jax.decode.result import DecodeOutput, result_dict, work_counters
from alodlm_jax.decode.window import (  # noqa: F401  (re-exported: the engine's public names)
    STOP_ID_SLOTS, TRACE_COUNTS, Bucket, begin, close_window, end_and_begin, next_pow2, open_window,
    window_pass)

# ---------------------------------------------------------------------------------------------
# The single-request program
# ---------------------------------------------------------------------------------------------


def _single_program(params, cache, prompt, prompt_len, consts, *, cfg, window_size, mode, capacity):
    """Prefill + outer window loop + inner pass loop, one request. Returns ``(cache, DecodeState)``."""
    TRACE_COUNTS["single"] += 1
    cache = prefill(params, cache, prompt, cfg=cfg)
    dstate = S.DecodeState.initial(rows=2 * window_size, capacity=capacity,
                                   mask_id=cfg.mask_token_id, cache_len=prompt_len)
    dstate = begin(dstate, consts, cfg=cfg, window_size=window_size)

    def window_body(carry):
        cache, dstate = carry
        cache, h, packed, pst = open_window(params, cache, dstate, consts, cfg=cfg)

        def pass_body(inner):
            s, cache, h, pst, _ = inner
            cache, h, pst, stop = window_pass(params, cache, h, packed, pst, s, consts,
                                              cfg=cfg, mode=mode)
            return s + 1, cache, h, pst, stop

        executed, cache, h, pst, _ = jax.lax.while_loop(
            lambda inner: ~inner[4], pass_body, (jnp.int32(0), cache, h, pst, jnp.bool_(False)))
        return close_window(cache, dstate, packed, pst, executed, consts, cfg=cfg,
                            window_size=window_size)

    return jax.lax.while_loop(lambda carry: ~carry[1].finished, window_body, (cache, dstate))


def _prefill_program(params, cache, prompt, *, cfg):
    """The prefill alone (timed once per bucket to report ``prefill_seconds``)."""
    TRACE_COUNTS["prefill"] += 1
    return prefill(params, cache, prompt, cfg=cfg)


_JIT = {
    "single": Program(_single_program, ("cfg", "window_size", "mode", "capacity"), ("cache",)),
    "prefill": Program(_prefill_program, ("cfg",), ("cache",)),
}


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


class CompiledEngine:
    """Greedy adaptive decoding where one request is one compiled XLA program execution.

    Same constructor and ``generate`` contract as :class:`~alodlm_jax.decode.portable.PortableEngine`;
    :meth:`generate_batch` decodes several requests together (see :mod:`.batched`).

    Args:
      cfg, params, decode, stop_ids: as for the portable engine.
      batch_size: request slots of the batched program of :meth:`generate_batch` /
        :meth:`generate_stream` (continuous batching).
      compilation_cache_dir: enables JAX's persistent compilation cache there.
      measure_prefill: time the bucket's prefill once at compile time for ``prefill_seconds``
        (otherwise ``prefill_seconds`` is reported as 0.0).
      cache_slots: a fixed, larger cache size (benchmarks: time against ``max_new_tokens`` at a
        constant per-pass attention length). Outputs then equal the portable engine's only up to
        fp32 rounding, since the attention reductions run over a different buffer length.
      layout: the devices the programs run on (:mod:`.layout`: one device, or a ``("data",
        "model")`` mesh whose ``model`` axis ``params`` are already sharded on); ``batch_size``
        must be a multiple of its ``data``.
    """

    name = "jax-xla-compiled"

    def __init__(self, cfg, params, decode: DecodeConfig, stop_ids: Sequence[int], *,
                 batch_size: int = 1, compilation_cache_dir: str | None = None,
                 measure_prefill: bool = True, cache_slots: int | None = None,
                 layout: Layout = ONE_DEVICE):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        layout.check_batch(batch_size)
        self.layout = layout
        enable_persistent_cache(compilation_cache_dir)
        self.cfg = cfg
        self.params = params
        self.decode = decode
        self.stop_ids = sorted({int(i) for i in stop_ids})
        self.batch_size = int(batch_size)
        self.measure_prefill = measure_prefill
        self.cache_slots = cache_slots
        self.dtype = params["embed"].dtype
        self.compile_seconds = 0.0
        self._params_signature = _signature(params)
        self._caches: dict[tuple[int, int], Any] = {}  # (batch, t_max) -> cache, reused
        self._prefill_seconds: dict[Bucket, float] = {}

    # -- inputs ------------------------------------------------------------------------------

    def consts(self) -> dict[str, jax.Array]:
        """The runtime decoding inputs shared by every request."""
        d = self.decode
        stop = list(self.stop_ids) + [-1] * max(0, STOP_ID_SLOTS - len(self.stop_ids))
        return {
            "max_new_tokens": jnp.asarray(d.max_new_tokens, jnp.int32),
            "stop_ids": jnp.asarray(stop, jnp.int32),
            "penalty": jnp.asarray(d.effective_position_penalty, jnp.float32),
            "q": jnp.asarray(d.q, jnp.float32),
            "tau": jnp.asarray(d.tau, jnp.float32),
        }

    def bucket_for(self, prompt_len: int, batch: int = 1) -> Bucket:
        bucket = Bucket.for_request(prompt_len, self.decode, batch)
        if self.cache_slots is not None:
            if self.cache_slots < bucket.cache_slots:
                raise ValueError(f"cache_slots must be at least {bucket.cache_slots}")
            bucket = dataclasses.replace(bucket, cache_slots=int(self.cache_slots))
        return bucket

    def check_request(self, prompt_ids: Sequence[int]) -> list[int]:
        """§6.1 request checks (ValueError), exactly the portable engine's."""
        from alodlm_jax.decode.portable import PortableEngine

        return PortableEngine.check_request(self, prompt_ids)  # uses only cfg and decode

    def take_cache(self, bucket: Bucket, batched: bool):
        key = (bucket.batch if batched else 0, bucket.t_max)
        cache = self._caches.pop(key, None)
        if cache is None:
            for other in list(self._caches):  # free buffers of other shapes first
                del self._caches[other]
            cache = self.layout.new_cache(self.cfg, bucket.t_max, self.dtype,
                                          bucket.batch if batched else None)
        return key, cache

    def give_back_cache(self, key, cache) -> None:
        self._caches[key] = cache

    # -- compilation -------------------------------------------------------------------------

    def get_executable(self, name: str, jitted, key: tuple, make_args: Callable):
        """The executable of program ``name`` for ``key`` from the process's bounded program store
        (shared by every engine: program, cfg, params signature, layout, bucket, mode), compiled
        now if it is not there; compile seconds are added to :attr:`compile_seconds`."""
        full_key = ("compiled", name, self.cfg, self._params_signature, self.layout.key) + key
        exe, seconds = PROGRAMS.get(full_key, jitted, make_args)
        self.compile_seconds += seconds
        return exe

    def cache_spec(self, bucket: Bucket, batched: bool):
        """Abstract cache of ``bucket`` (with its layout's shardings)."""
        cache = jax.eval_shape(lambda: M.init_cache(self.cfg, bucket.t_max, self.dtype))
        if batched:
            cache = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct((bucket.batch,) + x.shape, x.dtype), cache)
        return self.layout.spec(cache, self.layout.cache_shardings(self.cfg, batched))

    def compile_for(self, bucket: Bucket):
        """Compiles (once per process and bucket, while it stays in the program store) the
        single-request program; returns it."""
        cfg, mode = self.cfg, self.decode.mode
        layout = self.layout
        params = _spec(self.params)
        cache = self.cache_spec(bucket, batched=False)
        prompt = layout.spec(jax.ShapeDtypeStruct((bucket.prompt_bucket,), jnp.int32))
        i32 = layout.spec(jax.ShapeDtypeStruct((), jnp.int32))
        consts = layout.spec(self.consts())
        statics = dict(cfg=cfg, window_size=bucket.window_size, mode=mode, capacity=bucket.capacity)
        exe = self.get_executable("single", self.layout.jit(_JIT["single"]), (bucket, mode), lambda: (
            (params, cache, prompt, i32, consts), statics))
        if self.measure_prefill and bucket not in self._prefill_seconds:
            self._prefill_seconds[bucket] = self._time_prefill(bucket, params, cache, prompt)
        return exe

    def _time_prefill(self, bucket: Bucket, params_spec, cache_spec, prompt_spec) -> float:
        exe = self.get_executable("prefill", self.layout.jit(_JIT["prefill"]), (bucket.prompt_bucket, bucket.t_max),
                                  lambda: ((params_spec, cache_spec, prompt_spec), {"cfg": self.cfg}))
        return self.median_prefill_seconds(exe, bucket, jnp.zeros((bucket.prompt_bucket,), jnp.int32))

    def median_prefill_seconds(self, exe, bucket: Bucket, ids) -> float:
        """Median of 3 synchronized runs of a compiled prefill ``exe(params, cache, ids)`` on the
        bucket's cache buffer; this is the reported prefill time of a single request."""
        key, cache = self.take_cache(bucket, batched=False)
        times = []
        for _ in range(3):
            jax.block_until_ready((cache, ids))
            t0 = time.perf_counter()
            cache = exe(self.params, cache, ids)
            jax.block_until_ready(cache)
            times.append(time.perf_counter() - t0)
        self.give_back_cache(key, cache)
        return statistics.median(times)

    # -- one request -------------------------------------------------------------------------

    def _output(self, host, prompt_len: int, wall: float, prefill_seconds: float) -> DecodeOutput:
        cfg = self.cfg
        n = int(host.num_generated)
        counters = dict(outer_steps=int(host.outer_steps),
                        recurrent_passes=int(host.recurrent_passes),
                        loop_token_passes=int(host.loop_token_passes))
        work = work_counters(prompt_tokens=prompt_len, max_depth=cfg.max_depth,
                             num_prelude=cfg.num_prelude_layers, num_core=cfg.num_core_layers,
                             num_coda=cfg.num_coda_layers, window_rows=int(host.window_rows),
                             **counters)
        return DecodeOutput(
            token_ids=np.asarray(host.out_tokens[:n]).tolist(),
            exit_depths=np.asarray(host.out_exit[:n]).tolist(),
            first_pass_halt_probabilities=[float(x) for x in np.asarray(host.out_halt[:n])],
            prompt_tokens=prompt_len, wall_seconds=wall, prefill_seconds=prefill_seconds,
            stop_reason="eos" if bool(host.hit_stop) else "length", work=work, **counters)

    def generate(self, prompt_ids: Sequence[int]) -> DecodeOutput:
        """Decodes one request with one program execution (compiling first, outside the timer)."""
        prompt = self.check_request(prompt_ids)
        bucket = self.bucket_for(len(prompt))
        exe = self.compile_for(bucket)
        padded = np.zeros((bucket.prompt_bucket,), np.int32)
        padded[: len(prompt)] = prompt
        ids, prompt_len, consts = self.layout.place(
            (jnp.asarray(padded), jnp.asarray(len(prompt), jnp.int32), self.consts()))
        key, cache = self.take_cache(bucket, batched=False)
        jax.block_until_ready((cache, ids, prompt_len, consts, self.params))

        start = time.perf_counter()
        cache, dstate = exe(self.params, cache, ids, prompt_len, consts)
        host = jax.device_get(dstate)
        wall = time.perf_counter() - start
        self.give_back_cache(key, cache)
        return self._output(host, len(prompt), wall, self._prefill_seconds.get(bucket, 0.0))

    # -- several requests --------------------------------------------------------------------

    def generate_batch(self, prompts: Sequence[Sequence[int]], *, batch_size: int | None = None,
                       text: Callable[[list[int]], str] | None = None) -> list:
        """Decodes ``prompts`` with ``batch_size`` slots and continuous batching (see
        :mod:`.batched`); outputs in input order.

        Returns :class:`DecodeOutput` objects, or §6.6 result dicts when ``text`` (token ids ->
        decoded text) is given. Each output equals decoding the prompt alone; its timings follow
        :data:`.batched.BATCH_TIMING`.
        """
        outs = self.generate_stream(prompts, batch_size=batch_size)
        if text is None:
            return list(outs)
        return [result_dict(out, text(out.token_ids)) for out in outs]

    def generate_stream(self, prompts: Sequence[Sequence[int]], *, batch_size: int | None = None):
        """:meth:`generate_batch` as an iterator: each output as soon as it and every earlier one
        are complete (an evaluation writes each row then)."""
        return batched.generate_stream(self, prompts, batch_size or self.batch_size)
