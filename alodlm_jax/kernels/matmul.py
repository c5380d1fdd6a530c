"""A window layer's products with the norm before them and the residual add after them, one
Triton kernel each (NVIDIA GPUs, 16-bit models, one request's window).

A pass of one request multiplies a few rows (32 for a window of 16) through each layer's weights.
XLA:GPU splits each of those products' reductions (split-K: more programs to read the weights
with) and adds the partial sums in the next kernel, and a norm is a reduction fusion of its own,
so a layer's products come with a kernel or two each around them: the input norm, the sum of the
q/k/v partials, the residual add after the output product, the post-attention norm, SwiGLU, and
the residual add after the down product. Here each product is one kernel that does its
neighbours' work too:

* :func:`norm_matmul`: ``rms_norm(x, norm_weight) @ W`` for one or more weights side by side (the
  layer's q, k and v projections in one output), or, ``gated``, SwiGLU's
  ``silu(b @ W_gate) * (b @ W_up)`` of the normed ``b``;
* :func:`matmul_residual`: ``residual + a @ W`` (the output and down projections).

Each program computes a column tile of the output over the whole reduction (no split: a weight
tile's bytes are read once, by one program), all rows at once. A norm needs a row's whole sum of
squares before the product may start, so each program sums it itself (the rows are few: 32 rows
of 2,048 values are 128 KB, read from L2). Grids of 128-384 programs for the released models.

Numerics: the XLA form's operations in its order, with its roundings: the norm in fp32, its
normalized value rounded to the 16-bit dtype, the weight's product rounded; each product
accumulated in fp32 and rounded once (:func:`alodlm_jax.network.layers.mm`'s GPU form); silu in fp32 and
rounded; SwiGLU's product and the residual's sum rounded. Sums are added in another order than
XLA's (the norm's squares, the products' split-K parts), so 16-bit outputs agree to rounding, not
bit for bit. The model uses them only for 16-bit activations (fp32 parity runs keep XLA's form).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from alodlm_jax.kernels.common import power_of_two

__all__ = ["norm_matmul", "matmul_residual", "supported", "MIN_ROWS", "MAX_ROWS"]

# Rows a program multiplies at once: Triton's dot takes at least 16; above 64 the rows re-read by
# every program (and the accumulators) outgrow what a split-free column tile is good for, and
# XLA's tiled GEMMs are the better form (a batch of 8 requests is 256 rows).
MIN_ROWS, MAX_ROWS = 16, 64
# The reduction's tile (_block_k): each stage of the software pipeline (NUM_STAGES of them in
# shared memory) loads the rows' tile and the weights' tiles, at most STAGE_BYTES in all (the
# H200 has 227 KB of shared memory a block) and at most MAX_BLOCK_K values of the reduction: one
# request's 32 rows and a 16-column weight tile read 512 values a stage, two 32-column tiles
# (SwiGLU) 256. ASSUMED, not measured: scripts/gpu_check.sh times the kernels against XLA's form
# on the device.
MAX_BLOCK_K, STAGE_BYTES, NUM_STAGES = 1024, 64 * 1024, 3
# Column tiles: 32 columns, or 16 where that leaves fewer than TARGET_PROGRAMS programs (the
# H200's 132 SMs each reading with one program at least).
TARGET_PROGRAMS = 128


def _block_k(inner: int, rows: int, width: int, item: int) -> int:
    """The largest power of two dividing ``inner`` whose stage (``rows`` + ``width`` columns of
    weights, ``item`` bytes each) fits :data:`STAGE_BYTES`, at most :data:`MAX_BLOCK_K`."""
    fits = STAGE_BYTES // ((rows + width) * item)
    return min(MAX_BLOCK_K, inner & -inner, 1 << (fits.bit_length() - 1))


def _tile(columns) -> int:
    return 32 if sum(columns) // 32 >= TARGET_PROGRAMS else 16


def supported(rows: int, inner: int, columns, dtype) -> bool:
    """Where the kernels run: 16-bit, ``MIN_ROWS..MAX_ROWS`` rows (a power of two), a reduction
    of ``inner`` values in tiles of at least 16, and each output's ``columns`` a multiple of the
    column tile."""
    tile = _tile(columns)
    return (jnp.dtype(dtype).itemsize == 2 and MIN_ROWS <= rows <= MAX_ROWS
            and power_of_two(rows) and _block_k(inner, rows, 2 * tile, 2) >= 16
            and all(n % tile == 0 for n in columns))


def _accumulate(lhs, w_refs, cols, steps: int, bk: int, shape):
    """For each weight, ``sum_i lhs(i) @ w_ref[i-th tile of rows, cols]`` in fp32 (one loop: the
    tiles of ``lhs`` are made once for all)."""
    def step(i, accs):
        a, rows = lhs(i), pl.ds(i * bk, bk)
        return tuple(acc + jnp.dot(a, w_ref[rows, cols], preferred_element_type=jnp.float32)
                     for acc, w_ref in zip(accs, w_refs, strict=True))
    zero = jnp.zeros(shape, jnp.float32)
    return jax.lax.fori_loop(0, steps, step, tuple(zero for _ in w_refs))


def _norm_matmul_kernel(x_ref, nw_ref, *refs, eps, bk, bn, blocks, gated):
    *w_refs, o_ref = refs
    f32, dtype = jnp.float32, o_ref.dtype
    rows, inner = x_ref.shape
    steps = inner // bk

    def squares(i, total):
        x = x_ref[:, pl.ds(i * bk, bk)].astype(f32)
        return total + jnp.sum(x * x, axis=1)

    total = jax.lax.fori_loop(0, steps, squares, jnp.zeros((rows,), f32))
    scale = jax.lax.rsqrt(total / inner + eps)[:, None]

    def normed(i):  # rms_norm's tile i: weight * round(x * scale), rounded
        part = pl.ds(i * bk, bk)
        y = (x_ref[:, part].astype(f32) * scale).astype(dtype).astype(f32)
        return (nw_ref[part].astype(f32)[None, :] * y).astype(dtype)

    p = pl.program_id(0)
    if gated:
        cols = pl.ds(p * bn, bn)
        g, u = (acc.astype(dtype) for acc in _accumulate(normed, w_refs, cols, steps, bk,
                                                           (rows, bn)))
        g = jax.nn.silu(g.astype(f32)).astype(dtype)
        o_ref[...] = (g.astype(f32) * u.astype(f32)).astype(dtype)
        return
    first = 0
    for w_ref, count in zip(w_refs, blocks):  # program p computes a tile of one weight's product
        @pl.when((p >= first) & (p < first + count))
        def _(w_ref=w_ref, first=first):
            cols = pl.ds((p - first) * bn, bn)
            acc, = _accumulate(normed, (w_ref,), cols, steps, bk, (rows, bn))
            o_ref[...] = acc.astype(dtype)
        first += count


def _call(kernel, out_shape, grid_size, in_specs, out_spec, moved, flops, interpret, *args):
    return pl.pallas_call(
        kernel, out_shape=out_shape, grid=(grid_size,), in_specs=in_specs, out_specs=out_spec,
        compiler_params=pltr.CompilerParams(num_warps=4, num_stages=NUM_STAGES),
        # XLA:GPU keeps no cost estimate: the figures travel in the kernel's metadata.
        metadata={"bytes_accessed": str(moved), "flops": str(flops),
                  "programs": str(grid_size)},
        interpret=interpret)(*args)


def norm_matmul(x, norm_weight, weights, eps: float, *, gated: bool = False,
                interpret: bool = False):
    """``rms_norm(x, norm_weight, eps) @ W`` for each ``W`` of ``weights`` (``[K, N_i]``), side by
    side in one output ``[T, sum N_i]``; ``gated`` (two weights, gate and up): SwiGLU,
    ``silu(b @ W_gate) * (b @ W_up)`` of the normed ``b``, ``[T, N]``. ``x [T, K]`` (16-bit
    where the model uses it), the norm's weight ``[K]``. Where :func:`supported` says so;
    ``interpret`` runs it in Pallas's interpreter."""
    rows, inner = x.shape
    columns = [w.shape[1] for w in weights]
    item = jnp.dtype(x.dtype).itemsize
    weights = [w.astype(x.dtype) for w in weights]
    bn = _tile(columns[:1] if gated else columns)
    bk = _block_k(inner, rows, bn * (2 if gated else 1), item)
    width = columns[0] if gated else sum(columns)
    programs = width // bn
    moved = (x.size + inner + sum(w.size for w in weights) + rows * width) * item
    flops = 2 * rows * inner * sum(columns)
    whole = pl.no_block_spec
    kernel = functools.partial(_norm_matmul_kernel, eps=float(eps), bk=bk, bn=bn, gated=gated,
                               blocks=tuple(n // bn for n in columns))
    return _call(kernel, jax.ShapeDtypeStruct((rows, width), x.dtype), programs,
                 [whole] * (2 + len(weights)), pl.BlockSpec((rows, bn), lambda p: (0, p)),
                 moved, flops, interpret, x, norm_weight.astype(x.dtype), *weights)


def _matmul_residual_kernel(a_ref, w_ref, r_ref, o_ref, *, bk, bn):
    f32, dtype = jnp.float32, o_ref.dtype
    rows, inner = a_ref.shape
    cols = pl.ds(pl.program_id(0) * bn, bn)
    acc, = _accumulate(lambda i: a_ref[:, pl.ds(i * bk, bk)], (w_ref,), cols, inner // bk, bk,
                       (rows, bn))
    o_ref[...] = (r_ref[...].astype(f32) + acc.astype(dtype).astype(f32)).astype(dtype)


def matmul_residual(a, weight, residual, *, interpret: bool = False):
    """``residual + a @ weight``: ``a [T, K]``, ``weight [K, N]``, ``residual [T, N]``, the product
    rounded to ``a``'s dtype before the sum. Where :func:`supported` says so; ``interpret`` runs
    it in Pallas's interpreter."""
    rows, inner = a.shape
    width = weight.shape[1]
    item = jnp.dtype(a.dtype).itemsize
    bn = _tile([width])
    bk = _block_k(inner, rows, bn, item)
    moved = (a.size + weight.size + 2 * residual.size) * item
    tile = pl.BlockSpec((rows, bn), lambda p: (0, p))
    return _call(functools.partial(_matmul_residual_kernel, bk=bk, bn=bn),
                 jax.ShapeDtypeStruct((rows, width), a.dtype), width // bn,
                 [pl.no_block_spec, pl.no_block_spec, tile], tile, moved,
                 2 * rows * inner * width, interpret, a, weight.astype(a.dtype),
                 residual.astype(a.dtype))
