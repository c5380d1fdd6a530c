"""Model-level comparison on tiny checkpoints: clean conversion passes, a perturbed JAX parameter
is caught and named, the official-package adapter is wired, bad input exits 2.

The first test pays for the imports and the compilations (forward and the portable decoder); later
tests reuse the shapes (every prompt fits the same 16-token bucket), so the file stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

pytest.importorskip("torch")

from alodlm_jax import compare  # noqa: E402
from alodlm_jax.cli.compare import main  # noqa: E402
from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint  # noqa: E402

# With a 100x head (peaked logits) these settings commit several tokens per window forward, at
# exit depths 1 and 2: the decode comparison is not a one-token-per-window triviality.
LM_HEAD_SCALE = 100.0
DECODE_FLAGS = ["--max-new-tokens", "12", "--window-size", "4", "--q", "0.95", "--tau", "0.4"]


@pytest.fixture(scope="module")
def sandwich(tmp_path_factory):
    return str(build_tiny_checkpoint(tmp_path_factory.mktemp("sandwich"),
                                     TinySpec.for_topology("sandwich", lm_head_scale=LM_HEAD_SCALE)))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        # Three ways to give a prompt, all 7 tokens long so one forward compilation serves them.
        {"prompt": "Return value one ."},  # chat template applied: "user Return value one . </s> assistant"
        {"prompt_ids": [4, 7, 8, 9, 12, 2, 5]},  # explicit ids
        {"prompt": "Return value two . one two three", "raw": True},  # verbatim
    ]) + "\n")
    return str(path)


def _failing(report):
    return [(c["name"], c.get("depth")) for c in report["checks"] if not c["passed"]]


def test_clean_conversion_passes(sandwich, prompts, tmp_path, capsys):
    out = tmp_path / "report.json"
    status = main(["--model", sandwich, "--prompts", prompts, "--output", str(out), *DECODE_FLAGS])
    report = json.loads(out.read_text())
    assert status == 0, report["failed"]
    assert report["torch_side"] == "alodlm-jax-torch-reference"
    assert report["device"] == "cpu" and report["torch_device"] == "cpu"  # auto beside a CPU
    assert report["precision"] == "fp32" and report["decode_config"]["max_new_tokens"] == 12
    assert [p["tokens"] for p in report["prompts"]] == [7, 7, 7]
    assert [d["depth"] for d in report["forward"]["depths"]] == [1, 2, 3, 4]
    for row in report["forward"]["depths"]:
        assert row["rows"] == 21 and row["max_abs_logits"] <= 1e-4 and row["top1_agreement"] == 1.0
    decode = report["decode"]
    assert decode["token_agreement"] == 1.0 and decode["exit_depth_sequence_agreement"] == 1.0
    # Not vacuous: every prompt generated its full budget, with more than one exit depth overall.
    assert all(p["generated_tokens"] == {"torch": 12, "jax": 12} for p in decode["per_prompt"])
    assert {d for p in decode["per_prompt"] for d in p["exit_depths"]["jax"]} >= {1, 2}
    assert all(c["passed"] for c in report["checks"]) and report["failed"] == []
    stdout = capsys.readouterr().out
    assert "max|dlogits|" in stdout and stdout.rstrip().endswith("PASS")


def test_perturbed_q_kernel_is_caught(sandwich, prompts, tmp_path, capsys):
    out = tmp_path / "report.json"
    status = main(["--model", sandwich, "--prompts", prompts, "--output", str(out), "--nodecode"],
                  jax_params_hook=compare.perturb_core_q)
    report = json.loads(out.read_text())
    assert status == 1
    assert report["jax_params_hook"] == "perturb_core_q" and report["decode"] is None
    failing = _failing(report)
    # The core runs at every depth, so every depth fails, logits and hazards alike.
    assert ("max_abs_logits", 1) in failing and ("max_abs_hazard", 1) in failing
    assert {depth for _, depth in failing} == {1, 2, 3, 4}
    assert report["failed"][0].startswith("max_abs_logits at depth 1: ")
    assert "FAIL max_abs_logits at depth 1" in capsys.readouterr().out
    # A looser tolerance above the measured error accepts the same perturbation: the check is a bound.
    worst = max(r["max_abs_logits"] for r in report["forward"]["depths"])
    assert main(["--model", sandwich, "--prompts", prompts, "--nodecode", "--atol", str(worst * 2)],
                jax_params_hook=compare.perturb_core_q) == 0


def test_official_package_is_used_when_importable(sandwich, prompts, tmp_path, monkeypatch):
    """A stand-in ``alodlm`` package (delegating to our torch reference) proves the adapter's calls:
    ``ALoDLM.from_pretrained(dir, config=None, dtype=...)``, ``Decoder(model, tokenizer)``,
    ``Decoder.generate(ids, DecodeConfig(**fields))``."""
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.compare.torch_reference import TorchALoDLM

    calls = []

    class FakeModel:
        @classmethod
        def from_pretrained(cls, directory, config=None, dtype=None):
            calls.append(("from_pretrained", str(dtype)))
            model = cls()
            model.reference = TorchALoDLM.from_checkpoint(directory, "fp32")
            return model

        def to(self, device):
            return self

    @dataclasses.dataclass
    class FakeDecodeConfig:
        q: float
        tau: float
        window_size: int
        max_new_tokens: int
        position_penalty: float | None
        mode: str

    class FakeDecoder:
        def __init__(self, model, tokenizer):
            self.model = model

        def generate(self, ids, cfg):
            calls.append(("generate", cfg.max_new_tokens))
            return self.model.reference.generate(ids, DecodeConfig(**dataclasses.asdict(cfg)))

    package = types.ModuleType("alodlm")
    modules = {"alodlm": package,
               "alodlm.model": types.SimpleNamespace(ALoDLM=FakeModel),
               "alodlm.inference": types.SimpleNamespace(Decoder=FakeDecoder, DecodeConfig=FakeDecodeConfig),
               "alodlm.data": types.SimpleNamespace(load_tokenizer=lambda directory: None)}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    out = tmp_path / "report.json"
    assert main(["--model", sandwich, "--prompts", prompts, "--output", str(out), *DECODE_FLAGS]) == 0
    report = json.loads(out.read_text())
    assert report["torch_side"] == "alodlm-official"
    assert report["torch_forward_side"] == "alodlm-jax-torch-reference"
    assert calls == [("from_pretrained", "torch.float32")] + [("generate", 12)] * 3


def _bad(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_model_level_input_exits_2(sandwich, prompts, tmp_path, capsys):
    assert "--prompts" in _bad(["--model", sandwich], capsys)
    assert "local model directory does not exist" in _bad(
        ["--model", str(tmp_path / "nowhere"), "--prompts", prompts], capsys)
    bad_prompts = tmp_path / "bad.jsonl"
    bad_prompts.write_text('{"prompt_ids": "4 7 9"}\n')
    assert "bad.jsonl:1: field 'prompt_ids'" in _bad(["--model", sandwich, "--prompts", str(bad_prompts)], capsys)
    out_of_vocab = tmp_path / "oov.jsonl"
    out_of_vocab.write_text('{"prompt_ids": [4, 640]}\n')
    assert "oov.jsonl:1: token id 640" in _bad(["--model", sandwich, "--prompts", str(out_of_vocab)], capsys)
    assert "q must be in [0,1]" in _bad(["--model", sandwich, "--prompts", prompts, "--q", "1.5"], capsys)
    _bad(["--model", sandwich, "--prompts", prompts, "--precision", "fp16"], capsys)
    assert "alodlm package" in _bad(["--model", sandwich, "--prompts", prompts, "--torch-side", "official"], capsys)
    _bad(["--model", sandwich, "--prompts", prompts, "--predictions-a", prompts], capsys)


@pytest.mark.slow
@pytest.mark.parametrize("topology,precision", [("all_layer", "fp32"), ("all_layer", "bf16"), ("sandwich", "bf16")])
def test_other_topologies_and_bf16(topology, precision, prompts, tmp_path):
    model = build_tiny_checkpoint(tmp_path / topology, TinySpec.for_topology(topology, lm_head_scale=LM_HEAD_SCALE))
    out = tmp_path / "report.json"
    status = main(["--model", str(model), "--prompts", prompts, "--precision", precision, "--output", str(out),
                   *DECODE_FLAGS])
    report = json.loads(out.read_text())
    assert status == 0, report["failed"]


@pytest.mark.slow
def test_left1_mode_passes(sandwich, prompts):
    assert main(["--model", sandwich, "--prompts", prompts, "--mode", "left1", "--q", "0.4", *DECODE_FLAGS]) == 0


@pytest.mark.slow
def test_compiled_engine_passes(sandwich, prompts):
    assert main(["--model", sandwich, "--prompts", prompts, "--engine", "compiled", *DECODE_FLAGS]) == 0


def test_torch_device_is_checked_before_loading(sandwich, prompts, monkeypatch, capsys):
    """--torch_device: cpu, cuda or auto (cuda beside a JAX GPU when PyTorch sees one); cuda
    without a GPU PyTorch sees, or another name, is one line and exit status 2."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "--torch_device must be one of auto, cpu, cuda" in _bad(
        ["--model", sandwich, "--prompts", prompts, "--torch-device", "tpu"], capsys)
    assert "--torch_device cuda: PyTorch sees no CUDA device" in _bad(
        ["--model", sandwich, "--prompts", prompts, "--torch_device", "cuda"], capsys)
    assert compare.resolve_torch_device("auto", "cuda") == "cpu"  # no GPU: the CPU
    assert compare.resolve_torch_device("auto", "cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert compare.resolve_torch_device("auto", "cuda") == "cuda"
    assert compare.resolve_torch_device("auto", "gpu") == "cuda"
    assert compare.resolve_torch_device("auto", "tpu") == "cpu"
    assert compare.resolve_torch_device("cpu", "cuda") == "cpu"
    assert compare.resolve_torch_device("cuda", "cpu") == "cuda"
