"""The GPU check script runs end to end on CPU with --tiny (slow: it compiles both engines)."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_tiny_runs_on_cpu():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--tiny",
                           "--max_new_tokens", "16"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GPU_CHECK_DONE ok" in done.stdout
    assert done.stdout.count("same tokens portable/compiled: True") == 4


@pytest.mark.slow
def test_bench_decode_quick_run(tmp_path):
    """The decode benchmark runs end to end (small model, short budget) and writes its report."""
    report = tmp_path / "bench.json"
    done = subprocess.run(
        ["python", str(ROOT / "scripts" / "bench_decode.py"), "--quick", "--models", "small",
         "--modes", "entropy", "--batch", "2", "--batch_prompts", "3", "--repeats", "1",
         "--scaling", "", "--workdir", str(tmp_path / "work"), "--json", str(report)],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    data = json.loads(report.read_text())
    model = data["models"][0]
    assert model["modes"]["entropy"]["same_tokens"] is True
    assert model["batch_same_tokens"] == {"entropy": True}
    engines = {row["engine"] for row in model["modes"]["entropy"]["rows"]}
    assert engines == {"portable", "compiled", "torch-eager", "compiled-seq2", "compiled-batch2"}
    for goal in model["goals"].values():
        assert goal["measured"] > 0 and goal["ceiling"] > 0
    assert "goal compiled/torch >= 10.0" in done.stdout
