"""Fast casts are bit-identical to ml_dtypes/numpy; the strip transpose equals ``.T``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from alodlm_convert.transforms import BF16, cast, transpose_into, transposed

SPECIAL_F32_BITS = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7F7FFFFF,
                    0x3F808000, 0x3F818000, 0x3F80FFFF, 0x00000001, 0x807FFFFF, 0x7F7F8000, 0x00008000]


def test_f32_to_bf16_matches_ml_dtypes_on_random_and_special_bits():
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2**32, size=500_000, dtype=np.uint32),
                           np.array(SPECIAL_F32_BITS, np.uint32)])
    f = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        want = f.astype(ml_dtypes.bfloat16)
    assert np.array_equal(cast(f, BF16).view(np.uint16), want.view(np.uint16))


def test_widening_casts_are_exact():
    rng = np.random.default_rng(1)
    b = rng.integers(0, 2**16, size=100_000, dtype=np.uint16).view(BF16)
    assert np.array_equal(cast(b, np.float32).view(np.uint32), b.astype(np.float32).view(np.uint32))
    h = rng.integers(0, 2**16, size=100_000, dtype=np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        want = h.astype(np.float32).astype(ml_dtypes.bfloat16)
    assert np.array_equal(cast(h, BF16).view(np.uint16), want.view(np.uint16))
    same = np.ones(3, np.float32)
    assert cast(same, np.float32) is same


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (17, 1025), (40, 2100), (2049, 3)])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.int64])
def test_transpose_matches_numpy(shape, dtype):
    rng = np.random.default_rng(2)
    src = rng.standard_normal(shape).astype(dtype)
    assert np.array_equal(transposed(src), src.T)
    with pytest.raises(ValueError):
        transpose_into(np.empty(shape, dtype), src) if shape[0] != shape[1] else transpose_into(
            np.empty(shape, np.int8), src)
