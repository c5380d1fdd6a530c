"""The per-layer math equals transformers' Qwen3 (one pass over the full stack, no looping)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import model
from alodlm_jax.network import layers as L
from alodlm_jax.network.params import to_device

IDS = np.array([1, 4, 7, 8, 9, 3, 3, 12, 40, 63, 2, 5, 17], np.int32)


def _hf_logits(hf_model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf_model(torch.tensor(ids[None], dtype=torch.long)).logits[0].numpy()


def test_backbone_matches_transformers_fp32(tiny):
    params = to_device(tiny.np_params, "fp32")
    got = np.asarray(jax.jit(model.backbone_logits, static_argnums=1)(params, tiny.cfg, jnp.asarray(IDS)))
    want = _hf_logits(tiny.hf_model, IDS)
    assert got.dtype == np.float32 and got.shape == want.shape
    err = np.abs(got - want).max()
    assert err < 1e-4, f"max abs diff {err}"
    # Honesty check: a perturbed norm weight must be visible at this tolerance.
    bad = jax.tree_util.tree_map(lambda x: x, params)
    bad["final_norm"] = params["final_norm"] * 1.01
    bad_logits = np.asarray(model.backbone_logits(bad, tiny.cfg, jnp.asarray(IDS)))
    assert np.abs(bad_logits - want).max() > 1e-3


def test_rms_norm_matches_torch_bf16():
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 16)).astype(np.float32) * 3
    w = (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)
    norm = Qwen3RMSNorm(16, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor(w))
        want = norm(torch.tensor(x).to(torch.bfloat16)).to(torch.float32).numpy()
    got = L.rms_norm(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), 1e-6)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)


@pytest.mark.parametrize("head_dim", [8, 128])
def test_rope_tables_match_transformers(head_dim):
    """Same tables up to a few fp32 ulps even at the longest context (XLA's and torch's pow may
    round one inverse frequency differently by an ulp)."""
    torch = pytest.importorskip("torch")
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = Qwen3Config(head_dim=head_dim, hidden_size=4 * head_dim, num_attention_heads=4, rope_theta=1e6)
    rotary = Qwen3RotaryEmbedding(cfg)
    pos = np.array([0, 1, 5, 77, 1000, 4097, 40959], np.int32)
    dummy = torch.zeros(1, dtype=torch.float32)
    cos_t, sin_t = rotary(dummy, torch.tensor(pos[None], dtype=torch.long))
    cos, sin = L.rope_tables(jnp.asarray(pos), head_dim, 1e6, jnp.float32)
    np.testing.assert_allclose(np.asarray(cos), cos_t[0].numpy(), atol=5e-6)
    np.testing.assert_allclose(np.asarray(sin), sin_t[0].numpy(), atol=5e-6)
    cos_b, _ = L.rope_tables(jnp.asarray(pos), head_dim, 1e6, jnp.bfloat16)
    assert cos_b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(cos_b), np.asarray(cos.astype(jnp.bfloat16)))
