"""The KV cache of the ALoDLM network (MODEL_AND_DECODING.md §5) and the writes into it.

:class:`KVCache`: one preallocated buffer a layer (prelude and coda) or a layer and depth (core);
:func:`write_slots` writes a call's ``T`` rows in place (also per request under ``vmap``),
:func:`store_window` a window forward's K/V, :func:`complete_depths` the depths a window's early
exits skipped. Attention reads a power-of-two bucket of a buffer (:func:`kv_buckets`,
:func:`kv_bucket_index`, :func:`on_kv_bucket`). :mod:`alodlm_jax.network.model` describes the
cache's addressing.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.custom_batching import custom_vmap

if TYPE_CHECKING:  # pragma: no cover
    from alodlm_convert.config import ModelConfig


@struct.dataclass
class KVCache:
    """Depth-aware prefix cache (spec §5): prelude/coda one buffer per layer, core one per depth."""

    prelude_k: jax.Array  # [L_pre, T_max, n_kv, d_h]
    prelude_v: jax.Array
    core_k: jax.Array  # [L_core, K, T_max, n_kv, d_h]
    core_v: jax.Array
    coda_k: jax.Array  # [L_coda, T_max, n_kv, d_h]
    coda_v: jax.Array

    @property
    def t_max(self) -> int:
        return self.core_k.shape[2]


def init_cache(cfg: "ModelConfig", t_max: int, dtype) -> KVCache:
    """A zeroed cache with room for ``t_max`` slots per buffer."""
    dtype = resolve_dtype(dtype)
    tail = (t_max, cfg.num_key_value_heads, cfg.head_dim)
    zeros = lambda *lead: jnp.zeros(lead + tail, dtype)  # noqa: E731
    return KVCache(
        prelude_k=zeros(cfg.num_prelude_layers), prelude_v=zeros(cfg.num_prelude_layers),
        core_k=zeros(cfg.num_core_layers, cfg.max_depth), core_v=zeros(cfg.num_core_layers, cfg.max_depth),
        coda_k=zeros(cfg.num_coda_layers), coda_v=zeros(cfg.num_coda_layers),
    )


def resolve_dtype(dtype):
    """``"fp32"``/``"bf16"`` or anything ``jnp.dtype`` understands -> a numpy dtype."""
    names = {"fp32": jnp.float32, "float32": jnp.float32, "bf16": jnp.bfloat16, "bfloat16": jnp.bfloat16}
    if isinstance(dtype, str) and dtype in names:
        return jnp.dtype(names[dtype])
    return jnp.dtype(dtype)


def on_kv_bucket(slots: int, kv_bucket, attend, *operands):
    """``attend(size, *operands)`` over the first ``size`` slots of a ``slots``-slot buffer: the
    ``kv_buckets(slots)[kv_bucket]`` length (one ``lax.switch``), or all of them without
    ``kv_bucket``."""
    sizes = kv_buckets(slots)
    if kv_bucket is None or len(sizes) == 1:
        return attend(slots, *operands)
    return jax.lax.switch(kv_bucket, [functools.partial(attend, size) for size in sizes], *operands)


def kv_buckets(slots: int, smallest: int = 64) -> tuple[int, ...]:
    """Attention lengths for a buffer of ``slots`` slots: powers of two from ``smallest``, then ``slots``."""
    sizes = []
    size = smallest
    while size < slots:
        sizes.append(size)
        size *= 2
    return tuple(sizes) + (slots,)


def kv_bucket_index(sizes: tuple[int, ...], needed) -> jax.Array:
    """Index of the smallest of ``sizes`` holding ``needed`` slots (the last one if none does)."""
    needed = jnp.asarray(needed, jnp.int32)
    return jnp.minimum(jnp.sum((jnp.asarray(sizes, jnp.int32) < needed).astype(jnp.int32)),
                       len(sizes) - 1)


@custom_vmap
def write_slots(buf: jax.Array, update: jax.Array, offset: jax.Array) -> jax.Array:
    """``dynamic_update_slice(buf, update, offset)`` with ``offset`` an int32 vector.

    Under ``jax.vmap`` (a batch of requests, each with its own cache and offset) the default rule
    turns the update into a ``scatter`` over the whole batched buffer, which XLA:CPU does not run
    in place (a full cache copy per layer call). The batching rule below writes each request's
    rows with its own in-place ``dynamic_update_slice`` instead.
    """
    return jax.lax.dynamic_update_slice(buf, update, tuple(offset[i] for i in range(buf.ndim)))


@write_slots.def_vmap
def _write_slots_batched(axis_size, in_batched, buf, update, offset):
    buf_batched, update_batched, offset_batched = in_batched
    if not buf_batched:
        buf = jnp.broadcast_to(buf, (axis_size,) + buf.shape)
    for b in range(axis_size):
        u = update[b] if update_batched else update
        o = offset[b] if offset_batched else offset
        buf = jax.lax.dynamic_update_slice(
            buf, u[None], (jnp.int32(b),) + tuple(o[i] for i in range(u.ndim)))
    return buf, True


def store_window(cache: KVCache, start, depth=None, *, prelude=None, core=None, coda=None) -> KVCache:
    """Writes window K/V pairs from :func:`run_window_stack` at slots ``start..start+T``: one
    in-place update per buffer (``core`` at ``depth``). Groups left ``None`` are unchanged."""
    zero = jnp.int32(0)
    start = jnp.asarray(start, jnp.int32)

    def put(buf, new, at_depth):
        if new.shape[0] == 0:
            return buf
        if at_depth:
            new = new[:, None]
            offset = jnp.stack([zero, jnp.asarray(depth, jnp.int32), start, zero, zero])
        else:
            offset = jnp.stack([zero, start, zero, zero])
        return write_slots(buf, new.astype(buf.dtype), offset)

    updates = {}
    for name, kv, at_depth in (("prelude", prelude, False), ("core", core, True), ("coda", coda, False)):
        if kv is not None:
            updates[name + "_k"] = put(getattr(cache, name + "_k"), kv[0], at_depth)
            updates[name + "_v"] = put(getattr(cache, name + "_v"), kv[1], at_depth)
    return cache.replace(**updates)


def complete_depths(cache: KVCache, start, num_rows, executed) -> KVCache:
    """Spec §5 ``complete``: core depths ``>= executed`` take depth ``executed-1``'s window slots.

    Touches slots ``[start, start + num_rows)`` of every core layer only; computed depths
    ``< executed`` and the prelude/coda buffers are unchanged. ``start`` and ``executed`` may be
    traced. ``num_rows`` should be a static int (a padded row count is fine: padded slots hold
    garbage anyway), so only those slots are read and written; a traced ``num_rows`` also works but
    rewrites the whole core buffers under a mask. Slots past ``t_max`` are never written, and slots
    before ``start`` are left alone even where the slice has to be clamped at the buffer's end.
    """
    n_core, k_depth, t_max = cache.core_k.shape[:3]
    static_rows = isinstance(num_rows, (int, np.integer))
    if n_core == 0 or (static_rows and num_rows <= 0):
        return cache
    span = min(int(num_rows), t_max) if static_rows else t_max
    start = jnp.asarray(start, jnp.int32)
    executed = jnp.asarray(executed, jnp.int32)
    lo = jnp.clip(start, 0, t_max - span)  # what dynamic_slice would clamp to anyway
    slots = lo + jnp.arange(span, dtype=jnp.int32)
    in_window = (slots >= start) & (slots < start + jnp.asarray(num_rows, jnp.int32))  # [R]
    depths = jnp.arange(k_depth, dtype=jnp.int32)
    replace = (depths[:, None] >= executed) & in_window[None, :]  # [K, R]
    replace = replace[None, :, :, None, None]
    zero = jnp.int32(0)

    def complete(buf):
        tail = buf.shape[3:]
        window = jax.lax.dynamic_slice(buf, (zero, zero, lo, zero, zero), (n_core, k_depth, span) + tail)
        source = jax.lax.dynamic_index_in_dim(window, executed - 1, axis=1, keepdims=True)
        window = jnp.where(replace, source, window)
        return write_slots(buf, window, jnp.stack([zero, zero, lo, zero, zero]))

    return cache.replace(core_k=complete(cache.core_k), core_v=complete(cache.core_v))
