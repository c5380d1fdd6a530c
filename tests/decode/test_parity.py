"""Token-for-token, exit-depth-for-exit-depth parity of the portable JAX engine with the PyTorch
reference decoder (MODEL_AND_DECODING.md §8: FP32 must reproduce the reference exactly).

The default grid shares one set of compiled shapes per topology and mode (window 4; q and tau are
runtime inputs, so they cost no compilation); other window sizes and the full grid are slow.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from alodlm_jax.config import DecodeConfig

PROMPTS = ([4, 7, 9], [5, 9, 11, 13, 4, 8])
# Default grid: (mode, q, tau, max_new_tokens). The PyTorch reference is slow (pure Python, many
# small ops), so the default suite keeps to a few short runs; the full grid is slow.
DEFAULT_GRID = [("entropy", 0.5, 0.4, 16), ("entropy", 0.3, 2.0, 24), ("entropy", 1.0, 0.0, 8),
                ("left1", 0.5, 0.0, 12), ("left1", 1.0, 0.4, 8)]
FULL_Q = (0.0, 0.3, 0.5, 1.0)
FULL_TAU = (0.0, 0.4, 2.0)


def assert_same(out, ref: dict, label: str = "") -> None:
    """Our DecodeOutput against the reference's result dict."""
    assert out.token_ids == ref["token_ids"], label
    assert out.exit_depths == ref["exit_depths"], label
    np.testing.assert_allclose(out.first_pass_halt_probabilities,
                               ref["first_pass_halt_probabilities"], rtol=0, atol=1e-6,
                               err_msg=label)
    for key in ("outer_steps", "recurrent_passes", "loop_token_passes", "stop_reason",
                "prompt_tokens"):
        assert getattr(out, key) == ref[key], (label, key)


def run_both(tiny, decode: DecodeConfig, prompt, stop_ids=None):
    stops = tiny.ref.default_stop_ids() if stop_ids is None else stop_ids
    out = tiny.engine(decode, stop_ids=stops).generate(prompt)
    ref = tiny.ref.generate(prompt, decode, stop_ids=stops)
    assert_same(out, ref, f"{tiny.topology} {decode} {prompt}")
    return out, ref


def test_parity_window4(tiny):
    seen_multi_commit = seen_deep_exit = False
    for mode, q, tau, max_new in DEFAULT_GRID:
        decode = DecodeConfig(q=q, tau=tau, window_size=4, max_new_tokens=max_new, mode=mode)
        out, _ = run_both(tiny, decode, PROMPTS[1])
        seen_multi_commit |= len(out.token_ids) > out.outer_steps
        seen_deep_exit |= max(out.exit_depths) > 1
    # The fixture must exercise the interesting branches, or parity proves little.
    assert seen_deep_exit and seen_multi_commit


@pytest.mark.parametrize("mode,q,tau", [("entropy", 0.3, 2.0),
                                        pytest.param("left1", 1.0, 0.0, marks=pytest.mark.slow),
                                        pytest.param("entropy", 0.5, 0.4, marks=pytest.mark.slow)])
def test_parity_ends_on_stop_id(tiny, mode, q, tau):
    """Runs that end on a stop id: the stop token is excluded, stop_reason is "eos"."""
    decode = DecodeConfig(q=q, tau=tau, window_size=4, max_new_tokens=24, mode=mode)
    free = tiny.ref.generate(PROMPTS[1], decode, stop_ids=[])
    stop = free["token_ids"][len(free["token_ids"]) // 2]
    out, ref = run_both(tiny, decode, PROMPTS[1], stop_ids=[stop])
    assert ref["stop_reason"] == "eos"
    assert stop not in out.token_ids
    assert len(out.token_ids) < len(free["token_ids"])


@pytest.mark.parametrize("max_new", [1, 5, pytest.param(2, marks=pytest.mark.slow),
                                     pytest.param(7, marks=pytest.mark.slow)])
def test_parity_small_budgets_shrink_the_window(tiny, max_new):
    for q, tau in [(0.5, 2.0)]:
        decode = DecodeConfig(q=q, tau=tau, window_size=4, max_new_tokens=max_new)
        out, _ = run_both(tiny, decode, PROMPTS[0])
        assert len(out.token_ids) == max_new


def test_parity_explicit_position_penalty(sandwich):
    for penalty in (0.0, 0.3):
        decode = DecodeConfig(q=0.5, tau=2.0, window_size=4, max_new_tokens=12,
                              position_penalty=penalty)
        run_both(sandwich, decode, PROMPTS[1])


@pytest.mark.slow
@pytest.mark.parametrize("window_size", [1, 4, 16])
@pytest.mark.parametrize("mode", ["entropy", "left1"])
def test_parity_full_grid(tiny, window_size, mode):
    """q in {0, 0.3, 0.5, 1} x tau in {0, 0.4, 2} x windows {1, 4, 16}, both modes and topologies;
    runs ending on the budget, and (tau 2) on a stop id."""
    for q, tau in itertools.product(FULL_Q, FULL_TAU):
        decode = DecodeConfig(q=q, tau=tau, window_size=window_size, max_new_tokens=20, mode=mode)
        out, ref = run_both(tiny, decode, PROMPTS[1])
        assert ref["stop_reason"] == "length"
        if tau == 2.0:
            stop = ref["token_ids"][len(ref["token_ids"]) // 3]
            _, ref_eos = run_both(tiny, decode, PROMPTS[1], stop_ids=[stop])
            assert ref_eos["stop_reason"] == "eos"


@pytest.mark.slow
def test_bf16_tokens_match_the_bf16_reference(sandwich):
    """BF16 (§8): visible tokens are expected to match; exit depths may differ near thresholds."""
    from alodlm_jax.network.params import load_model
    from alodlm_jax.compare.torch_reference import TorchALoDLM

    cfg, params = load_model(str(sandwich.path), "bf16")
    ref = TorchALoDLM.from_checkpoint(sandwich.path, "bf16")
    same_depths = 0
    for q, tau in [(0.5, 2.0), (0.5, 0.4), (1.0, 0.4)]:
        decode = DecodeConfig(q=q, tau=tau, window_size=4, max_new_tokens=16)
        out = sandwich.engine(decode, cfg=cfg, params=params).generate(PROMPTS[1])
        theirs = ref.generate(PROMPTS[1], decode)
        assert out.token_ids == theirs["token_ids"]
        same_depths += out.exit_depths == theirs["exit_depths"]
    assert same_depths >= 2
