"""The inference properties of MODEL_AND_DECODING.md §12.2 on the portable JAX engine."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import model as M
from alodlm_jax.network import cache as KC
from alodlm_jax.config import DecodeConfig

from .conftest import with_max_depth
from .test_parity import assert_same

PROMPT = [4, 7, 9]


def test_requests_are_independent_and_respect_the_budget(sandwich):
    """§12.2.2: the same request decoded twice around unrelated requests gives the same result."""
    decode = DecodeConfig(q=0.5, tau=0.1, max_new_tokens=8, window_size=4)
    engine = sandwich.engine(decode)
    first = engine.generate(PROMPT)
    engine.generate([5, 9, 11, 13, 4, 8, 12, 10, 9, 7, 6])  # longer prompt, same cache buffer
    sandwich.engine(DecodeConfig(q=1.0, tau=0.0, max_new_tokens=8, window_size=4,
                                 mode="left1")).generate([6, 10, 12])
    again = engine.generate(PROMPT)
    for key in ("token_ids", "exit_depths", "first_pass_halt_probabilities", "outer_steps",
                "recurrent_passes", "loop_token_passes", "stop_reason"):
        assert getattr(again, key) == getattr(first, key), key
    for out in (first, again):
        assert len(out.token_ids) <= 8
        assert len(out.exit_depths) == len(out.token_ids) == len(out.first_pass_halt_probabilities)
        assert out.wall_seconds > 0 and out.wall_seconds >= out.prefill_seconds > 0


def test_q_controls_executed_recurrence(tiny):
    """§12.2.3: tau 0, window 4, 6 tokens: q=0 -> one pass per window, q=1 -> all K passes."""
    zero = tiny.engine(DecodeConfig(q=0.0, tau=0.0, window_size=4, max_new_tokens=6)).generate(PROMPT)
    one = tiny.engine(DecodeConfig(q=1.0, tau=0.0, window_size=4, max_new_tokens=6)).generate(PROMPT)
    assert zero.recurrent_passes == zero.outer_steps > 0
    assert one.recurrent_passes == tiny.cfg.max_depth * one.outer_steps > 0


def _fresh_forward_cache(params, cfg, ids):
    """A window forward with an empty cache over ``ids`` at positions 0..len-1 (one pass, K = 1)."""
    t = len(ids)
    cache = KC.init_cache(cfg, t, jnp.float32)
    positions = jnp.arange(t, dtype=jnp.int32)
    start = jnp.int32(0)
    h, cache = M.prelude(params, cfg, M.embed(params, jnp.asarray(ids, jnp.int32)), positions, cache, start)
    h, cache = M.core_pass(params, cfg, h, positions, cache, start, jnp.int32(0))
    _, cache = M.readout(params, cfg, h, positions, cache, start)
    return cache


@pytest.mark.parametrize("topology", ["sandwich", pytest.param("all_layer", marks=pytest.mark.slow)])
def test_max_depth_one_cache_equals_an_observed_token_forward(tiny_models, topology):
    """§12.2.4: K forced to 1, left1, q 0, window 4: the persisted prefix cache equals a fresh
    forward over the cached tokens (prompt + committed tokens), compared after 4, 6 and 8 tokens."""
    tiny = tiny_models[topology]
    cfg1 = with_max_depth(tiny.cfg, 1)
    params1 = dict(tiny.params, gate=dict(tiny.params["gate"],
                                          depth_bias=tiny.params["gate"]["depth_bias"][:1]))
    compared = 0
    for max_new in (4, 6, 8):
        decode = DecodeConfig(q=0.0, tau=0.4, window_size=4, max_new_tokens=max_new, mode="left1")
        engine = tiny.engine(decode, cfg=cfg1, params=params1)
        out = engine.generate(PROMPT)
        assert len(out.token_ids) == max_new
        length = engine.last_cache_len
        assert length > 3
        sequence = PROMPT + out.token_ids[: length - len(PROMPT)]
        fresh = _fresh_forward_cache(params1, cfg1, sequence)
        cache = engine._cache
        for name in ("prelude_k", "prelude_v", "core_k", "core_v", "coda_k", "coda_v"):
            got = np.asarray(getattr(cache, name))
            want = np.asarray(getattr(fresh, name))
            slot_axis = 2 if name.startswith("core") else 1
            got = np.take(got, np.arange(length), axis=slot_axis)
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5, err_msg=name)
        compared += 1
        # ... and the K = 1 run still matches the reference decoder.
        saved = tiny.ref.max_depth
        tiny.ref.max_depth = 1
        try:
            assert_same(out, tiny.ref.generate(PROMPT, decode))
        finally:
            tiny.ref.max_depth = saved
    assert compared >= 3


def _identity_layers(params):
    """Every decoder layer becomes the identity (zero attention output and MLP down projection)."""
    out = dict(params)
    for group in ("prelude", "core", "coda"):
        stack = dict(params[group])
        stack["o"] = jnp.zeros_like(stack["o"])
        stack["down_proj"] = jnp.zeros_like(stack["down_proj"])
        out[group] = stack
    return out


def test_committed_token_is_injected_once_then_evolves_as_a_latent(tiny):
    """§12.2.5 (identity layers): with left1, q 1, tau 0 and 4 masks, the mask committed at pass
    s enters pass s+1 as its raw embedding and pass s+2 as FinalNorm of that (a latent)."""
    params = _identity_layers(tiny.params)
    decode = DecodeConfig(q=1.0, tau=0.0, window_size=4, max_new_tokens=4, mode="left1")
    events = []
    out = tiny.engine(decode, params=params).generate(PROMPT, trace=lambda e, p: events.append((e, p)))
    first_window = []
    for event, payload in events:
        if event == "window" and first_window:
            break
        if event == "core_input":
            first_window.append(payload["h"])
    assert len(first_window) == 4  # the core ran 4 times
    embed = np.asarray(params["embed"])
    norm = lambda x: np.asarray(M.carry_norm(params, tiny.cfg, jnp.asarray(x)))  # noqa: E731
    toks = out.token_ids  # left1 commits window index s at pass s
    mask_row = embed[tiny.cfg.mask_token_id]
    np.testing.assert_array_equal(first_window[0][0], mask_row)
    for s in range(1, 4):
        injected = first_window[s][s - 1]
        np.testing.assert_array_equal(injected, embed[toks[s - 1]])  # raw embedding, exactly
        if s >= 2:  # the pass after: normalized latent, not the embedding again
            row = first_window[s][s - 2]
            assert not np.array_equal(row, embed[toks[s - 2]])
            np.testing.assert_allclose(row, norm(first_window[s - 1][s - 2]), atol=1e-6, rtol=1e-6)


def test_core_inputs_match_the_reference_trace(tiny):
    """Every pass's core input (after injection) equals the reference's, window by window."""
    decode = DecodeConfig(q=1.0, tau=0.4, window_size=4, max_new_tokens=6)
    ours, theirs = [], []
    tiny.engine(decode).generate(PROMPT, trace=lambda e, p: ours.append((e, p)))
    tiny.ref.generate(PROMPT, decode, trace=lambda e, p: theirs.append((e, p)))
    windows = [p for e, p in ours if e == "window"]
    ref_windows = [p for e, p in theirs if e == "window"]
    assert [(w["ids"], w["positions"]) for w in windows] == [
        (w["ids"], w["positions"]) for w in ref_windows]
    inputs = [p for e, p in ours if e == "core_input"]
    ref_inputs = [p for e, p in theirs if e == "core_input"]
    assert len(inputs) == len(ref_inputs) > len(windows)
    for a, b in zip(inputs, ref_inputs):
        assert a["depth"] == b["depth"]
        np.testing.assert_allclose(a["h"], b["h"].numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(q=1.1), dict(tau=math.nan), dict(window_size=0),
                                    dict(max_new_tokens=0), dict(mode="greedy"),
                                    dict(position_penalty=-1.0)])
def test_invalid_configuration_raises(kwargs):
    with pytest.raises(ValueError):
        DecodeConfig(**kwargs)


def test_invalid_requests_raise(sandwich):
    engine = sandwich.engine(DecodeConfig(max_new_tokens=40, window_size=4))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.generate([4] * 100)  # 100 + 40 > 128
    with pytest.raises(ValueError):
        engine.generate([])
    with pytest.raises(ValueError):
        engine.generate([4, 64])
    with pytest.raises(ValueError):
        engine.generate([-1])


def test_result_dict_has_the_reference_keys(sandwich):
    from alodlm_jax.decode.result import RESULT_KEYS, result_dict

    out = sandwich.engine(DecodeConfig(q=0.5, tau=2.0, window_size=4, max_new_tokens=6)).generate(PROMPT)
    result = result_dict(out, "text")
    assert tuple(result) == RESULT_KEYS
    assert result["generated_tokens"] == len(result["token_ids"])
    assert result["tokens_per_second"] == result["generated_tokens"] / result["wall_seconds"]
    assert result["mean_exit_depth"] == sum(out.exit_depths) / len(out.exit_depths)
    assert all(isinstance(x, float) for x in result["first_pass_halt_probabilities"])
    assert all(float(np.float32(x)) == x for x in result["first_pass_halt_probabilities"])
    # Token-layer calls (§9.2) are tracked outside the result dict.
    work = out.work
    cfg = sandwich.cfg
    assert work.forward_calls == out.outer_steps + 1
    assert work.loop_block_passes == out.recurrent_passes + cfg.max_depth
    per_pass = cfg.num_core_layers + cfg.num_coda_layers
    assert work.token_layer_calls == (
        len(PROMPT) * (cfg.num_prelude_layers + cfg.max_depth * per_pass)
        + (work.stream_tokens - len(PROMPT)) * cfg.num_prelude_layers
        + out.loop_token_passes * per_pass)
