"""The heads' norms and RoPE as one Triton kernel (:mod:`alodlm_jax.kernels.head_norm`) against the
XLA form it replaces, in Pallas's interpreter; and, with the aot extra, compiled for a GPU without
one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.kernels import head_norm as HK
from alodlm_jax.network import layers as L

from . import gpu_compile

EPS = 1e-6


def _operands(dtype, rows, n_q, n_kv, d_h, seed=0):
    rng = np.random.default_rng(seed)
    draw = lambda *shape, scale=1.0: jnp.asarray(scale * rng.standard_normal(shape), dtype)  # noqa: E731
    q, k, v = draw(rows, n_q, d_h, scale=3.0), draw(rows, n_kv, d_h), draw(rows, n_kv, d_h)
    q_w, k_w = (jnp.asarray(1 + 0.1 * rng.standard_normal(d_h), dtype) for _ in range(2))
    cos, sin = L.rope_tables(jnp.arange(rows) + 1000, d_h, 1e6, dtype)
    return q, k, v, q_w, k_w, cos, sin


def _xla(q, k, v, q_w, k_w, cos, sin):
    return (L.apply_rope(L.rms_norm(q, q_w, EPS), cos, sin),
            L.apply_rope(L.rms_norm(k, k_w, EPS), cos, sin), v)


def _kernel(q, k, v, q_w, k_w, cos, sin):
    qkv = jnp.concatenate([q, k, v], axis=1)
    return HK.norm_rope(qkv, q.shape[1], k.shape[1], q_w, k_w, cos, sin, EPS, interpret=True)


# Rows: one tile, several tiles, and a count whose largest power-of-two factor is 8 (tiles of 8).
# Groups of 1, 2 and 4 query heads per KV head; head sizes of the released models and tiny ones.
SHAPES = [(32, 16, 8, 128), (96, 8, 2, 32), (24, 4, 4, 16), (64, 32, 8, 128)]


@pytest.mark.parametrize("rows,n_q,n_kv,d_h", SHAPES)
def test_kernel_is_the_xla_form_to_fp32_rounding(rows, n_q, n_kv, d_h):
    """Every operation in the XLA form's order: in fp32 (no 16-bit rounding between them) only the
    order of the norm's sum of squares differs."""
    operands = _operands(jnp.float32, rows, n_q, n_kv, d_h)
    for want, got in zip(_xla(*operands), _kernel(*operands), strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rows,n_q,n_kv,d_h", SHAPES)
def test_kernel_rounds_where_the_xla_form_rounds_in_bf16(rows, n_q, n_kv, d_h):
    """In bf16 each product and sum is rounded as XLA rounds it: outputs differ only where the
    norm's scale, summed in another order, lands a value on the other side of a rounding: a bf16
    step or two of RoPE's products (a few in size, so 2**-6 each; their sum may cancel to a
    much smaller value); the values pass through untouched."""
    operands = _operands(jnp.bfloat16, rows, n_q, n_kv, d_h, seed=1)
    (q0, k0, v0), (q1, k1, v1) = _xla(*operands), _kernel(*operands)
    assert q1.dtype == k1.dtype == v1.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(v1, np.float32), np.asarray(v0, np.float32))
    for want, got in ((q0, q1), (k0, k1)):
        want, got = np.asarray(want, np.float32), np.asarray(got, np.float32)
        np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=2.0 ** -5)


def test_supported_shapes():
    assert HK.supported((32, 16, 128), (32, 8, 128), jnp.bfloat16)
    assert HK.supported((32, 32, 128), (32, 8, 128), jnp.float16)
    assert not HK.supported((32, 16, 128), (32, 8, 128), jnp.float32)  # fp32 keeps XLA's form
    assert not HK.supported((32, 12, 128), (32, 4, 128), jnp.bfloat16)  # a group of 3
    assert not HK.supported((32, 16, 96), (32, 8, 96), jnp.bfloat16)  # halves of 48
    assert HK.supported((HK.MAX_ROWS, 16, 128), (HK.MAX_ROWS, 8, 128), jnp.bfloat16)
    assert not HK.supported((2 * HK.MAX_ROWS, 16, 128), (2 * HK.MAX_ROWS, 8, 128), jnp.bfloat16)


GPU_COMPILE = """
    rows, hidden, n_q, n_kv, d_h = 128, 256, 4, 2, 128  # more rows than matmul_kernel takes
    lp = {"input_norm": spec(hidden), "q": spec(hidden, n_q, d_h), "k": spec(hidden, n_kv, d_h),
          "v": spec(hidden, n_kv, d_h), "q_norm": spec(d_h), "k_norm": spec(d_h)}
    json.dump({str(kernel): report(lambda lp, h, cos, sin: L.qkv(lp, 1e-6, h, cos, sin, kernel),
                                   lp, spec(rows, hidden), spec(rows, d_h), spec(rows, d_h))
               for kernel in (True, False)}, sys.stdout)
"""


@pytest.mark.jax_backend
@pytest.mark.skipif(not gpu_compile.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_kernel_compiles_for_a_gpu_without_one():
    """XLA:GPU compiles the Triton kernel (JAX's CUDA plugin and ptxas, no GPU) where a layer asks
    for it, and the plan reads what it moves from its metadata: the projections' output read and
    the three outputs written, the RoPE tables and the norms' weights; a program for each tile of
    rows and KV head. The heads' norms and rotations are one kernel where XLA's form is four.
    In a child process with the plugin on its path, as tests/plan runs the GPU plan."""
    found = gpu_compile.compile_in_child(GPU_COMPILE)
    rows, heads, d_h = 128, 4 + 2 * 2, 128
    moved = 2 * rows * heads * d_h * 2 + 2 * rows * d_h * 2 + 2 * d_h * 2
    assert found["True"]["triton"] == 1
    assert found["True"]["bytes"] == [moved]
    assert found["True"]["programs"] == [rows // HK.TILE_ROWS * 2]
    assert found["False"]["triton"] == 0
    # XLA:GPU of JAX 0.12.1 fuses XLA's form further: 5 kernels against the kernel's 4 (3 more
    # on JAX 0.10.2 and 0.11.2)
    fewer = 3 if jax.__version_info__ < (0, 12) else 1
    assert found["False"]["kernels"] - found["True"]["kernels"] == fewer
