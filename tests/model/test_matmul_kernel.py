"""A window layer's products with their norms and residual adds as Triton kernels
(:mod:`alodlm_jax.matmul_kernel`) against the XLA form they replace, in Pallas's interpreter, alone
and as the model wires them; and, with the aot extra, compiled for a GPU without one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax import head_norm_kernel as HK
from alodlm_jax import matmul_kernel as MK
from alodlm_jax import model as M

from . import gpu_compile

EPS = 1e-6


def _draw(rng, dtype, *shape, scale=1.0):
    return jnp.asarray(scale * rng.standard_normal(shape), dtype)


def _norm_weight(rng, dtype, n):
    return jnp.asarray(1 + 0.1 * rng.standard_normal(n), dtype)


def _xla_swiglu(b, gate, up):
    g = M._mm("th,hi->ti", b, gate)
    return jax.nn.silu(g.astype(jnp.float32)).astype(g.dtype) * M._mm("th,hi->ti", b, up)


def _cases(dtype, rows, inner, widths, seed=0):
    """Each kernel's output and its XLA form's, on the same operands."""
    rng = np.random.default_rng(seed)
    x = _draw(rng, dtype, rows, inner, scale=3.0)
    nw = _norm_weight(rng, dtype, inner)
    weights = [_draw(rng, dtype, inner, n, scale=inner ** -0.5) for n in widths]
    b = M.rms_norm(x, nw, EPS)
    residual = _draw(rng, dtype, rows, widths[0])
    yield (MK.norm_matmul(x, nw, weights, EPS, interpret=True),
           jnp.concatenate([M._mm("th,hi->ti", b, w) for w in weights], axis=1))
    gate, up = weights[0], _draw(rng, dtype, inner, widths[0], scale=inner ** -0.5)
    yield (MK.norm_matmul(x, nw, (gate, up), EPS, gated=True, interpret=True),
           _xla_swiglu(b, gate, up))
    yield (MK.matmul_residual(x, weights[0], residual, interpret=True),
           residual + M._mm("ti,ih->th", x, weights[0]))


# Rows: Triton's smallest dot and the most the kernels take; reductions of one tile and of
# several (BLOCK_K); column tiles of 16 and 32, and side-by-side weights of other widths.
SHAPES = [(16, 64, (32, 16, 16)), (32, 512, (64, 32, 32)), (64, 1024, (128, 64, 64)),
          (32, 256, (8192, 32, 32))]


@pytest.mark.parametrize("rows,inner,widths", SHAPES)
def test_kernels_are_the_xla_form_to_fp32_rounding(rows, inner, widths):
    """In fp32 (no 16-bit rounding between the operations) only the order of the sums differs."""
    for got, want in _cases(jnp.float32, rows, inner, widths):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows,inner,widths", SHAPES[:3])
def test_kernels_round_where_the_xla_form_rounds_in_bf16(rows, inner, widths):
    """In bf16 the outputs are the XLA form's but where a sum added in another order lands on the
    other side of a rounding: a bf16 step (2**-8 of the value) or two."""
    for got, want in _cases(jnp.bfloat16, rows, inner, widths, seed=1):
        assert got.dtype == jnp.bfloat16
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        np.testing.assert_allclose(got, want, rtol=2.0 ** -6, atol=2.0 ** -8)
        assert np.mean(got == want) > 0.9


def test_supported_shapes():
    assert MK.supported(32, 2048, (2048, 1024, 1024), jnp.bfloat16)
    assert MK.supported(MK.MAX_ROWS, 4096, (12288,), jnp.float16)
    assert not MK.supported(32, 2048, (2048,), jnp.float32)  # fp32 keeps XLA's form
    assert not MK.supported(2 * MK.MAX_ROWS, 2048, (2048,), jnp.bfloat16)  # a batch's rows
    assert not MK.supported(8, 2048, (2048,), jnp.bfloat16)  # fewer than Triton's dot takes
    assert not MK.supported(20, 2048, (2048,), jnp.bfloat16)  # no power of two
    assert not MK.supported(32, 2056, (2048,), jnp.bfloat16)  # a reduction in tiles of 8
    assert not MK.supported(32, 2048, (2048, 40), jnp.bfloat16)  # 40 columns: no tile of 16


def _layer(rng, dtype, hidden, n_q, n_kv, d_h, inner):
    draw = lambda *shape: _draw(rng, dtype, *shape, scale=shape[0] ** -0.5)  # noqa: E731
    return {"input_norm": _norm_weight(rng, dtype, hidden), "q": draw(hidden, n_q, d_h),
            "k": draw(hidden, n_kv, d_h), "v": draw(hidden, n_kv, d_h),
            "q_norm": _norm_weight(rng, dtype, d_h), "k_norm": _norm_weight(rng, dtype, d_h),
            "o": draw(n_q, d_h, hidden), "post_norm": _norm_weight(rng, dtype, hidden),
            "gate_proj": draw(hidden, inner), "up_proj": draw(hidden, inner),
            "down_proj": draw(inner, hidden)}


def test_the_model_wires_the_kernels_as_its_xla_form(monkeypatch):
    """A window layer's q/k/v and its output and MLP as the model runs them on an NVIDIA GPU
    (``platform_dependent``'s cuda branch, the kernels in the interpreter) against the model's
    XLA form, in bf16: the same values to a bf16 step or two."""
    rng = np.random.default_rng(2)
    rows, hidden, n_q, n_kv, d_h, inner = 32, 256, 4, 2, 64, 512
    lp = _layer(rng, jnp.bfloat16, hidden, n_q, n_kv, d_h, inner)
    h = _draw(rng, jnp.bfloat16, rows, hidden, scale=2.0)
    attn = _draw(rng, jnp.bfloat16, rows, n_q, d_h)
    cos, sin = M.rope_tables(jnp.arange(rows) + 100, d_h, 1e6, jnp.bfloat16)
    want = (*M._qkv(lp, EPS, h, cos, sin), M._attention_out_and_mlp(lp, EPS, h, attn))
    calls = []

    def interpreted(fn):
        def run(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs, interpret=True)
        return run

    monkeypatch.setattr(jax.lax, "platform_dependent", lambda *args, cuda, default: cuda(*args))
    for module, name in ((MK, "norm_matmul"), (MK, "matmul_residual"), (HK, "norm_rope")):
        monkeypatch.setattr(module, name, interpreted(getattr(module, name)))
    got = (*M._qkv(lp, EPS, h, cos, sin, kernel=True),
           M._attention_out_and_mlp(lp, EPS, h, attn, kernel=True))
    assert sorted(calls) == ["matmul_residual", "matmul_residual", "norm_matmul", "norm_matmul",
                             "norm_rope"]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        np.testing.assert_allclose(g, w, rtol=2.0 ** -5, atol=2.0 ** -6)


GPU_COMPILE = """
    rows, hidden, n_q, n_kv, d_h, inner = 64, 512, 4, 2, 128, 1024  # MAX_ROWS: most shared memory
    lp = {"input_norm": spec(hidden), "q": spec(hidden, n_q, d_h), "k": spec(hidden, n_kv, d_h),
          "v": spec(hidden, n_kv, d_h), "q_norm": spec(d_h), "k_norm": spec(d_h),
          "o": spec(n_q, d_h, hidden), "post_norm": spec(hidden), "gate_proj": spec(hidden, inner),
          "up_proj": spec(hidden, inner), "down_proj": spec(inner, hidden)}

    def layer(kernel):
        return lambda lp, h, attn, cos, sin: (
            M._qkv(lp, 1e-6, h, cos, sin, kernel),
            M._attention_out_and_mlp(lp, 1e-6, h, attn, kernel))

    json.dump({str(kernel): report(layer(kernel), lp, spec(rows, hidden), spec(rows, n_q, d_h),
                                   spec(rows, d_h), spec(rows, d_h))
               for kernel in (True, False)}, sys.stdout)
"""


@pytest.mark.jax_backend
@pytest.mark.skipif(not gpu_compile.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_kernels_compile_for_a_gpu_without_one():
    """XLA:GPU compiles the kernels (JAX's CUDA plugin and ptxas, no GPU; it refuses a kernel that
    asks for more shared memory than an H200 has) where a window layer of 64 bf16 rows (the most
    the kernels take) asks for them, and the plan reads what each moves from its metadata: its
    operands and output once each. A layer's q/k/v, output product and MLP are 5 kernels (the
    products, and the heads' norms) where XLA's form is more than twice as many.
    In a child process with the plugin on its path, as tests/plan runs the GPU plan."""
    found = gpu_compile.compile_in_child(GPU_COMPILE)
    rows, hidden, d_h, inner, item = 64, 512, 128, 1024, 2
    qkv = (4 + 2 * 2) * d_h
    heads = 2 * rows * qkv * item + 2 * rows * d_h * item + 2 * d_h * item  # head_norm_kernel's
    moved = sorted([
        (rows * hidden + hidden + hidden * qkv + rows * qkv) * item,  # norm + q/k/v products
        (rows * 4 * d_h + 4 * d_h * hidden + 2 * rows * hidden) * item,  # output product + h
        (rows * hidden + hidden + 2 * hidden * inner + rows * inner) * item,  # norm + SwiGLU
        (rows * inner + inner * hidden + 2 * rows * hidden) * item,  # down product + h
        heads])
    assert found["True"]["triton"] == 5 == found["True"]["kernels"]
    assert found["True"]["bytes"] == moved
    # Column tiles of 16 (fewer than 128 tiles of 32 in every product): q/k/v 1,024 columns,
    # the output and down products 512, SwiGLU 1,024; and the heads' norms: 8 tiles x 2 KV heads.
    assert found["True"]["programs"] == sorted([64, 32, 64, 32, 16])
    assert found["False"]["triton"] == 0
    assert found["False"]["kernels"] >= 2 * found["True"]["kernels"]
