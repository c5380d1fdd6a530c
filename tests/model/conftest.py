"""Shared fixtures for the model tests: tiny checkpoints of both topologies, built once per session.

Params come from ``alodlm_convert.load.load_params`` (the production path);
:func:`params_from_state_dict` is an independent mapping of a transformers state dict to our layout,
written here from DESIGN.md's pytree description, used to cross-check the converter.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

TOPOLOGIES = ("sandwich", "all_layer")


def _np(t) -> np.ndarray:
    import torch

    return t.detach().to(torch.float32).cpu().numpy()


def params_from_state_dict(state: dict, gate: dict, cfg) -> dict:
    """HF ``Qwen3ForCausalLM`` state dict + ``exit_gate.pt`` dict -> numpy fp32 params pytree."""
    h, n_q, n_kv, d_h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def layer(i: int) -> dict:
        p = f"model.layers.{i}."
        w = lambda name: _np(state[p + name])  # noqa: E731
        return {
            "input_norm": w("input_layernorm.weight"),
            "q": w("self_attn.q_proj.weight").T.reshape(h, n_q, d_h),
            "k": w("self_attn.k_proj.weight").T.reshape(h, n_kv, d_h),
            "v": w("self_attn.v_proj.weight").T.reshape(h, n_kv, d_h),
            "o": w("self_attn.o_proj.weight").T.reshape(n_q, d_h, h),
            "q_norm": w("self_attn.q_norm.weight"),
            "k_norm": w("self_attn.k_norm.weight"),
            "post_norm": w("post_attention_layernorm.weight"),
            "gate_proj": w("mlp.gate_proj.weight").T,
            "up_proj": w("mlp.up_proj.weight").T,
            "down_proj": w("mlp.down_proj.weight").T,
        }

    def stack(lo: int, hi: int) -> dict:
        layers = [layer(i) for i in range(lo, hi)]
        shapes = {k: v.shape for k, v in layer(0).items()}
        return {k: (np.stack([l[k] for l in layers]) if layers else np.zeros((0,) + shapes[k], np.float32))
                for k in shapes}

    return {
        "embed": _np(state["model.embed_tokens.weight"]),
        "final_norm": _np(state["model.norm.weight"]),
        "lm_head": _np(state["lm_head.weight"]).T.copy(),
        "gate": {
            "weight": _np(gate["net.weight"]).reshape(h),
            "bias": _np(gate["net.bias"]).reshape(()),
            "depth_bias": _np(gate["depth_bias"]).reshape(cfg.max_depth),
        },
        "prelude": stack(0, cfg.loop_start),
        "core": stack(cfg.loop_start, cfg.loop_end),
        "coda": stack(cfg.loop_end, cfg.num_hidden_layers),
    }


@dataclasses.dataclass
class Tiny:
    """One tiny checkpoint: its directory, config, numpy fp32 params and the transformers model."""

    topology: str
    path: pathlib.Path
    cfg: object
    np_params: dict
    hf_model: object


def _load_tiny(path: pathlib.Path, topology: str) -> Tiny:
    import torch
    from transformers import Qwen3ForCausalLM

    from alodlm_convert.load import load_params

    cfg, np_params = load_params(path, "fp32")
    hf = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return Tiny(topology, path, cfg, np_params, hf)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Tiny]:
    """Both tiny topologies in fp32, built once per session."""
    pytest.importorskip("torch")
    from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint

    root = tmp_path_factory.mktemp("model_tiny")
    out = {}
    for topology in TOPOLOGIES:
        # A peaked head makes top-1 comparisons meaningful.
        spec = TinySpec.for_topology(topology, lm_head_scale=4.0)
        path = build_tiny_checkpoint(root / topology, spec)
        out[topology] = _load_tiny(path, topology)
    return out


@pytest.fixture(params=TOPOLOGIES)
def tiny(request, tiny_checkpoints) -> Tiny:
    return tiny_checkpoints[request.param]
