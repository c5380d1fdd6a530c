"""The batch step's attention kernel (:mod:`alodlm_jax.window_kernel`) against the XLA form it
replaces, in Pallas's interpreter; and, with the aot extra, compiled for a TPU without one."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax import model as M
from alodlm_jax import window_kernel as WK
from alodlm_jax.plan import targets

HAVE_TPU = targets.missing_extra(targets.load_target("v5p")) is None


def _operands(dtype, *, batch=3, rows=8, n_q=4, n_kv=2, d_h=128, layers=2, depths=3, slots=512,
              seed=0):
    rng = np.random.default_rng(seed)
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
    cache = (batch, layers, depths, slots, n_kv, d_h)
    return (draw(batch, rows, n_q, d_h), draw(batch, rows, n_kv, d_h), draw(batch, rows, n_kv, d_h),
            draw(*cache), draw(*cache))


def _in_copy(q, k, v, k_all, v_all, layer, depth, start):
    one = functools.partial(M._attend_in_copy, layer=jnp.int32(layer), size=k_all.shape[-3])
    return jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, None if depth is None else 0))(
        q, k, v, k_all, v_all, start, depth)


# Starts: no prefix, inside the first block, on a block boundary, inside the last block.
@pytest.mark.parametrize("starts", [(0, 5, 256), (255, 257, 500)])
@pytest.mark.parametrize("with_depth", [True, False])
def test_kernel_equals_the_xla_form_in_fp32(starts, with_depth):
    q, k, v, k_all, v_all = _operands(jnp.float32)
    start = jnp.asarray(starts, jnp.int32)
    depth = jnp.asarray([2, 0, 1], jnp.int32) if with_depth else None
    if not with_depth:
        k_all, v_all = k_all[:, :, 0], v_all[:, :, 0]
    want = _in_copy(q, k, v, k_all, v_all, 1, depth, start)
    got = WK.window_attention(q, k, v, k_all, v_all, jnp.int32(1), depth, start, interpret=True)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-6)


def test_kernel_reads_only_its_layer_depth_and_prefix():
    """Changing the cache anywhere else (other layers, depths, requests' slots at or past their
    start) changes nothing."""
    q, k, v, k_all, v_all = _operands(jnp.float32)
    start = jnp.asarray([5, 256, 300], jnp.int32)
    depth = jnp.asarray([2, 0, 1], jnp.int32)
    run = functools.partial(WK.window_attention, q, k, v, layer=jnp.int32(1), depth=depth,
                            start=start, interpret=True)
    before = run(k_all, v_all)
    slot = jnp.arange(k_all.shape[3])
    mine = ((jnp.arange(2)[None, :, None, None] == 1)
            & (jnp.arange(3)[None, None, :, None] == depth[:, None, None, None])
            & (slot[None, None, None, :] < start[:, None, None, None]))[..., None, None]
    noise = jnp.full_like(k_all, 1e3)
    after = run(jnp.where(mine, k_all, noise), jnp.where(mine, v_all, noise))
    np.testing.assert_array_equal(np.asarray(after), np.asarray(before))


def test_kernel_in_bf16_agrees_to_bf16_resolution():
    q, k, v, k_all, v_all = _operands(jnp.bfloat16)
    start = jnp.asarray([5, 256, 480], jnp.int32)
    depth = jnp.asarray([0, 2, 1], jnp.int32)
    want = _in_copy(q, k, v, k_all, v_all, 0, depth, start).astype(jnp.float32)
    got = WK.window_attention(q, k, v, k_all, v_all, jnp.int32(0), depth, start, interpret=True)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want), rtol=0,
                               atol=2e-2)


def test_block_sizes_and_supported_shapes():
    assert [WK.block_slots(n) for n in (5376, 5120, 768, 96)] == [256, 512, 256, 96]
    assert WK.supported(8, 128, jnp.bfloat16) and WK.supported(3, 128, jnp.float32)
    assert not WK.supported(3, 128, jnp.bfloat16) and not WK.supported(8, 64, jnp.float32)


@pytest.mark.jax_backend
@pytest.mark.skipif(not HAVE_TPU, reason="needs the aot extra (libtpu)")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_compiles_for_a_tpu_without_one(dtype):
    """XLA:TPU compiles the Mosaic kernel (libtpu, no TPU), and the program says what it moves:
    one depth of each request's K/V at its layer, not the buffers."""
    from jax.sharding import SingleDeviceSharding

    (device,) = targets.load_target("v5p").devices()[:1]
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
