"""`--device cuda` without JAX's CUDA plugin says which package is missing and how to install it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.jax_backend


def test_missing_cuda_plugin_names_the_package_and_the_install_command(monkeypatch):
    import jax

    from alodlm_jax import generate

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "jax_cuda12_plugin" else find_spec(name, *a))
    with pytest.raises(ValueError) as error:
        generate.jax_device("cuda")
    message = str(error.value)
    assert message.startswith("JAX has no cuda device on this machine: JAX's CUDA plugin")
    assert "jax-cuda12-plugin" in message and "pip install -e '.[cuda]'" in message
    assert f"jax[cuda12]=={jax.__version__}" in message


def test_plugin_present_but_no_gpu_says_so(monkeypatch):
    from alodlm_jax import generate

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(ValueError, match="plugin is installed but found no usable GPU"):
        generate.jax_device("cuda")


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is not None,
                    reason="a CUDA plugin is installed here")
def test_generate_command_fails_with_one_line_and_status_2():
    run = subprocess.run([sys.executable, "-m", "alodlm_jax.cli.generate", "--model", "builtin:tiny",
                          "--device", "cuda", "--prompt", "Return value one"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr
    assert "jax-cuda12-plugin" in lines[0] and "[cuda]" in lines[0]


def test_missing_tpu_runtime_names_the_extra(monkeypatch):
    import jax

    from alodlm_jax import generate

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else find_spec(name, *a))
    monkeypatch.setattr(jax, "devices", lambda *a: [])
    with pytest.raises(ValueError) as error:
        generate.jax_device("tpu")
    message = str(error.value)
    assert message.startswith("JAX has no tpu device on this machine: JAX's TPU runtime (libtpu)")
    assert "pip install -e '.[tpu]'" in message and f"jax[tpu]=={jax.__version__}" in message


def test_accelerator_extras_follow_the_projects_jax_range():
    """The cuda, cuda13 and tpu extras ask for JAX's own extra over the project's JAX range, so
    pip resolves the plugin or libtpu of the JAX it installs."""
    import pathlib
    import tomllib

    project = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    jax_range = next(d for d in project["project"]["dependencies"] if d.startswith("jax>="))
    extras = project["project"]["optional-dependencies"]
    for extra, jax_extra in (("cuda", "cuda12"), ("cuda13", "cuda13"), ("tpu", "tpu")):
        assert extras[extra] == [f"jax[{jax_extra}]" + jax_range.removeprefix("jax")]
