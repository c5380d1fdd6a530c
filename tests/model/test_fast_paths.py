"""The pass's fast paths change how the work is laid out, never what it computes.

* per-layer weights (``unstack_layers``) against the stacked ``lax.scan`` form, and their loop
  traced once for all layers against each layer traced with its own index;
* attention over a power-of-two bucket of the cache against attention over the whole buffer;
* the batched cache write (``write_slots`` under ``vmap``) against per-request writes, and its
  lowering (no whole-buffer ``scatter``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import layers as L
from alodlm_jax.network import model
from alodlm_jax.network import cache as KC
from alodlm_jax.network import window_layers as WL
from alodlm_jax.network import rows as R
from alodlm_jax.network.params import to_device
from alodlm_jax.testing.released_shapes import model_config, random_params

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


def _traces(monkeypatch, name: str, module=model) -> list:
    """Records each trace of ``module.<name>`` (one entry per call while tracing)."""
    calls = []
    inner = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return inner(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _trace_each_layer(monkeypatch) -> None:
    """Every layer loop traces its layer per layer (no ``traced_once``): the stacks' loops in
    ``model`` and the window forwards' in ``layers``."""
    for module in (model, L):
        monkeypatch.setattr(module, "traced_once", lambda layer: layer)


def _layer_programs(params, cfg, start: int):
    """Each layer group's full pass (``run_stack``, writing the cache) and window pass
    (``run_window_stack``, returning the window's K/V), the core at depth 1, in one program."""
    cache = KC.init_cache(cfg, 64, params["embed"].dtype)
    rng = np.random.default_rng(3)
    filled = {name: jnp.asarray(rng.standard_normal(x.shape), x.dtype)
              for name, x in vars(cache).items()}
    cache = cache.replace(**filled)
    h = model.embed(params, jnp.asarray(IDS[:8]))
    pos = jnp.arange(start, start + 8, dtype=jnp.int32)

    def passes(params, h, pos, cache, start):  # a new function each call: traced anew
        depth = (jnp.int32(1),)
        return [run(params, cfg, h, pos, cache, start, *at)
                for run, at in ((model.prelude, ()), (model.core_pass, depth), (model.readout, ()),
                                (model.prelude_window, ()), (model.core_window, depth),
                                (model.readout_window, ()))]

    return jax.tree.leaves(jax.jit(passes)(params, h, pos, cache, jnp.int32(start)))


def test_per_layer_loop_is_traced_once_and_computes_each_layer_traced(monkeypatch):
    """A tuple of per-layer weights is traced once for the whole loop (``traced_once``: one jit
    of the layer, its index an operand, its jaxpr inlined at each call), where a loop tracing
    every layer traced it per layer; the values are those of each layer traced with its Python
    index, to the bit (the 8B's tiny shape: 2 layers in each of its three groups; bf16, where
    XLA:CPU rounded elsewhere when each layer was a call rather than inlined)."""
    cfg = model_config("8b", tiny=True)
    params = random_params(cfg, jnp.bfloat16, seed=1)
    sizes = [len(params[group]) for group in ("prelude", "core", "coda")]
    groups, layers = sum(1 for n in sizes if n), sum(sizes)
    assert layers > groups
    full, window = _traces(monkeypatch, "_layer"), _traces(monkeypatch, "window_layer", WL)
    once = _layer_programs(params, cfg, start=20)
    assert (len(full), len(window)) == (groups, groups)
    _trace_each_layer(monkeypatch)
    each = _layer_programs(params, cfg, start=20)
    assert (len(full), len(window)) == (groups + layers, groups + layers)
    for got, expected in zip(once, each, strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))


def test_batch_rows_trace_the_layer_once(monkeypatch):
    """The batch step's layers (several requests' rows, XLA's attention in row buckets on a CPU)
    are traced once too, and compute what each layer traced with its index computes."""
    cfg = model_config("1.7b", tiny=True)
    params = random_params(cfg, jnp.float32, seed=1)
    assert len(params["core"]) > 1
    traced = _traces(monkeypatch, "window_layer_rows", WL)
    batch, rows = 2, 8
    one = KC.init_cache(cfg, 64, jnp.float32)
    rng = np.random.default_rng(4)
    k_all, v_all = (jnp.asarray(rng.standard_normal((batch,) + x.shape).astype(np.float32))
                    for x in (one.core_k, one.core_v))
    m = R.row_map(jnp.array([rows, 5], jnp.int32), 2 * rows)
    h = jnp.asarray(rng.standard_normal((2 * rows, cfg.hidden_size)).astype(np.float32))
    positions = jnp.concatenate([jnp.arange(16, 24), jnp.arange(8, 16)]).astype(jnp.int32)

    def step():  # a new function each call: traced anew
        return jax.jit(lambda h: WL.run_window_rows(
            params["core"], cfg, h, positions, m, k_all, v_all, jnp.array([16, 8], jnp.int32),
            jnp.array([1, 2], jnp.int32), prefix_limit=jnp.int32(24), rows=rows))(h)

    once = jax.tree.leaves(step())
    assert len(traced) == 1
    _trace_each_layer(monkeypatch)
    each = jax.tree.leaves(step())
    assert len(traced) == 1 + len(params["core"])
    for got, expected in zip(once, each, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_kv_buckets():
    assert KC.kv_buckets(32) == (32,)
    assert KC.kv_buckets(64) == (64,)
    assert KC.kv_buckets(256) == (64, 128, 256)
    assert KC.kv_buckets(288) == (64, 128, 256, 288)  # a batch's scratch slots: the whole buffer
    sizes = KC.kv_buckets(288)
    picks = [int(KC.kv_bucket_index(sizes, n)) for n in (1, 64, 65, 128, 129, 256, 257, 288, 999)]
    assert picks == [0, 0, 1, 1, 2, 2, 3, 3, 3]


@pytest.mark.parametrize("start", [0, 40, 100, 200])
def test_bucketed_attention_equals_the_whole_buffer(tiny, start):
    """Garbage past ``start + T`` is never seen, and the short bucket computes what the whole
    buffer computes (only the length of the fp32 reductions differs)."""
    params, cfg = to_device(tiny.np_params, "fp32", per_layer=True), tiny.cfg
    rows, t_max = 8, 256
    rng = np.random.default_rng(start)
    cache = KC.init_cache(cfg, t_max, jnp.float32)
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
        return KC.write_slots(b, u, jnp.stack([layer, start, zero]))

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
    cache = KC.init_cache(cfg, t_max, jnp.float32)

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
    cache_d = KC.store_window(cache, jnp.int32(start), *depth, **{key: kv})
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
