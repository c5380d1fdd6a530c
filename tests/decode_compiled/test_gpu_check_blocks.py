"""scripts/gpu_check's blocks as functions (the package scripts/gpu_check/, imported in this
process): its command line refuses bad flags before it builds anything, and the helpers its
blocks share compute what they say. The whole check runs end to end in test_scripts.py (slow)."""

from __future__ import annotations

import pathlib
import sys

import jax.numpy as jnp
import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(SCRIPTS))
    try:
        from gpu_check import cli, common, layouts

        yield cli, common, layouts
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.mark.parametrize("flags, message", [
    (["--models", "1.7b,9b"], "--models: unknown 9b"),
    (["--goals", "--window_size", "0"], "--window_size / --max_new_tokens"),
    (["--goals", "--batches", ""], "--goals needs at least one batch"),
])
def test_the_command_line_refuses_bad_flags(gpu_check, capsys, flags, message):
    cli, _, _ = gpu_check
    with pytest.raises(SystemExit) as caught:
        cli.main(["--tiny", *flags])
    captured = capsys.readouterr()
    assert caught.value.code == 2 and captured.out == ""
    assert captured.err.splitlines()[-1].startswith(f"scripts/gpu_check.sh: error: {message}")


def test_the_shared_helpers(gpu_check):
    _, common, layouts = gpu_check
    a = [jnp.array([1.0, 2.0, 3.0, 4.0]), jnp.array([5.0, 6.0])]
    b = [jnp.array([1.0, 2.0, 3.5, 4.0]), jnp.array([5.0, 6.0])]
    equal, diff = common.agreement(a, b)
    assert equal == pytest.approx(5 / 6) and diff == pytest.approx(0.5)
    assert common.agreement(a, a) == (1.0, 0.0)
    assert layouts.mesh_layouts(1, 8) == [("data=1", 8)]
    assert layouts.mesh_layouts(4, 8) == [("data=1", 8), ("data=4", 32), ("model=4", 8),
                                          ("data=2,model=2", 16)]
    assert common.random_prompts(type("Cfg", (), {"mask_token_id": 7})(), 3, 5) == \
        common.random_prompts(type("Cfg", (), {"mask_token_id": 7})(), 3, 5)
