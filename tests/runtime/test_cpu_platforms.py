"""A command run for the CPU starts no accelerator plugin: with JAX's CUDA plugin and libtpu both
installed (the aot extra) on a machine without a GPU, its stderr holds only its own lines."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from alodlm_jax.cli import platforms
from alodlm_jax.data import BUILTINS
from alodlm_jax.plan import aot_gpu

PROG = "alodlm-jax-evaluate"
# .ci/run installs the aot extra's GPU half outside the environment (alodlm_jax.plan.aot_gpu).
BOTH_PLUGINS = ((aot_gpu.DIR / "jax_plugins" / "xla_cuda12").is_dir()
                and importlib.util.find_spec("libtpu") is not None)


def _child(code: str) -> subprocess.CompletedProcess:
    """A JAX process in the environment of a user who installed the aot extra: both plugins
    importable, and no JAX_PLATFORMS (the suite sets one for its own processes)."""
    return subprocess.run([sys.executable, "-c", code], env=aot_gpu.child_env(cpu=False),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not BOTH_PLUGINS, reason="needs libtpu and .ci/aot-gpu (the aot extra)")
def test_the_plugins_are_loud_in_a_plain_jax_process():
    """The environment the next tests use: a JAX process that fixes nothing runs on the CPU here
    (and, with the JAX release this project pins, writes the CUDA plugin's lines: what the next
    test's command must not)."""
    if _child("from alodlm_jax.cli import platforms; "
              "assert platforms.runs_on_cpu(None)").returncode:
        pytest.skip("this machine may have an accelerator")
    done = _child("import jax; print(jax.default_backend())")
    assert done.returncode == 0 and done.stdout.strip() == "cpu", done.stderr
    if "cuda" not in done.stderr.lower():  # a JAX release whose plugins keep quiet on their own
        pytest.skip("the plugins write nothing in a plain JAX process here")


@pytest.mark.skipif(not BOTH_PLUGINS, reason="needs libtpu and .ci/aot-gpu (the aot extra)")
def test_a_cpu_command_with_both_plugins_installed_prints_only_its_own_lines(tmp_path):
    rows = [json.loads(line) for line in open(BUILTINS["builtin:sample"])][:2]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = [sys.executable, "-m", "alodlm_jax.cli.evaluate", "--model", "builtin:tiny", "--input",
            str(tasks), "--output", str(tmp_path / "out"), "--device", "cpu", "--window-size", "4",
            "--max-new-tokens", "8", "--workers", "1"]
    done = subprocess.run(argv, env=aot_gpu.child_env(cpu=False), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines, "the command's own phase lines are missing"
    assert all(line.startswith(f"{PROG}: ") for line in lines), done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["protocol"]["device"] == "cpu"
    # A bad prompt found after the model is loaded (JAX started): the error line alone follows.
    long_task = dict(rows[0], prompt="word " * 5000)
    tasks.write_text(json.dumps(long_task) + "\n")
    argv[argv.index(str(tmp_path / "out"))] = str(tmp_path / "bad")
    done = subprocess.run(argv, env=aot_gpu.child_env(cpu=False), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert all(line.startswith(f"{PROG}: ") for line in lines), done.stderr
    assert lines[-1].startswith(f"{PROG}: error: ") and "Traceback" not in done.stderr


@pytest.mark.skipif(not BOTH_PLUGINS, reason="needs libtpu and .ci/aot-gpu (the aot extra)")
def test_the_default_device_on_a_machine_without_accelerators_starts_quietly():
    done = _child("from alodlm_jax.cli import platforms\n"
                  "if not platforms.runs_on_cpu(None): print('accelerator'); raise SystemExit\n"
                  "assert platforms.start_jax_for(None)\n"
                  "import jax; print(jax.default_backend(), len(jax.devices()))")
    if done.stdout.strip() == "accelerator":
        pytest.skip("this machine may have an accelerator: the default is JAX's choice")
    assert done.returncode == 0 and done.stdout.split() == ["cpu", "1"], done.stderr
    assert done.stderr == ""


def test_which_device_values_run_on_the_cpu(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert platforms.runs_on_cpu("cpu")
    for device in ("cuda", "gpu", "tpu"):
        assert not platforms.runs_on_cpu(device)
    # The default: the CPU unless the machine may have a GPU or a TPU.
    for gpu, tpu, expected in ((False, False, True), (True, False, False), (False, True, False)):
        monkeypatch.setattr(platforms, "_may_have_gpu", lambda: gpu)
        monkeypatch.setattr(platforms, "_may_have_tpu", lambda: tpu)
        assert platforms.runs_on_cpu(None) is expected
    # The user's own JAX_PLATFORMS decides the default.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert platforms.runs_on_cpu(None)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    monkeypatch.setattr(platforms, "_may_have_gpu", lambda: False)
    assert not platforms.runs_on_cpu(None)


def test_a_gpu_needs_the_plugin_and_a_device_node(monkeypatch):
    monkeypatch.setattr(platforms, "_installed", lambda name: name == "jax_cuda12_plugin")
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    assert not platforms._may_have_gpu()
    monkeypatch.setattr(os.path, "exists", lambda path: path == "/dev/nvidiactl")
    assert platforms._may_have_gpu()
    monkeypatch.setattr(platforms, "_installed", lambda name: False)
    assert not platforms._may_have_gpu()


def test_a_process_that_imported_jax_is_left_as_it_is(monkeypatch):
    import jax  # noqa: F401

    finders = list(sys.meta_path)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert platforms.start_jax_for("cpu") is False
    assert sys.meta_path == finders and os.environ["JAX_PLATFORMS"] == "cuda"
