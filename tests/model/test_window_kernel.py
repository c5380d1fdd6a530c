"""The batch step's attention kernels (:mod:`alodlm_jax.kernels.window`, TPU and GPU) against the
XLA form they replace, in Pallas's interpreter; and, with the aot extra, compiled for a TPU and a
GPU without either."""

import functools
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import attention as A
from alodlm_jax.kernels import window as WK
from alodlm_jax.plan import targets

from . import gpu_compile

HAVE_TPU = targets.missing_extra(targets.load_target("v5p")) is None
BACKENDS = ["tpu", "gpu"]


def _operands(dtype, *, batch=3, rows=8, n_q=4, n_kv=2, d_h=128, layers=2, depths=3, slots=512,
              seed=0):
    rng = np.random.default_rng(seed)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
    cache = (batch, layers, depths, slots, n_kv, d_h)
    return (draw(batch, rows, n_q, d_h), draw(batch, rows, n_kv, d_h), draw(batch, rows, n_kv, d_h),
            draw(*cache), draw(*cache))


def _in_copy(q, k, v, k_all, v_all, layer, depth, start):
    one = functools.partial(A.attend_in_copy, layer=jnp.int32(layer), size=k_all.shape[-3])
    return jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, None if depth is None else 0))(
        q, k, v, k_all, v_all, start, depth)


# Starts: no prefix, inside the first block, on a block boundary, inside the last block. Rows: the
# GPU kernel pads 8 and 5 window rows to 16 (its smallest tile). Splits: the GPU kernel's parts of
# a prefix, here 8 by default (3 requests x 2 KV heads, 8 tiles; 255 slots in the first 4, the
# other 4 parts see none), or one part (no combining), or 2 (4 tiles each).
@pytest.mark.parametrize("starts", [(0, 5, 256), (255, 257, 500)])
@pytest.mark.parametrize("with_depth", [True, False])
@pytest.mark.parametrize("backend,rows,splits", [("tpu", 8, None), ("gpu", 8, None),
                                                 ("gpu", 5, None), ("gpu", 8, 1), ("gpu", 8, 2)])
def test_kernel_equals_the_xla_form_in_fp32(backend, rows, splits, starts, with_depth):
    q, k, v, k_all, v_all = _operands(jnp.float32, rows=rows)
    start = jnp.asarray(starts, jnp.int32)
    depth = jnp.asarray([2, 0, 1], jnp.int32) if with_depth else None
    if not with_depth:
        k_all, v_all = k_all[:, :, 0], v_all[:, :, 0]
    want = _in_copy(q, k, v, k_all, v_all, 1, depth, start)
    got = WK.window_attention(q, k, v, k_all, v_all, jnp.int32(1), depth, start, backend=backend,
                              interpret=True, splits=splits)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-6)


@pytest.mark.parametrize("run_blocks", [1, 4])
@pytest.mark.parametrize("splits", [2, 16])
def test_gpu_kernel_parts_of_a_long_prefix(splits, run_blocks, monkeypatch):
    """A prefix of up to 16 blocks cut in parts of at least ``run_blocks`` blocks each (16 parts
    of one block; 4 of 4; 2 of 8), each request's own number of them, combined: the XLA form's
    output to fp32 rounding."""
    monkeypatch.setattr(WK, "GPU_RUN_BLOCKS", run_blocks)
    q, k, v, k_all, v_all = _operands(jnp.float32, slots=1024, seed=1)
    start = jnp.asarray([1000, 300, 64], jnp.int32)
    depth = jnp.asarray([1, 2, 0], jnp.int32)
    want = _in_copy(q, k, v, k_all, v_all, 0, depth, start)
    got = WK.window_attention(q, k, v, k_all, v_all, jnp.int32(0), depth, start, backend="gpu",
                              interpret=True, splits=splits)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-6)


@pytest.mark.parametrize("backend,splits", [("tpu", None), ("gpu", 1), ("gpu", 8)])
def test_kernel_reads_only_its_layer_depth_and_prefix(backend, splits):
    """Changing the cache anywhere else (other layers, depths, requests' slots at or past their
    start) changes nothing; in the parts of a split prefix too (a part past the prefix, inf in
    the slots it does not see)."""
    q, k, v, k_all, v_all = _operands(jnp.float32)
    start = jnp.asarray([5, 256, 300], jnp.int32)
    depth = jnp.asarray([2, 0, 1], jnp.int32)
    run = functools.partial(WK.window_attention, q, k, v, layer=jnp.int32(1), depth=depth,
                            start=start, backend=backend, interpret=True, splits=splits)
    before = run(k_all, v_all)
    slot = jnp.arange(k_all.shape[3])
    mine = ((jnp.arange(2)[None, :, None, None] == 1)
            & (jnp.arange(3)[None, None, :, None] == depth[:, None, None, None])
            & (slot[None, None, None, :] < start[:, None, None, None]))[..., None, None]
    noise = jnp.full_like(k_all, jnp.inf)
    after = run(jnp.where(mine, k_all, noise), jnp.where(mine, v_all, noise))
    np.testing.assert_array_equal(np.asarray(after), np.asarray(before))


@pytest.mark.parametrize("backend,n_kv", [("tpu", 2), ("gpu", 2), ("tpu", 1)])
def test_kernel_in_bf16_agrees_to_bf16_resolution(backend, n_kv):
    q, k, v, k_all, v_all = _operands(jnp.bfloat16, n_kv=n_kv)
    start = jnp.asarray([5, 256, 480], jnp.int32)
    depth = jnp.asarray([0, 2, 1], jnp.int32)
    want = _in_copy(q, k, v, k_all, v_all, 0, depth, start).astype(jnp.float32)
    got = WK.window_attention(q, k, v, k_all, v_all, jnp.int32(0), depth, start, backend=backend,
                              interpret=True)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want), rtol=0,
                               atol=2e-2)


def _projections(dtype, *, batch=3, rows=8, n_q=4, n_kv=2, d_h=128, seed=0):
    """The window's projections ``[B, W, n_q + 2 n_kv, d_h]`` (as the model's q/k/v product
    writes them), the heads' norm weights and each request's RoPE tables ``[B, W, d_h]``."""
    from alodlm_jax.network import layers as L

    rng = np.random.default_rng(seed)
    qkv = jnp.asarray(2 * rng.standard_normal((batch, rows, n_q + 2 * n_kv, d_h)), dtype)
    q_w, k_w = (jnp.asarray(1 + 0.1 * rng.standard_normal(d_h), dtype) for _ in range(2))
    tables = [L.rope_tables(jnp.arange(rows) + 100 * b + 7, d_h, 1e6, dtype)
              for b in range(batch)]
    return qkv, q_w, k_w, jnp.stack([c for c, _ in tables]), jnp.stack([s for _, s in tables])


# Rows: 8 and 5 padded to 16; query groups of 2 and 4; the prefix in parts (2, or the default
# 8) and whole; fp32 and bf16.
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rows,n_q,splits", [(8, 4, None), (5, 4, 2), (16, 8, 1), (8, 8, 2)])
def test_gpu_kernel_normalizing_its_window_is_the_two_kernels(dtype, rows, n_q, splits):
    """:func:`~alodlm_jax.kernels.window.window_attention_qkv` (the heads' norms and RoPE inside
    the attention kernel) performs the operations of
    :func:`~alodlm_jax.kernels.head_norm.norm_rope` and then
    :func:`~alodlm_jax.kernels.window.window_attention`: in Pallas's interpreter its keys are
    norm_rope's to the bit, and its output theirs to rounding (the queries' halves are joined
    in the kernel, and XLA:CPU may then multiply them in another order: a unit in the last
    place, fp32's or bf16's)."""
    from alodlm_jax.kernels import head_norm as HK

    qkv, q_w, k_w, cos, sin = _projections(dtype, rows=rows, n_q=n_q)
    *_, k_all, v_all = _operands(dtype, rows=rows, n_q=n_q)
    start = jnp.asarray([0, 200, 500], jnp.int32)
    depth = jnp.asarray([2, 0, 1], jnp.int32)
    q, k, v = (jnp.stack(x) for x in zip(*(
        HK.norm_rope(qkv[b], n_q, 2, q_w, k_w, cos[b], sin[b], 1e-6, interpret=True)
        for b in range(3))))
    want = WK.window_attention(q, k, v, k_all, v_all, jnp.int32(1), depth, start, backend="gpu",
                               interpret=True, splits=splits)
    got, keys = WK.window_attention_qkv(qkv, n_q, q_w, k_w, cos, sin, 1e-6, k_all, v_all,
                                        jnp.int32(1), depth, start, interpret=True,
                                        splits=splits)
    assert got.dtype == keys.dtype == dtype and got.shape == want.shape
    tolerance = dict(rtol=0, atol=2e-6) if dtype == jnp.float32 else dict(rtol=2 ** -7, atol=0)
    if jax.__version_info__ < (0, 11):
        np.testing.assert_array_equal(np.asarray(keys), np.asarray(k))
    else:  # XLA:CPU of JAX 0.11.2 rounds the two interpreted programs' fp32 keys apart (14 % of
        # them, by up to 2.4e-7, at 16 rows and 8 heads); tokens do not move (token_corpus)
        np.testing.assert_allclose(np.asarray(keys, np.float32), np.asarray(k, np.float32),
                                   **tolerance)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               **tolerance)


def test_block_sizes_and_supported_shapes():
    assert [WK.block_slots(n) for n in (5376, 5120, 768, 96)] == [256, 512, 256, 96]
    released = dict(slots=5376, n_kv=8, head_dim=128, rows=32, group=4, dtype=jnp.bfloat16)
    assert WK.supported("tpu", **released) and WK.supported("gpu", **released)
    assert WK.supported("tpu", **dict(released, n_kv=3, dtype=jnp.float32))
    assert not WK.supported("tpu", **dict(released, n_kv=3))  # 16-bit heads read in pairs
    assert not WK.supported("tpu", **dict(released, head_dim=64))
    # Triton's tiles are powers of two: the window's rows are padded (14 -> 16, 24 -> 32), a
    # query group of 3 is not.
    assert [WK.gpu_rows(n) for n in (1, 14, 16, 24, 32)] == [16, 16, 16, 32, 32]
    # The GPU kernel's grid: one request of the released models (8 KV heads) is 8 programs, its
    # prefix split in 8 parts makes 64; 8 requests make 64 alone; never more parts than tiles.
    assert [WK.gpu_splits(b, 8, 5376) for b in (1, 2, 4, 7, 8, 32)] == [8, 4, 2, 2, 1, 1]
    assert [WK.gpu_splits(1, 8, n) for n in (64, 128, 256)] == [1, 2, 4]
    assert WK.supported("gpu", **dict(released, rows=24))
    assert WK.supported("gpu", **dict(released, rows=14, group=2, dtype=jnp.float32))
    assert not WK.supported("gpu", **dict(released, group=3))
    assert not WK.supported("gpu", **dict(released, slots=5376 + 32))
    with pytest.raises(ValueError, match="backend must be"):
        WK.window_attention(*_operands(jnp.float32), 0, None, jnp.zeros(3, jnp.int32),
                            backend="cpu")


@pytest.mark.jax_backend
@pytest.mark.skipif(not HAVE_TPU, reason="needs the aot extra (libtpu)")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_compiles_for_a_tpu_without_one(dtype):
    """XLA:TPU compiles the Mosaic kernel (libtpu, no TPU), and the program says what it moves:
    one depth of each request's K/V at its layer, not the buffers."""
    from jax.sharding import SingleDeviceSharding

    device = targets.load_target("v5p").devices()[0]
    arrays = _operands(dtype, batch=2, rows=16, n_q=16, n_kv=8, slots=768)
    on_tpu = SingleDeviceSharding(device)
    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_tpu)  # noqa: E731
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=on_tpu)  # noqa: E731
    compiled = jax.jit(WK.window_attention).lower(
        *map(spec, arrays), ints(), ints(2), ints(2)).compile()
    text = compiled.as_text()
    assert 'custom_call_target="tpu_custom_call"' in text
    item = jnp.dtype(dtype).itemsize
    one_depth = 2 * 2 * 768 * 8 * 128 * item
    window = 2 * arrays[1].size * item + 2 * arrays[0].size * item
    assert f'"bytes_accessed":"{one_depth + window}"' in text


GPU_COMPILE = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding
    from alodlm_jax.kernels import window as WK
    from alodlm_jax.plan import hlo, targets
    from alodlm_jax.plan.compile import lowering_for

    device = targets.load_target("h200").devices()[0]
    on_gpu = SingleDeviceSharding(device)
    spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=on_gpu)
    cache = spec((2, 2, 3, 768, 8, 128))
    window = spec((2, 16, 8, 128))
    scalars = spec((), jnp.int32), spec((2,), jnp.int32), spec((2,), jnp.int32)
    found = []
    for splits, normed in ((None, False), (1, False), (None, True)):
        if normed:  # the projections as they leave the product: the kernel normalizes them
            fn = lambda *a: WK.window_attention_qkv(a[0], 16, *a[1:5], 1e-6, *a[5:], splits=splits)
            operands = (spec((2, 16, 32, 128)), spec((128,)), spec((128,)), spec((2, 16, 128)),
                        spec((2, 16, 128)), cache, cache, *scalars)
        else:
            fn = lambda *a: WK.window_attention(*a, backend="gpu", splits=splits)
            operands = (spec((2, 16, 16, 128)), window, window, cache, cache, *scalars)
        with lowering_for(device):
            lowered = jax.jit(fn).lower(*operands)
        text = lowered.compile().as_text()
        module = hlo.parse(text)
        calls = [i for c in module.computations.values() for i in c.instructions
                 if i.opcode == "custom-call"]
        found.append({"triton": text.count('custom_call_target="__gpu$xla.gpu.triton"'),
                      "fusions": hlo.count_fusions(text),
                      "bytes": [module.kernel_bytes(module.entry, i) for i in calls],
                      "flops": [module.kernel_flops(module.entry, i) for i in calls],
                      "programs": [module.instruction_cost(module.entry, i).few_programs
                                   for i in calls]})
    json.dump(found, sys.stdout)
""")


@pytest.mark.jax_backend
@pytest.mark.skipif(not gpu_compile.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_gpu_kernel_compiles_for_a_gpu_without_one():
    """XLA:GPU compiles the Triton kernel (JAX's CUDA plugin and ptxas, no GPU), also the form
    that applies the heads' norms itself, and the plan reads what it moves from the kernel's
    metadata: one depth of each request's K/V; and its
    FLOPs: both products of every query row with the slots it may see. In a child process with
    the plugin on its path, as tests/plan runs the GPU plan."""
    split, whole, normed = gpu_compile.run_in_child(GPU_COMPILE)
    one_depth = 2 * 2 * 768 * 8 * 128 * 2
    read = one_depth + 2 * (2 * 16 * 8 * 128 * 2) + 2 * 16 * 16 * 128 * 2  # + window K/V, queries
    out = 2 * 16 * 16 * 128 * 2
    flops = 4 * 2 * 16 * 16 * (768 + 16) * 128  # batch x query heads x rows x (slots + window)
    # 2 requests x 8 KV heads: each prefix in 4 parts (64 programs), each part's fp32 output,
    # maximum and sum for 16 x 2 stacked query rows, combined by a second kernel (64 programs:
    # 4 chunks of 4 window rows); nothing else runs.
    parts = 4 * 2 * 8 * 4 * 32 * (128 + 2)
    assert split == {"triton": 2, "fusions": 0, "bytes": [read + parts, parts + out],
                     "flops": [flops, 0],
                     "programs": [[[read + parts, 64]], [[parts + out, 64]]]}
    assert whole == {"triton": 1, "fusions": 0, "bytes": [read + out], "flops": [flops],
                     "programs": [[[read + out, 16]]]}
    # The kernel that applies the heads' norms and RoPE also reads the RoPE tables and writes
    # the window's keys; the rest as before (the norms' weights are not counted).
    moved = read + 2 * 2 * 16 * 128 * 2 + parts + 2 * 16 * 8 * 128 * 2
    assert normed == {"triton": 2, "fusions": 0, "bytes": [moved, parts + out],
                      "flops": [flops, 0], "programs": [[[moved, 64]], [[parts + out, 64]]]}
