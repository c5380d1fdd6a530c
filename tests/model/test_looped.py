"""Looped forward parity: every depth's readout logits and hazards against PyTorch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import model
from alodlm_jax.network.params import to_device

IDS = np.array([1, 4, 7, 8, 9, 3, 3, 12, 40, 63, 2, 5, 17, 3, 22], np.int32)

looped = jax.jit(model.looped_forward, static_argnums=1)


@functools.lru_cache(maxsize=None)
def _torch_reference(path: str, dtype: str):
    reference = pytest.importorskip("alodlm_jax.compare.torch_reference")
    return reference.TorchALoDLM.from_checkpoint(path, dtype)


def _torch_looped(tiny, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    ref = _torch_reference(str(tiny.path), dtype)
    logits, hazards = ref.looped_forward([int(i) for i in IDS])
    return logits.float().numpy(), hazards.float().numpy()


def test_looped_shapes_and_dtypes(tiny):
    params = to_device(tiny.np_params, "fp32")
    logits, hazards = looped(params, tiny.cfg, jnp.asarray(IDS))
    k, t, v = tiny.cfg.max_depth, len(IDS), tiny.cfg.vocab_size
    assert logits.shape == (k, t, v) and hazards.shape == (k, t)
    assert logits.dtype == jnp.float32 and hazards.dtype == jnp.float32
    assert ((hazards > 0) & (hazards < 1)).all()


def test_all_layer_passes_are_the_backbone_on_the_normalized_carry(tiny_checkpoints):
    """Independent of the torch reference: with every layer in the core (empty coda) and no masks,
    pass s+1 is transformers' Qwen3 run on ``inputs_embeds = r_s`` (the normalized carry), pass 0 on
    the token embeddings. Hazards are the gate applied to the same final hidden states."""
    import torch

    tiny = tiny_checkpoints["all_layer"]
    params = to_device(tiny.np_params, "fp32")
    logits, hazards = (np.asarray(x) for x in looped(params, tiny.cfg, jnp.asarray(IDS)))
    gate = tiny.np_params["gate"]
    with torch.no_grad():
        embeds = tiny.hf_model.model.embed_tokens(torch.tensor(IDS[None], dtype=torch.long))
        for depth in range(tiny.cfg.max_depth):
            out = tiny.hf_model(inputs_embeds=embeds, output_hidden_states=True)
            r = out.hidden_states[-1][0].numpy()  # after model.norm
            np.testing.assert_allclose(logits[depth], out.logits[0].numpy(), atol=1e-4, err_msg=f"depth {depth}")
            want_h = 1 / (1 + np.exp(-(r @ gate["weight"] + gate["bias"] + gate["depth_bias"][depth])))
            np.testing.assert_allclose(hazards[depth], want_h, atol=1e-5, err_msg=f"depth {depth}")
            embeds = out.hidden_states[-1]
    assert np.abs(logits[1] - logits[0]).max() > 1e-2  # the passes really differ


def test_looped_matches_torch_reference_fp32(tiny):
    want_logits, want_hazards = _torch_looped(tiny, "fp32")
    params = to_device(tiny.np_params, "fp32")
    logits, hazards = (np.asarray(x) for x in looped(params, tiny.cfg, jnp.asarray(IDS)))
    assert logits.shape == want_logits.shape and hazards.shape == want_hazards.shape
    for depth in range(tiny.cfg.max_depth):
        err_l = np.abs(logits[depth] - want_logits[depth]).max()
        err_h = np.abs(hazards[depth] - want_hazards[depth]).max()
        print(f"fp32 {tiny.topology} depth {depth}: max|dlogits|={err_l:.2e} max|dhazard|={err_h:.2e}")
        assert err_l < 1e-4 and err_h < 1e-4, (depth, err_l, err_h)


def test_looped_bf16_close_to_torch_reference(tiny):
    """bf16 cannot match bit for bit (different GEMM orders); report agreement, assert sanity."""
    want_logits, want_hazards = _torch_looped(tiny, "bf16")
    params = to_device(tiny.np_params, "bf16")
    assert params["core"]["q"].dtype == jnp.bfloat16 and params["gate"]["weight"].dtype == jnp.float32
    logits, hazards = (np.asarray(x) for x in looped(params, tiny.cfg, jnp.asarray(IDS)))
    top1 = (logits.argmax(-1) == want_logits.argmax(-1)).mean()
    err_l = np.abs(logits - want_logits).max()
    err_h = np.abs(hazards - want_hazards).max()
    print(f"bf16 {tiny.topology}: top-1 agreement {top1:.3f}, max|dlogits|={err_l:.3e}, max|dhazard|={err_h:.3e}")
    assert top1 >= 0.9
    assert err_l < 0.25 * np.abs(want_logits).max() and err_h < 0.05
