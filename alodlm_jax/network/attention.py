"""The attention forms of the network's layers (MODEL_AND_DECODING.md §2, §5), over cache buffers.

Every form computes the same thing: grouped-query attention of a layer's query rows over the slots
of their buffer that they see, scores, masking and softmax in fp32, probabilities cast to the
activation dtype before the product with V (the numerics of :mod:`alodlm_jax.network.model`). They differ
in where the keys and values lie:

* :func:`attend`: a whole buffer holding the rows' own K/V; row ``a`` sees slots ``<= start + a``
  (:mod:`alodlm_jax.network.model`'s layers that write the cache);
* :func:`attend_window`: the cache's prefix (slots ``< start``) and the window's own K/V beside it,
  as two blocks of one softmax (the window forwards, which only read the cache);
* :func:`attend_in_copy`: one request's prefix read into a copy with its window written in, then
  :func:`attend` (the :data:`~alodlm_jax.network.rows.FIXED` batch step); :func:`attend_in_order` runs it
  for in-order lanes, :func:`kernel_attention` in :mod:`alodlm_jax.kernels.window`'s Pallas kernel
  where the platform has one.

Slots no row sees get zero values, so a request's outputs depend only on the slots it wrote and
sees. :func:`first_slots` reads the first slots of one buffer out of a stack of them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST
_NEG_INF = -1e30  # finite "minus infinity" for masked scores: exp underflows to exactly 0


def attend(q: jax.Array, k_buf: jax.Array, v_buf: jax.Array, start: jax.Array) -> jax.Array:
    """GQA over a whole buffer; query row ``a`` sees slots ``j <= start + a``.

    q ``[T, n_q, d_h]``, k_buf/v_buf ``[S, n_kv, d_h]`` -> ``[T, n_q, d_h]`` in q's dtype.

    The queries of one KV head are stacked into ``group * T`` rows (``[n_kv, group*T, d_h]``), so
    both products are batched matrix products with the KV head as the leading batch axis; XLA:CPU
    runs that about twice as fast as the ``[n_kv, group, T, S]`` form.
    """
    qg, rows = _group_queries(q, k_buf.shape[1])
    scores = _scores(qg, k_buf)
    slots = jnp.arange(k_buf.shape[0], dtype=jnp.int32)
    visible = slots[None, :] <= start + rows[:, None]  # [group*T, S]
    scores = jnp.where(visible[None], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)  # masked slots: exp underflows to 0
    return _ungroup(_values(probs, _seen_values(v_buf, start + q.shape[0])), q)


def _seen_values(v: jax.Array, limit) -> jax.Array:
    """``v [S, n_kv, d_h]`` with slots ``>= limit`` zeroed: the slots no row sees.

    Their probabilities are exact zeros, but ``0 * inf`` or ``0 * nan`` is NaN, so a slot that no
    row sees could otherwise still reach the output: a slot a continuous batch reuses holds
    whatever its previous request (or nothing) wrote there. With its values zeroed, a request's
    outputs depend only on the slots it wrote and sees (finite values give the same sums)."""
    seen = jnp.arange(v.shape[0], dtype=jnp.int32) < limit
    return jnp.where(seen[:, None, None], v, jnp.zeros((), v.dtype))


def _group_queries(q: jax.Array, n_kv: int) -> tuple[jax.Array, jax.Array]:
    """q ``[T, n_q, d_h]`` -> ``([n_kv, group*T, d_h], row [group*T])``: stacked row ``g*T + a``
    is query row ``a`` of the ``g``-th query head of a KV head."""
    t, n_q, d_h = q.shape
    group = n_q // n_kv
    qg = q.reshape(t, n_kv, group, d_h).transpose(1, 2, 0, 3).reshape(n_kv, group * t, d_h)
    return qg, jnp.tile(jnp.arange(t, dtype=jnp.int32), group)


def _ungroup(out: jax.Array, q: jax.Array) -> jax.Array:
    """fp32 ``[n_kv, group*T, d_h]`` attention output -> ``[T, n_q, d_h]`` in q's dtype."""
    t, n_q, d_h = q.shape
    n_kv = out.shape[0]
    return out.astype(q.dtype).reshape(n_kv, n_q // n_kv, t, d_h).transpose(2, 0, 1, 3).reshape(t, n_q, d_h)


def _scores(qg: jax.Array, k: jax.Array) -> jax.Array:
    """Scaled fp32 scores ``[n_kv, group*T, S]`` of grouped queries against keys ``[S, n_kv, d_h]``."""
    scores = jnp.einsum("kqd,skd->kqs", qg, k, precision=_HIGHEST, preferred_element_type=jnp.float32)
    return scores * jnp.float32(qg.shape[-1] ** -0.5)


def _values(probs: jax.Array, v: jax.Array) -> jax.Array:
    """fp32 ``probs [n_kv, group*T, S] x v [S, n_kv, d_h]`` -> ``[n_kv, group*T, d_h]``."""
    return jnp.einsum("kqs,skd->kqd", probs, v, precision=_HIGHEST, preferred_element_type=jnp.float32)


def first_slots(buf: jax.Array, index: tuple, size: int) -> jax.Array:
    """``buf[index][:size]`` (``index``: int32 leading indices) -> ``[size, n_kv, d_h]``."""
    zero = jnp.int32(0)
    tail = buf.shape[len(index) + 1:]
    shape = (size,) + tail
    return jax.lax.dynamic_slice(buf, index + (zero,) * (1 + len(tail)),
                                 (1,) * len(index) + shape).reshape(shape)


def attend_window(q: jax.Array, k_pre: jax.Array, v_pre: jax.Array, start: jax.Array,
                   k_win: jax.Array, v_win: jax.Array) -> jax.Array:
    """Window attention with the window's own K/V passed beside the cache.

    q/k_win/v_win ``[T, n, d_h]`` are the window's rows; k_pre/v_pre ``[S, n_kv, d_h]`` the cache,
    of which slots ``< start`` (the prefix) are visible to every row. Row ``a`` also sees window rows
    ``<= a`` (causal in packed order). This is :func:`attend` over a buffer holding the window at
    slots ``start..start+T`` (the same visible set, one softmax over it), with the prefix and the
    window as two blocks of each score row.
    """
    qg, rows = _group_queries(q, k_pre.shape[1])
    prefix_visible = jnp.arange(k_pre.shape[0], dtype=jnp.int32) < start
    window_visible = jnp.arange(q.shape[0], dtype=jnp.int32)[None, :] <= rows[:, None]
    s_pre = jnp.where(prefix_visible[None, None, :], _scores(qg, k_pre), _NEG_INF)
    s_win = jnp.where(window_visible[None], _scores(qg, k_win), _NEG_INF)
    probs = jax.nn.softmax(jnp.concatenate([s_pre, s_win], axis=-1), axis=-1).astype(q.dtype)
    split = k_pre.shape[0]
    return _ungroup(_values(probs[..., :split], _seen_values(v_pre, start))
                    + _values(probs[..., split:], v_win), q)


def attend_in_copy(q, k, v, k_buf, v_buf, start, depth, *, layer, size: int) -> jax.Array:
    """One request's window attention (:func:`attend_window`'s visible set) for the
    :data:`~alodlm_jax.network.rows.FIXED` batch step: the request's ``size`` cache slots at ``layer`` (and
    ``depth``) are read into a copy, the window's K/V written into it at ``start``, and the rows
    attend over that one buffer (:func:`attend`: row ``a`` sees slots ``<= start + a``).

    The same softmax over the same scores as the two blocks of :func:`attend_window`, in another
    order (one block of ``size`` slots): results equal to rounding. The per-request read of a batch
    cache at each request's own depth is a copy in any case (a gather); writing the window into it
    saves the scores' concatenation and the slices of the probabilities (measured, the 1.7B's
    2-layer batch-8 step for an H200: 3.49 GB per step to 2.93 GB)."""
    index = (layer,) if depth is None else (layer, depth)
    zero = jnp.int32(0)
    k_pre = jax.lax.dynamic_update_slice(first_slots(k_buf, index, size).astype(q.dtype),
                                         k.astype(q.dtype), (start, zero, zero))
    v_pre = jax.lax.dynamic_update_slice(first_slots(v_buf, index, size).astype(q.dtype),
                                         v.astype(q.dtype), (start, zero, zero))
    return attend(q, k_pre, v_pre, start)


def attend_in_order(q, k, v, k_all, v_all, layer, depth, start, *, size: int):
    """In-order lanes (lane ``b`` is request ``b``) attending in XLA: :func:`attend_in_copy` of
    each request's ``size`` slots at ``layer`` and its ``depth``."""
    # The copies of the prefixes depend only on the cache: without the barrier XLA:GPU made every
    # layer's ahead of the layers, all alive at once (the 8B's batch-32 step for an H200: 31.6 GB
    # of temporaries, 14.7 GB with it).
    q, k_all, v_all = jax.lax.optimization_barrier((q, k_all, v_all))
    in_copy = functools.partial(attend_in_copy, layer=layer, size=size)
    return jax.vmap(in_copy, in_axes=(0, 0, 0, 0, 0, 0, None if depth is None else 0))(
        q, k, v, k_all, v_all, start, depth)


def kernel_attention(q, k, v, k_all, v_all, layer, depth, start, *, size: int):
    """:func:`attend_in_order` by :mod:`alodlm_jax.kernels.window`, chosen by the platform the
    program is lowered for: the Mosaic kernel on a TPU, the Triton one on an NVIDIA GPU (each
    where it supports the shapes), the TPU's in Pallas's interpreter on the CPU (tests), and
    :func:`attend_in_order` itself elsewhere."""
    from alodlm_jax.kernels import select

    def xla(*operands):
        return attend_in_order(*operands, size=size)

    shape = dict(slots=k_all.shape[-3], n_kv=k.shape[-2], head_dim=k.shape[-1],
                 rows=q.shape[1], group=q.shape[2] // k.shape[2], dtype=k_all.dtype)
    return jax.lax.platform_dependent(q, k, v, k_all, v_all, layer, depth, start,
                                      **select.window_attention_forms(shape, xla))
