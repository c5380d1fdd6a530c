"""load_params on Hugging Face checkpoints: layout, dtypes, stacking, gate; checkpoint validation."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from alodlm_convert.errors import CheckpointError
from alodlm_convert.load import load_params
from alodlm_convert.safetensors_io import write_safetensors
from alodlm_convert.torch_pickle import read_state_dict

BF16 = np.dtype(ml_dtypes.bfloat16)


def _hf_tensors(model_dir) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _expected_layer(hf, layer, cfg):
    p = f"model.layers.{layer}."
    H, nq, nkv, dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    return {
        "input_norm": hf[p + "input_layernorm.weight"],
        "q": hf[p + "self_attn.q_proj.weight"].T.reshape(H, nq, dh),
        "k": hf[p + "self_attn.k_proj.weight"].T.reshape(H, nkv, dh),
        "v": hf[p + "self_attn.v_proj.weight"].T.reshape(H, nkv, dh),
        "o": hf[p + "self_attn.o_proj.weight"].T.reshape(nq, dh, H),
        "q_norm": hf[p + "self_attn.q_norm.weight"],
        "k_norm": hf[p + "self_attn.k_norm.weight"],
        "post_norm": hf[p + "post_attention_layernorm.weight"],
        "gate_proj": hf[p + "mlp.gate_proj.weight"].T,
        "up_proj": hf[p + "mlp.up_proj.weight"].T,
        "down_proj": hf[p + "mlp.down_proj.weight"].T,
    }


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _assert_layout(model_dir, cfg, params, dtype):
    hf = _hf_tensors(model_dir)
    cast = lambda a: a.astype(dtype)
    assert np.array_equal(_bits(params["embed"]), _bits(cast(hf["model.embed_tokens.weight"])))
    assert np.array_equal(_bits(params["lm_head"]), _bits(cast(hf["lm_head.weight"].T)))
    assert np.array_equal(_bits(params["final_norm"]), _bits(cast(hf["model.norm.weight"])))
    for layer in range(cfg.num_hidden_layers):
        group, index = cfg.layer_group(layer)
        for key, want in _expected_layer(hf, layer, cfg).items():
            got = params[group][key][index]
            assert got.dtype == dtype
            assert np.array_equal(_bits(got), _bits(cast(want))), (layer, key)


def test_sandwich_keep_is_bit_exact_and_stacked(sandwich_fp32):
    cfg, params = load_params(sandwich_fp32, "keep")
    _assert_layout(sandwich_fp32, cfg, params, np.dtype(np.float32))
    for group in ("prelude", "core", "coda"):
        assert params[group]["q"].shape == (1, 32, 4, 8)
        assert params[group]["o"].shape == (1, 4, 8, 32)
        assert params[group]["down_proj"].shape == (1, 64, 32)


def test_sharded_bf16_keep_fp32_and_bf16(all_layer_bf16_sharded):
    for dtype, want in (("keep", BF16), ("bf16", BF16), ("fp32", np.dtype(np.float32))):
        cfg, params = load_params(all_layer_bf16_sharded, dtype)
        _assert_layout(all_layer_bf16_sharded, cfg, params, want)
    # Empty groups: zero-length stacks with the right trailing shapes.
    assert params["prelude"]["q"].shape == (0, 32, 4, 8)
    assert params["coda"]["gate_proj"].shape == (0, 32, 64)
    assert params["core"]["k"].shape == (2, 32, 2, 8)


def test_fp32_to_bf16_rounds_like_ml_dtypes(sandwich_fp32):
    cfg, params = load_params(sandwich_fp32, "bf16")
    _assert_layout(sandwich_fp32, cfg, params, BF16)


@pytest.mark.parametrize("fixture", ["sandwich_fp32", "all_layer_bf16_sharded"])
def test_gate_is_fp32_and_exact(request, fixture):
    model_dir = request.getfixturevalue(fixture)
    state = read_state_dict(model_dir / "exit_gate.pt")
    for dtype in ("keep", "bf16"):
        _, params = load_params(model_dir, dtype)
        gate = params["gate"]
        assert all(v.dtype == np.float32 for v in gate.values())
        assert gate["weight"].shape == (32,) and gate["bias"].shape == () and gate["depth_bias"].shape == (4,)
        assert np.array_equal(gate["weight"], state["net.weight"][0].astype(np.float32))
        assert gate["bias"] == np.float32(-0.25)
        assert np.array_equal(gate["depth_bias"], np.array([-0.7, 0.2, 0.8, 0.0], np.float32).astype(
            state["depth_bias"].dtype).astype(np.float32))


def test_learned_gate_values_survive_exactly(sandwich_bf16, copy_of):
    """§12.3.2: weight 0.125, bias -0.25, depth_bias [-0.7, 0.2, 0.8, 0] restored exactly."""
    torch = pytest.importorskip("torch")
    d = copy_of(sandwich_bf16)
    gate = {"net.weight": torch.full((1, 32), 0.125, dtype=torch.bfloat16),
            "net.bias": torch.tensor([-0.25], dtype=torch.bfloat16),
            "depth_bias": torch.tensor([-0.7, 0.2, 0.8, 0.0], dtype=torch.bfloat16)}
    torch.save(gate, d / "exit_gate.pt")
    _, params = load_params(d, "keep")
    assert np.array_equal(params["gate"]["weight"], np.full(32, 0.125, np.float32))
    assert params["gate"]["bias"] == np.float32(-0.25)
    assert np.array_equal(params["gate"]["depth_bias"], gate["depth_bias"].float().numpy())


def _problems(model_dir, dtype="keep"):
    with pytest.raises(CheckpointError) as info:
        load_params(model_dir, dtype)
    assert "\n" not in str(info.value)
    return info.value.problems


def _save_gate(path, **tensors):
    torch = pytest.importorskip("torch")
    torch.save({k: torch.tensor(v) for k, v in tensors.items()}, path)


def test_gate_key_and_shape_errors(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    _save_gate(d / "exit_gate.pt", **{"net.weight": np.zeros((1, 31), np.float32),
                                      "depth_bias": np.zeros(4, np.float32),
                                      "extra": np.zeros(1, np.float32)})
    joined = " | ".join(_problems(d))
    assert "missing key(s) ['net.bias']" in joined
    assert "unexpected key(s) ['extra']" in joined
    assert "net.weight: shape [1, 31] != expected [1, 32]" in joined
    _save_gate(d / "exit_gate.pt", **{"net.0.weight": np.zeros((8, 32), np.float32),
                                      "net.2.weight": np.zeros((1, 8), np.float32)})
    assert any("legacy MLP gate layout" in p for p in _problems(d))
    _save_gate(d / "exit_gate.pt", **{"net.weight": np.zeros((1, 32), np.float32),
                                      "net.bias": np.zeros(1, np.float32),
                                      "depth_bias": np.zeros(3, np.float32)})
    assert any("depth_bias: shape [3] != expected [4]" in p for p in _problems(d))
    (d / "exit_gate.pt").unlink()
    assert any("exit_gate.pt: missing" in p for p in _problems(d))


def test_missing_unexpected_and_misshapen_tensors_together(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float32)
    tensors["model.layers.2.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
    write_safetensors(d / "model.safetensors", tensors)
    joined = " | ".join(_problems(d))
    assert "missing tensor 'model.layers.1.mlp.up_proj.weight'" in joined
    assert "unexpected tensor(s) 'model.layers.0.self_attn.q_proj.bias'" in joined
    assert "model.layers.2.self_attn.k_proj.weight': shape [8, 32] != expected [16, 32]" in joined


def test_tied_embeddings_checkpoint_rejected(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    tensors = load_file(d / "model.safetensors")
    del tensors["lm_head.weight"]
    write_safetensors(d / "model.safetensors", tensors)
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    assert any("tie_word_embeddings" in p for p in _problems(d))


def test_mixed_dtypes_need_explicit_dtype(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    tensors = load_file(d / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.float16)
    write_safetensors(d / "model.safetensors", tensors)
    assert any("--dtype keep needs one backbone dtype" in p for p in _problems(d))
    cfg, params = load_params(d, "fp32")
    assert params["final_norm"].dtype == np.float32


def test_index_pointing_to_missing_shard(all_layer_bf16_sharded, copy_of):
    d = copy_of(all_layer_bf16_sharded)
    victim = sorted(d.glob("model-*.safetensors"))[0]
    victim.unlink()
    assert any(p.startswith(victim.name) and "missing" in p for p in _problems(d))


def test_bad_dtype_argument(sandwich_fp32):
    with pytest.raises(CheckpointError, match="dtype"):
        load_params(sandwich_fp32, "fp8")


def test_no_weight_files_is_one_problem_not_hundreds(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    (d / "model.safetensors").unlink()
    problems = _problems(d)
    assert problems == ["model.safetensors: missing (and no model.safetensors.index.json); "
                        "safetensors files present: none"]


def test_many_missing_tensors_are_summarised(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    tensors = load_file(d / "model.safetensors")
    write_safetensors(d / "model.safetensors", {k: v for k, v in tensors.items() if "layers.2." not in k})
    (problem,) = _problems(d)
    assert problem.startswith("missing tensors 'model.layers.2.") and "and 3 more" in problem
