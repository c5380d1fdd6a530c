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
