"""docs/api.md's Python blocks run as written (in a fresh interpreter each, from a scratch
directory) and print what the page says they print."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.M | re.S)


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_scoring_and_command_blocks(tmp_path):
    blocks = _blocks()
    assert len(blocks) == 3
    done = _run(blocks[1], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(True, '12')"
    done = _run(blocks[2] + "\nassert status == 0\n", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "outputs" / "notebook-rescored" / "summary.json").is_file()


@pytest.mark.slow  # loads and compiles the tiny model
def test_the_generate_block(tmp_path):
    done = _run(_blocks()[0], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(("eos", "length"))
