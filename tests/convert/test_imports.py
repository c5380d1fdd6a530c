"""alodlm_convert stays free of jax/flax/torch (DESIGN.md), and the bench's gate writer is valid."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from alodlm_convert.torch_pickle import read_state_dict

MODULES = ["config", "errors", "safetensors_io", "torch_pickle", "mapping", "transforms", "checkpoint",
           "load", "stream", "convert", "resolve"]


def test_converter_imports_no_heavy_frameworks():
    code = ("import sys\n" + "".join(f"import alodlm_convert.{m}\n" for m in MODULES) +
            "import alodlm_jax.cli.convert\n"
            "print(sorted(m for m in ('jax', 'flax', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bench_gate_writer_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_convert.py"
    spec = importlib.util.spec_from_file_location("bench_convert", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.write_gate(tmp_path / "exit_gate.pt")
    ours = read_state_dict(tmp_path / "exit_gate.pt")
    theirs = torch.load(tmp_path / "exit_gate.pt", weights_only=True)
    assert list(ours) == list(theirs) == ["net.weight", "net.bias", "depth_bias"]
    for key in theirs:
        assert np.array_equal(ours[key], theirs[key].numpy())
