"""KV-cache semantics: window writes, causal consistency with a full forward, depth completion."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import model
from alodlm_jax.network import cache as KC
from alodlm_jax.network.params import to_device

SEQ = np.array([1, 4, 7, 8, 9, 12, 2, 5, 9, 10, 11, 30, 41, 52, 63, 13], np.int32)
ROWS, T_MAX = 8, 24  # one window shape and cache size for every test here: few compilations


@functools.partial(jax.jit, static_argnums=(1, 6))
def window_all_passes(params, cfg, ids, positions, cache, start, passes):
    """A window forward as a decoder drives it (no masks): prelude, then per pass core, readout,
    heads, carry norm. ``depth`` is traced; ``passes`` static."""
    h, cache = model.prelude(params, cfg, model.embed(params, ids), positions, cache, start)

    def one_pass(carry, depth):
        h, cache = carry
        h, cache = model.core_pass(params, cfg, h, positions, cache, start, depth)
        r, cache = model.readout(params, cfg, h, positions, cache, start)
        heads = (model.lm_logits(params, r), model.gate_hazard(params, r, depth))
        return (model.carry_norm(params, cfg, h), cache), heads

    (_, cache), (logits, hazards) = jax.lax.scan(one_pass, (h, cache), jnp.arange(passes, dtype=jnp.int32))
    return logits, hazards, cache


def _buffers(cache: KC.KVCache) -> dict[str, np.ndarray]:
    return {f: np.asarray(getattr(cache, f)) for f in
            ("prelude_k", "prelude_v", "core_k", "core_v", "coda_k", "coda_v")}


def _slots(name: str, buf: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return buf[:, :, lo:hi] if name.startswith("core") else buf[:, lo:hi]


def test_init_cache_shapes(tiny):
    cfg = tiny.cfg
    cache = KC.init_cache(cfg, 10, "bf16")
    n_kv, d_h, k = cfg.num_key_value_heads, cfg.head_dim, cfg.max_depth
    assert cache.prelude_k.shape == (cfg.num_prelude_layers, 10, n_kv, d_h)
    assert cache.core_v.shape == (cfg.num_core_layers, k, 10, n_kv, d_h)
    assert cache.coda_k.shape == (cfg.num_coda_layers, 10, n_kv, d_h)
    assert cache.core_k.dtype == jnp.bfloat16 and cache.t_max == 10


def test_prefill_then_window_equals_full_forward(tiny):
    """Prefill P tokens, then a window at start=P with padding rows: the valid rows' cached K/V at
    every depth equal one causal forward over the concatenated sequence, and so do their logits and
    hazards at every depth whose readout sees the same prefix coda K/V.

    The coda keeps one buffer that holds the prefix's *last* pass (spec §5), so with a non-empty
    coda a window's pass s < K-1 reads prefix coda K/V of pass K-1 while the one-shot forward reads
    pass s: only the last pass is comparable there. With an empty coda every pass is.
    """
    params, cfg = to_device(tiny.np_params, "fp32"), tiny.cfg
    k = cfg.max_depth
    p, w = ROWS, 5  # the window: w valid rows + (ROWS - w) padding rows
    full_ids = jnp.asarray(SEQ[:2 * ROWS])  # a causal forward: rows past p + w change nothing before
    full_logits, full_haz, full_cache = window_all_passes(
        params, cfg, full_ids, jnp.arange(2 * ROWS, dtype=jnp.int32), KC.init_cache(cfg, T_MAX, jnp.float32),
        jnp.int32(0), k)

    cache = KC.init_cache(cfg, T_MAX, jnp.float32)
    pre_logits, pre_haz, cache = window_all_passes(
        params, cfg, full_ids[:p], jnp.arange(p, dtype=jnp.int32), cache, jnp.int32(0), k)
    np.testing.assert_allclose(pre_logits, full_logits[:, :p], atol=1e-5, rtol=1e-5)
    before = _buffers(cache)

    win_ids = jnp.concatenate([full_ids[p:p + w], jnp.asarray([3, 3, 50], jnp.int32)])  # 3 padding rows
    win_pos = jnp.arange(p, p + ROWS, dtype=jnp.int32)
    win_logits, win_haz, cache2 = window_all_passes(params, cfg, win_ids, win_pos, cache, jnp.int32(p), k)
    first = 0 if cfg.num_coda_layers == 0 else k - 1
    np.testing.assert_allclose(win_logits[first:, :w], full_logits[first:, p:p + w], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(win_haz[first:, :w], full_haz[first:, p:p + w], atol=1e-6)
    if cfg.num_coda_layers:  # and the coda rule is visible: pass 0 differs
        assert np.abs(np.asarray(win_logits[0, :w] - full_logits[0, p:p + w])).max() > 1e-3

    after, full = _buffers(cache2), _buffers(full_cache)
    for name in after:
        # Prefix slots are never touched by a window; window slots hold the concatenated forward's K/V.
        np.testing.assert_array_equal(_slots(name, after[name], 0, p), _slots(name, before[name], 0, p))
        np.testing.assert_allclose(_slots(name, after[name], 0, p + w), _slots(name, full[name], 0, p + w),
                                   atol=1e-5, rtol=1e-5, err_msg=name)

    # Valid rows never see padding rows: other padding ids leave them bit-identical.
    other_ids = win_ids.at[w:].set(jnp.asarray([60, 61, 62], jnp.int32))
    other_logits, other_haz, _ = window_all_passes(params, cfg, other_ids, win_pos, cache, jnp.int32(p), k)
    np.testing.assert_array_equal(np.asarray(other_logits[:, :w]), np.asarray(win_logits[:, :w]))
    np.testing.assert_array_equal(np.asarray(other_haz[:, :w]), np.asarray(win_haz[:, :w]))
    assert not np.array_equal(np.asarray(other_logits[:, w:]), np.asarray(win_logits[:, w:]))


def test_window_reads_its_own_depth(tiny):
    """Pass s reads only the depth-s core buffers: corrupting another depth's prefix slots changes
    nothing at pass s, corrupting depth s does."""
    params, cfg = to_device(tiny.np_params, "fp32"), tiny.cfg
    p, k = ROWS, tiny.cfg.max_depth
    cache = KC.init_cache(cfg, T_MAX, jnp.float32)
    _, _, cache = window_all_passes(params, cfg, jnp.asarray(SEQ[:p]), jnp.arange(p, dtype=jnp.int32),
                                    cache, jnp.int32(0), k)
    ids, pos = jnp.asarray(SEQ[p:2 * p]), jnp.arange(p, 2 * p, dtype=jnp.int32)
    base = np.asarray(window_all_passes(params, cfg, ids, pos, cache, jnp.int32(p), k)[0])
    for corrupt in (1, 3):
        noisy = cache.replace(core_k=cache.core_k.at[:, corrupt, :p].add(1.0))
        got = np.asarray(window_all_passes(params, cfg, ids, pos, noisy, jnp.int32(p), k)[0])
        np.testing.assert_array_equal(got[:corrupt], base[:corrupt])  # earlier passes: other depths
        assert np.abs(got[corrupt] - base[corrupt]).max() > 1e-4


def _labelled_cache(cfg, t_max: int) -> KC.KVCache:
    """Core value = 1000*layer + 100*depth + slot (keys), negated for values; prelude/coda random."""
    cache = KC.init_cache(cfg, t_max, jnp.float32)
    lc, k = cfg.num_core_layers, cfg.max_depth
    label = (1000 * np.arange(lc)[:, None, None] + 100 * np.arange(k)[None, :, None]
             + np.arange(t_max)[None, None, :]).astype(np.float32)
    core = np.broadcast_to(label[..., None, None], cache.core_k.shape)
    rng = np.random.default_rng(1)
    rand = lambda a: jnp.asarray(rng.standard_normal(a.shape).astype(np.float32))  # noqa: E731
    return cache.replace(core_k=jnp.asarray(core), core_v=jnp.asarray(-core),
                         prelude_k=rand(cache.prelude_k), prelude_v=rand(cache.prelude_v),
                         coda_k=rand(cache.coda_k), coda_v=rand(cache.coda_v))


@pytest.mark.parametrize("start,num_rows", [(5, 3), (10, 4), (0, 12)])
def test_complete_depths_copies_exactly(tiny, start, num_rows):
    """Depths >= executed take depth executed-1 on slots [start, start+num_rows) only (clamped at
    t_max); computed depths, other slots, prelude and coda are untouched (spec §12.2 test 1)."""
    cfg, t_max = tiny.cfg, 12
    cache = _labelled_cache(cfg, t_max)
    original = _buffers(cache)
    complete = jax.jit(KC.complete_depths, static_argnums=2)
    complete_traced_rows = jax.jit(KC.complete_depths)
    for executed in range(1, cfg.max_depth + 1):
        out = _buffers(complete(cache, jnp.int32(start), num_rows, jnp.int32(executed)))
        traced = _buffers(complete_traced_rows(cache, jnp.int32(start), jnp.int32(num_rows), jnp.int32(executed)))
        for name in out:
            np.testing.assert_array_equal(traced[name], out[name])
        for name in ("prelude_k", "prelude_v", "coda_k", "coda_v"):
            np.testing.assert_array_equal(out[name], original[name])
        want = original["core_k"].copy()
        hi = min(start + num_rows, t_max)
        for d in range(executed, cfg.max_depth):
            want[:, d, start:hi] = original["core_k"][:, executed - 1, start:hi]
        np.testing.assert_array_equal(out["core_k"], want)
        np.testing.assert_array_equal(out["core_v"], -want)
        # Spec §12.2 test 1 in words: window depth d holds min(d, executed-1) after completion.
        depth_of = (out["core_k"][0, :, start, 0, 0] - start) // 100
        assert list(depth_of) == [min(d, executed - 1) for d in range(cfg.max_depth)]


core_jit = jax.jit(model.core_pass, static_argnums=1, static_argnames="kv_len")


def test_functions_jit_with_traced_start_and_depth(tiny):
    """One compiled core_pass serves every depth and offset (decode's portable path relies on it)."""
    params, cfg = to_device(tiny.np_params, "fp32"), tiny.cfg
    cache = KC.init_cache(cfg, T_MAX, jnp.float32)
    h = model.embed(params, jnp.asarray(SEQ[:ROWS]))
    pos = jnp.arange(ROWS, dtype=jnp.int32)
    core_jit(params, cfg, h, pos, cache, jnp.int32(0), jnp.int32(0))
    compiled = core_jit._cache_size()
    for depth in range(cfg.max_depth):
        out, cache = core_jit(params, cfg, h, pos, cache, jnp.int32(depth % 2 * ROWS), jnp.int32(depth))
        assert out.shape == h.shape
    assert core_jit._cache_size() == compiled
    written = np.abs(np.asarray(cache.core_k)).sum(axis=(0, 3, 4))  # [K, T_max]
    assert (written[0, :ROWS] > 0).all() and (written[1, ROWS:2 * ROWS] > 0).all()
    assert (written[0, ROWS:] == 0).all() and (written[1, :ROWS] == 0).all()


def test_kv_len_limits_attention_without_changing_results(tiny):
    """Attending over only the first kv_len >= start+T slots equals attending over the whole buffer."""
    params, cfg = to_device(tiny.np_params, "fp32"), tiny.cfg
    cache = KC.init_cache(cfg, T_MAX, jnp.float32)
    start, kv_len = 4, 4 + ROWS
    cache = cache.replace(core_k=cache.core_k.at[:, :, kv_len:].set(7.0))  # garbage beyond kv_len
    h = model.embed(params, jnp.asarray(SEQ[:ROWS]))
    pos = jnp.arange(start, start + ROWS, dtype=jnp.int32)
    full, cache_full = core_jit(params, cfg, h, pos, cache, jnp.int32(start), jnp.int32(1))
    short, cache_short = core_jit(params, cfg, h, pos, cache, jnp.int32(start), jnp.int32(1), kv_len=kv_len)
    np.testing.assert_allclose(np.asarray(short), np.asarray(full), atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(cache_short.core_k), np.asarray(cache_full.core_k), atol=1e-6, rtol=1e-6)


def test_all_layer_readout_is_the_normalized_carry(tiny_checkpoints):
    """Empty coda (1.7B topology): the readout is exactly FinalNorm of the core output."""
    tiny = tiny_checkpoints["all_layer"]
    params, cfg = to_device(tiny.np_params, "fp32"), tiny.cfg
    cache = KC.init_cache(cfg, T_MAX, jnp.float32)
    h = model.embed(params, jnp.asarray(SEQ[:ROWS]))
    pos = jnp.arange(ROWS, dtype=jnp.int32)
    r, cache2 = model.readout(params, cfg, h, pos, cache, jnp.int32(0))
    np.testing.assert_array_equal(np.asarray(r), np.asarray(model.carry_norm(params, cfg, h)))
    assert cache2.coda_k.shape[0] == 0 and cache2.prelude_k.shape[0] == 0
