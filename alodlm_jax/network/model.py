"""The ALoDLM network as pure functions over the params pytree (MODEL_AND_DECODING.md §2, §3, §5, §8).

The layers' attention forms are in :mod:`alodlm_jax.network.attention`.

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

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from alodlm_jax.network import attention as A
from alodlm_jax.network.cache import (KVCache, init_cache, kv_bucket_index, kv_buckets,
                                      on_kv_bucket, write_slots)
from alodlm_jax.network.layers import (Params, attention_out_and_mlp, mm, num_layers, qkv,
                                       rms_norm, rope_tables, traced_once)
from alodlm_jax.network.window_layers import run_window_stack

if TYPE_CHECKING:  # pragma: no cover
    from alodlm_convert.config import ModelConfig

_HIGHEST = jax.lax.Precision.HIGHEST


def _layer(lp: Params, eps: float, h: jax.Array, cos: jax.Array, sin: jax.Array,
           k_all: jax.Array, v_all: jax.Array, index: tuple, start: jax.Array, kv_len: int | None,
           kv_bucket: jax.Array | None = None):
    """One Qwen3 decoder layer; writes its K/V at ``k_all[index][start:start+T]`` and attends to it.

    ``index`` is the buffer's leading index tuple: ``(layer,)`` or ``(layer, depth)`` (int32).
    Only the ``T`` window slots are written, so the carried cache is updated in place. Attention
    reads the first ``kv_len`` slots (static; all of them when ``None``), or, given ``kv_bucket``
    (traced index into :func:`kv_buckets` of that length), the first ``kv_buckets(...)[kv_bucket]``.
    """
    q, k, v = qkv(lp, eps, h, cos, sin)
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

    attn = on_kv_bucket(slots, kv_bucket, attend_first, q, k_all, v_all)
    return attention_out_and_mlp(lp, eps, h, attn), k_all, v_all


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
                           for i in range(num_layers(stack)))
    return out


def run_stack(stack, cfg: "ModelConfig", h: jax.Array, positions: jax.Array,
              k_all: jax.Array, v_all: jax.Array, start, depth=None, *, kv_len: int | None = None,
              kv_limit=None, bucketed: bool = True):
    """Runs a layer group in order; ``stack`` is a stacked dict or a tuple of per-layer dicts.

    The group's whole cache is threaded through the layers and each layer writes only its window
    slots, so nothing is copied per pass. ``depth=None`` addresses ``[L, T_max, ...]`` buffers, an
    int32 ``depth`` addresses ``[L, K, T_max, ...]`` buffers at that depth. An empty group is the
    identity. A stacked group runs as one ``lax.scan`` (one compiled layer body), a tuple as a
    Python loop traced once (see :func:`unstack_layers`, :func:`traced_once`); the arithmetic is
    the same.

    Attention length: the layers attend over the smallest of :func:`kv_buckets` (powers of two
    from 64, then the whole buffer) that holds ``kv_limit`` slots (traced; default ``start + T``,
    one past the highest slot any row of this call may see), chosen once per group with
    ``lax.switch``. Masked slots contribute exact zeros, so the bucket changes only the length of
    the reductions, not what they add up. A larger ``kv_limit`` picks a longer bucket (several
    callers sharing one bucket; tests compare against the whole buffer). ``kv_len`` (static,
    optional) caps the buffer first, e.g. in a prefill bucket; it changes nothing as long as
    ``start + T <= kv_len``. ``bucketed=False``: no switch, the layers attend over the whole
    (capped) buffer (:data:`alodlm_jax.network.rows.FIXED`).
    """
    n = num_layers(stack)
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
        call = traced_once(layer)
        for i, lp in enumerate(stack):
            h, k_all, v_all = call(lp, i, h, k_all, v_all)
        return h, k_all, v_all

    def body(carry, xs):
        lp, i = xs
        return layer(lp, i, *carry), None

    (h, k_all, v_all), _ = jax.lax.scan(body, (h, k_all, v_all), (stack, jnp.arange(n, dtype=jnp.int32)))
    return h, k_all, v_all


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
    return mm("th,hv->tv", r, params["lm_head"]).astype(jnp.float32)


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
