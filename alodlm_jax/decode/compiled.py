"""The compiled engine: a whole generation is one XLA program per static shape bucket.

The single-request program (:func:`single_program`) runs, with no host round trip until the
result is complete: the prompt prefill (MODEL_AND_DECODING.md §6.2), then an outer
``lax.while_loop`` over windows (§6.5: begin, open) whose body runs an inner ``lax.while_loop``
over recurrent passes (§6.4) until the device-side stop flag, then closes the window. Every piece
is :mod:`.window`'s, called exactly as the portable engine calls it, so the two engines' outputs
are identical. :meth:`CompiledEngine.generate_stream` decodes several requests in the batch
program (:mod:`.batched`) under the host scheduler (:mod:`.scheduler`).

Static shapes (:class:`~.window.Bucket`, the model config, the decoding mode and the layout) key a
program; the prompt, ``max_new_tokens``, ``q``, ``tau``, the position penalty and the stop ids are
runtime inputs (:func:`.window.consts`), so every request of one decoding configuration whose
prompt falls in one length bucket shares one executable. Params and cache are arguments; the
cache is donated and handed back, so XLA updates it in place and the next request of the bucket
reuses the buffers.

Timing: the program has no host synchronization inside, so ``prefill_seconds`` is the measured,
synchronized wall time of the bucket's prefill run on its own (the same computation: the padded
prompt length fixes it), measured once per bucket at compile time (median of three runs).
``wall_seconds`` is the request's true synchronized wall time (prefill included).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.network import cache as KC
from alodlm_jax.network import rows as R
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import scheduler
from alodlm_jax.decode import state as S
from alodlm_jax.decode import window as W
from alodlm_jax.decode.layout import ONE_DEVICE, Layout, Program
from alodlm_jax.decode.programs import PROGRAMS, compiler_options, enable_persistent_cache
from alodlm_jax.decode.result import DecodeOutput, result_dict
from alodlm_jax.decode.window import Bucket

# ---------------------------------------------------------------------------------------------
# The single-request program
# ---------------------------------------------------------------------------------------------


def single_program(params, cache, prompt, prompt_len, consts, *, cfg, window_size, mode, capacity,
                   shapes=R.BUCKETED):
    """Prefill + outer window loop + inner pass loop, one request. Returns ``(cache, DecodeState)``.
    ``shapes``: the :mod:`alodlm_jax.network.rows` policy of every forward."""
    W.TRACE_COUNTS["single"] += 1
    cache = W.prefill(params, cache, prompt, cfg=cfg, shapes=shapes)
    dstate = S.DecodeState.initial(rows=2 * window_size, capacity=capacity,
                                   mask_id=cfg.mask_token_id, cache_len=prompt_len)
    dstate = W.begin(dstate, consts, cfg=cfg, window_size=window_size)

    def window_body(carry):
        cache, dstate = carry
        cache, h, packed, pst = W.open_window(params, cache, dstate, consts, cfg=cfg, shapes=shapes)

        def pass_body(inner):
            s, cache, h, pst, _ = inner
            cache, h, pst, stop, _ = W.window_pass(params, cache, h, packed, pst, s, consts["q"],
                                                   consts["tau"], cfg=cfg, mode=mode, shapes=shapes)
            return s + 1, cache, h, pst, stop

        executed, cache, h, pst, _ = jax.lax.while_loop(
            lambda inner: ~inner[4], pass_body, (jnp.int32(0), cache, h, pst, jnp.bool_(False)))
        return W.close_window(cache, dstate, packed, pst, executed, consts, cfg=cfg,
                              window_size=window_size)

    return jax.lax.while_loop(lambda carry: ~carry[1].finished, window_body, (cache, dstate))


def prefill_program(params, cache, prompt, *, cfg, shapes=R.BUCKETED):
    """The prefill alone (timed once per bucket to report ``prefill_seconds``)."""
    W.TRACE_COUNTS["prefill"] += 1
    return W.prefill(params, cache, prompt, cfg=cfg, shapes=shapes)


# The engine's programs by name, for a layout to jit (alodlm_jax.plan compiles them too).
JIT = {
    "single": Program(single_program, ("cfg", "window_size", "mode", "capacity", "shapes"),
                      ("cache",)),
    "prefill": Program(prefill_program, ("cfg", "shapes"), ("cache",)),
}


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


def _platform(params, layout: Layout) -> str:
    """The JAX platform of ``params`` (where the programs run), or the layout's."""
    leaf = jax.tree_util.tree_leaves(params)[0]
    if isinstance(leaf, jax.Array):
        return next(iter(leaf.devices())).platform
    return layout.platform


class CompiledEngine:
    """Greedy adaptive decoding where one request is one compiled XLA program execution.

    Same constructor and ``generate`` contract as :class:`~alodlm_jax.decode.portable.PortableEngine`;
    :meth:`generate_batch` decodes several requests together (:mod:`.scheduler`).

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
      shapes: the programs' shape policy (:mod:`alodlm_jax.network.rows`); by default the one of the
        platform the params are on (the layout's, for abstract params): row and attention buckets
        on a CPU, one fixed shape on a GPU or TPU.
      graphs: on a GPU, compile with loops and branches in command buffers too
        (:func:`.programs.compiler_options`); elsewhere nothing changes.
    """

    name = "jax-xla-compiled"

    def __init__(self, cfg, params, decode: DecodeConfig, stop_ids: Sequence[int], *,
                 batch_size: int = 1, compilation_cache_dir: str | None = None,
                 measure_prefill: bool = True, cache_slots: int | None = None,
                 layout: Layout = ONE_DEVICE, shapes: str | None = None, graphs: bool = False):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        layout.check_batch(batch_size)
        if shapes is not None and shapes not in R.SHAPES:
            raise ValueError(f"shapes must be one of {R.SHAPES}, not {shapes!r}")
        self.layout = layout
        platform = _platform(params, layout)
        self.shapes = shapes or R.shapes_for(platform, layout.data * layout.model)
        # XLA options of every program (programs.compiler_options: XLA's defaults, or on a GPU
        # with ``graphs`` loops and branches in command buffers too).
        self.compiler_options = compiler_options(platform, graphs=graphs)
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
        self._seconds_lock = threading.Lock()
        self._params_signature = W.signature(params)
        self._caches: dict[tuple[int, int], Any] = {}  # (batch, t_max) -> cache, reused
        self._prefill_seconds: dict[Bucket, float] = {}

    # -- inputs ------------------------------------------------------------------------------

    def consts(self, step_budget: int = W.NO_STEP_BUDGET) -> dict[str, jax.Array]:
        """The runtime decoding inputs shared by every request (:func:`.window.consts`;
        ``step_budget``: the batch program's, none by default)."""
        return W.consts(self.decode, self.stop_ids, step_budget)

    def bucket_for(self, prompt_len: int, batch: int = 1) -> Bucket:
        multiple = R.FIXED_SLOT_MULTIPLE if R.is_fixed(self.shapes) else None
        bucket = Bucket.for_request(prompt_len, self.decode, batch, slot_multiple=multiple)
        if self.cache_slots is not None:
            if self.cache_slots < bucket.cache_slots:
                raise ValueError(f"cache_slots must be at least {bucket.cache_slots}")
            bucket = dataclasses.replace(bucket, cache_slots=int(self.cache_slots))
        return bucket

    def check_request(self, prompt_ids: Sequence[int]) -> list[int]:
        """§6.1 request checks (ValueError), exactly the portable engine's."""
        return W.check_request(self.cfg, self.decode, prompt_ids)

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
        now if it is not there; compile seconds are added to :attr:`compile_seconds` (a sum: two
        compiles may overlap, :func:`.batched.compile_batch`)."""
        full_key = ("compiled", name, self.cfg, self._params_signature, self.layout.key,
                    tuple(sorted(self.compiler_options.items()))) + key
        exe, seconds = PROGRAMS.get(full_key, jitted, make_args, self.compiler_options)
        with self._seconds_lock:  # programs may compile in two threads (batched.compile_batch)
            self.compile_seconds += seconds
        return exe

    def cache_spec(self, bucket: Bucket, batched: bool):
        """Abstract cache of ``bucket`` (with its layout's shardings)."""
        cache = jax.eval_shape(lambda: KC.init_cache(self.cfg, bucket.t_max, self.dtype))
        if batched:
            cache = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct((bucket.batch,) + x.shape, x.dtype), cache)
        return self.layout.spec(cache, self.layout.cache_shardings(self.cfg, batched))

    def compile_for(self, bucket: Bucket):
        """Compiles (once per process and bucket, while it stays in the program store) the
        single-request program; returns it."""
        cfg, mode = self.cfg, self.decode.mode
        layout = self.layout
        params = W.abstract(self.params)
        cache = self.cache_spec(bucket, batched=False)
        prompt = layout.spec(jax.ShapeDtypeStruct((bucket.prompt_bucket,), jnp.int32))
        i32 = layout.spec(jax.ShapeDtypeStruct((), jnp.int32))
        consts = layout.spec(self.consts())
        statics = dict(cfg=cfg, window_size=bucket.window_size, mode=mode, capacity=bucket.capacity,
                       shapes=self.shapes)
        exe = self.get_executable("single", self.layout.jit(JIT["single"]),
                                  (bucket, mode, self.shapes),
                                  lambda: ((params, cache, prompt, i32, consts), statics))
        if self.measure_prefill and bucket not in self._prefill_seconds:
            self._prefill_seconds[bucket] = self._time_prefill(bucket, params, cache, prompt)
        return exe

    def _time_prefill(self, bucket: Bucket, params_spec, cache_spec, prompt_spec) -> float:
        exe = self.get_executable("prefill", self.layout.jit(JIT["prefill"]),
                                  (bucket.prompt_bucket, bucket.t_max, self.shapes),
                                  lambda: ((params_spec, cache_spec, prompt_spec),
                                           {"cfg": self.cfg, "shapes": self.shapes}))
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
        return W.decode_output(self.cfg, host, len(prompt), wall,
                               self._prefill_seconds.get(bucket, 0.0))

    # -- several requests --------------------------------------------------------------------

    def generate_batch(self, prompts: Sequence[Sequence[int]], *, batch_size: int | None = None,
                       text: Callable[[list[int]], str] | None = None,
                       step_budget: int = W.NO_STEP_BUDGET) -> list:
        """Decodes ``prompts`` with ``batch_size`` slots and continuous batching (see
        :mod:`.batched`); outputs in input order.

        Returns :class:`DecodeOutput` objects, or §6.6 result dicts when ``text`` (token ids ->
        decoded text) is given. Each output equals decoding the prompt alone; its timings follow
        :data:`.scheduler.BATCH_TIMING`. ``step_budget``: the most steps of one batch program
        execution (:func:`.batched.run_program`; the outputs do not depend on it).
        """
        outs = self.generate_stream(prompts, batch_size=batch_size, step_budget=step_budget)
        if text is None:
            return list(outs)
        return [result_dict(out, text(out.token_ids)) for out in outs]

    def generate_stream(self, prompts: Sequence[Sequence[int]], *, batch_size: int | None = None,
                        step_budget: int = W.NO_STEP_BUDGET):
        """:meth:`generate_batch` as an iterator: each output as soon as it and every earlier one
        are complete (an evaluation writes each row then)."""
        return scheduler.generate_stream(self, prompts, batch_size or self.batch_size,
                                         step_budget=step_budget)
