"""The ALoDLM network as pure functions over the params pytree (MODEL_AND_DECODING.md §2, §3, §5, §8).

The layers' attention forms are in :mod:`alodlm_jax.attention`.

Every function takes the params pytree as an argument (never closes over it), so callers jit them
with params as ordinary inputs. ``cfg`` (an ``alodlm_convert.config.ModelConfig``, a hashable frozen
dataclass) only supplies static scalars; layer shapes come from the arrays themselves.

The KV cache is preallocated with a fixed shape. A layer call at cache offset ``start`` (traced
int32) with ``T`` rows writes its keys/values (after ``k_norm`` and RoPE) into slots
``start .. start+T`` of its buffer and lets query row ``a`` attend to slots ``j <= start + a``. That
single rule is causal prefill (``start=0``) and a decode window (prefix cache plus causal attention in
packed order). Rows past the valid count are padding: they write garbage into slots that a later
window overwrites, and valid rows (which come first) never attend to them. The caller must size the
cache so that ``start + T <= t_max`` for every call (``dynamic_update_slice`` clamps out-of-range
offsets, which would overwrite prefix slots).

Cost model: a layer group is either stacked (one ``lax.scan``, one compiled layer body) or a tuple
of per-layer dicts (:func:`unstack_layers`, a Python loop; the ordinary load's layout, since
XLA copies a layer's weights out of a stack on every call). The group's whole cache is threaded
through the layers, each of which writes only its ``T`` window slots (:func:`write_slots`:
``dynamic_update_slice``, in place when the caller donates the cache to its jitted function, also
per request under ``vmap``). Attention reads the smallest power-of-two bucket of the buffer that
holds every slot the call's rows may see (:func:`kv_buckets`, one ``lax.switch`` per group), so a
pass costs what the filled part of the cache costs, up to a factor of two. The decode loop uses
the window forwards (:func:`run_window_stack`: ``prelude_window``, ``core_window``,
``readout_window``), which only read the cache and return the window's K/V for
:func:`store_window`, so that they can run inside a ``lax.switch`` over row buckets without XLA
copying the cache into the taken branch. A long prompt can also
be prefilled in chunks, each running all K passes: successive ``start`` offsets leave exactly the
one-shot cache (attention is causal; the coda buffer ends holding the last pass either way), though
a chunk's readouts before the last pass see the previous chunks' last-pass coda K/V (spec §5).

Numerics follow transformers' Qwen3 and the portable decoder:

* matrix products accumulate in fp32 (``preferred_element_type``) and are rounded once to the
  activation dtype, which is what PyTorch's bf16 GEMMs do; ``Precision.HIGHEST`` keeps fp32 products
  exact on GPUs (XLA's default there is TF32-like);
* RMSNorm in fp32, cast back to the input dtype, then the weight multiply in that dtype;
* RoPE tables from fp32 positions and fp32 inverse frequencies, cast to the activation dtype
  (XLA's fp32 ``pow`` may round an inverse frequency one ulp away from torch's: tables agree to
  ~2e-6 at position 40959);
* SwiGLU: ``silu`` evaluated in fp32 and rounded once, as torch does for bf16 tensors;
* attention scores, masking and softmax in fp32; probabilities are cast to the activation dtype
  before the product with V. transformers' eager path (and our torch reference) rounds the scores
  to bf16 and scales them in bf16 before its fp32 softmax; we keep the scores in fp32, which is
  one rounding more accurate. Measured against the torch reference in bf16 (tiny checkpoints, 200
  tokens, 4 depths): top-1 agreement 0.99-0.996 and mean |Δlogit| 0.0014 either way — the
  rounding of the scores is not where bf16 differences come from, so the more accurate variant
  stays. In fp32 both are the same computation;
* LM head in the model dtype, cast to fp32; gate linear + bias + depth bias in the model dtype, logit
  cast to fp32, sigmoid in fp32.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.custom_batching import custom_vmap

from alodlm_jax import attention as A
from alodlm_jax import rows as R
from alodlm_jax.kernels import select

if TYPE_CHECKING:  # pragma: no cover
    from alodlm_convert.config import ModelConfig

Params = dict[str, Any]
_HIGHEST = jax.lax.Precision.HIGHEST


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


# --------------------------------------------------------------------------------------------------
# Building blocks


def _mm(equation: str, x: jax.Array, w: jax.Array) -> jax.Array:
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


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x ``[T, n, d_h]``; (x1·cos − x2·sin, x2·cos + x1·sin) in x's dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _on_kv_bucket(slots: int, kv_bucket, attend, *operands):
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


def _layer(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
           k_all: jax.Array, v_all: jax.Array, index: tuple, start: jax.Array, kv_len: int | None,
           kv_bucket: jax.Array | None = None):
    """One Qwen3 decoder layer; writes its K/V at ``k_all[index][start:start+T]`` and attends to it.

    ``index`` is the buffer's leading index tuple: ``(layer,)`` or ``(layer, depth)`` (int32).
    Only the ``T`` window slots are written, so the carried cache is updated in place. Attention
    reads the first ``kv_len`` slots (static; all of them when ``None``), or, given ``kv_bucket``
    (traced index into :func:`kv_buckets` of that length), the first ``kv_buckets(...)[kv_bucket]``.
    """
    q, k, v = _qkv(lp, eps, h, cos, sin)
    lead = (1,) * len(index)
    zero = jnp.int32(0)
    index = tuple(jnp.asarray(i, jnp.int32) for i in index)
    offset = jnp.stack(index + (start, zero, zero))
    k_all = write_slots(k_all, k.astype(k_all.dtype).reshape(lead + k.shape), offset)
    v_all = write_slots(v_all, v.astype(v_all.dtype).reshape(lead + v.shape), offset)
    slots = k_all.shape[len(index)]
    if kv_len is not None:
        slots = min(kv_len, slots)

    def attend_first(size, q, k_all, v_all):
        k_buf = A.first_slots(k_all, index, size).astype(q.dtype)
        return A.attend(q, k_buf, A.first_slots(v_all, index, size).astype(q.dtype), start)

    attn = _on_kv_bucket(slots, kv_bucket, attend_first, q, k_all, v_all)
    return _attention_out_and_mlp(lp, eps, h, attn), k_all, v_all


def _qkv(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
         kernel: bool = False):
    """A layer's queries, keys and values ``[T, n, d_h]`` (norms and RoPE applied). ``kernel``
    (:data:`~alodlm_jax.rows.KERNEL`, one device): on an NVIDIA GPU where they apply, the heads'
    norms and RoPE in one Triton kernel (:mod:`alodlm_jax.kernels.head_norm`) after the products
    (:func:`_qkv_projections`: for a window of few rows, the input norm and the three products in
    another); XLA's form elsewhere."""
    a = rms_norm(h, lp["input_norm"], eps)

    def product(name):
        return _mm("th,hnd->tnd", a, lp[name])

    def norm_rope(x, name):
        return _apply_rope(rms_norm(x, lp[f"{name}_norm"], eps), cos, sin)

    def xla(_=None):
        return norm_rope(product("q"), "q"), norm_rope(product("k"), "k"), product("v")

    (_, n_q, d_h), n_kv = lp["q"].shape, lp["k"].shape[1]
    rows = h.shape[0]
    if not (kernel and select.head_norm(rows, n_q, n_kv, d_h, a.dtype)):
        return xla()
    from alodlm_jax.kernels import head_norm as HK  # Pallas's Triton module: only where it may run

    def in_kernels(h):  # the products, then the heads' norms in one kernel where XLA:GPU makes 4
        return HK.norm_rope(_qkv_projections(lp, eps, h), n_q, n_kv, lp["q_norm"], lp["k_norm"],
                            cos, sin, eps)

    return jax.lax.platform_dependent(h, cuda=in_kernels, default=xla)


def _attention_out_and_mlp(lp: Params, eps: float, h: jax.Array, attn: jax.Array,
                           kernel: bool = False) -> jax.Array:
    """The rest of a layer after attention: output projection + residual, then the SwiGLU MLP.
    ``kernel`` (:data:`~alodlm_jax.rows.KERNEL`, one device): on an NVIDIA GPU, for a window of
    few rows, each product with its norm or residual add in one Triton kernel
    (:mod:`alodlm_jax.kernels.matmul`); XLA's form elsewhere."""
    # The output projection as one [T, n_q*d_h] x [n_q*d_h, H] product (a reshape of the kernel, no
    # copy). Written as "tnd,ndh->th", XLA:CPU transposed the whole [n_q, d_h, H] kernel on every
    # call (7 % of a pass of the 1 GB bench model).
    o = lp["o"]
    attn = attn.reshape(attn.shape[0], -1)
    o = o.reshape(-1, o.shape[-1])

    def xla(h, attn):
        h = h + _mm("tk,kh->th", attn, o)
        b = rms_norm(h, lp["post_norm"], eps)
        gate = _mm("th,hi->ti", b, lp["gate_proj"])
        gate = jax.nn.silu(gate.astype(jnp.float32)).astype(gate.dtype)  # torch: silu in fp32, one rounding
        mlp = gate * _mm("th,hi->ti", b, lp["up_proj"])
        return h + _mm("ti,ih->th", mlp, lp["down_proj"])

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


def _num_layers(stack) -> int:
    if isinstance(stack, (list, tuple)):
        return len(stack)
    return stack["input_norm"].shape[0]


def unstack_layers(params: Params) -> Params:
    """The same params with every layer group as a tuple of per-layer dicts (no leading axis).

    :func:`run_stack` accepts both forms. Stacked groups run as one ``lax.scan`` whose body slices
    the layer's weights out of the stack; XLA:CPU copies that slice on every call (measured: 29 % of
    a pass of the 1 GB bench model), and a copy of the weights doubles the memory traffic of a
    bandwidth-bound pass on a GPU. Per-layer arrays are read in place by the matrix products.
    Works on numpy and on jax arrays; groups that already are tuples are kept.
    """
    out = dict(params)
    for group in ("prelude", "core", "coda"):
        stack = params[group]
        if isinstance(stack, (list, tuple)):
            continue
        out[group] = tuple({key: value[i] for key, value in stack.items()}
                           for i in range(_num_layers(stack)))
    return out


def run_stack(stack, cfg: "ModelConfig", h: jax.Array, positions: jax.Array,
              k_all: jax.Array, v_all: jax.Array, start, depth=None, *, kv_len: int | None = None,
              kv_limit=None, bucketed: bool = True):
    """Runs a layer group in order; ``stack`` is a stacked dict or a tuple of per-layer dicts.

    The group's whole cache is threaded through the layers and each layer writes only its window
    slots, so nothing is copied per pass. ``depth=None`` addresses ``[L, T_max, ...]`` buffers, an
    int32 ``depth`` addresses ``[L, K, T_max, ...]`` buffers at that depth. An empty group is the
    identity. A stacked group runs as one ``lax.scan`` (one compiled layer body), a tuple as a
    Python loop traced once (see :func:`unstack_layers`, :func:`_traced_once`); the arithmetic is
    the same.

    Attention length: the layers attend over the smallest of :func:`kv_buckets` (powers of two
    from 64, then the whole buffer) that holds ``kv_limit`` slots (traced; default ``start + T``,
    one past the highest slot any row of this call may see), chosen once per group with
    ``lax.switch``. Masked slots contribute exact zeros, so the bucket changes only the length of
    the reductions, not what they add up. A larger ``kv_limit`` picks a longer bucket (several
    callers sharing one bucket; tests compare against the whole buffer). ``kv_len`` (static,
    optional) caps the buffer first, e.g. in a prefill bucket; it changes nothing as long as
    ``start + T <= kv_len``. ``bucketed=False``: no switch, the layers attend over the whole
    (capped) buffer (:data:`alodlm_jax.rows.FIXED`).
    """
    n = _num_layers(stack)
    if n == 0:
        return h, k_all, v_all
    start = jnp.asarray(start, jnp.int32)
    cos, sin = rope_tables(positions, k_all.shape[-1], cfg.rope_theta, h.dtype)
    eps = cfg.rms_norm_eps
    slots = k_all.shape[1 if depth is None else 2]
    if kv_len is not None:
        slots = min(kv_len, slots)
    if kv_limit is None:
        kv_limit = start + h.shape[0]
    kv_bucket = kv_bucket_index(kv_buckets(slots), kv_limit) if bucketed else None

    def layer(lp, i, h, k_all, v_all):
        index = (i,) if depth is None else (i, depth)
        return _layer(lp, eps, h, cos, sin, k_all, v_all, index, start, kv_len, kv_bucket)

    if isinstance(stack, (list, tuple)):
        call = _traced_once(layer)
        for i, lp in enumerate(stack):
            h, k_all, v_all = call(lp, i, h, k_all, v_all)
        return h, k_all, v_all

    def body(carry, xs):
        lp, i = xs
        return layer(lp, i, *carry), None

    (h, k_all, v_all), _ = jax.lax.scan(body, (h, k_all, v_all), (stack, jnp.arange(n, dtype=jnp.int32)))
    return h, k_all, v_all


# --------------------------------------------------------------------------------------------------
# Window forwards with deferred cache writes (the decode loop's hot path)


def _window_layer(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
                  k_all: jax.Array, v_all: jax.Array, index: tuple, start: jax.Array,
                  kv_bucket: jax.Array | None, kernel: bool = False, counts=None):
    """One decoder layer over a window that reads the cache and writes nothing.

    Returns ``(h, k, v, counts)`` with the rows' K/V ``[T, n_kv, d_h]`` in the cache dtype, which
    the caller stores (:func:`store_window`). Attention: prefix slots ``< start`` of the buffer at
    ``index`` (its first ``kv_buckets(...)[kv_bucket]`` slots) plus the window's own rows, see
    :func:`~alodlm_jax.attention.attend_window`; ``kernel``: in the platform's Pallas kernel, as a
    batch of one (:func:`~alodlm_jax.attention.kernel_attention`), which reads the prefix where it
    lies instead of XLA's copies of the buffer, its scores and its probabilities. ``counts``:
    the attention kernel's (:func:`_kernel_qkv_attention`), as they came where it does not
    count.
    """
    if kernel:
        attn, k, v, counts = _kernel_qkv_attention(lp, eps, h, cos, sin, k_all, v_all, index,
                                                   start, counts)
        return _attention_out_and_mlp(lp, eps, h, attn, kernel), k, v, counts
    q, k, v = _qkv(lp, eps, h, cos, sin)
    k = k.astype(k_all.dtype)
    v = v.astype(v_all.dtype)
    index = tuple(jnp.asarray(i, jnp.int32) for i in index)

    def attend_first(size, q, k, v, k_all, v_all):
        k_pre = A.first_slots(k_all, index, size).astype(q.dtype)
        v_pre = A.first_slots(v_all, index, size).astype(q.dtype)
        return A.attend_window(q, k_pre, v_pre, start, k.astype(q.dtype), v.astype(q.dtype))

    attn = _on_kv_bucket(k_all.shape[len(index)], kv_bucket, attend_first, q, k, v, k_all, v_all)
    return _attention_out_and_mlp(lp, eps, h, attn), k, v, counts


def _normed_attention(lp: Params, h: jax.Array, k_all: jax.Array, rows: int) -> bool:
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


def _qkv_projections(lp: Params, eps: float, h: jax.Array) -> jax.Array:
    """The input norm and the q/k/v products of ``h [T, H]`` as one array ``[T, n_q + 2 n_kv,
    d_h]`` (the heads of q, k, v in that order), on an NVIDIA GPU: in one kernel where
    :func:`alodlm_jax.kernels.select.qkv_products` says so, else XLA's products side by side."""
    from alodlm_jax.kernels import matmul as MK
    (hidden, n_q, d_h), n_kv = lp["q"].shape, lp["k"].shape[1]
    if select.qkv_products(h.shape[0], hidden, n_q, n_kv, d_h, h.dtype):
        return MK.norm_matmul(h, lp["input_norm"], [lp[n].reshape(hidden, -1) for n in "qkv"],
                              eps).reshape(h.shape[0], n_q + 2 * n_kv, d_h)
    a = rms_norm(h, lp["input_norm"], eps)
    return jnp.concatenate([_mm("th,hnd->tnd", a, lp[n]) for n in "qkv"], axis=1)


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
    """A window's queries, keys and values (:func:`_qkv`) and its attention in the platform's
    Pallas kernel as a batch of one (:func:`~alodlm_jax.attention.kernel_attention`): ``(attn
    [T, n_q, d_h], k, v [T, n_kv, d_h], counts)``, k and v in the cache's dtype; on an NVIDIA
    GPU where :func:`_normed_attention` says so, the products' output goes to the attention
    kernel as it is (:func:`_normed_window_attention`), which, given ``counts`` (``int32 [L, 1,
    n_kv]``, zero at this layer: :func:`run_window_stack`'s), combines a split prefix's parts
    in its last part (:mod:`alodlm_jax.kernels.window`); elsewhere ``counts`` come back as
    they came."""
    size = k_all.shape[len(index)]

    def cache_index():  # the layer, and the depth as [1] (None without a depth axis)
        layer, *depth = (jnp.asarray(i, jnp.int32) for i in index)
        return layer, depth[0][None] if depth else None

    def separate(h):
        q, k, v = _qkv(lp, eps, h, cos, sin, True)
        k, v = k.astype(k_all.dtype), v.astype(v_all.dtype)
        layer, depth = cache_index()
        attn = A.kernel_attention(q[None], k[None], v[None], k_all[None], v_all[None], layer,
                                  depth, start[None], size=size)[0]
        return attn, k, v, counts

    if not _normed_attention(lp, h, k_all, h.shape[0]):
        return separate(h)

    def fused(h):
        layer, depth = cache_index()
        attn, k, v, counted = _normed_window_attention(
            lp, eps, _qkv_projections(lp, eps, h)[None], cos[None], sin[None], k_all[None],
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
    (:func:`_window_layer`). ``rope``: :func:`rope_tables` of ``positions`` where the caller made
    them once for several calls (the passes of a window); else they are made here.
    """
    n = _num_layers(stack)
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
        h, k, v, counts = _window_layer(lp, eps, h, cos, sin, k_all, v_all, index, start,
                                        kv_bucket, kernel, counts)
        return (h, counts), k, v

    (h, _), k, v = _layer_loop(stack, layer, (h, counts))
    return h, k, v


def _traced_once(layer):
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


def _layer_loop(stack, layer, h, kv_axis: int = 0):
    """``layer(lp, i, h) -> (h, k, v)`` over a group in order (a Python loop over a tuple of
    per-layer dicts, :func:`_traced_once`; one ``lax.scan`` over a stacked dict); the layers'
    ``k``/``v`` stacked on ``kv_axis``."""
    if isinstance(stack, (list, tuple)):
        ks, vs = [], []
        call = _traced_once(layer)
        for i, lp in enumerate(stack):
            h, k, v = call(lp, i, h)
            ks.append(k)
            vs.append(v)
        return h, jnp.stack(ks, axis=kv_axis), jnp.stack(vs, axis=kv_axis)

    def body(h, xs):
        lp, i = xs
        h, k, v = layer(lp, i, h)
        return h, (k, v)

    h, (ks, vs) = jax.lax.scan(body, h, (stack, jnp.arange(_num_layers(stack), dtype=jnp.int32)))
    return h, jnp.moveaxis(ks, 0, kv_axis), jnp.moveaxis(vs, 0, kv_axis)


# --------------------------------------------------------------------------------------------------
# Several requests' windows at once, their valid rows packed together (the batch step;
# the packing is :mod:`alodlm_jax.rows`)


def _window_layer_rows(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
                       k_all: jax.Array, v_all: jax.Array, layer, depth, start: jax.Array,
                       kv_bucket: jax.Array, m: R.RowMap, rows: int, kernel: bool = False):
    """:func:`_window_layer` for ``B`` requests: compact rows ``h [R, H]``, the batch's cache
    buffers ``[B, L, (K,) T, n_kv, d_h]``, per-request ``start`` and ``depth`` ``[B]``.

    Returns ``(h [R, H], k, v)`` with the window rows' K/V in the padded layout ``[B, rows,
    n_kv, d_h]`` (zeros past each request's rows). Attention runs in the ``A`` lanes of
    :class:`~alodlm_jax.rows.RowMap`: each lane's queries attend over its request's prefix (read
    from the batch's buffers at that request's index and depth) and window rows exactly as
    :func:`_window_layer` does. ``kernel`` (in-order lanes only): the lanes attend in the
    platform's Pallas kernel instead (:func:`~alodlm_jax.attention.kernel_attention`); on an
    NVIDIA GPU, where :func:`_normed_attention` says so, the q/k/v products' output goes to it as
    it is (:func:`_normed_window_attention`)."""
    def lanes(h):
        return _window_layer_lanes(lp, eps, h, cos, sin, k_all, v_all, layer, depth, start,
                                   kv_bucket, m, rows, kernel)

    if not (kernel and m.in_order and kv_bucket is None
            and _normed_attention(lp, h, k_all, rows)):
        return lanes(h)

    def fused(h):  # in-order lanes: a request's lane is its padded rows (from_rows)
        attn, k, v, _ = _normed_window_attention(
            lp, eps, R.to_lanes(_qkv_projections(lp, eps, h), m, rows), R.to_lanes(cos, m, rows),
            R.to_lanes(sin, m, rows), k_all, v_all, jnp.asarray(layer, jnp.int32), depth,
            jnp.where(m.lane_valid, start, 0))
        return _attention_out_and_mlp(lp, eps, h, R.from_lanes(attn, m), kernel), k, v

    return jax.lax.platform_dependent(h, cuda=fused, default=lanes)


def _window_layer_lanes(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
                        k_all: jax.Array, v_all: jax.Array, layer, depth, start: jax.Array,
                        kv_bucket: jax.Array, m: R.RowMap, rows: int, kernel: bool):
    """:func:`_window_layer_rows` with the queries, keys and values made first
    (:func:`_qkv`) and moved to the lanes."""
    q, k, v = _qkv(lp, eps, h, cos, sin, kernel)
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

    attn = _on_kv_bucket(k_all.shape[2 if depth is None else 3], kv_bucket, attend_first,
                         R.to_lanes(q, m, rows), R.to_lanes(k, m, rows), R.to_lanes(v, m, rows),
                         k_all, v_all)
    return (_attention_out_and_mlp(lp, eps, h, R.from_lanes(attn, m), kernel),
            R.from_rows(k, m, rows), R.from_rows(v, m, rows))


def run_window_rows(stack, cfg: "ModelConfig", h: jax.Array, positions: jax.Array, m: R.RowMap,
                    k_all: jax.Array, v_all: jax.Array, start: jax.Array, depth=None, *,
                    prefix_limit, rows: int, bucketed: bool = True, kernel: bool = False):
    """:func:`run_window_stack` for ``B`` requests on packed rows (:class:`~alodlm_jax.rows.RowMap`).

    ``h [R, H]`` and ``positions [R]`` are compact; ``k_all``/``v_all`` the batch's buffers
    ``[B, L, (K,) T, n_kv, d_h]``; ``start`` (and ``depth`` for the core) ``[B]``; ``prefix_limit``
    one attention bucket limit shared by the batch (not ``bucketed``: the whole buffers). Returns
    ``(h [R, H], k_new, v_new)`` with ``k_new``/``v_new`` ``[B, L, rows, n_kv, d_h]`` for
    :func:`store_window` per request. Reads the cache only, like :func:`run_window_stack`. With
    in-order lanes (:data:`~alodlm_jax.rows.FIXED`) each lane attends as
    :func:`~alodlm_jax.attention.attend_in_copy` does; ``kernel`` (:data:`~alodlm_jax.rows.KERNEL`):
    in :mod:`alodlm_jax.kernels.window`.
    """
    n = _num_layers(stack)
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
        return _window_layer_rows(lp, eps, h, cos, sin, k_all, v_all, i, depth, start, kv_bucket,
                                  m, rows, kernel)

    return _layer_loop(stack, layer, h, kv_axis=1)


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


# --------------------------------------------------------------------------------------------------
# The model functions of DESIGN.md


def embed(params: Params, ids: jax.Array) -> jax.Array:
    """Token embeddings ``E[ids]`` -> ``[T, H]`` in the model dtype."""
    return jnp.take(params["embed"], ids, axis=0)


def prelude(params: Params, cfg: "ModelConfig", h, positions, cache: KVCache, start, *,
            kv_len: int | None = None, kv_limit=None, bucketed: bool = True):
    """Layers ``[0, L_s)`` (run once per window, as depth 0)."""
    h, k, v = run_stack(params["prelude"], cfg, h, positions, cache.prelude_k, cache.prelude_v, start,
                        kv_len=kv_len, kv_limit=kv_limit, bucketed=bucketed)
    return h, cache.replace(prelude_k=k, prelude_v=v)


def core_pass(params: Params, cfg: "ModelConfig", h, positions, cache: KVCache, start, depth, *,
              kv_len: int | None = None, kv_limit=None, bucketed: bool = True):
    """Layers ``[L_s, L_e)`` at pass ``depth`` (traced int32), reading/writing the depth's buffers."""
    h, k, v = run_stack(params["core"], cfg, h, positions, cache.core_k, cache.core_v, start, depth=depth,
                        kv_len=kv_len, kv_limit=kv_limit, bucketed=bucketed)
    return h, cache.replace(core_k=k, core_v=v)


def readout(params: Params, cfg: "ModelConfig", h, positions, cache: KVCache, start, *,
            kv_len: int | None = None, kv_limit=None, bucketed: bool = True):
    """``FinalNorm(Coda(h))`` on a copy of the carry; the coda buffers hold this pass's K/V."""
    r, k, v = run_stack(params["coda"], cfg, h, positions, cache.coda_k, cache.coda_v, start,
                        kv_len=kv_len, kv_limit=kv_limit, bucketed=bucketed)
    return rms_norm(r, params["final_norm"], cfg.rms_norm_eps), cache.replace(coda_k=k, coda_v=v)


def prelude_window(params: Params, cfg: "ModelConfig", h, positions, cache: KVCache, start, *,
                   prefix_limit=None, bucketed: bool = True, kernel: bool = False, rope=None):
    """:func:`prelude` over a window without writing: ``(h, (k, v))`` for :func:`store_window`
    (``rope``: as :func:`run_window_stack`'s)."""
    h, k, v = run_window_stack(params["prelude"], cfg, h, positions, cache.prelude_k, cache.prelude_v,
                               start, prefix_limit=prefix_limit, bucketed=bucketed,
                               kernel=kernel, rope=rope)
    return h, (k, v)


def core_window(params: Params, cfg: "ModelConfig", h, positions, cache: KVCache, start, depth, *,
                prefix_limit=None, bucketed: bool = True, kernel: bool = False, rope=None):
    """:func:`core_pass` over a window without writing: ``(h, (k, v))`` for :func:`store_window`
    (``rope``: as :func:`run_window_stack`'s)."""
    h, k, v = run_window_stack(params["core"], cfg, h, positions, cache.core_k, cache.core_v, start,
                               depth=depth, prefix_limit=prefix_limit, bucketed=bucketed,
                               kernel=kernel, rope=rope)
    return h, (k, v)


def readout_window(params: Params, cfg: "ModelConfig", h, positions, cache: KVCache, start, *,
                   prefix_limit=None, bucketed: bool = True, kernel: bool = False, rope=None):
    """:func:`readout` over a window without writing: ``(r, (k, v))`` for :func:`store_window`
    (``rope``: as :func:`run_window_stack`'s)."""
    r, k, v = run_window_stack(params["coda"], cfg, h, positions, cache.coda_k, cache.coda_v, start,
                               prefix_limit=prefix_limit, bucketed=bucketed,
                               kernel=kernel, rope=rope)
    return rms_norm(r, params["final_norm"], cfg.rms_norm_eps), (k, v)


def carry_norm(params: Params, cfg: "ModelConfig", h) -> jax.Array:
    """Between-pass carry normalization with ``model.norm`` (applied to the core output)."""
    return rms_norm(h, params["final_norm"], cfg.rms_norm_eps)


def lm_logits(params: Params, r: jax.Array) -> jax.Array:
    """``lm_head(r)`` in the model dtype, then cast to fp32 -> ``[T, V]``."""
    return _mm("th,hv->tv", r, params["lm_head"]).astype(jnp.float32)


def gate_logit(params: Params, r: jax.Array, depth) -> jax.Array:
    """Exit-gate logit in the model dtype (portable rule): ``w·r + b`` then ``+ depth_bias[depth]``.

    The fp32 gate parameters are cast to ``r``'s dtype first, like ``F.linear`` on a bf16 module; the
    linear accumulates in fp32 with the bias added before the single rounding (an addmm), and the
    depth bias is added in the model dtype afterwards.
    """
    gate = params["gate"]
    dtype = r.dtype
    w = gate["weight"].astype(dtype)
    b = gate["bias"].astype(dtype)
    lin = jnp.einsum("th,h->t", r, w, precision=_HIGHEST, preferred_element_type=jnp.float32)
    lin = (lin + b.astype(jnp.float32)).astype(dtype)
    depth_bias = jnp.take(gate["depth_bias"].astype(dtype), jnp.asarray(depth, jnp.int32))
    return lin + depth_bias


def gate_hazard(params: Params, r: jax.Array, depth) -> jax.Array:
    """Hazard ``sigmoid(gate logit)`` in fp32 -> ``[T]``."""
    return jax.nn.sigmoid(gate_logit(params, r, depth).astype(jnp.float32))


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


# --------------------------------------------------------------------------------------------------
# Whole-sequence conveniences (parity tests, ``compare``)


def looped_forward(params: Params, cfg: "ModelConfig", ids: jax.Array):
    """All ``K`` passes over ``ids`` (causal prefill, positions ``0..T-1``, no masks, no injection).

    Mirrors the torch reference's ``looped_forward``: returns the per-depth readout logits
    ``[K, T, V]`` (fp32) and hazards ``[K, T]`` (fp32) for every row. Jit with ``cfg`` static:
    ``jax.jit(looped_forward, static_argnums=1)``.
    """
    t = ids.shape[0]
    dtype = params["embed"].dtype
    cache = init_cache(cfg, t, dtype)
    positions = jnp.arange(t, dtype=jnp.int32)
    start = jnp.int32(0)
    h, cache = prelude(params, cfg, embed(params, ids), positions, cache, start)

    def one_pass(carry, depth):
        h, cache = carry
        h, cache = core_pass(params, cfg, h, positions, cache, start, depth)
        r, cache = readout(params, cfg, h, positions, cache, start)
        out = (lm_logits(params, r), gate_hazard(params, r, depth))
        return (carry_norm(params, cfg, h), cache), out

    _, (logits, hazards) = jax.lax.scan(one_pass, (h, cache), jnp.arange(cfg.max_depth, dtype=jnp.int32))
    return logits, hazards


def backbone_logits(params: Params, cfg: "ModelConfig", ids: jax.Array) -> jax.Array:
    """Plain Qwen3 forward (prelude, core once at depth 0, coda, final norm, head) -> fp32 ``[T, V]``.

    No looping: this is exactly ``Qwen3ForCausalLM`` over all layers in order, for backbone parity.
    """
    t = ids.shape[0]
    cache = init_cache(cfg, t, params["embed"].dtype)
    positions = jnp.arange(t, dtype=jnp.int32)
    start = jnp.int32(0)
    h, cache = prelude(params, cfg, embed(params, ids), positions, cache, start)
    h, cache = core_pass(params, cfg, h, positions, cache, start, jnp.int32(0))
    r, _ = readout(params, cfg, h, positions, cache, start)
    return lm_logits(params, r)
