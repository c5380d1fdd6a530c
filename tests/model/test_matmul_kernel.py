"""A window layer's products with their norms and residual adds as Triton kernels
(:mod:`alodlm_jax.kernels.matmul`) against the XLA form they replace, in Pallas's interpreter, alone
and as the model wires them; and, with the aot extra, compiled for a GPU without one."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.kernels import head_norm as HK
from alodlm_jax.kernels import matmul as MK
from alodlm_jax.network import layers as L
from alodlm_jax.network import window_layers as WL
from alodlm_jax.kernels import window as WK

from . import gpu_compile

EPS = 1e-6


def _draw(rng, dtype, *shape, scale=1.0):
    return jnp.asarray(scale * rng.standard_normal(shape), dtype)


def _norm_weight(rng, dtype, n):
    return jnp.asarray(1 + 0.1 * rng.standard_normal(n), dtype)


def _xla_swiglu(b, gate, up):
    g = L.mm("th,hi->ti", b, gate)
    return jax.nn.silu(g.astype(jnp.float32)).astype(g.dtype) * L.mm("th,hi->ti", b, up)


def _cases(dtype, rows, inner, widths, seed=0):
    """Each kernel's output and its XLA form's, on the same operands."""
    rng = np.random.default_rng(seed)
    x = _draw(rng, dtype, rows, inner, scale=3.0)
    nw = _norm_weight(rng, dtype, inner)
    weights = [_draw(rng, dtype, inner, n, scale=inner ** -0.5) for n in widths]
    b = L.rms_norm(x, nw, EPS)
    residual = _draw(rng, dtype, rows, widths[0])
    yield (MK.norm_matmul(x, nw, weights, EPS, interpret=True),
           jnp.concatenate([L.mm("th,hi->ti", b, w) for w in weights], axis=1))
    gate, up = weights[0], _draw(rng, dtype, inner, widths[0], scale=inner ** -0.5)
    yield (MK.norm_matmul(x, nw, (gate, up), EPS, gated=True, interpret=True),
           _xla_swiglu(b, gate, up))
    yield (MK.matmul_residual(x, weights[0], residual, interpret=True),
           residual + L.mm("ti,ih->th", x, weights[0]))


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


def _on_cuda_interpreted(monkeypatch) -> list:
    """Runs the model as it would run on an NVIDIA GPU (``platform_dependent``'s cuda branch)
    with the GPU kernels in Pallas's interpreter; returns the list their calls' names go to."""
    calls = []

    def interpreted(fn):
        def run(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **dict(kwargs, interpret=True))
        return run

    monkeypatch.setattr(jax.lax, "platform_dependent", lambda *args, cuda, **_: cuda(*args))
    for module, name in ((MK, "norm_matmul"), (MK, "matmul_residual"), (HK, "norm_rope"),
                         (WK, "window_attention_qkv"), (WK, "window_attention")):
        monkeypatch.setattr(module, name, interpreted(getattr(module, name)))
    return calls


def _assert_close(got, want, tolerance: float):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=tolerance, atol=tolerance)


PRODUCTS = ["matmul_residual", "matmul_residual", "norm_matmul", "norm_matmul"]


def test_the_model_wires_the_kernels_as_its_xla_form(monkeypatch):
    """A window layer's q/k/v and its output and MLP as the model runs them on an NVIDIA GPU
    (``platform_dependent``'s cuda branch, the kernels in the interpreter) against the model's
    XLA form, in bf16: the same values to a bf16 step or two."""
    rng = np.random.default_rng(2)
    rows, hidden, n_q, n_kv, d_h, inner = 32, 256, 4, 2, 64, 512
    lp = _layer(rng, jnp.bfloat16, hidden, n_q, n_kv, d_h, inner)
    h = _draw(rng, jnp.bfloat16, rows, hidden, scale=2.0)
    attn = _draw(rng, jnp.bfloat16, rows, n_q, d_h)
    cos, sin = L.rope_tables(jnp.arange(rows) + 100, d_h, 1e6, jnp.bfloat16)
    want = (*L.qkv(lp, EPS, h, cos, sin), L.attention_out_and_mlp(lp, EPS, h, attn))
    calls = _on_cuda_interpreted(monkeypatch)
    got = (*L.qkv(lp, EPS, h, cos, sin, kernel=True),
           L.attention_out_and_mlp(lp, EPS, h, attn, kernel=True))
    assert sorted(calls) == sorted(PRODUCTS + ["norm_rope"])
    _assert_close(got, want, 2.0 ** -5)


def _one_request_layer(*, seed: int, slots: int, position: int):
    """A bf16 window layer's weights, one request's 32 window rows ``h`` from ``position`` on
    with their RoPE tables, and a cache of 3 layers x 2 depths x ``slots``: ``(lp, h, cos, sin,
    k_all, v_all)``."""
    rng = np.random.default_rng(seed)
    rows, hidden, n_q, n_kv, d_h, inner = 32, 256, 4, 2, 64, 512
    lp = _layer(rng, jnp.bfloat16, hidden, n_q, n_kv, d_h, inner)
    h = _draw(rng, jnp.bfloat16, rows, hidden, scale=2.0)
    cos, sin = L.rope_tables(jnp.arange(rows) + position, d_h, 1e6, jnp.bfloat16)
    k_all, v_all = (_draw(rng, jnp.bfloat16, 3, 2, slots, n_kv, d_h) for _ in range(2))
    return lp, h, cos, sin, k_all, v_all


def test_the_window_layer_hands_the_products_to_the_attention_kernel(monkeypatch):
    """A single request's window layer as the model runs it on an NVIDIA GPU (bf16, 32 rows:
    ``platform_dependent``'s cuda branch, the kernels in the interpreter): the q/k/v product
    kernel's output goes to the attention kernel as it is, which applies the heads' norms and
    RoPE (no :func:`~alodlm_jax.kernels.head_norm.norm_rope` call); the layer's output and the
    window's K/V are the XLA form's to a bf16 step or two, the values the product's own."""
    lp, h, cos, sin, k_all, v_all = _one_request_layer(seed=3, slots=128, position=100)
    index, start = (jnp.int32(1), jnp.int32(2)), jnp.int32(70)
    *want, no_counts = WL.window_layer(lp, EPS, h, cos, sin, k_all, v_all, index, start, None)
    calls = _on_cuda_interpreted(monkeypatch)
    *got, counts = WL.window_layer(lp, EPS, h, cos, sin, k_all, v_all, index, start, None,
                                   kernel=True)
    assert sorted(calls) == sorted(PRODUCTS + ["window_attention_qkv"])
    assert counts is None is no_counts
    _assert_close(got, want, 2.0 ** -5)


def test_one_request_combines_its_parts_in_the_attention_kernel(monkeypatch):
    """Given the counts (zeros, as run_window_stack passes them), one request's window layer
    on the cuda branch (interpreted) combines its prefix's parts in the attention kernel's last
    part: its output and K/V equal, to the bit, the same layer with the parts combined by a
    second kernel (no counts, or COMBINE_IN_ATTENTION off), and the counts hold the parts used
    at the layer's KV heads, zeros elsewhere."""
    monkeypatch.setattr(WK, "GPU_RUN_BLOCKS", 1)  # a part of each 64-slot tile: 5 parts
    lp, h, cos, sin, k_all, v_all = _one_request_layer(seed=5, slots=512, position=300)
    index, start = (jnp.int32(2), jnp.int32(1)), jnp.int32(300)
    zeros = jnp.zeros((3, 1, k_all.shape[-2]), jnp.int32)
    calls = _on_cuda_interpreted(monkeypatch)
    run = functools.partial(WL.window_layer, lp, EPS, h, cos, sin, k_all, v_all, index, start,
                            None, kernel=True)
    *got, counts = run(counts=zeros)
    *apart, none = run()
    with monkeypatch.context() as separate:  # the switch gpu_check's --separate_combine turns
        separate.setattr(WK, "COMBINE_IN_ATTENTION", False)
        *switched, unchanged = run(counts=zeros)
    assert calls == ["norm_matmul", "window_attention_qkv", "matmul_residual", "norm_matmul",
                     "matmul_residual"] * 3
    assert none is None and (unchanged == zeros).all()
    assert counts.tolist() == [[[0, 0]], [[0, 0]], [[5, 5]]]
    for one, other in ((got, apart), (got, switched)):
        for g, w in zip(one, other, strict=True):
            np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def test_the_batch_layer_hands_the_products_to_the_attention_kernel(monkeypatch):
    """The same for a batch step's window layer (in-order lanes, two requests of 16 rows, one
    of them with 9 valid), against the same layer with the heads' norms in their own kernel
    (both on the cuda branch, interpreted): the output to a bf16 step, and the window's K/V in
    each request's padded rows, zeros past its count."""
    from alodlm_jax.network import rows as R

    rng = np.random.default_rng(4)
    rows, hidden, n_q, n_kv, d_h, inner, slots = 16, 256, 4, 2, 64, 512, 128
    lp = _layer(rng, jnp.bfloat16, hidden, n_q, n_kv, d_h, inner)
    m = R.row_map(jnp.asarray([16, 9], jnp.int32), 2 * rows, in_order=True)
    h = _draw(rng, jnp.bfloat16, 2 * rows, hidden, scale=2.0)
    cos, sin = L.rope_tables(jnp.arange(2 * rows) + 100, d_h, 1e6, jnp.bfloat16)
    k_all, v_all = (_draw(rng, jnp.bfloat16, 2, 3, 2, slots, n_kv, d_h) for _ in range(2))
    layer, depth, start = jnp.int32(1), jnp.asarray([0, 1], jnp.int32), jnp.asarray([70, 3])
    calls = _on_cuda_interpreted(monkeypatch)

    def run():
        calls.clear()
        return WL.window_layer_rows(lp, EPS, h, cos, sin, k_all, v_all, layer, depth, start,
                                    None, m, rows, kernel=True), sorted(calls)

    got, got_calls = run()
    with monkeypatch.context() as separate:  # the switch gpu_check's --separate_norms turns
        separate.setattr(WK, "NORMS_IN_ATTENTION", False)
        want, want_calls = run()
    assert got_calls == sorted(PRODUCTS + ["window_attention_qkv"])
    assert want_calls == sorted(PRODUCTS + ["norm_rope", "window_attention"])
    assert not got[1][1, 9:].any() and not want[1][1, 9:].any()  # K past the count: zeros
    valid = np.arange(2 * rows) < 16 + 9  # compact rows past the requests' count are padding
    _assert_close((got[0][valid], *got[1:]), (want[0][valid], *want[1:]), 2.0 ** -7)


GPU_COMPILE = """
    rows, hidden, n_q, n_kv, d_h, inner = 64, 512, 4, 2, 128, 1024  # MAX_ROWS: most shared memory
    lp = {"input_norm": spec(hidden), "q": spec(hidden, n_q, d_h), "k": spec(hidden, n_kv, d_h),
          "v": spec(hidden, n_kv, d_h), "q_norm": spec(d_h), "k_norm": spec(d_h),
          "o": spec(n_q, d_h, hidden), "post_norm": spec(hidden), "gate_proj": spec(hidden, inner),
          "up_proj": spec(hidden, inner), "down_proj": spec(inner, hidden)}

    def layer(kernel):
        return lambda lp, h, attn, cos, sin: (
            L.qkv(lp, 1e-6, h, cos, sin, kernel),
            L.attention_out_and_mlp(lp, 1e-6, h, attn, kernel))

    found = {str(kernel): report(layer(kernel), lp, spec(rows, hidden), spec(rows, n_q, d_h),
                                 spec(rows, d_h), spec(rows, d_h))
             for kernel in (True, False)}
    # A whole window layer over a cache of 2 layers x 3 depths x 256 slots, at depth 1.
    window_layer = lambda lp, h, cos, sin, k_all, v_all, start: WL.window_layer(
        lp, 1e-6, h, cos, sin, k_all, v_all, (0, jnp.int32(1)), start, None, kernel=True)
    cache = spec(2, 3, 256, n_kv, d_h)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=on_gpu)
    found["layer"] = report(window_layer, lp, spec(rows, hidden), spec(rows, d_h), spec(rows, d_h),
                            cache, cache, scalar)
    # The same with the counts (zeros, as run_window_stack makes them): the attention kernel's
    # last part combines the parts.
    counting_layer = lambda lp, h, cos, sin, k_all, v_all, start: WL.window_layer(
        lp, 1e-6, h, cos, sin, k_all, v_all, (0, jnp.int32(1)), start, None, kernel=True,
        counts=jnp.zeros((2, 1, n_kv), jnp.int32))
    found["counting"] = report(counting_layer, lp, spec(rows, hidden), spec(rows, d_h),
                               spec(rows, d_h), cache, cache, scalar)
    json.dump(found, sys.stdout)
"""


@pytest.mark.jax_backend
@pytest.mark.skipif(not gpu_compile.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_kernels_compile_for_a_gpu_without_one():
    """XLA:GPU compiles the kernels (JAX's CUDA plugin and ptxas, no GPU; it refuses a kernel that
    asks for more shared memory than an H200 has) where a window layer of 64 bf16 rows (the most
    the kernels take) asks for them, and the plan reads what each moves from its metadata: its
    operands and output once each. A layer's q/k/v, output product and MLP are 5 kernels (the
    products, and the heads' norms) where XLA's form is more than twice as many; the whole
    window layer, with its attention, 6.
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
    # The whole layer: the q/k/v products' output goes to the attention kernel, which applies
    # the heads' norms (no kernel of their own), and (one request, 2 KV heads) the kernel
    # combining its prefix's parts; then the three products of the output and the MLP.
    assert found["layer"]["triton"] == 6
    # Given the counts, the attention kernel's last part combines the parts: 5 Triton kernels.
    # (Its zeros are a kernel here, made once a layer group in run_window_stack.)
    assert found["counting"]["triton"] == 5
    assert found["counting"]["kernels"] == found["layer"]["kernels"]
