"""A window's attention as a Pallas kernel reading each request's K/V in place.

:func:`window_attention` computes what ``jax.vmap(attention.attend_in_copy)`` computes for the
in-order lanes of the :data:`~alodlm_jax.rows.FIXED` batch step (and, as a batch of one, for a
single request's window, :func:`alodlm_jax.model.run_window_stack`): request ``b``'s queries (its
window rows) attend over its prefix, cache slots ``< start[b]`` of layer ``layer`` at depth
``depth[b]`` of the batch's buffers, and over its own window's K/V, row ``a`` seeing window rows
``<= a``, in one softmax. The XLA form reads every request's slice of the cache into a copy (a
gather at a per-request depth), writes the window into it and materializes fp32 scores and
probabilities as large as the keys; XLA:TPU expands the gather and the write into loops (33.7k
kernels a step for the 8B at batch 32). The kernels read the cache where it lies, only the
blocks of slots a request's prefix covers, and keep the scores on chip with flash attention's
online softmax:

* TPU (Mosaic): grid ``(B, S / bs)``; a block's index comes from the request's layer, depth and
  start (scalar prefetch), and the steps past the prefix repeat the last block's index, which
  Pallas does not fetch again. The cache is ``[.., S, n_kv, d_h]``, slots before heads: a head's
  keys are every ``n_kv``-th row of the block seen as ``[bs * n_kv, d_h]`` (a strided load; 16-bit
  rows two heads at a time as 32-bit words, as JAX's ragged paged attention does).
* GPU (Triton): grid ``(B, n_kv)``; a program loops over its request's prefix in tiles of
  :data:`GPU_BLOCK_SLOTS` slots of one head, loaded from the cache at the request's layer and
  depth. A small batch makes too few programs to read at the device's bandwidth (one request of
  the released models: 8, on 132 SMs), so there each prefix is walked in parts (flash-decoding,
  :func:`gpu_splits`): grid ``(B, n_kv, splits)``, each program one run of the prefix's tiles,
  writing its unnormalized output, maximum and sum in fp32; a second kernel combines them, or,
  where the caller carries zeroed counts (one request's window layers,
  :func:`alodlm_jax.model.run_window_stack`), the head's last program to finish does, in the
  same order.
  :func:`window_attention_qkv` is the same kernel taking the window's queries and keys as the
  q/k/v products leave them: each program applies the heads' norms and RoPE itself
  (:func:`norm_rope_halves`, the operations of :mod:`alodlm_jax.head_norm_kernel`) and the
  window's keys so made come back for the cache, one kernel a layer fewer.

Numerics: scores, the running maximum and sums and the output accumulation in fp32, products of
fp32 operands at ``Precision.HIGHEST``, as :func:`alodlm_jax.attention.attend` does; the
unnormalized probabilities are cast to the value dtype before their product with V (the XLA form
casts the normalized ones) and the sum is taken in another order (the GPU's parts: summed per
part, then across parts), so in fp32 the two agree to rounding (tested) and in bf16 to bf16's
resolution.
The CPU never runs these kernels (its programs keep the XLA form); tests run both in Pallas's
interpreter, and compile them for a TPU and a GPU without either.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltr

# JAX 0.11 deprecates Pallas's Triton backend (these GPU kernels' and matmul_kernel's and
# head_norm_kernel's) with a DeprecationWarning at each lowering for a GPU; what its removal would
# take is in docs/performance.md. Users are not told at every compile: that one warning is ignored.
warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated",
                        category=DeprecationWarning)

_NEG_INF = -1e30  # as attention's _NEG_INF: masked scores' exp underflows to exactly 0
GPU_BLOCK_SLOTS = 64  # cache slots per tile of the GPU kernel's loop (the FIXED cache: multiples)
# The programs the GPU kernel's grid aims for (gpu_splits): at the rate the plan assumes one
# program reads (alodlm_jax.plan.launches.TIME_MODEL, 100 GB/s), 64 read 6.4 TB/s, above an
# H200's 4.8 TB/s; one request of the released models is 8.
GPU_PROGRAMS = 64
GPU_RUN_BLOCKS = 4  # the fewest blocks a part of a split prefix walks (_runs)
# Whether the model hands a window's q/k/v products to the GPU kernel to normalize itself
# (window_attention_qkv) where it can; False keeps the heads' norms in a kernel of their own
# (scripts/gpu_check.sh --separate_norms, to compare the engines' ms/pass both ways).
NORMS_IN_ATTENTION = True
# Whether the split GPU kernel's last part to finish combines a head's parts itself where its
# caller carries the counts (_gpu_attention's ``counts``); False combines them in a kernel of
# their own (scripts/gpu_check.sh --separate_combine, to compare the engines both ways).
COMBINE_IN_ATTENTION = True


def _precision(dtype):
    """As the model's products: fp32 operands multiplied in full fp32 (Triton's default is TF32);
    16-bit ones at the default (Mosaic refuses ``HIGHEST`` for them)."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


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
    form (:func:`alodlm_jax.model.rms_norm`, ``_apply_rope``) in its order, each result rounded
    to the 16-bit dtype where XLA rounds it (it evaluates 16-bit elementwise operations in
    fp32): the sum of squares in fp32 (per half, then added), the normalized value, its product
    with the weight, RoPE's two products and their sum. Returns the rotated halves in
    ``x_ref``'s dtype; a row of zeros stays zeros. Used by :mod:`alodlm_jax.head_norm_kernel` and
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


def block_slots(slots: int) -> int:
    """The cache slots a grid step reads: 512 or 256 where they divide ``slots``, else all."""
    for size in (512, 256):
        if slots % size == 0:
            return size
    return slots


def gpu_rows(rows: int) -> int:
    """The window rows the GPU kernel runs on: ``rows`` padded to a power of two of at least 16
    (Triton's tiles; the padding rows come after every real row, which sees none of them)."""
    return max(16, 1 << (max(rows, 1) - 1).bit_length())


def _pad_rows(x, rows: int):
    """``x [B, W, ...]`` with zero rows after its ``W`` up to ``rows`` (:func:`gpu_rows`)."""
    if x.shape[1] == rows:
        return x
    return jnp.pad(x, [(0, 0), (0, rows - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def gpu_splits(batch: int, n_kv: int, slots: int) -> int:
    """The parts the GPU kernel splits each request's prefix into (flash-decoding): one program
    per request and KV head is ``batch * n_kv`` programs, 8 for one request of the released
    models on a GPU of 108-148 SMs, too few to read at the device's bandwidth; so the smallest
    power of two that makes at least :data:`GPU_PROGRAMS` of them, at most the cache's tiles. 1
    (no parts, no combining) where the batch alone makes that many."""
    want, splits = -(-GPU_PROGRAMS // (batch * n_kv)), 1
    while splits < want and 2 * splits <= max(slots // GPU_BLOCK_SLOTS, 1):
        splits *= 2
    return splits


def supported(backend: str, *, slots: int, n_kv: int, head_dim: int, rows: int, group: int,
              dtype) -> bool:
    """Whether the kernel compiles for ``backend`` at these shapes. TPU: lane-wide heads, and
    for 16-bit caches an even number of KV heads (read in pairs). GPU (Triton): power-of-two
    tiles of at least 16 (the padded window rows, :func:`gpu_rows`; a KV head's stacked queries;
    the head size), a power-of-two query group and a cache of whole tiles."""
    if backend == "tpu":
        return head_dim % 128 == 0 and (jnp.dtype(dtype).itemsize == 4 or n_kv % 2 == 0)
    tiles = (gpu_rows(rows) * group, head_dim)
    return (slots % GPU_BLOCK_SLOTS == 0 and power_of_two(group)
            and all(n >= 16 and power_of_two(n) for n in tiles))


def _heads(ref, n_kv: int) -> list:
    """The ``n_kv`` heads of a ``[bs, n_kv, d_h]`` block ref as ``[bs, d_h]`` arrays."""
    bs, _, d_h = ref.shape
    if ref.dtype.itemsize != 4 and n_kv % 2:  # not for Mosaic (``supported``); the interpreter
        return [ref[:, h, :] for h in range(n_kv)]
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


def _online(carry, s, v):
    """One block of flash attention's online softmax: ``carry`` the running maximum and sum
    ``[g, 1]`` and output ``[g, d_h]`` (fp32), ``s`` the block's masked fp32 scores ``[g, n]``,
    ``v`` its values ``[n, d_h]``."""
    m, l, acc = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new)
    acc = alpha * acc + jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                            precision=_precision(v.dtype),
                                            preferred_element_type=jnp.float32)
    return m_new, alpha * l + jnp.sum(p, axis=1, keepdims=True), acc


def _scores(q, k, mask):
    """Scaled fp32 scores ``[g, n]`` of queries ``[g, d_h]`` against keys ``[n, d_h]``, masked."""
    s = jax.lax.dot_general(q, k.astype(q.dtype), (((1,), (1,)), ((), ())),
                            precision=_precision(q.dtype), preferred_element_type=jnp.float32)
    return jnp.where(mask, s * jnp.float32(q.shape[-1] ** -0.5), _NEG_INF)


def _seen(v, seen):
    """A block's values ``[n, d_h]`` zeroed in the slots past the prefix (``seen`` ``[n, 1]``):
    their probabilities are zeros, but a slot left from another request may hold inf or NaN
    (``0 * inf`` is NaN; as in :mod:`alodlm_jax.attention`)."""
    return jnp.where(seen, v, jnp.zeros((), v.dtype))


def _window_mask(g: int, rows: int, group: int | None = None):
    """Stacked query row ``j * rows + a`` (``group`` given: ``a * group + j``) sees window rows
    ``<= a``."""
    stacked = jax.lax.broadcasted_iota(jnp.int32, (g, rows), 0)
    row = stacked % rows if group is None else stacked // group
    return jax.lax.broadcasted_iota(jnp.int32, (g, rows), 1) <= row


def _tpu_kernel(layer_ref, depth_ref, start_ref, q_ref, kw_ref, vw_ref, k_ref, v_ref, o_ref,
                m_ref, l_ref, acc_ref, *, bs: int, rows: int):
    """Grid ``(B, S / bs)``: the blocks of request ``b``'s slots at its layer and depth arrive
    one per step (the index map stops at the prefix's last block); every KV head of the block
    in turn, its running softmax in VMEM scratch."""
    b = pl.program_id(0)
    t = pl.program_id(1)
    start = start_ref[b]
    n_kv, g, _ = q_ref.shape

    @pl.when(t == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, _NEG_INF, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def update(h, s, v):
        m_ref[h], l_ref[h], acc_ref[h] = _online((m_ref[h], l_ref[h], acc_ref[h]), s, v)

    @pl.when(t * bs < start)
    def _():
        visible = t * bs + jax.lax.broadcasted_iota(jnp.int32, (g, bs), 1) < start
        seen = t * bs + jax.lax.broadcasted_iota(jnp.int32, (bs, 1), 0) < start
        ks, vs = _heads(k_ref, n_kv), _heads(v_ref, n_kv)
        for h in range(n_kv):
            update(h, _scores(q_ref[h], ks[h], visible), _seen(vs[h].astype(q_ref.dtype), seen))

    @pl.when(t == pl.num_programs(1) - 1)
    def _():
        ks, vs = _heads(kw_ref, n_kv), _heads(vw_ref, n_kv)
        for h in range(n_kv):
            update(h, _scores(q_ref[h], ks[h], _window_mask(g, rows)), vs[h].astype(q_ref.dtype))
            o_ref[h] = (acc_ref[h] / l_ref[h]).astype(o_ref.dtype)


def _gpu_kernel(layer_ref, depth_ref, start_ref, q_ref, kw_ref, vw_ref, k_ref, v_ref, *refs,
                bs: int, rows: int, splits: int, eps: float | None = None,
                counting: bool = False, interpret: bool = False):
    """Grid ``(B, n_kv)``: one program per request and KV head loops over the blocks of the
    request's prefix, loading each from the cache at its layer and depth (a strided tile), then
    its window. The head's queries ``[rows, group, d_h]`` are stacked row-major (row ``a * group
    + j``), so that they arrive and leave in the layer's own ``[B, W, n_q, d_h]`` layout.

    ``splits > 1`` (grid ``(B, n_kv, splits)``, :func:`gpu_splits`): the prefix's blocks are
    cut in runs (:func:`_runs`); program ``p`` walks the ``p``-th (the last one also the window)
    and writes its unnormalized part, running maximum and sum (``out_refs``: acc ``[g, d_h]``, m
    and l ``[g]``, fp32) for :func:`_gpu_combine_kernel`; a program past the runs writes
    nothing.

    ``eps`` given (:func:`window_attention_qkv`): the queries and the window's keys arrive as
    the projections left them, and the program applies the heads' norms and RoPE first
    (:func:`norm_rope_halves`; ``refs`` begin with cos, sin and the two norms' weights), and
    writes the window's keys so made to its last output (the first part's program, where the
    prefix is split).

    ``counting`` (a split prefix): each program's acc, m and l blocks hold all its head's parts,
    and after writing its own a program adds one to its layer's, request's and head's count
    (``int32 [L, B, n_kv]``, an input aliased to an output, zero before the call); the one that
    brings it to the parts used combines them (:func:`_combined`, as :func:`_gpu_combine_kernel`
    does) into the output, where a second kernel did. A barrier first, so that the whole
    program's part is written before the count (one thread's acquire-release add, at the GPU's
    scope); the last program reads the others' parts past its cache (volatile loads)."""
    b = pl.program_id(0)
    h = pl.program_id(1)
    start = start_ref[b]
    depth = depth_ref[b]
    layer = layer_ref[0]
    group = q_ref.shape[1]
    refs = list(refs)
    if eps is not None:
        cos_ref, sin_ref, qn_ref, kn_ref = refs[:4]
        del refs[:4]
    if counting:
        del refs[0]  # the counts as an input: the buffer of their output
    ko_ref = refs.pop() if eps is not None else None
    out_refs = refs
    if eps is None:
        q = q_ref[...].reshape(rows * group, q_ref.shape[2])
        k_window = kw_ref[...]
    else:
        q, k_window = _normed_window(q_ref, kw_ref, cos_ref, sin_ref, qn_ref, kn_ref, eps)
    g, d_h = q.shape

    def block(t, carry):
        first = pl.multiple_of(t * bs, bs)
        k = k_ref[b, layer, depth, pl.ds(first, bs), h, :]
        v = v_ref[b, layer, depth, pl.ds(first, bs), h, :].astype(q.dtype)
        visible = first + jax.lax.broadcasted_iota(jnp.int32, (g, bs), 1) < start
        seen = first + jax.lax.broadcasted_iota(jnp.int32, (bs, 1), 0) < start
        return _online(carry, _scores(q, k, visible), _seen(v, seen))

    carry = (jnp.full((g, 1), _NEG_INF, jnp.float32), jnp.zeros((g, 1), jnp.float32),
             jnp.zeros((g, d_h), jnp.float32))
    tiles = pl.cdiv(start, bs)
    window = _window_mask(g, rows, group)

    def attend(first, last, window):
        walked = jax.lax.fori_loop(first, last, block, carry)
        return _online(walked, _scores(q, k_window, window), vw_ref[...].astype(q.dtype))

    if splits == 1:
        _, l, acc = attend(0, tiles, window)
        (o_ref,) = out_refs
        o_ref[...] = (acc / l).astype(o_ref.dtype).reshape(o_ref.shape)
        if ko_ref is not None:
            ko_ref[...] = k_window.astype(ko_ref.dtype)
        return
    part = pl.program_id(2)
    run, used = _runs(start, bs, splits)
    acc_ref, m_ref, l_ref, *combined = out_refs
    mine = (part, ...) if counting else (...,)  # the blocks hold every part, or this program's

    @pl.when(part < used)
    def _():
        m, l, acc = attend(part * run, jnp.minimum((part + 1) * run, tiles),
                           window & (part == used - 1))
        acc_ref[mine] = acc
        m_ref[mine] = m.reshape(g)
        l_ref[mine] = l.reshape(g)
        if not counting:
            return
        o_ref, count_ref = combined
        if not interpret:
            pltr.debug_barrier()
        arrived = pltr.atomic_add(count_ref, (layer, b, h), jnp.int32(1))

        @pl.when(arrived == used - 1)
        def _():
            load = ((lambda ref: ref[...]) if interpret
                    else (lambda ref: pltr.load(ref, volatile=True)))
            out = _combined(lambda p: (load(m_ref.at[p]), load(acc_ref.at[p]), load(l_ref.at[p])),
                            used, g, d_h)
            o_ref[...] = out.astype(o_ref.dtype).reshape(o_ref.shape)

    if ko_ref is not None:
        @pl.when(part == 0)
        def _():
            ko_ref[...] = k_window.astype(ko_ref.dtype)


def _normed_window(q_ref, kw_ref, cos_ref, sin_ref, qn_ref, kn_ref, eps: float):
    """A program's stacked queries ``[rows * group, d_h]`` and window keys ``[rows, d_h]`` from
    their projections, ``q_ref`` ``[rows, group, d_h]`` and ``kw_ref`` ``[rows, d_h]``, with the
    heads' norms and RoPE applied as :mod:`alodlm_jax.head_norm_kernel` applies them."""
    cos, sin = table_halves(cos_ref), table_halves(sin_ref)

    def rows(x_ref, w_ref):
        o1, o2 = norm_rope_halves(x_ref, w_ref, cos, sin, eps)
        # [n, d_h] rows from the halves: Triton joins only along a new minor axis of 2, so the
        # halves are stacked there and that axis is moved before the half's.
        half = o1.shape[-1]
        o1, o2 = o1.reshape(-1, half), o2.reshape(-1, half)
        return jnp.swapaxes(jnp.stack([o1, o2], axis=-1), 1, 2).reshape(o1.shape[0], 2 * half)

    return rows(q_ref, qn_ref), rows(kw_ref, kn_ref)


def _runs(start, bs: int, splits: int):
    """How the split GPU kernel cuts a prefix of ``start`` slots: runs of ``run`` blocks of
    ``bs`` slots (an equal share of ``splits``, at least :data:`GPU_RUN_BLOCKS`: a short prefix
    is cut in fewer, so that the parts written and combined follow the prefix, not the grid), of
    which the first ``used`` (at least one, for the window) cover the prefix."""
    tiles = pl.cdiv(start, bs)
    run = jnp.maximum(pl.cdiv(tiles, splits), GPU_RUN_BLOCKS)
    return run, jnp.maximum(pl.cdiv(tiles, run), 1)


def _gpu_combine_kernel(start_ref, acc_ref, m_ref, l_ref, o_ref, *, bs: int, splits: int):
    """Grid ``(B, n_kv, chunks)``: the output of a request's KV head's ``c``-th chunk of window
    rows from the split kernel's parts (acc ``[splits, g / chunks, d_h]``, m and l ``[splits, g /
    chunks]``; the first ``used`` written, :func:`_runs`), added one part at a time, rescaled to
    the running maximum as flash attention's online softmax rescales a block."""
    g, d_h = acc_ref.shape[1:]
    _, used = _runs(start_ref[pl.program_id(0)], bs, splits)
    out = _combined(lambda p: (m_ref[p, :], acc_ref[p, :, :], l_ref[p, :]), used, g, d_h)
    o_ref[...] = out.astype(o_ref.dtype).reshape(o_ref.shape)


def _combined(part_at, used, g: int, d_h: int):
    """The output ``[g, d_h]`` (fp32) of the first ``used`` parts, ``part_at(p)`` giving part
    ``p``'s maximum ``[g]``, unnormalized output ``[g, d_h]`` and sum ``[g]``: added one part at a
    time, rescaled to the running maximum as flash attention's online softmax rescales a
    block."""
    def part(p, carry):
        top, total, norm = carry
        m, acc, l = part_at(p)
        new = jnp.maximum(top, m)
        old, weight = jnp.exp(top - new), jnp.exp(m - new)
        return new, old[:, None] * total + weight[:, None] * acc, old * norm + weight * l

    _, total, norm = jax.lax.fori_loop(
        0, used, part, (jnp.full((g,), _NEG_INF, jnp.float32), jnp.zeros((g, d_h), jnp.float32),
                        jnp.zeros((g,), jnp.float32)))
    return total / norm[:, None]


def _gpu_attention(scalars, window, window_specs, k_all, v_all, *, rows: int, group: int,
                   read: int, out_bytes: int, flops: int, scores: int, splits: int | None,
                   interpret: bool, eps: float | None = None, counts=None):
    """The GPU kernel's call (and, for a split prefix, the combining one): ``window`` the
    operands before the cache (q, the window's k and v; with ``eps``, the projections' views,
    then cos, sin and the norms' weights) and their specs; ``rows`` the padded window rows; the
    figures from :func:`_operands`. ``counts`` (``int32 [L, B, n_kv]``, zero where this call
    counts): for a split prefix, the kernel's last part to finish combines a head's parts itself
    (:func:`_gpu_kernel`'s ``counting``, where :data:`COMBINE_IN_ATTENTION`), no second kernel.
    Returns the output ``[B, rows, n_kv, group, d_h]``, with ``eps`` the window's keys ``[B,
    rows, n_kv, d_h]`` as the kernel normalized them (else None), and the counts (the buffer
    the kernel counted in, or ``counts`` as they came)."""
    batch, _, _, slots, n_kv, d_h = k_all.shape
    if slots % GPU_BLOCK_SLOTS:
        raise ValueError(f"the GPU kernel reads {GPU_BLOCK_SLOTS}-slot tiles: {slots} slots")
    dtype = window[0].dtype
    splits = gpu_splits(batch, n_kv, slots) if splits is None else splits
    counting = counts is not None and splits > 1 and COMBINE_IN_ATTENTION
    g = group * rows
    whole = pl.no_block_spec
    head_out = pl.BlockSpec((None, rows, None, group, d_h), lambda b, h, *_: (b, 0, h, 0, 0))
    grouped = jax.ShapeDtypeStruct((batch, rows, n_kv, group, d_h), dtype)
    if splits == 1:
        out_shape, out_specs, written = (grouped,), (head_out,), out_bytes
    else:
        # a program's own part, or (counting) all its head's parts, which the last one reads
        parts_in_block = splits if counting else None
        part = lambda *shape: pl.BlockSpec(  # noqa: E731
            (None, None, parts_in_block) + shape,
            lambda b, h, p: (b, h, 0 if counting else p) + (0,) * len(shape))
        out_shape = (jax.ShapeDtypeStruct((batch, n_kv, splits, g, d_h), jnp.float32),
                     jax.ShapeDtypeStruct((batch, n_kv, splits, g), jnp.float32),
                     jax.ShapeDtypeStruct((batch, n_kv, splits, g), jnp.float32))
        out_specs = (part(g, d_h), part(g), part(g))
        written = parts = sum(4 * s.size for s in out_shape)
        if counting:  # the output, and the parts read back by the last program
            out_shape += (grouped, jax.ShapeDtypeStruct(counts.shape, jnp.int32))
            out_specs += (head_out, whole)
            written += parts + out_bytes
    if eps is not None:  # the window's keys, normalized and rotated
        keys = jax.ShapeDtypeStruct((batch, rows, n_kv, d_h), dtype)
        out_shape += (keys,)
        out_specs += (pl.BlockSpec((None, rows, None, d_h), lambda b, h, *_: (b, 0, h, 0)),)
        written += keys.size * jnp.dtype(dtype).itemsize
    # XLA:GPU keeps no cost estimate: the figures travel in the kernel's metadata.
    moved = read + written
    operands = (*scalars, *window[:3], k_all, v_all, *window[3:]) + ((counts,) if counting else ())
    out = pl.pallas_call(
        functools.partial(_gpu_kernel, bs=GPU_BLOCK_SLOTS, rows=rows, splits=splits, eps=eps,
                          counting=counting, interpret=interpret),
        out_shape=out_shape,
        grid=(batch, n_kv) if splits == 1 else (batch, n_kv, splits),
        in_specs=[whole, whole, whole, *window_specs[:3], whole, whole, *window_specs[3:]]
        + ([whole] if counting else []),
        out_specs=out_specs,
        input_output_aliases={len(operands) - 1: 4} if counting else {},
        compiler_params=pltr.CompilerParams(num_warps=4, num_stages=2),
        metadata={"bytes_accessed": str(moved), "flops": str(flops),
                  "programs": str(batch * n_kv * splits)},
        cost_estimate=pl.CostEstimate(flops=flops, transcendentals=scores, bytes_accessed=moved),
        interpret=interpret)(*operands)
    keys = out[-1] if eps is not None else None
    if splits == 1:
        return out[0], keys, counts
    if counting:
        return out[3], keys, out[4]
    # As many programs: each combines the parts of rows / chunks window rows.
    chunks = min(splits, rows)
    part_rows = lambda *shape: pl.BlockSpec(  # noqa: E731
        (None, None, splits, g // chunks) + shape, lambda b, h, c: (b, h, 0, c) + (0,) * len(shape))
    combined = pl.pallas_call(
        functools.partial(_gpu_combine_kernel, bs=GPU_BLOCK_SLOTS, splits=splits),
        out_shape=grouped,
        grid=(batch, n_kv, chunks),
        in_specs=[whole, part_rows(d_h), part_rows(), part_rows()],
        out_specs=pl.BlockSpec((None, rows // chunks, None, group, d_h),
                               lambda b, h, c: (b, c, h, 0, 0)),
        compiler_params=pltr.CompilerParams(num_warps=4),
        metadata={"bytes_accessed": str(parts + out_bytes), "flops": "0",
                  "programs": str(batch * n_kv * chunks)},
        interpret=interpret)(scalars[2], *out[:3])
    return combined, keys, counts


def _operands(q_shape, n_kv: int, dtype, k_all, v_all, layer, depth, start):
    """What both kernels' calls start from: the cache with a depth axis (one of size 1 where
    ``depth`` is None), the scalar operands (layer ``[1]``, depth and start ``[B]``), and the
    call's figures: bytes read (each request's K/V at one depth, its window's queries, keys and
    values) and written (the output's window rows, not the GPU's padding rows), scores, FLOPs."""
    batch, rows, n_q, d_h = q_shape
    if depth is None:
        k_all, v_all = k_all[:, :, None], v_all[:, :, None]
        depth = jnp.zeros((batch,), jnp.int32)
    slots = k_all.shape[3]
    item, q_item = jnp.dtype(k_all.dtype).itemsize, jnp.dtype(dtype).itemsize
    out_bytes = batch * rows * n_q * d_h * q_item
    read = 2 * batch * slots * n_kv * d_h * item + 2 * batch * rows * n_kv * d_h * item + out_bytes
    scores = batch * n_q * rows * (slots + rows)
    scalars = (jnp.reshape(jnp.asarray(layer, jnp.int32), (1,)), jnp.asarray(depth, jnp.int32),
               jnp.asarray(start, jnp.int32))
    return k_all, v_all, scalars, read, out_bytes, scores, 4 * scores * d_h  # both products


def window_attention(q, k, v, k_all, v_all, layer, depth, start, *, backend: str = "tpu",
                     interpret: bool = False, splits: int | None = None):
    """Each request's window attention over its prefix in the batch's cache and its window.

    q ``[B, W, n_q, d_h]`` (the lanes' queries), k/v ``[B, W, n_kv, d_h]`` (the window's K/V),
    k_all/v_all ``[B, L, K, S, n_kv, d_h]`` (core) or ``[B, L, S, n_kv, d_h]``, ``layer`` an int32
    scalar, ``depth`` int32 ``[B]`` (None without a depth axis), ``start`` int32 ``[B]``. Returns
    ``[B, W, n_q, d_h]`` in q's dtype: ``jax.vmap(attention.attend_in_copy)`` of the same (module
    docstring). ``backend``: ``"tpu"`` (Mosaic) or ``"gpu"`` (Triton); ``interpret``: run it in
    Pallas's interpreter (any platform); ``splits``: the GPU kernel's parts of each prefix
    (:func:`gpu_splits` where None; the TPU kernel walks the prefix in one part)."""
    batch, rows, n_q, d_h = q.shape
    n_kv = k.shape[2]
    group = n_q // n_kv
    k_all, v_all, scalars, read, out_bytes, scores, flops = _operands(
        q.shape, n_kv, q.dtype, k_all, v_all, layer, depth, start)
    slots = k_all.shape[3]
    if backend == "tpu":
        # [B, n_kv, group*W, d_h]: row j*W + a is query row a of the kv head's j-th query head.
        g = group * rows
        qg = q.reshape(batch, rows, n_kv, group, d_h).transpose(0, 2, 3, 1, 4).reshape(
            batch, n_kv, g, d_h)
        bs = block_slots(slots)

        def cache_block(b, t, layer_ref, depth_ref, start_ref):
            last = jnp.maximum(pl.cdiv(start_ref[b], bs) - 1, 0)
            return (b, layer_ref[0], depth_ref[b], jnp.minimum(t, last), 0, 0)

        def per_request(b, t, *_):
            return (b, 0, 0, 0)

        cache_spec = pl.BlockSpec((None, None, None, bs, n_kv, d_h), cache_block)
        window_spec = pl.BlockSpec((None, rows, n_kv, d_h), per_request)
        q_spec = pl.BlockSpec((None, n_kv, g, d_h), per_request)
        moved = read + out_bytes
        cost = pl.CostEstimate(flops=flops, transcendentals=scores, bytes_accessed=moved)
        call = pl.pallas_call(
            functools.partial(_tpu_kernel, bs=bs, rows=rows),
            out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=3, grid=(batch, slots // bs),
                in_specs=[q_spec, window_spec, window_spec, cache_spec, cache_spec],
                out_specs=q_spec,
                scratch_shapes=[pltpu.VMEM((n_kv, g, 1), jnp.float32),
                                pltpu.VMEM((n_kv, g, 1), jnp.float32),
                                pltpu.VMEM((n_kv, g, d_h), jnp.float32)]),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
            cost_estimate=cost, interpret=interpret)
        out = call(*scalars, qg, k, v, k_all, v_all)
        return out.reshape(batch, n_kv, group, rows, d_h).transpose(0, 3, 1, 2, 4).reshape(
            batch, rows, n_q, d_h)
    if backend == "gpu":
        real, rows = rows, gpu_rows(rows)
        # zero rows after the window: no real row sees them, their outputs go
        q, k, v = (_pad_rows(x, rows) for x in (q, k, v))
        # q and the output as [B, W, n_kv, group, d_h] (a reshape of [B, W, n_q, d_h], no copy).
        head_q = pl.BlockSpec((None, rows, None, group, d_h), lambda b, h, *_: (b, 0, h, 0, 0))
        head_window = pl.BlockSpec((None, rows, None, d_h), lambda b, h, *_: (b, 0, h, 0))
        out, _, _ = _gpu_attention(
            scalars, (q.reshape(batch, rows, n_kv, group, d_h), k, v),
            [head_q, head_window, head_window], k_all, v_all, rows=rows, group=group,
            read=read, out_bytes=out_bytes, flops=flops, scores=scores, splits=splits,
            interpret=interpret)
        return out.reshape(batch, rows, n_q, d_h)[:, :real]
    raise ValueError(f"backend must be 'tpu' or 'gpu', not {backend!r}")


def window_attention_qkv(qkv, n_q: int, q_weight, k_weight, cos, sin, eps: float, k_all, v_all,
                         layer, depth, start, *, interpret: bool = False,
                         splits: int | None = None, counts=None):
    """:func:`window_attention` on an NVIDIA GPU for queries and window keys as the projections
    leave them: the kernel applies the heads' norms and RoPE first, as
    :func:`alodlm_jax.head_norm_kernel.norm_rope` would in a kernel of its own
    (:func:`norm_rope_halves`).

    ``qkv`` ``[B, W, n_q + 2 n_kv, d_h]`` (16-bit, as the cache; the heads of q, k and v in that
    order), the norms' weights ``[d_h]``, cos/sin ``[B, W, d_h]``
    (:func:`alodlm_jax.model.rope_tables`); the rest as :func:`window_attention`. Returns the
    output ``[B, W, n_q, d_h]`` and the window's keys ``[B, W, n_kv, d_h]`` as normalized and
    rotated (for the cache); the window's values are ``qkv``'s last ``n_kv`` heads as they
    are. Where :func:`supported` says so for the GPU and :func:`norm_rope_supported` for the
    heads; ``interpret`` runs it in Pallas's interpreter. ``counts`` given (``int32 [L, B,
    n_kv]``, zero at ``layer``): a split prefix's parts are combined by the kernel's last part
    to finish, counting there (:func:`_gpu_attention`), and the counts come back third."""
    batch, real, heads, d_h = qkv.shape
    n_kv = (heads - n_q) // 2
    group = n_q // n_kv
    k_all, v_all, scalars, read, out_bytes, scores, flops = _operands(
        (batch, real, n_q, d_h), n_kv, qkv.dtype, k_all, v_all, layer, depth, start)
    read += (cos.size + sin.size) * cos.dtype.itemsize
    rows = gpu_rows(real)
    # zero rows after the window: they stay zeros, and no real row sees them
    qkv, cos, sin = (_pad_rows(x, rows) for x in (qkv, cos, sin))
    head = lambda first: pl.BlockSpec((None, rows, None, d_h),  # noqa: E731
                                      lambda b, h, *_: (b, 0, first + h, 0))
    table = pl.BlockSpec((None, rows, d_h), lambda b, h, *_: (b, 0, 0))
    weight = pl.no_block_spec
    out, keys, counted = _gpu_attention(
        scalars,
        (qkv, qkv, qkv, cos, sin, q_weight.astype(qkv.dtype), k_weight.astype(qkv.dtype)),
        # the KV head's group of query heads: block h of `group` heads
        [pl.BlockSpec((None, rows, group, d_h), lambda b, h, *_: (b, 0, h, 0)),
         head(n_q), head(n_q + n_kv), table, table, weight, weight],
        k_all, v_all, rows=rows, group=group, read=read, out_bytes=out_bytes, flops=flops,
        scores=scores, splits=splits, interpret=interpret, eps=float(eps), counts=counts)
    out, keys = out.reshape(batch, rows, n_q, d_h)[:, :real], keys[:, :real]
    return (out, keys) if counts is None else (out, keys, counted)
