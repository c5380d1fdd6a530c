"""The README's commands run as written.

Every ``bash`` block of the README is one of three kinds:

* the set-up commands (``pip install``, ``pytest``): the extras they name exist;
* commands for the real models or accelerators (a Hub model id, ``--device cuda``, a plan's
  ``--target``): they need a network, a GPU or the deviceless compilers, so each command's program is checked to exist and each of its flags to be
  one the program defines;
* everything else runs offline, and is run here, block after block in one scratch directory, as a
  user would paste it (``bash -e``), with the Hub switched offline so nothing can download. These
  runs take minutes, so they are marked slow; ``.ci/run`` runs them after the default suite.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NEEDS_MODELS = ("amazon/ALoDLM", "--device cuda", "--device tpu", "--target ")
COMMANDS = {
    "alodlm-jax-evaluate": "alodlm_jax.cli.evaluate",
    "alodlm-jax-prepare": "alodlm_jax.cli.prepare",
    "alodlm-jax-report": "alodlm_jax.cli.report",
    "alodlm-jax-generate": "alodlm_jax.cli.generate",
    "alodlm-jax-convert": "alodlm_jax.cli.convert",
    "alodlm-jax-compare": "alodlm_jax.cli.compare",
    "alodlm-jax-sweep": "alodlm_jax.cli.sweep",
    "alodlm-jax-plan": "alodlm_jax.cli.plan",
}


def _blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)


def _kind(block: str) -> str:
    if "pip install" in block or "pytest" in block:
        return "setup"
    if any(marker in block for marker in NEEDS_MODELS):
        return "models"
    return "offline"


def _commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists (continuation lines joined, comments dropped, the
    block's own shell variables expanded as the shell would: ``NAME="..."`` then ``$NAME``)."""
    text = re.sub(r"\\\n", " ", block)
    variables: dict[str, str] = {}
    commands = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        line = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), line)
        argv = shlex.split(line, comments=True)
        assignment = re.fullmatch(r"(\w+)=(.*)", argv[0], re.S)
        if assignment and len(argv) == 1:
            variables[assignment.group(1)] = assignment.group(2)
        commands.append(argv)
    return commands


def test_the_readme_is_short_and_has_every_kind_of_block():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 260
    kinds = [_kind(block) for block in _blocks()]
    assert kinds[:2] == ["setup", "setup"]  # install, then test, before anything else
    assert kinds.count("offline") >= 3 and kinds.count("models") >= 2


def test_setup_commands_name_extras_that_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    text = "\n".join(block for block in _blocks() if _kind(block) == "setup")
    named = {extra for group in re.findall(r"\.\[([\w,-]+)\]", text) for extra in group.split(",")}
    assert {"test", "cuda", "tpu"} <= named
    assert named <= set(extras)


def test_real_model_commands_use_flags_their_programs_define():
    import importlib

    checked = 0
    for block in _blocks():
        if _kind(block) != "models":
            continue
        for argv in _commands(block):
            if "=" in argv[0] and not argv[0].startswith("-"):  # a shell variable
                continue
            program = argv[0]
            if program == "alodlm-jax-lm-eval":
                continue  # lm-eval's own flags
            module = importlib.import_module(COMMANDS[program])
            defined = set(module.FLAGS)
            for arg in argv[1:]:
                if arg.startswith("--"):
                    name = arg[2:].split("=", 1)[0].replace("-", "_")
                    assert name in defined or (name.startswith("no") and name[2:] in defined), (
                        program, arg)
            checked += 1
    assert checked >= 6


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("readme")


@pytest.mark.slow  # minutes of generation; CI runs it after the default suite (.ci/run)
@pytest.mark.parametrize("index", [i for i, block in enumerate(_blocks())
                                   if _kind(block) == "offline"])
def test_offline_block_runs_as_written(index, scratch):
    block = _blocks()[index]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    # The console scripts of this interpreter's installation come first.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    done = subprocess.run(["bash", "-e", "-c", block], cwd=scratch, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, (block, done.stdout[-2000:], done.stderr[-4000:])
