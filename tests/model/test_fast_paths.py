"""The pass's fast paths change how the work is laid out, never what it computes.

* per-layer weights (``unstack_layers``) against the stacked ``lax.scan`` form;
* attention over a power-of-two bucket of the cache against attention over the whole buffer;
* the batched cache write (``write_slots`` under ``vmap``) against per-request writes, and its
  lowering (no whole-buffer ``scatter``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax import model
from alodlm_jax.params import to_device

IDS = np.array([1, 4, 7, 8, 9, 12, 2, 5, 9, 10, 11, 30, 41, 52, 63, 13], np.int32)


def test_per_layer_params_compute_the_stacked_forward(tiny):
    stacked = to_device(tiny.np_params, "fp32")
    per_layer = to_device(tiny.np_params, "fp32", per_layer=True)
    assert isinstance(per_layer["core"], tuple) and len(per_layer["core"]) == tiny.cfg.num_core_layers
    assert per_layer["core"][0]["q"].shape == stacked["core"]["q"].shape[1:]
    assert model.unstack_layers(per_layer) == per_layer  # idempotent
    fwd = jax.jit(model.looped_forward, static_argnums=1)
    logits_s, hazards_s = fwd(stacked, tiny.cfg, jnp.asarray(IDS))
    logits_p, hazards_p = fwd(per_layer, tiny.cfg, jnp.asarray(IDS))
    np.testing.assert_allclose(np.asarray(logits_p), np.asarray(logits_s), atol=2e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(hazards_p), np.asarray(hazards_s), atol=2e-7, rtol=0)


def test_kv_buckets():
    assert model.kv_buckets(32) == (32,)
    assert model.kv_buckets(64) == (64,)
    assert model.kv_buckets(256) == (64, 128, 256)
    assert model.kv_buckets(288) == (64, 128, 256, 288)  # a batch's scratch slots: the whole buffer
    sizes = model.kv_buckets(288)
    picks = [int(model.kv_bucket_index(sizes, n)) for n in (1, 64, 65, 128, 129, 256, 257, 288, 999)]
    assert picks == [0, 0, 1, 1, 2, 2, 3, 3, 3]


@pytest.mark.parametrize("start", [0, 40, 100, 200])
def test_bucketed_attention_equals_the_whole_buffer(tiny, start):
    """Garbage past ``start + T`` is never seen, and the short bucket computes what the whole
    buffer computes (only the length of the fp32 reductions differs)."""
    params, cfg = to_device(tiny.np_params, "fp32", per_layer=True), tiny.cfg
    rows, t_max = 8, 256
    rng = np.random.default_rng(start)
    cache = model.init_cache(cfg, t_max, jnp.float32)
    filled = rng.standard_normal(cache.core_k.shape).astype(np.float32)
    visible = np.arange(t_max) < start  # earlier windows' K/V
    garbage = np.where(visible[None, None, :, None, None], filled, 1e4)  # huge values past the prefix
    cache = cache.replace(core_k=jnp.asarray(garbage), core_v=jnp.asarray(garbage))
    h = model.embed(params, jnp.asarray(IDS[:rows]))
    pos = jnp.arange(start, start + rows, dtype=jnp.int32)
    run = jax.jit(model.core_pass, static_argnums=1)
    bucketed, cache_b = run(params, cfg, h, pos, cache, jnp.int32(start), jnp.int32(1))
    whole, cache_w = run(params, cfg, h, pos, cache, jnp.int32(start), jnp.int32(1), kv_limit=t_max)
    assert np.isfinite(np.asarray(bucketed)).all()
    np.testing.assert_allclose(np.asarray(bucketed), np.asarray(whole), atol=2e-6, rtol=0)
    # Later layers' K/V follow from earlier layers' outputs: equal up to the same rounding.
    np.testing.assert_allclose(np.asarray(cache_b.core_k), np.asarray(cache_w.core_k), atol=2e-6, rtol=0)


def test_batched_cache_write_is_per_request_and_in_place():
    buf = jnp.arange(4 * 2 * 10 * 3, dtype=jnp.float32).reshape(4, 2, 10, 3)
    upd = -jnp.ones((4, 1, 2, 3), jnp.float32) * jnp.arange(1, 5, dtype=jnp.float32)[:, None, None, None]
    layer = jnp.array([0, 1, 1, 0], jnp.int32)
    start = jnp.array([0, 3, 8, 5], jnp.int32)

    def write(b, u, layer, start):
        zero = jnp.int32(0)
        return model.write_slots(b, u, jnp.stack([layer, start, zero]))

    got = jax.vmap(write)(buf, upd, layer, start)
    expected = np.asarray(buf).copy()
    for b in range(4):
        expected[b, int(layer[b]), int(start[b]):int(start[b]) + 2] = np.asarray(upd[b, 0])
    np.testing.assert_array_equal(np.asarray(got), expected)
    # A shared (unbatched) update and offset also work under vmap.
    shared = jax.vmap(write, in_axes=(0, None, None, None))(buf, upd[0], layer[1], start[1])
    np.testing.assert_array_equal(np.asarray(shared[:, 1, 3:5]), np.broadcast_to(np.asarray(upd[0, 0]), (4, 2, 3)))

    hlo = jax.jit(jax.vmap(write), donate_argnums=0).lower(buf, upd, layer, start).compile().as_text()
    assert "scatter" not in hlo
    assert hlo.count("dynamic-update-slice") >= 4


GROUPS = {  # name -> (writing forward, window forward without writes, store_window keyword)
    "prelude": (model.prelude, model.prelude_window, "prelude"),
    "core": (model.core_pass, model.core_window, "core"),
    "coda": (model.readout, model.readout_window, "coda"),
}


def _cache_with_garbage(cfg, t_max: int, start: int, seed: int):
    """A cache whose slots ``< start`` hold random K/V and every later slot holds 1e4."""
    rng = np.random.default_rng(seed)
    cache = model.init_cache(cfg, t_max, jnp.float32)

    def fill(buf):
        values = rng.standard_normal(buf.shape).astype(np.float32)
        visible = (np.arange(t_max) < start).reshape((t_max,) + (1, 1))
        return jnp.asarray(np.where(visible, values, np.float32(1e4)))

    return jax.tree_util.tree_map(fill, cache)


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("start", [16, 40, 100])
def test_window_forward_without_writes_equals_the_writing_forward(tiny, group, start):
    """``*_window`` + ``store_window`` (prefix and window as two attention blocks, cache only read)
    compute what the writing forward computes, up to the order of the fp32 softmax sums."""
    params, cfg = to_device(tiny.np_params, "fp32", per_layer=True), tiny.cfg
    rows, t_max = 8, 256
    cache = _cache_with_garbage(cfg, t_max, start, seed=start)
    h = model.embed(params, jnp.asarray(IDS[:rows]))
    pos = jnp.arange(start, start + rows, dtype=jnp.int32)
    writing, window, key = GROUPS[group]
    depth = (jnp.int32(1),) if group == "core" else ()
    out_w, cache_w = jax.jit(writing, static_argnums=1)(params, cfg, h, pos, cache, jnp.int32(start), *depth)
    out_d, kv = jax.jit(window, static_argnums=1)(params, cfg, h, pos, cache, jnp.int32(start), *depth)
    assert kv[0].shape[:2] == (len(params[group]), rows)
    cache_d = model.store_window(cache, jnp.int32(start), *depth, **{key: kv})
    assert np.isfinite(np.asarray(out_d)).all()  # the 1e4 garbage past the prefix is never seen
    np.testing.assert_allclose(np.asarray(out_d), np.asarray(out_w), atol=2e-6, rtol=0)
    for name in ("prelude_k", "prelude_v", "core_k", "core_v", "coda_k", "coda_v"):
        np.testing.assert_allclose(np.asarray(getattr(cache_d, name)), np.asarray(getattr(cache_w, name)),
                                   atol=2e-6, rtol=0, err_msg=name)


@pytest.mark.parametrize("start", [16, 100])
def test_rows_past_a_row_bucket_are_never_seen(tiny, start):
    """A window forward on its first ``n`` rows gives those rows what the forward on all rows gives
    them (attention is causal in packed order): what makes row buckets exact."""
    params, cfg = to_device(tiny.np_params, "fp32", per_layer=True), tiny.cfg
    cache = _cache_with_garbage(cfg, 256, start, seed=1)
    ids = jnp.asarray(IDS)
    pos = jnp.arange(start, start + len(IDS), dtype=jnp.int32)
    run = jax.jit(model.core_window, static_argnums=1)
    full, (k_full, v_full) = run(params, cfg, model.embed(params, ids), pos, cache, jnp.int32(start), jnp.int32(0))
    n = 10
    part, (k_part, v_part) = run(params, cfg, model.embed(params, ids[:n]), pos[:n], cache, jnp.int32(start),
                                 jnp.int32(0))
    np.testing.assert_allclose(np.asarray(part), np.asarray(full[:n]), atol=2e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(k_part), np.asarray(k_full[:, :n]), atol=2e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(v_part), np.asarray(v_full[:, :n]), atol=2e-6, rtol=0)
