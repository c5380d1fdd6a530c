"""Fast, exact array transforms for conversion: tiled 2-D transpose and bf16/fp16/fp32 casts.

Why not plain numpy: ``np.ascontiguousarray(a.T)`` on 2-byte elements walks memory with a large
stride (~100 MB/s on the project's 2-core machine), and ml_dtypes' bfloat16 casts go through a
generic per-element loop (~85 MB/s). A transpose done in cache-sized strips runs at over 1 GB/s,
and bfloat16 is the top half of a float32, so both casts are a few integer operations:

* bf16 -> fp32: shift the 16 bits into the high half (exact);
* fp32 -> bf16: round to nearest, ties to even, on the bit pattern; NaNs become the canonical
  quiet NaN with their sign — bit-identical to ``ml_dtypes``' ``astype``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
# Strips of 16 source rows x 1024 columns: each strip's reads stay in L1 while the writes fill
# whole cache lines of 16 destination rows; about 2x faster than square 256x256 tiles.
_TILE_ROWS, _TILE_COLS = 16, 1024
# Element-size-matched unsigned views make the tiled copy a plain memcpy-like loop.
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bf16_to_f32(a: np.ndarray) -> np.ndarray:
    return (a.view(np.uint16).astype(np.uint32) << 16).view(F32)


def _f32_to_bf16(a: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(a).view(np.uint32)
    rounded = u + (((u >> 16) & 1) + 0x7FFF).astype(np.uint32)
    out = (rounded >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if nan.any():
        out[nan] = (((u[nan] >> 16) & 0x8000) | 0x7FC0).astype(np.uint16)
    return out.view(BF16)


def cast(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` as ``dtype`` (returned unchanged when it already is); exact where the spec needs it."""
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return a
    if a.dtype == BF16 and dtype == F32:
        return _bf16_to_f32(a)
    if dtype == BF16 and a.dtype in (F32, F16):
        return _f32_to_bf16(a.astype(F32) if a.dtype == F16 else a)
    if a.dtype == BF16:
        return _bf16_to_f32(a).astype(dtype)
    return a.astype(dtype)


def transpose_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src.T`` for 2-D arrays of one dtype, copied tile by tile (cache friendly);
    either may be a strided view (a block of columns of a larger destination, say)."""
    rows, cols = src.shape
    if dst.shape != (cols, rows) or dst.dtype != src.dtype:
        raise ValueError(f"transpose_into: {src.dtype}{src.shape} -> {dst.dtype}{dst.shape}")
    view = _UINT.get(src.dtype.itemsize)
    if view is not None:  # a view with an equal element size is allowed for any strides
        src, dst = src.view(view), dst.view(view)
    for r in range(0, rows, _TILE_ROWS):
        for c in range(0, cols, _TILE_COLS):
            dst[c:c + _TILE_COLS, r:r + _TILE_ROWS] = src[r:r + _TILE_ROWS, c:c + _TILE_COLS].T


def transposed(src: np.ndarray) -> np.ndarray:
    """A new C-contiguous array equal to ``src.T`` (2-D)."""
    out = np.empty((src.shape[1], src.shape[0]), src.dtype)
    transpose_into(out, src)
    return out
