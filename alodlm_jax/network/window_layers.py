"""The window forwards (the decode loop's hot path): a layer group over a window's rows that reads
the cache and writes nothing, returning the window's K/V for
:func:`alodlm_jax.network.cache.store_window`; one request (:func:`run_window_stack`) or several
requests' valid rows packed together (:func:`run_window_rows`, the batch step; the packing is
:mod:`alodlm_jax.network.rows`). Attention in XLA's form (:mod:`alodlm_jax.network.attention`) or,
under the kernel shape policy, in the forms :mod:`alodlm_jax.kernels.select` allows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from alodlm_jax.kernels import select
from alodlm_jax.network import attention as A
from alodlm_jax.network import rows as R
from alodlm_jax.network.cache import kv_bucket_index, kv_buckets, on_kv_bucket
from alodlm_jax.network.layers import (Params, attention_out_and_mlp, layer_loop, num_layers, qkv,
                                       qkv_projections, rope_tables)

if TYPE_CHECKING:  # pragma: no cover
    from alodlm_convert.config import ModelConfig


def window_layer(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
                 k_all: jax.Array, v_all: jax.Array, index: tuple, start: jax.Array,
                 kv_bucket: jax.Array | None, kernel: bool = False, counts=None):
    """One decoder layer over a window that reads the cache and writes nothing.

    Returns ``(h, k, v, counts)`` with the rows' K/V ``[T, n_kv, d_h]`` in the cache dtype, which
    the caller stores (:func:`store_window`). Attention: prefix slots ``< start`` of the buffer at
    ``index`` (its first ``kv_buckets(...)[kv_bucket]`` slots) plus the window's own rows, see
    :func:`~alodlm_jax.network.attention.attend_window`; ``kernel``: in the platform's Pallas kernel, as a
    batch of one (:func:`~alodlm_jax.network.attention.kernel_attention`), which reads the prefix where it
    lies instead of XLA's copies of the buffer, its scores and its probabilities. ``counts``:
    the attention kernel's (:func:`_kernel_qkv_attention`), as they came where it does not
    count.
    """
    if kernel:
        attn, k, v, counts = _kernel_qkv_attention(lp, eps, h, cos, sin, k_all, v_all, index,
                                                   start, counts)
        return attention_out_and_mlp(lp, eps, h, attn, kernel), k, v, counts
    q, k, v = qkv(lp, eps, h, cos, sin)
    k = k.astype(k_all.dtype)
    v = v.astype(v_all.dtype)
    index = tuple(jnp.asarray(i, jnp.int32) for i in index)

    def attend_first(size, q, k, v, k_all, v_all):
        k_pre = A.first_slots(k_all, index, size).astype(q.dtype)
        v_pre = A.first_slots(v_all, index, size).astype(q.dtype)
        return A.attend_window(q, k_pre, v_pre, start, k.astype(q.dtype), v.astype(q.dtype))

    attn = on_kv_bucket(k_all.shape[len(index)], kv_bucket, attend_first, q, k, v, k_all, v_all)
    return attention_out_and_mlp(lp, eps, h, attn), k, v, counts


def normed_attention(lp: Params, h: jax.Array, k_all: jax.Array, rows: int) -> bool:
    """Whether a window layer under the kernel policy may hand its q/k/v products to the
    attention kernel as they are, which then applies the heads' norms and RoPE itself, on an
    NVIDIA GPU (:func:`~alodlm_jax.kernels.window.window_attention_qkv`): 16-bit activations and
    cache (K's and V's share a dtype), heads :func:`~alodlm_jax.kernels.window.norm_rope_supported`
    and shapes the GPU attention kernel takes (``rows``: a request's window rows), any number of
    requests; unless :data:`~alodlm_jax.kernels.window.NORMS_IN_ATTENTION` is off
    (:func:`alodlm_jax.kernels.select.normed_attention`)."""
    n_q, d_h = lp["q"].shape[1:]
    n_kv = lp["k"].shape[1]
    return select.normed_attention(n_q, n_kv, d_h, h.dtype, k_all.dtype, k_all.shape[-3], rows)


def _normed_window_attention(lp: Params, eps: float, qkv: jax.Array, cos: jax.Array,
                             sin: jax.Array, k_all, v_all, layer, depth, start, counts=None):
    """:func:`~alodlm_jax.kernels.window.window_attention_qkv` of the requests' projections
    ``qkv [B, W, n_q + 2 n_kv, d_h]``: ``(attn [B, W, n_q, d_h], k, v [B, W, n_kv, d_h],
    counts)``, the values those of ``qkv`` as they are; ``counts`` as the kernel's (None where
    not given: a second kernel combines a split prefix's parts)."""
    from alodlm_jax.kernels import window as WK
    n_q, n_kv = lp["q"].shape[1], lp["k"].shape[1]
    attn, k, *counted = WK.window_attention_qkv(qkv, n_q, lp["q_norm"], lp["k_norm"], cos, sin,
                                                eps, k_all, v_all, layer, depth, start,
                                                counts=counts)
    return attn, k, qkv[:, :, n_q + n_kv:], (counted[0] if counted else None)


def _kernel_qkv_attention(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
                          k_all: jax.Array, v_all: jax.Array, index: tuple, start: jax.Array,
                          counts=None):
    """A window's queries, keys and values (:func:`qkv`) and its attention in the platform's
    Pallas kernel as a batch of one (:func:`~alodlm_jax.network.attention.kernel_attention`): ``(attn
    [T, n_q, d_h], k, v [T, n_kv, d_h], counts)``, k and v in the cache's dtype; on an NVIDIA
    GPU where :func:`normed_attention` says so, the products' output goes to the attention
    kernel as it is (:func:`_normed_window_attention`), which, given ``counts`` (``int32 [L, 1,
    n_kv]``, zero at this layer: :func:`run_window_stack`'s), combines a split prefix's parts
    in its last part (:mod:`alodlm_jax.kernels.window`); elsewhere ``counts`` come back as
    they came."""
    size = k_all.shape[len(index)]

    def cache_index():  # the layer, and the depth as [1] (None without a depth axis)
        layer, *depth = (jnp.asarray(i, jnp.int32) for i in index)
        return layer, depth[0][None] if depth else None

    def separate(h):
        q, k, v = qkv(lp, eps, h, cos, sin, True)
        k, v = k.astype(k_all.dtype), v.astype(v_all.dtype)
        layer, depth = cache_index()
        attn = A.kernel_attention(q[None], k[None], v[None], k_all[None], v_all[None], layer,
                                  depth, start[None], size=size)[0]
        return attn, k, v, counts

    if not normed_attention(lp, h, k_all, h.shape[0]):
        return separate(h)

    def fused(h):
        layer, depth = cache_index()
        attn, k, v, counted = _normed_window_attention(
            lp, eps, qkv_projections(lp, eps, h)[None], cos[None], sin[None], k_all[None],
            v_all[None], layer, depth, start[None], counts)
        return attn[0], k[0], v[0], counted

    return jax.lax.platform_dependent(h, cuda=fused, default=separate)


def run_window_stack(stack, cfg: "ModelConfig", h: jax.Array, positions: jax.Array,
                     k_all: jax.Array, v_all: jax.Array, start, depth=None, *, prefix_limit=None,
                     bucketed: bool = True, kernel: bool = False, rope=None):
    """A layer group over a window's rows, reading (never writing) its cache buffers.

    Returns ``(h, k_new, v_new)`` with ``k_new``/``v_new`` ``[L, T, n_kv, d_h]``: what
    :func:`run_stack` would have written at slots ``start..start+T`` (at ``depth`` for the core), to
    be stored with :func:`store_window`. The layers attend over the prefix (slots ``< start``, read
    from the smallest :func:`kv_buckets` length holding ``prefix_limit`` slots, default ``start``;
    the whole buffer, with no switch, when not ``bucketed``) and the window's own rows. Because the
    cache is only read, the caller can run this inside a ``lax.switch`` (row buckets) without XLA
    copying the cache into the taken branch, which it does for a buffer updated inside a
    conditional. ``kernel`` (not ``bucketed``): attention in the platform's Pallas kernel
    (:func:`window_layer`). ``rope``: :func:`rope_tables` of ``positions`` where the caller made
    them once for several calls (the passes of a window); else they are made here.
    """
    n = num_layers(stack)
    kv_shape = (n, h.shape[0]) + k_all.shape[-2:]
    if n == 0:
        return h, jnp.zeros(kv_shape, k_all.dtype), jnp.zeros(kv_shape, v_all.dtype)
    start = jnp.asarray(start, jnp.int32)
    if rope is None:
        rope = rope_tables(positions, k_all.shape[-1], cfg.rope_theta, h.dtype)
    cos, sin = rope
    eps = cfg.rms_norm_eps
    slots = k_all.shape[1 if depth is None else 2]
    kv_bucket = (kv_bucket_index(kv_buckets(slots), start if prefix_limit is None else prefix_limit)
                 if bucketed else None)

    # The attention kernel's counts (one request, each layer's KV heads), zero for this call:
    # where it splits a prefix in parts, its last part to finish combines them
    # (kernels.window._gpu_attention), carried from layer to layer; unused elsewhere.
    counts = jnp.zeros((n, 1, k_all.shape[-2]), jnp.int32) if kernel else None

    def layer(lp, i, carry):
        h, counts = carry
        index = (i,) if depth is None else (i, depth)
        h, k, v, counts = window_layer(lp, eps, h, cos, sin, k_all, v_all, index, start,
                                        kv_bucket, kernel, counts)
        return (h, counts), k, v

    (h, _), k, v = layer_loop(stack, layer, (h, counts))
    return h, k, v


def window_layer_rows(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
                       k_all: jax.Array, v_all: jax.Array, layer, depth, start: jax.Array,
                       kv_bucket: jax.Array, m: R.RowMap, rows: int, kernel: bool = False):
    """:func:`window_layer` for ``B`` requests: compact rows ``h [R, H]``, the batch's cache
    buffers ``[B, L, (K,) T, n_kv, d_h]``, per-request ``start`` and ``depth`` ``[B]``.

    Returns ``(h [R, H], k, v)`` with the window rows' K/V in the padded layout ``[B, rows,
    n_kv, d_h]`` (zeros past each request's rows). Attention runs in the ``A`` lanes of
    :class:`~alodlm_jax.network.rows.RowMap`: each lane's queries attend over its request's prefix (read
    from the batch's buffers at that request's index and depth) and window rows exactly as
    :func:`window_layer` does. ``kernel`` (in-order lanes only): the lanes attend in the
    platform's Pallas kernel instead (:func:`~alodlm_jax.network.attention.kernel_attention`); on an
    NVIDIA GPU, where :func:`normed_attention` says so, the q/k/v products' output goes to it as
    it is (:func:`_normed_window_attention`)."""
    def lanes(h):
        return _window_layer_lanes(lp, eps, h, cos, sin, k_all, v_all, layer, depth, start,
                                   kv_bucket, m, rows, kernel)

    if not (kernel and m.in_order and kv_bucket is None
            and normed_attention(lp, h, k_all, rows)):
        return lanes(h)

    def fused(h):  # in-order lanes: a request's lane is its padded rows (from_rows)
        attn, k, v, _ = _normed_window_attention(
            lp, eps, R.to_lanes(qkv_projections(lp, eps, h), m, rows), R.to_lanes(cos, m, rows),
            R.to_lanes(sin, m, rows), k_all, v_all, jnp.asarray(layer, jnp.int32), depth,
            jnp.where(m.lane_valid, start, 0))
        return attention_out_and_mlp(lp, eps, h, R.from_lanes(attn, m), kernel), k, v

    return jax.lax.platform_dependent(h, cuda=fused, default=lanes)


def _window_layer_lanes(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
                        k_all: jax.Array, v_all: jax.Array, layer, depth, start: jax.Array,
                        kv_bucket: jax.Array, m: R.RowMap, rows: int, kernel: bool):
    """:func:`window_layer_rows` with the queries, keys and values made first
    (:func:`qkv`) and moved to the lanes."""
    q, k, v = qkv(lp, eps, h, cos, sin, kernel)
    k = k.astype(k_all.dtype)
    v = v.astype(v_all.dtype)
    layer = jnp.asarray(layer, jnp.int32)
    lane = m.lane  # each lane's request

    def attend_first(size, q, k, v, k_all, v_all):
        depth_axis = None if depth is None else 0
        if m.in_order and kernel:
            # A lane without rows (an idle or finished slot) reads no prefix: its output is
            # dropped (from_lanes), and the kernel reads only the blocks below start.
            return A.kernel_attention(q, k, v, k_all, v_all, layer, depth,
                                     jnp.where(m.lane_valid, start, 0), size=size)
        if m.in_order:  # FIXED: lane b is request b, and reads its own entry of the batch axis
            return A.attend_in_order(q, k, v, k_all, v_all, layer, depth, start, size=size)

        def one(q, k, v, b, start, depth):
            index = (b, layer) if depth is None else (b, layer, depth)
            k_pre = A.first_slots(k_all, index, size).astype(q.dtype)
            v_pre = A.first_slots(v_all, index, size).astype(q.dtype)
            return A.attend_window(q, k_pre, v_pre, start, k.astype(q.dtype), v.astype(q.dtype))

        lane_depth = None if depth is None else depth[lane]
        return jax.vmap(one, in_axes=(0, 0, 0, 0, 0, depth_axis))(
            q, k, v, lane, start[lane], lane_depth)

    attn = on_kv_bucket(k_all.shape[2 if depth is None else 3], kv_bucket, attend_first,
                         R.to_lanes(q, m, rows), R.to_lanes(k, m, rows), R.to_lanes(v, m, rows),
                         k_all, v_all)
    return (attention_out_and_mlp(lp, eps, h, R.from_lanes(attn, m), kernel),
            R.from_rows(k, m, rows), R.from_rows(v, m, rows))


def run_window_rows(stack, cfg: "ModelConfig", h: jax.Array, positions: jax.Array, m: R.RowMap,
                    k_all: jax.Array, v_all: jax.Array, start: jax.Array, depth=None, *,
                    prefix_limit, rows: int, bucketed: bool = True, kernel: bool = False):
    """:func:`run_window_stack` for ``B`` requests on packed rows (:class:`~alodlm_jax.network.rows.RowMap`).

    ``h [R, H]`` and ``positions [R]`` are compact; ``k_all``/``v_all`` the batch's buffers
    ``[B, L, (K,) T, n_kv, d_h]``; ``start`` (and ``depth`` for the core) ``[B]``; ``prefix_limit``
    one attention bucket limit shared by the batch (not ``bucketed``: the whole buffers). Returns
    ``(h [R, H], k_new, v_new)`` with ``k_new``/``v_new`` ``[B, L, rows, n_kv, d_h]`` for
    :func:`store_window` per request. Reads the cache only, like :func:`run_window_stack`. With
    in-order lanes (:data:`~alodlm_jax.network.rows.FIXED`) each lane attends as
    :func:`~alodlm_jax.network.attention.attend_in_copy` does; ``kernel`` (:data:`~alodlm_jax.network.rows.KERNEL`):
    in :mod:`alodlm_jax.kernels.window`.
    """
    n = num_layers(stack)
    batch = k_all.shape[0]
    kv_shape = (batch, n, rows) + k_all.shape[-2:]
    if n == 0:
        return h, jnp.zeros(kv_shape, k_all.dtype), jnp.zeros(kv_shape, v_all.dtype)
    start = jnp.asarray(start, jnp.int32)
    cos, sin = rope_tables(positions, k_all.shape[-1], cfg.rope_theta, h.dtype)
    eps = cfg.rms_norm_eps
    kv_bucket = (kv_bucket_index(kv_buckets(k_all.shape[2 if depth is None else 3]), prefix_limit)
                 if bucketed else None)

    def layer(lp, i, h):
        return window_layer_rows(lp, eps, h, cos, sin, k_all, v_all, i, depth, start, kv_bucket,
                                  m, rows, kernel)

    return layer_loop(stack, layer, h, kv_axis=1)
