"""What the kernels share: Triton's power-of-two tiles, and the heads' norm and RoPE as a kernel
computes them (:func:`norm_rope_halves`), which the head-norm kernel
(:mod:`alodlm_jax.kernels.head_norm`) and the GPU attention kernel that normalizes its own window
(:func:`alodlm_jax.kernels.window.window_attention_qkv`) both run. No Pallas import here: the
conditions (:mod:`alodlm_jax.kernels.select`) read it on every platform."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

# JAX 0.11 deprecates Pallas's Triton backend (the GPU kernels of this package) with a
# DeprecationWarning at each lowering for a GPU; what its removal would take is in
# docs/performance.md. Users are not told at every compile: that one warning is ignored.
warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated",
                        category=DeprecationWarning)

__all__ = ["power_of_two", "table_halves", "norm_rope_supported", "norm_rope_halves"]


def power_of_two(n: int) -> bool:
    """Whether ``n`` is a power of two (Triton's tensors have power-of-two sizes)."""
    return n > 0 and n & (n - 1) == 0


def table_halves(ref) -> tuple:
    """The two halves ``[T, d_h / 2]`` of a RoPE table ref ``[T, d_h]`` (cos or sin), in fp32."""
    half = ref.shape[-1] // 2
    return ref[:, :half].astype(jnp.float32), ref[:, half:].astype(jnp.float32)


def norm_rope_supported(n_q: int, n_kv: int, head_dim: int, dtype) -> bool:
    """Whether :func:`norm_rope_halves` runs on a GPU for these heads: 16-bit, a query group and
    head halves whose sizes are powers of two (Triton's tiles)."""
    return (jnp.dtype(dtype).itemsize == 2 and n_q % n_kv == 0 and power_of_two(n_q // n_kv)
            and head_dim % 2 == 0 and power_of_two(head_dim // 2))


def norm_rope_halves(x_ref, w_ref, cos, sin, eps: float):
    """Qwen3's head RMSNorm, then rotate-half RoPE, of the heads in ``x_ref`` ``[T, d_h]`` or
    ``[T, group, d_h]`` (16-bit), read as their two halves so that the rotation is a choice of
    operands; ``w_ref`` the norm's weight ``[d_h]``, ``cos`` and ``sin`` the tables' halves
    ``[T, d_h / 2]`` (:func:`table_halves`), shared by a row's heads. Every operation of the XLA
    form (:func:`alodlm_jax.network.layers.rms_norm`, ``_apply_rope``) in its order, each result rounded
    to the 16-bit dtype where XLA rounds it (it evaluates 16-bit elementwise operations in
    fp32): the sum of squares in fp32 (per half, then added), the normalized value, its product
    with the weight, RoPE's two products and their sum. Returns the rotated halves in
    ``x_ref``'s dtype; a row of zeros stays zeros. Used by :mod:`alodlm_jax.kernels.head_norm` and
    by the GPU attention kernel that normalizes its own window (:func:`window_attention_qkv`)."""
    f32, dtype = jnp.float32, x_ref.dtype
    half = x_ref.shape[-1] // 2

    def round_(x):  # one 16-bit rounding, back in fp32 for the next operation
        return x.astype(dtype).astype(f32)

    x1, x2 = x_ref[..., :half].astype(f32), x_ref[..., half:].astype(f32)
    total = jnp.sum(x1 * x1, axis=-1, keepdims=True) + jnp.sum(x2 * x2, axis=-1, keepdims=True)
    scale = jax.lax.rsqrt(total / (2 * half) + eps)
    n1 = round_(w_ref[:half].astype(f32) * round_(x1 * scale))
    n2 = round_(w_ref[half:].astype(f32) * round_(x2 * scale))
    c1, c2, s1, s2 = (t[:, None, :] if x1.ndim == 3 else t for t in (*cos, *sin))
    # rotate_half(n) = (-n2, n1): out = n * cos + rotate_half(n) * sin
    return ((round_(n1 * c1) + round_(-n2 * s1)).astype(dtype),
            (round_(n2 * c2) + round_(n1 * s2)).astype(dtype))
