"""alodlm-jax-convert (exit status 2, one-line errors) and resolve_model (§4.6, §12.4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from alodlm_convert.resolve import INFERENCE_PATTERNS, resolve_model
from alodlm_jax.cli import convert as cli


def _run(argv, capsys):
    status = cli.main(["alodlm-jax-convert", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_converts(sandwich_fp32, tmp_path, capsys):
    status, out, err = _run(["--model", str(sandwich_fp32), "--output", str(tmp_path / "c"),
                             "--dtype", "bf16"], capsys)
    assert status == 0, err
    assert out.strip() == str(tmp_path / "c")
    assert "tensor 36/36" in err and "MB/s" in err
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["dtype"] == "bf16"


def test_cli_dash_model_config(sandwich_fp32, copy_of, tmp_path, capsys):
    src = copy_of(sandwich_fp32)
    (src / "alodlm_config.json").unlink()
    yaml_path = tmp_path / "m.yaml"
    yaml_path.write_text("model:\n  loop_start: 1\n  loop_end: 3\n  mask_token_id: 3\n")
    status, _, err = _run(["--model", str(src), "--output", str(tmp_path / "c"), "--model-config",
                           str(yaml_path), "--quiet"], capsys)
    assert status == 0, err
    assert json.loads((tmp_path / "c" / "alodlm_config.json").read_text())["loop_end"] == 3


@pytest.mark.parametrize("argv, needle", [
    (["--output", "x"], "--model"),
    (["--model", "/definitely/not/here", "--output", "x"], "The local model directory does not exist"),
    (["--model", "SRC", "--output", "x", "--dtype", "fp8"], "--dtype"),
    (["--model", "SRC", "--output", "x", "--bogus"], "bogus"),
])
def test_cli_usage_errors_are_one_line(sandwich_fp32, tmp_path, capsys, argv, needle):
    argv = [a.replace("SRC", str(sandwich_fp32)) for a in argv]
    status, out, err = _run(argv, capsys)
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("alodlm-jax-convert: error:") and needle in err
    assert "Traceback" not in err


def test_cli_bad_checkpoint_is_one_line(sandwich_fp32, copy_of, tmp_path, capsys):
    src = copy_of(sandwich_fp32)
    cfg = json.loads((src / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "exit_gate.pt").unlink()
    status, _, err = _run(["--model", str(src), "--output", str(tmp_path / "c")], capsys)
    assert status == 2 and err.count("\n") == 1
    assert "tie_word_embeddings" in err and "exit_gate.pt: missing" in err
    assert not (tmp_path / "c").exists()


def test_cli_subprocess_help_and_no_jax(tmp_path):
    code = ("import sys; from alodlm_jax.cli.convert import main; s = main(['p', '--help']); "
            "print('jax' in sys.modules, 'torch' in sys.modules, s)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: alodlm-jax-convert" in out and "--model-config" in out
    assert out.strip().splitlines()[-1] == "False False 0"


def test_resolve_existing_directory_without_download(tmp_path, monkeypatch):
    def forbidden(**kwargs):
        raise AssertionError("no download expected")

    monkeypatch.setattr("huggingface_hub.snapshot_download", forbidden)
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").mkdir()
    assert resolve_model("local") == (tmp_path / "local").resolve()


@pytest.mark.parametrize("path", ["/no/such/model/dir", "./missing-model", "~/no-such-alodlm-model-dir"])
def test_resolve_missing_explicit_path_raises(monkeypatch, path):
    def forbidden(**kwargs):
        raise AssertionError("no download expected")

    monkeypatch.setattr("huggingface_hub.snapshot_download", forbidden)
    with pytest.raises(ValueError, match="local model directory"):
        resolve_model(path)


def test_resolve_hub_id_uses_inference_patterns(tmp_path, monkeypatch):
    calls = []

    def fake_snapshot_download(**kwargs):
        calls.append(kwargs)
        return str(tmp_path)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("example/model") == tmp_path
    assert calls[0]["repo_id"] == "example/model"
    patterns = calls[0]["allow_patterns"]
    for needed in ("exit_gate.pt", "alodlm_config.json", "*.safetensors", "*.safetensors.index.json",
                   "config.json", "tokenizer.json", "*.jinja", "chat_templates/*.jinja"):
        assert needed in patterns
    assert "*.pt" not in patterns and "*" not in patterns
    assert tuple(patterns) == INFERENCE_PATTERNS


@pytest.mark.parametrize("value, offline", [(None, False), ("0", False), ("1", True)])
def test_import_leaves_offline_mode_alone(value, offline):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    if value is not None:
        env["HF_HUB_OFFLINE"] = value
    code = ("import os; import alodlm_convert.resolve, alodlm_convert.load, alodlm_convert.convert, "
            "alodlm_jax.cli.convert; import huggingface_hub.constants as c; "
            "print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('TRANSFORMERS_OFFLINE'), c.HF_HUB_OFFLINE)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(value), "None", str(offline)]


def test_load_params_and_cli_accept_a_hub_id(sandwich_fp32, tmp_path, monkeypatch, capsys):
    from alodlm_convert.load import load_params

    calls = []
    monkeypatch.setattr("huggingface_hub.snapshot_download",
                        lambda **kw: calls.append(kw) or str(sandwich_fp32))
    monkeypatch.chdir(tmp_path)
    cfg, params = load_params("example/tiny", "keep")
    assert cfg.num_hidden_layers == 3 and calls[-1]["repo_id"] == "example/tiny"
    status, _, err = _run(["--model", "example/tiny", "--output", str(tmp_path / "c"), "--quiet"], capsys)
    assert status == 0, err
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["source"]["model"] == "example/tiny"
