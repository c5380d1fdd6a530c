"""Which form of each operation runs, per shape policy, platform, shape and precision: the one
place that decides.

The network (:mod:`alodlm_jax.network`) writes every operation in XLA's form and asks here
whether a Pallas kernel takes it instead. A kernel runs only under the
:data:`~alodlm_jax.network.rows.KERNEL` shape policy (one device: the kernels are not
partitioned across devices), only on the platforms its row of :data:`FORMS` names (the program
picks by the platform it is lowered for, ``jax.lax.platform_dependent``), and only where its
module's ``supported`` predicate takes the shapes and dtype (Triton's power-of-two tiles, the
rows a kernel is good for, 16-bit activations); everywhere else XLA's form runs. :data:`FORMS`
is that table, one row a form, as data (``scripts/gpu_check`` prints the rows of the device's
platform before it measures), and :func:`allowed` evaluates a row's condition.

The functions below are the conditions as the network calls them; each imports its kernel's
module (Pallas's Triton module with it) only when called, so a program that runs no kernel
(the CPU's, a mesh's) never imports one.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

__all__ = ["Form", "FORMS", "allowed", "attention_options", "window_attention_forms",
           "head_norm", "qkv_products", "out_and_mlp", "normed_attention"]


@dataclasses.dataclass(frozen=True)
class Form:
    """One form of an operation other than XLA's: ``operation`` (what the network computes),
    ``kernel`` (the Pallas kernel's module and function), the ``platforms`` it runs on
    (``platform_dependent``'s names), the ``policy`` it needs (a shape policy of
    :mod:`alodlm_jax.network.rows`), ``condition`` (its module's predicate, ``module:function``;
    empty: none)
    and ``when``: the condition in words."""

    operation: str
    kernel: str
    platforms: tuple[str, ...]
    policy: str
    condition: str
    when: str


FORMS = (
    Form("window attention (a batch step's in-order lanes, a single request's window)",
         "alodlm_jax.kernels.window:window_attention", ("tpu",), "fixed-kernel",
         "alodlm_jax.kernels.window:supported",
         "TPU (Mosaic): lane-wide heads; 16-bit caches an even number of KV heads"),
    Form("window attention (a batch step's in-order lanes, a single request's window)",
         "alodlm_jax.kernels.window:window_attention", ("cuda",), "fixed-kernel",
         "alodlm_jax.kernels.window:supported",
         "GPU (Triton): power-of-two tiles of at least 16 (padded window rows x query group, "
         "head size), a power-of-two query group, a cache of whole 64-slot tiles"),
    Form("window attention in Pallas's interpreter (tests)",
         "alodlm_jax.kernels.window:window_attention", ("cpu",), "fixed-kernel", "",
         "the TPU kernel, interpreted: any shape"),
    Form("window attention with the heads' norms and RoPE inside",
         "alodlm_jax.kernels.window:window_attention_qkv", ("cuda",), "fixed-kernel",
         "alodlm_jax.kernels.select:normed_attention",
         "16-bit activations and cache, heads the norm kernel takes, shapes the GPU attention "
         "kernel takes; unless window.NORMS_IN_ATTENTION is off"),
    Form("heads' norms and RoPE", "alodlm_jax.kernels.head_norm:norm_rope", ("cuda",),
         "fixed-kernel", "alodlm_jax.kernels.head_norm:supported",
         "16-bit, at most 256 rows, a power-of-two query group and head halves"),
    Form("input norm and the q/k/v products", "alodlm_jax.kernels.matmul:norm_matmul", ("cuda",),
         "fixed-kernel", "alodlm_jax.kernels.matmul:supported",
         "16-bit, 16-64 rows (a power of two), reduction tiles of at least 16, whole column "
         "tiles"),
    Form("output product + residual, post norm + SwiGLU, down product + residual",
         "alodlm_jax.kernels.matmul:norm_matmul, matmul_residual", ("cuda",), "fixed-kernel",
         "alodlm_jax.kernels.select:out_and_mlp",
         "each of the three products as matmul.supported takes it"),
)


def allowed(form: Form, *args, **kwargs) -> bool:
    """``form``'s condition evaluated on ``args`` and ``kwargs`` (its predicate's arguments);
    True for a form without one."""
    if not form.condition:
        return True
    module, function = form.condition.split(":")
    return bool(getattr(importlib.import_module(module), function)(*args, **kwargs))


def attention_options(shapes: str) -> dict[str, bool]:
    """The window forwards' attention options under the shape policy ``shapes`` (the network's
    ``bucketed`` and ``kernel``): attention buckets under
    :data:`~alodlm_jax.network.rows.BUCKETED`, the Pallas kernels under
    :data:`~alodlm_jax.network.rows.KERNEL`."""
    from alodlm_jax.network import rows as R

    return {"bucketed": not R.is_fixed(shapes), "kernel": shapes == R.KERNEL}


def window_attention_forms(shape: dict, xla) -> dict:
    """``platform_dependent``'s branches for a window's attention over the cache (the network's
    ``kernel_attention``): the Mosaic kernel on a TPU, the Triton one on an NVIDIA GPU (each
    where :func:`alodlm_jax.kernels.window.supported` takes ``shape``), the TPU's in Pallas's
    interpreter on the CPU (tests), and ``xla`` elsewhere."""
    from alodlm_jax.kernels import window as WK

    def on(backend, interpret=False):
        if interpret or WK.supported(backend, **shape):
            return functools.partial(WK.window_attention, backend=backend, interpret=interpret)
        return xla

    return dict(tpu=on("tpu"), cuda=on("gpu"), cpu=on("tpu", interpret=True), default=xla)


def head_norm(rows: int, n_q: int, n_kv: int, d_h: int, dtype) -> bool:
    """Whether the heads' norms and RoPE of ``rows`` rows run in
    :func:`alodlm_jax.kernels.head_norm.norm_rope` on an NVIDIA GPU."""
    from alodlm_jax.kernels import head_norm as HK

    return HK.supported((rows, n_q, d_h), (rows, n_kv, d_h), dtype)


def qkv_products(rows: int, hidden: int, n_q: int, n_kv: int, d_h: int, dtype) -> bool:
    """Whether the input norm and the q/k/v products run in one
    :func:`alodlm_jax.kernels.matmul.norm_matmul` on an NVIDIA GPU."""
    from alodlm_jax.kernels import matmul as MK

    return MK.supported(rows, hidden, (n_q * d_h, n_kv * d_h, n_kv * d_h), dtype)


def out_and_mlp(rows: int, attn_width: int, hidden: int, inner: int, dtype) -> bool:
    """Whether a layer's output product, post norm with SwiGLU and down product run in the
    matmul kernels (:mod:`alodlm_jax.kernels.matmul`) on an NVIDIA GPU."""
    from alodlm_jax.kernels import matmul as MK

    return (MK.supported(rows, attn_width, (hidden,), dtype)
            and MK.supported(rows, hidden, (inner,), dtype)
            and MK.supported(rows, inner, (hidden,), dtype))


def normed_attention(n_q: int, n_kv: int, d_h: int, dtype, cache_dtype, slots: int,
                     rows: int) -> bool:
    """Whether a window layer may hand its q/k/v products to the GPU attention kernel as they
    are, which then applies the heads' norms and RoPE itself
    (:func:`alodlm_jax.kernels.window.window_attention_qkv`): 16-bit activations and cache (K's
    and V's share a dtype), heads :func:`~alodlm_jax.kernels.common.norm_rope_supported` and
    shapes the GPU attention kernel takes (``rows``: a request's window rows), any number of
    requests; unless :data:`~alodlm_jax.kernels.window.NORMS_IN_ATTENTION` is off."""
    from alodlm_jax.kernels import common
    from alodlm_jax.kernels import window as WK

    return (WK.NORMS_IN_ATTENTION and dtype == cache_dtype
            and common.norm_rope_supported(n_q, n_kv, d_h, dtype)
            and WK.supported("gpu", slots=slots, n_kv=n_kv, head_dim=d_h, rows=rows,
                             group=n_q // n_kv, dtype=cache_dtype))
