"""Config loading and the §4.4 / §4.8 validation rules, each alone and several together."""

from __future__ import annotations

import dataclasses
import json

import pytest

from alodlm_convert.config import ModelConfig, load_model_config
from alodlm_convert.errors import CheckpointError


def _edit(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is _DELETE:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


_DELETE = object()


def _problems(model_dir, yaml_path=None) -> list[str]:
    with pytest.raises(CheckpointError) as info:
        load_model_config(model_dir, yaml_path)
    assert "\n" not in str(info.value)
    return info.value.problems


def test_reads_tiny_sandwich(sandwich_fp32):
    cfg = load_model_config(sandwich_fp32)
    assert cfg == ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=1e6,
                              rms_norm_eps=1e-6, max_position_embeddings=128, loop_start=1, loop_end=2,
                              max_depth=4, mask_token_id=3)
    assert (cfg.num_prelude_layers, cfg.num_core_layers, cfg.num_coda_layers) == (1, 1, 1)
    assert [cfg.layer_group(i) for i in range(3)] == [("prelude", 0), ("core", 0), ("coda", 0)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loop_start = 0


def test_all_layer_topology_has_empty_prelude_and_coda(all_layer_bf16_sharded):
    cfg = load_model_config(all_layer_bf16_sharded)
    assert (cfg.num_prelude_layers, cfg.num_core_layers, cfg.num_coda_layers) == (0, 2, 0)


def test_rope_theta_top_level_and_head_dim_default(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    _edit(d / "config.json", rope_parameters=_DELETE, rope_theta=5e5, head_dim=_DELETE, rope_scaling=None)
    cfg = load_model_config(d)
    assert cfg.rope_theta == 5e5 and cfg.head_dim == 32 // 4


def test_rope_theta_inside_rope_scaling(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    _edit(d / "config.json", rope_parameters=_DELETE, rope_scaling={"rope_type": "default", "rope_theta": 2e6})
    assert load_model_config(d).rope_theta == 2e6


@pytest.mark.parametrize("changes, needle", [
    (dict(model_type="llama"), "config.json: model_type"),
    (dict(tie_word_embeddings=True), "config.json: tie_word_embeddings"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), "non-default RoPE 'yarn'"),
    (dict(rope_parameters={"rope_type": "default", "factor": 2.0, "rope_theta": 1e6}), "RoPE scaling"),
    (dict(rope_parameters=_DELETE), "rope_theta: missing"),
    (dict(rope_theta=1e4), "rope_theta: conflicting"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(use_sliding_window=True), "use_sliding_window"),
    (dict(hidden_size=0), "config.json: hidden_size"),
    (dict(vocab_size=_DELETE), "config.json: vocab_size: missing"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
])
def test_each_backbone_rule(sandwich_fp32, copy_of, changes, needle):
    d = copy_of(sandwich_fp32)
    _edit(d / "config.json", **changes)
    problems = _problems(d)
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize("changes, needle", [
    (dict(loop_start=True), "alodlm_config.json: loop_start: must be an integer"),
    (dict(loop_end=2.0), "alodlm_config.json: loop_end: must be an integer"),
    (dict(loop_start=2, loop_end=2), "0 <= loop_start < loop_end <= num_hidden_layers"),
    (dict(loop_start=-1), "0 <= loop_start"),
    (dict(loop_end=4), "0 <= loop_start < loop_end <= num_hidden_layers"),
    (dict(max_depth=1, gate_init_pi=[1.0]), "max_depth: must be >= 2"),
    (dict(max_depth=False), "max_depth: must be an integer"),
    (dict(gate_init_pi=[0.5, 0.5]), "gate_init_pi: length 2 != max_depth 4"),
    (dict(gate_init_pi=[0.5, 0.5, 0.5, -0.5]), "gate_init_pi: every entry must be positive"),
    (dict(gate_init_pi=[0.3, 0.3, 0.3, 0.3]), "gate_init_pi: must sum to 1"),
    (dict(mask_token_id=64), "mask_token_id: must be in [0, vocab_size=64)"),
    (dict(mask_token_id=-1), "mask_token_id"),
    (dict(surprise=1), "unknown field(s) ['surprise']"),
])
def test_each_recurrence_rule(sandwich_fp32, copy_of, changes, needle):
    d = copy_of(sandwich_fp32)
    _edit(d / "alodlm_config.json", **changes)
    problems = _problems(d)
    assert any(needle in p for p in problems), problems


def test_several_problems_reported_together(sandwich_fp32, copy_of):
    d = copy_of(sandwich_fp32)
    _edit(d / "config.json", model_type="llama", tie_word_embeddings=True)
    _edit(d / "alodlm_config.json", loop_start=True, max_depth=1, mask_token_id=99)
    problems = _problems(d)
    joined = " | ".join(problems)
    for needle in ("model_type", "tie_word_embeddings", "loop_start", "max_depth", "mask_token_id"):
        assert needle in joined
    assert len(problems) >= 5


def test_missing_recurrence_file_then_yaml(sandwich_fp32, copy_of, tmp_path):
    d = copy_of(sandwich_fp32)
    (d / "alodlm_config.json").unlink()
    assert any("alodlm_config.json: missing" in p for p in _problems(d))
    yaml_path = tmp_path / "train.yaml"
    yaml_path.write_text("model:\n  loop_start: 0\n  loop_end: 3\n  max_depth: 3\n  mask_token_id: 5\n"
                         "  gate_init_pi: [0.5, 0.25, 0.25]\ntrain:\n  lr: 1.0\n")
    cfg = load_model_config(d, yaml_path)
    assert (cfg.loop_start, cfg.loop_end, cfg.max_depth, cfg.mask_token_id) == (0, 3, 3, 5)


def test_yaml_problems_name_the_yaml_file(sandwich_fp32, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  loop_start: 2\n  loop_end: 1\n  mask_token_id: 4\n")
    problems = _problems(sandwich_fp32, bad)
    assert any(p.startswith(str(bad)) and "loop_end" in p for p in problems), problems
    nomodel = tmp_path / "nomodel.yaml"
    nomodel.write_text("train: {}\n")
    assert any("model: missing" in p for p in _problems(sandwich_fp32, nomodel))


def test_missing_config_json_still_checks_recurrence(tmp_path):
    (tmp_path / "alodlm_config.json").write_text(json.dumps({"loop_start": True, "loop_end": 1}))
    problems = _problems(tmp_path)
    assert any(p.startswith("config.json: missing") for p in problems)
    assert any(p.startswith("alodlm_config.json: loop_start: must be an integer") for p in problems)


def test_direct_construction_validates():
    with pytest.raises(CheckpointError, match="loop_start"):
        ModelConfig(vocab_size=8, hidden_size=4, intermediate_size=8, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=2, rope_theta=1e6,
                    rms_norm_eps=1e-6, max_position_embeddings=16, loop_start=2, loop_end=1,
                    max_depth=4, mask_token_id=3)
