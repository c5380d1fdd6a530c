"""The queries' and keys' head norms and RoPE as one Triton kernel (NVIDIA GPUs, 16-bit models).

A layer applies Qwen3's per-head RMSNorm and then rotate-half RoPE to its queries and its keys
(:func:`alodlm_jax.network.layers.rms_norm`, ``_apply_rope``). XLA:GPU makes four kernels of them: each
norm is a reduction fusion, and RoPE's rotation (a concatenate of the head's halves) does not
join it, so each rotation is a kernel of its own. :func:`norm_rope` is one kernel for both: grid
``(T / TILE_ROWS, n_kv)``, a program normalizes and rotates one KV head's key and its group of
query heads for a tile of rows, reading each head as its two halves so that the rotation is a
choice of operands rather than a data movement. It takes the values too and returns them as
they are, so that the three projections arrive as one array, which XLA:GPU writes in the kernel
that adds the products' split-K partial sums (the values' own kernel before). Where the GPU
attention kernel takes the window, it applies the same operations itself
(:func:`alodlm_jax.kernels.window.window_attention_qkv`, through
:func:`~alodlm_jax.kernels.window.norm_rope_halves`, which this kernel runs too), and this kernel
is the fallback for the shapes it does not take.

Numerics: every operation of the XLA form, in its order, with the same roundings: the norm's
sum of squares in fp32 (summed per half, then added: the XLA form's order of summation is its
own), the normalized value rounded to the 16-bit dtype, then the weight's product, RoPE's two
products and their sum each rounded to the 16-bit dtype (XLA evaluates 16-bit elementwise
operations in fp32 and rounds each). So the two agree to rounding (tested in Pallas's
interpreter on the CPU). In fp32 the model keeps the XLA form: its parity runs compare exact
tokens, and Triton may contract a product and a sum into one fused multiply-add that XLA does
not.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from alodlm_jax.kernels.common import norm_rope_halves, norm_rope_supported, table_halves

__all__ = ["norm_rope", "supported", "TILE_ROWS", "MAX_ROWS"]

# Rows a program normalizes and rotates (fewer where T has no such factor): small, so that one
# request's window (32 rows) is 32 programs of the released models (8 KV heads), not 8.
TILE_ROWS = 8
# The most rows it takes. Its one input array is free where XLA:GPU splits the projections'
# reduction (few rows: a window of one request, 32 rows, or of 8, 256), since their partial sums
# are added by a kernel that writes it; with more rows the GEMM writes its output itself, and the
# array would be a copy of it (the 1.7B's batch of 32, 1,024 rows: 0.57 GB more a step).
MAX_ROWS = 256


def supported(q_shape, k_shape, dtype) -> bool:
    """Where :func:`norm_rope` runs: 16-bit activations, at most :data:`MAX_ROWS` rows, a query
    group and head halves whose sizes are powers of two (Triton's tiles)."""
    rows, n_q, d_h = q_shape
    return rows <= MAX_ROWS and norm_rope_supported(n_q, k_shape[1], d_h, dtype)


def _norm_rope_kernel(q_ref, k_ref, v_ref, cos_ref, sin_ref, qw_ref, kw_ref, qo_ref, ko_ref,
                      vo_ref, *, eps, half):
    cos, sin = table_halves(cos_ref), table_halves(sin_ref)
    for x_ref, w_ref, o_ref in ((q_ref, qw_ref, qo_ref), (k_ref, kw_ref, ko_ref)):
        o_ref[..., :half], o_ref[..., half:] = norm_rope_halves(x_ref, w_ref, cos, sin, eps)
    vo_ref[...] = v_ref[...]


def norm_rope(qkv, n_q: int, n_kv: int, q_weight, k_weight, cos, sin, eps: float, *,
              interpret: bool = False):
    """The layer's queries, keys and values from its projections' output: ``rope(rms_norm(q,
    q_weight))``, the same of k, and v, as the model computes them.

    qkv ``[T, n_q + 2 n_kv, d_h]`` (16-bit; the three projections' heads in that order, one
    array so that XLA:GPU writes it in one kernel), the norms' weights ``[d_h]``, cos/sin
    ``[T, d_h]`` (:func:`alodlm_jax.network.layers.rope_tables`). Returns q ``[T, n_q, d_h]``, k and v
    ``[T, n_kv, d_h]``. Where :func:`supported` says so; ``interpret`` runs it in Pallas's
    interpreter."""
    rows, _, d_h = qkv.shape
    group, half = n_q // n_kv, d_h // 2
    tile = min(TILE_ROWS, rows & -rows)  # the largest power of two dividing T, at most TILE_ROWS
    item = jnp.dtype(qkv.dtype).itemsize
    moved = (2 * qkv.size * item + cos.size * cos.dtype.itemsize + sin.size * sin.dtype.itemsize
             + 2 * d_h * item)
    table = pl.BlockSpec((tile, d_h), lambda i, h: (i, 0))
    weight = pl.BlockSpec((d_h,), lambda i, h: (0,))
    q_spec = pl.BlockSpec((tile, group, d_h), lambda i, h: (i, h, 0))
    head = lambda first: pl.BlockSpec((tile, None, d_h), lambda i, h: (i, first + h, 0))  # noqa: E731
    out = lambda n: jax.ShapeDtypeStruct((rows, n, d_h), qkv.dtype)  # noqa: E731
    programs = (rows // tile) * n_kv
    return pl.pallas_call(
        functools.partial(_norm_rope_kernel, eps=float(eps), half=half),
        out_shape=(out(n_q), out(n_kv), out(n_kv)),
        grid=(rows // tile, n_kv),
        in_specs=[q_spec, head(n_q), head(n_q + n_kv), table, table, weight, weight],
        out_specs=(q_spec, head(0), head(0)),
        compiler_params=pltr.CompilerParams(num_warps=4),
        # XLA:GPU keeps no cost estimate: the figures travel in the kernel's metadata.
        metadata={"bytes_accessed": str(moved), "flops": "0", "programs": str(programs)},
        interpret=interpret,
    )(qkv, qkv, qkv, cos, sin, q_weight.astype(qkv.dtype), k_weight.astype(qkv.dtype))
