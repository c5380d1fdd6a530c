"""The batch step's window attention as a Pallas TPU kernel reading each request's K/V in place.

:func:`window_attention` computes what ``jax.vmap(model._attend_in_copy)`` computes for the
in-order lanes of the :data:`~alodlm_jax.rows.FIXED` batch step: request ``b``'s queries (its
window rows) attend over its prefix, cache slots ``< start[b]`` of layer ``layer`` at depth
``depth[b]`` of the batch's buffers, and over its own window's K/V, row ``a`` seeing window rows
``<= a``, in one softmax. The XLA form reads every request's slice of the cache into a copy (a
gather at a per-request depth), writes the window into it and materializes fp32 scores and
probabilities as large as the keys; XLA:TPU expands the gather and the write into loops (33k
kernels a step for the 8B at batch 32). Here the grid walks each request's blocks of cache slots,
the block index taken from the request's layer, depth and start (scalar prefetch), so the kernel
reads the cache where it lies, only the blocks its prefix covers (later grid steps repeat the
last block's index, which Pallas does not fetch again), and keeps scores on chip with the online
softmax of flash attention.

Numerics: scores, the running maximum and sums and the output accumulation in fp32, as
:func:`alodlm_jax.model._attend` does; the unnormalized probabilities are cast to the value dtype
before their product with V (the XLA form casts the normalized ones) and the sum is taken in
another order, so in fp32 the two agree to rounding (tested) and in bf16 to bf16's resolution.
The CPU never runs this kernel (its programs keep the XLA form); tests run it in Pallas interpret
mode.

Layout: the cache is ``[B, L, (K,) S, n_kv, d_h]``, slots before heads, and a block holds ``bs``
slots of every head. The kernel reads a head's keys as every ``n_kv``-th row of the block seen as
``[bs * n_kv, d_h]`` (a strided load; bf16 rows are read two heads at a time as 32-bit words, as
JAX's ragged paged attention does). ``S`` must be a multiple of the block (the FIXED sizing gives
a multiple of 256 slots).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_NEG_INF = -1e30  # as model._NEG_INF: masked scores' exp underflows to exactly 0


def block_slots(slots: int) -> int:
    """The cache slots a grid step reads: 512 or 256 where they divide ``slots``, else all."""
    for size in (512, 256):
        if slots % size == 0:
            return size
    return slots


def supported(n_kv: int, head_dim: int, dtype) -> bool:
    """Whether the kernel compiles for XLA:TPU at these shapes: lane-wide heads, and for 16-bit
    caches an even number of KV heads (read in pairs)."""
    return head_dim % 128 == 0 and (jnp.dtype(dtype).itemsize == 4 or n_kv % 2 == 0)


def _heads(ref, n_kv: int) -> list:
    """The ``n_kv`` heads of a ``[bs, n_kv, d_h]`` block ref as ``[bs, d_h]`` arrays."""
    bs, _, d_h = ref.shape
    flat = ref.reshape(bs * n_kv, d_h)
    if ref.dtype.itemsize == 4:
        return [flat[pl.ds(h, bs, stride=n_kv), :] for h in range(n_kv)]
    # 16-bit rows 2j and 2j+1 share the 32-bit row j: low half, high half.
    words = flat.bitcast(jnp.uint32)
    out = []
    for h in range(0, n_kv, 2):
        w = words[pl.ds(h // 2, bs, stride=n_kv // 2), :]
        out.append(pltpu.bitcast(w << 16, jnp.float32).astype(ref.dtype))
        out.append(pltpu.bitcast(w & jnp.uint32(0xFFFF0000), jnp.float32).astype(ref.dtype))
    return out


def _kernel(layer_ref, depth_ref, start_ref, q_ref, kw_ref, vw_ref, k_ref, v_ref, o_ref,
            m_ref, l_ref, acc_ref, *, bs: int, rows: int):
    b = pl.program_id(0)
    t = pl.program_id(1)
    start = start_ref[b]
    n_kv, g, d_h = q_ref.shape
    scale = jnp.float32(d_h ** -0.5)

    @pl.when(t == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, _NEG_INF, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def update(h, s, v):
        m_prev = m_ref[h]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)
        l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[h] = alpha * acc_ref[h] + jax.lax.dot_general(
            p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        m_ref[h] = m_new

    def scores(q, k):
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        return s * scale

    @pl.when(t * bs < start)
    def _():
        slot = t * bs + jax.lax.broadcasted_iota(jnp.int32, (g, bs), 1)
        ks, vs = _heads(k_ref, n_kv), _heads(v_ref, n_kv)
        for h in range(n_kv):
            q = q_ref[h]
            s = jnp.where(slot < start, scores(q, ks[h].astype(q.dtype)), _NEG_INF)
            update(h, s, vs[h].astype(q.dtype))

    @pl.when(t == pl.num_programs(1) - 1)
    def _():
        row = jax.lax.broadcasted_iota(jnp.int32, (g, rows), 0) % rows
        col = jax.lax.broadcasted_iota(jnp.int32, (g, rows), 1)
        ks, vs = _heads(kw_ref, n_kv), _heads(vw_ref, n_kv)
        for h in range(n_kv):
            q = q_ref[h]
            s = jnp.where(col <= row, scores(q, ks[h].astype(q.dtype)), _NEG_INF)
            update(h, s, vs[h].astype(q.dtype))
            o_ref[h] = (acc_ref[h] / l_ref[h]).astype(o_ref.dtype)


def window_attention(q, k, v, k_all, v_all, layer, depth, start, *, interpret: bool = False):
    """Each request's window attention over its prefix in the batch's cache and its window.

    q ``[B, W, n_q, d_h]`` (the lanes' queries), k/v ``[B, W, n_kv, d_h]`` (the window's K/V),
    k_all/v_all ``[B, L, K, S, n_kv, d_h]`` (core) or ``[B, L, S, n_kv, d_h]``, ``layer`` an int32
    scalar, ``depth`` int32 ``[B]`` (None without a depth axis), ``start`` int32 ``[B]``. Returns
    ``[B, W, n_q, d_h]`` in q's dtype: ``jax.vmap(model._attend_in_copy)`` of the same (module
    docstring)."""
    batch, rows, n_q, d_h = q.shape
    n_kv = k.shape[2]
    group = n_q // n_kv
    if depth is None:
        k_all, v_all = k_all[:, :, None], v_all[:, :, None]
        depth = jnp.zeros((batch,), jnp.int32)
    slots = k_all.shape[3]
    bs = block_slots(slots)
    g = group * rows
    # [B, n_kv, group*W, d_h]: row j*W + a is query row a of the kv head's j-th query head.
    qg = q.reshape(batch, rows, n_kv, group, d_h).transpose(0, 2, 3, 1, 4).reshape(
        batch, n_kv, g, d_h)

    def cache_block(b, t, layer_ref, depth_ref, start_ref):
        last = jnp.maximum(pl.cdiv(start_ref[b], bs) - 1, 0)
        return (b, layer_ref[0], depth_ref[b], jnp.minimum(t, last), 0, 0)

    def per_request(b, t, *_):
        return (b, 0, 0, 0)

    cache_spec = pl.BlockSpec((None, None, None, bs, n_kv, d_h), cache_block)
    window_spec = pl.BlockSpec((None, rows, n_kv, d_h), per_request)
    q_spec = pl.BlockSpec((None, n_kv, g, d_h), per_request)
    item = jnp.dtype(k_all.dtype).itemsize
    cost = pl.CostEstimate(
        flops=4 * batch * n_q * rows * (slots + rows) * d_h,
        transcendentals=batch * n_q * rows * (slots + rows),
        bytes_accessed=(2 * batch * slots * n_kv * d_h * item  # each request's K/V, one depth
                        + 2 * k.size * item + 2 * q.size * q.dtype.itemsize))
    out = pl.pallas_call(
        functools.partial(_kernel, bs=bs, rows=rows),
        out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(batch, slots // bs),
            in_specs=[q_spec, window_spec, window_spec, cache_spec, cache_spec],
            out_specs=q_spec,
            scratch_shapes=[pltpu.VMEM((n_kv, g, 1), jnp.float32),
                            pltpu.VMEM((n_kv, g, 1), jnp.float32),
                            pltpu.VMEM((n_kv, g, d_h), jnp.float32)]),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        cost_estimate=cost,
        interpret=interpret,
    )(jnp.reshape(jnp.asarray(layer, jnp.int32), (1,)), jnp.asarray(depth, jnp.int32),
      jnp.asarray(start, jnp.int32), qg, k, v, k_all, v_all)
    return out.reshape(batch, n_kv, group, rows, d_h).transpose(0, 3, 1, 2, 4).reshape(
        batch, rows, n_q, d_h)
