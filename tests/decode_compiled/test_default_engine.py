"""The commands' default engine is the compiled one, on every layout: no flag combination falls
back to another engine; one that cannot work is refused with one line saying what to use."""

from __future__ import annotations

import json
import pathlib

import pytest

import alodlm_jax.data
from alodlm_jax.cli import evaluate, generate
from evaluation import suites

DEMO = pathlib.Path(alodlm_jax.data.__file__).parent / "tiny_checkpoint"


def test_both_commands_default_to_the_compiled_engine():
    assert evaluate.FLAGS["engine"].default == "compiled"
    assert generate.FLAGS["engine"].default == "compiled"


def _refused(tmp_path, capsys, mesh: str, *extra: str) -> str:
    """Runs evaluate with ``--mesh mesh`` plus ``extra``; asserts exit 2, nothing on stdout, a
    one-line error and no output directory, and returns that line."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "1", "benchmark": "b", "metric": "exact", "prompt": "one",
                                 "answer": "one"}) + "\n")
    status = evaluate.main(["alodlm-jax-evaluate", "--model", str(DEMO), "--input", str(tasks),
                            "--output", str(tmp_path / "out"), "--device", "cpu", "--mesh",
                            mesh, *extra])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    line = suites.error_after_phases(captured.err)  # after the phase lines
    assert not (tmp_path / "out").exists()
    return line


def test_a_data_axis_needs_the_compiled_engine(tmp_path, capsys):
    line = _refused(tmp_path, capsys, "data=2", "--engine", "portable")
    assert "only the compiled engine decodes" in line and "--engine compiled --batch_size 4" in line


def test_batch_size_must_split_over_data(tmp_path, capsys):
    line = _refused(tmp_path, capsys, "data=2", "--batch_size", "3")
    assert "--batch_size 3 is not a multiple of the mesh's data=2" in line
    line = _refused(tmp_path, capsys, "data=2")  # the default batch of 1 cannot split either
    assert "--batch_size 1 is not a multiple" in line


def test_a_mesh_larger_than_the_process_is_refused(tmp_path, capsys):
    line = _refused(tmp_path, capsys, "model=2", "--engine", "compiled", "--batch_size", "2")
    assert "--mesh model=2,data=1 needs 2 devices, but this process has 1" in line


def test_generate_refuses_a_data_axis(capsys):
    status = generate.main(["alodlm-jax-generate", "--model", str(DEMO), "--prompt_ids", "4,5",
                            "--device", "cpu", "--mesh", "data=2"])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("alodlm-jax-generate: ") and "--mesh" in line and "model=N" in line


def test_help_names_the_default_engine(capsys):
    for command in (evaluate, generate):
        assert command.main(["prog", "--help"]) == 0
        out = capsys.readouterr().out
        assert "compiled (the default" in " ".join(out.split())
