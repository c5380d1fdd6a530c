"""The commands' default engine is the compiled one, except where only the portable one works."""

from __future__ import annotations

import json
import pathlib

import pytest

import alodlm_jax.data
from alodlm_jax.cli import evaluate, generate
from alodlm_jax.cli.flags import parse_flags

DEMO = pathlib.Path(alodlm_jax.data.__file__).parent / "tiny_checkpoint"


def test_both_commands_default_to_the_compiled_engine():
    assert evaluate.FLAGS["engine"].default == "compiled"
    assert generate.FLAGS["engine"].default == "compiled"


@pytest.mark.parametrize("argv,engine", [
    ([], "compiled"),
    (["--engine", "portable"], "portable"),
    (["--mesh", "model=1"], "compiled"),  # one device: the compiled engine works
    (["--mesh", "model=2"], "portable"),  # tensor parallelism: fall back to portable
    (["--mesh", "data=2"], "portable"),
    (["--mesh", "model=2", "--engine", "compiled"], "compiled"),  # explicit: kept (then refused)
])
def test_engine_for_run(argv, engine):
    try:
        parse_flags(["alodlm-jax-evaluate", "--input", "t", "--output", "o"] + argv, evaluate.FLAGS)
        assert evaluate.engine_for_run() == engine
    finally:
        evaluate.FLAGS.unparse_flags()


def _refused_with_mesh(tmp_path, capsys, *extra: str) -> str:
    """Runs evaluate with ``--mesh model=2`` plus ``extra``; asserts exit 2, nothing on stdout and
    a one-line error, and returns that line."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "1", "benchmark": "b", "metric": "exact", "prompt": "one",
                                 "answer": "one"}) + "\n")
    status = evaluate.main(["alodlm-jax-evaluate", "--model", str(DEMO), "--input", str(tasks),
                            "--output", str(tmp_path / "out"), "--device", "cpu", "--mesh",
                            "model=2", *extra])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_explicit_compiled_engine_with_tensor_parallelism_is_refused(tmp_path, capsys):
    line = _refused_with_mesh(tmp_path, capsys, "--engine", "compiled")
    assert "supported by the portable engine only" in line


def test_help_names_the_default_engine(capsys):
    for command in (evaluate, generate):
        assert command.main(["prog", "--help"]) == 0
        out = capsys.readouterr().out
        assert "compiled (the default" in " ".join(out.split())


def test_batch_size_with_a_mesh_is_refused(tmp_path, capsys):
    line = _refused_with_mesh(tmp_path, capsys, "--batch_size", "2")
    assert "--batch_size > 1 is not supported with --mesh" in line
