"""A decoder layer's building blocks as pure functions (MODEL_AND_DECODING.md §2): the products,
the norms, RoPE, the q/k/v of a layer and the rest of it after attention, and the loop over a
layer group. Where a Pallas kernel may run instead of XLA's form, :mod:`alodlm_jax.kernels.select`
decides; :mod:`alodlm_jax.network.model` states the numerics.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from alodlm_jax.kernels import select

Params = dict[str, Any]
_HIGHEST = jax.lax.Precision.HIGHEST


def mm(equation: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """Einsum with fp32 accumulation, rounded once to ``x``'s dtype (a PyTorch GEMM's numerics).

    On NVIDIA GPUs a 16-bit product asks the GEMM for its own dtype (it accumulates in fp32 and
    rounds its result once; split-K partial sums stay fp32), so that XLA:GPU writes no fp32
    result to read back; elsewhere the product is fp32 and cast (XLA:CPU's 16-bit-output dots
    round otherwise)."""
    def accumulated(x, w):
        out = jnp.einsum(equation, x, w, precision=_HIGHEST, preferred_element_type=jnp.float32)
        return out.astype(x.dtype)

    def rounded(x, w):
        return jnp.einsum(equation, x, w, precision=_HIGHEST, preferred_element_type=x.dtype)

    w = w.astype(x.dtype)
    if x.dtype == jnp.float32:
        return accumulated(x, w)
    return jax.lax.platform_dependent(x, w, cuda=rounded, default=accumulated)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """transformers' Qwen3RMSNorm: fp32 internals, cast to the input dtype, then times the weight."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * y.astype(x.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos/sin ``[T, d_h]`` for rotate-half RoPE, computed in fp32 and cast to ``dtype``."""
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    inv_freq = 1.0 / (jnp.float32(theta) ** exponents)
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x ``[T, n, d_h]``; (x1·cos − x2·sin, x2·cos + x1·sin) in x's dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def qkv(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
         kernel: bool = False):
    """A layer's queries, keys and values ``[T, n, d_h]`` (norms and RoPE applied). ``kernel``
    (:data:`~alodlm_jax.network.rows.KERNEL`, one device): on an NVIDIA GPU where they apply, the heads'
    norms and RoPE in one Triton kernel (:mod:`alodlm_jax.kernels.head_norm`) after the products
    (:func:`qkv_projections`: for a window of few rows, the input norm and the three products in
    another); XLA's form elsewhere."""
    a = rms_norm(h, lp["input_norm"], eps)

    def product(name):
        return mm("th,hnd->tnd", a, lp[name])

    def norm_rope(x, name):
        return apply_rope(rms_norm(x, lp[f"{name}_norm"], eps), cos, sin)

    def xla(_=None):
        return norm_rope(product("q"), "q"), norm_rope(product("k"), "k"), product("v")

    (_, n_q, d_h), n_kv = lp["q"].shape, lp["k"].shape[1]
    rows = h.shape[0]
    if not (kernel and select.head_norm(rows, n_q, n_kv, d_h, a.dtype)):
        return xla()
    from alodlm_jax.kernels import head_norm as HK  # Pallas's Triton module: only where it may run

    def in_kernels(h):  # the products, then the heads' norms in one kernel where XLA:GPU makes 4
        return HK.norm_rope(qkv_projections(lp, eps, h), n_q, n_kv, lp["q_norm"], lp["k_norm"],
                            cos, sin, eps)

    return jax.lax.platform_dependent(h, cuda=in_kernels, default=xla)


def attention_out_and_mlp(lp: Params, eps: float, h: jax.Array, attn: jax.Array,
                           kernel: bool = False) -> jax.Array:
    """The rest of a layer after attention: output projection + residual, then the SwiGLU MLP.
    ``kernel`` (:data:`~alodlm_jax.network.rows.KERNEL`, one device): on an NVIDIA GPU, for a window of
    few rows, each product with its norm or residual add in one Triton kernel
    (:mod:`alodlm_jax.kernels.matmul`); XLA's form elsewhere."""
    # The output projection as one [T, n_q*d_h] x [n_q*d_h, H] product (a reshape of the kernel, no
    # copy). Written as "tnd,ndh->th", XLA:CPU transposed the whole [n_q, d_h, H] kernel on every
    # call (7 % of a pass of the 1 GB bench model).
    o = lp["o"]
    attn = attn.reshape(attn.shape[0], -1)
    o = o.reshape(-1, o.shape[-1])

    def xla(h, attn):
        h = h + mm("tk,kh->th", attn, o)
        b = rms_norm(h, lp["post_norm"], eps)
        gate = mm("th,hi->ti", b, lp["gate_proj"])
        gate = jax.nn.silu(gate.astype(jnp.float32)).astype(gate.dtype)  # torch: silu in fp32, one rounding
        mlp = gate * mm("th,hi->ti", b, lp["up_proj"])
        return h + mm("ti,ih->th", mlp, lp["down_proj"])

    rows, hidden = h.shape
    inner = lp["down_proj"].shape[0]
    if not (kernel and select.out_and_mlp(rows, attn.shape[1], hidden, inner, h.dtype)):
        return xla(h, attn)
    from alodlm_jax.kernels import matmul as MK  # Pallas's Triton module: only where it may run

    def in_kernels(h, attn):  # three kernels where XLA:GPU makes seven
        h = MK.matmul_residual(attn, o, h)
        mlp = MK.norm_matmul(h, lp["post_norm"], (lp["gate_proj"], lp["up_proj"]), eps,
                             gated=True)
        return MK.matmul_residual(mlp, lp["down_proj"], h)

    return jax.lax.platform_dependent(h, attn, cuda=in_kernels, default=xla)


def qkv_projections(lp: Params, eps: float, h: jax.Array) -> jax.Array:
    """The input norm and the q/k/v products of ``h [T, H]`` as one array ``[T, n_q + 2 n_kv,
    d_h]`` (the heads of q, k, v in that order), on an NVIDIA GPU: in one kernel where
    :func:`alodlm_jax.kernels.select.qkv_products` says so, else XLA's products side by side."""
    from alodlm_jax.kernels import matmul as MK
    (hidden, n_q, d_h), n_kv = lp["q"].shape, lp["k"].shape[1]
    if select.qkv_products(h.shape[0], hidden, n_q, n_kv, d_h, h.dtype):
        return MK.norm_matmul(h, lp["input_norm"], [lp[n].reshape(hidden, -1) for n in "qkv"],
                              eps).reshape(h.shape[0], n_q + 2 * n_kv, d_h)
    a = rms_norm(h, lp["input_norm"], eps)
    return jnp.concatenate([mm("th,hnd->tnd", a, lp[n]) for n in "qkv"], axis=1)


def num_layers(stack) -> int:
    if isinstance(stack, (list, tuple)):
        return len(stack)
    return stack["input_norm"].shape[0]


def traced_once(layer):
    """``layer(lp, i, ...)`` for a Python loop over per-layer dicts, traced once for the whole
    loop: one ``jax.jit(layer, inline=True)``, called per layer with ``i`` as an int32 operand,
    whose jaxpr is inlined at each call. So JAX lowers what a loop tracing every layer gave, the
    layer's operations once per layer (the same optimized programs), while the Python that traces
    a layer and its Pallas kernels, for every platform, runs once instead of per layer: 10 of the
    14.7 s that the 1.7B's batch-8 program for an H200 took to compile (``docs/plan.md``,
    "Compile time"). ``layer`` may close over the caller's tracers: the jit is made per loop."""
    jitted = jax.jit(layer, inline=True)

    def call(lp, i, *args):
        return jitted(lp, jnp.int32(i), *args)

    return call


def layer_loop(stack, layer, h, kv_axis: int = 0):
    """``layer(lp, i, h) -> (h, k, v)`` over a group in order (a Python loop over a tuple of
    per-layer dicts, :func:`traced_once`; one ``lax.scan`` over a stacked dict); the layers'
    ``k``/``v`` stacked on ``kv_axis``."""
    if isinstance(stack, (list, tuple)):
        ks, vs = [], []
        call = traced_once(layer)
        for i, lp in enumerate(stack):
            h, k, v = call(lp, i, h)
            ks.append(k)
            vs.append(v)
        return h, jnp.stack(ks, axis=kv_axis), jnp.stack(vs, axis=kv_axis)

    def body(h, xs):
        lp, i = xs
        h, k, v = layer(lp, i, h)
        return h, (k, v)

    h, (ks, vs) = jax.lax.scan(body, h, (stack, jnp.arange(num_layers(stack), dtype=jnp.int32)))
    return h, jnp.moveaxis(ks, 0, kv_axis), jnp.moveaxis(vs, 0, kv_axis)
