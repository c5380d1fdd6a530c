"""convert_checkpoint: layout, bit-exactness, round trip, atomicity, manifest, side files."""

from __future__ import annotations

import hashlib
import json
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from alodlm_convert.convert import convert_checkpoint
from alodlm_convert.errors import CheckpointError
from alodlm_convert.load import load_params
from alodlm_convert.safetensors_io import SafetensorsFile, write_safetensors

BF16 = np.dtype(ml_dtypes.bfloat16)


def _leaves(params, prefix=""):
    for key, value in params.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def _assert_params_identical(a, b):
    la, lb = dict(_leaves(a)), dict(_leaves(b))
    assert la.keys() == lb.keys()
    for key in la:
        x, y = la[key], lb[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert np.array_equal(np.ascontiguousarray(x).reshape(-1).view(np.uint8),
                              np.ascontiguousarray(y).reshape(-1).view(np.uint8)), key


@pytest.mark.parametrize("fixture", ["sandwich_fp32", "all_layer_bf16_sharded"])
@pytest.mark.parametrize("dtype", ["keep", "fp32", "bf16"])
def test_round_trip_equals_direct_load(request, tmp_path, fixture, dtype):
    src = request.getfixturevalue(fixture)
    out = convert_checkpoint(src, tmp_path / "converted", dtype)
    cfg_a, direct = load_params(src, dtype)
    cfg_b, converted = load_params(out, "keep")
    assert cfg_a == cfg_b
    _assert_params_identical(direct, converted)
    # Loading a converted directory with a dtype conversion works too.
    _, as_fp32 = load_params(out, "fp32")
    assert as_fp32["core"]["q"].dtype == np.float32


@pytest.mark.parametrize("fixture", ["sandwich_fp32", "all_layer_bf16_sharded"])
@pytest.mark.parametrize("dtype", ["keep", "fp32", "bf16"])
def test_small_blocks_stream_large_tensors_identically(request, tmp_path, fixture, dtype):
    """Row-block streaming (the path the big embedding and LM head take) gives the same file."""
    src = request.getfixturevalue(fixture)
    whole = convert_checkpoint(src, tmp_path / "whole", dtype)
    blocks = convert_checkpoint(src, tmp_path / "blocks", dtype, block_bytes=200)
    assert (whole / "params.safetensors").read_bytes() == (blocks / "params.safetensors").read_bytes()
    _, direct = load_params(src, dtype)
    _assert_params_identical(direct, load_params(blocks)[1])
    manifest = json.loads((blocks / "manifest.json").read_text())
    for entry in manifest["source"]["files"]:
        data = (src / entry["name"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), entry["name"]


def test_keep_is_bit_exact_against_source_tensors(all_layer_bf16_sharded, tmp_path):
    out = convert_checkpoint(all_layer_bf16_sharded, tmp_path / "c", "keep")
    ours = SafetensorsFile(out / "params.safetensors")
    src = {}
    for f in all_layer_bf16_sharded.glob("*.safetensors"):
        sf = SafetensorsFile(f)
        src.update({n: sf.read(n) for n in sf.tensors})
    pairs = {"embed": src["model.embed_tokens.weight"], "lm_head": src["lm_head.weight"].T,
             "layers.1.q": src["model.layers.1.self_attn.q_proj.weight"].T.reshape(32, 4, 8),
             "layers.0.o": src["model.layers.0.self_attn.o_proj.weight"].T.reshape(4, 8, 32),
             "layers.1.down_proj": src["model.layers.1.mlp.down_proj.weight"].T,
             "layers.0.k_norm": src["model.layers.0.self_attn.k_norm.weight"]}
    for name, want in pairs.items():
        got = ours.read(name)
        assert got.dtype == BF16 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8)), name
    assert ours.read("gate.bias").dtype == np.float32 and ours.read("gate.bias").shape == ()
    expected_names = {"embed", "final_norm", "lm_head", "gate.weight", "gate.bias", "gate.depth_bias"}
    expected_names |= {f"layers.{i}.{k}" for i in range(2) for k in
                       ("input_norm", "q", "k", "v", "o", "q_norm", "k_norm", "post_norm",
                        "gate_proj", "up_proj", "down_proj")}
    assert set(ours.tensors) == expected_names


def test_manifest_and_side_files(sandwich_fp32, tmp_path):
    out = convert_checkpoint(sandwich_fp32, tmp_path / "c", "bf16")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "alodlm-jax-params" and manifest["dtype"] == "bf16"
    assert manifest["converter_version"]
    files = {f["name"]: f for f in manifest["source"]["files"]}
    for name in ("config.json", "alodlm_config.json", "model.safetensors", "exit_gate.pt"):
        data = (sandwich_fp32 / name).read_bytes()
        assert files[name]["sha256"] == hashlib.sha256(data).hexdigest()
        assert files[name]["bytes"] == len(data)
    assert manifest["params"] == {"name": "params.safetensors",
                                  "bytes": (out / "params.safetensors").stat().st_size}
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        assert (out / name).read_bytes() == (sandwich_fp32 / name).read_bytes(), name
    assert json.loads((out / "alodlm_config.json").read_text()) == json.loads(
        (sandwich_fp32 / "alodlm_config.json").read_text())
    # The reference safetensors library reads our file.
    torch_tensors = pytest.importorskip("safetensors.torch").load_file(out / "params.safetensors")
    assert set(torch_tensors) == set(SafetensorsFile(out / "params.safetensors").tensors)
    assert str(torch_tensors["layers.0.q"].dtype) == "torch.bfloat16"


def test_yaml_recurrence_is_written_into_output(sandwich_fp32, copy_of, tmp_path):
    src = copy_of(sandwich_fp32)
    (src / "alodlm_config.json").unlink()
    yaml_path = tmp_path / "m.yaml"
    yaml_path.write_text("model:\n  loop_start: 0\n  loop_end: 2\n  mask_token_id: 3\n")
    out = convert_checkpoint(src, tmp_path / "c", "keep", model_config_yaml=yaml_path)
    written = json.loads((out / "alodlm_config.json").read_text())
    assert (written["loop_start"], written["loop_end"], written["max_depth"]) == (0, 2, 4)
    cfg, params = load_params(out)
    assert cfg.num_prelude_layers == 0 and params["coda"]["q"].shape[0] == 1


def test_errors_leave_nothing_behind(sandwich_fp32, copy_of, tmp_path):
    src = copy_of(sandwich_fp32)
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    write_safetensors(src / "model.safetensors", tensors)
    before = set(os.listdir(tmp_path))
    with pytest.raises(CheckpointError, match="missing tensor"):
        convert_checkpoint(src, tmp_path / "c", "keep")
    assert set(os.listdir(tmp_path)) == before


def test_failure_while_streaming_removes_partial_output(sandwich_fp32, tmp_path):
    def boom(progress):
        if progress.index == 5:
            raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        convert_checkpoint(sandwich_fp32, tmp_path / "c", "keep", progress=boom)
    assert os.listdir(tmp_path) == []


def test_existing_output_refused(sandwich_fp32, tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("keep me")
    with pytest.raises(CheckpointError, match="already exists"):
        convert_checkpoint(sandwich_fp32, tmp_path / "c")
    assert (tmp_path / "c" / "x").read_text() == "keep me"
    (tmp_path / "e").mkdir()  # an empty directory is fine
    convert_checkpoint(sandwich_fp32, tmp_path / "e")
    assert (tmp_path / "e" / "manifest.json").is_file()


def test_the_converted_directory_and_files_honour_the_umask(sandwich_fp32, tmp_path):
    import stat

    previous = os.umask(0o027)
    try:
        out = convert_checkpoint(sandwich_fp32, tmp_path / "converted", "keep")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o750
    files = [path for path in out.rglob("*") if path.is_file()]
    assert files and {stat.S_IMODE(path.stat().st_mode) for path in files} == {0o640}
