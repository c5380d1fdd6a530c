"""alodlm-jax-evaluate --batch_size auto: the largest batch whose programs fit the device (at most
the number of tasks), recorded in the protocol; a value that is neither is one line, exit 2."""

from __future__ import annotations

import json
import pathlib

import pytest

import alodlm_jax.data
from alodlm_jax.cli import evaluate
from alodlm_jax.plan.auto import parse_batch_size
from evaluation import suites

DEMO = pathlib.Path(alodlm_jax.data.__file__).parent / "tiny_checkpoint"


def _tasks(tmp_path, n: int) -> pathlib.Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": str(i), "benchmark": "b", "metric": "exact",
                                         "prompt": f"task {i} says", "answer": "one"}) + "\n"
                             for i in range(n)))
    return tasks


def test_batch_size_parses_integers_and_auto_only():
    assert parse_batch_size("auto") == "auto" and parse_batch_size(" AUTO ") == "auto"
    assert parse_batch_size("8") == 8 and parse_batch_size(3) == 3
    with pytest.raises(ValueError, match="positive integer or auto"):
        parse_batch_size("many")


def test_a_batch_size_that_is_neither_is_one_line(tmp_path, capsys):
    status = evaluate.main(["alodlm-jax-evaluate", "--model", str(DEMO), "--input",
                            str(_tasks(tmp_path, 1)), "--output", str(tmp_path / "out"),
                            "--batch_size", "many"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "--batch_size" in lines[0]
    assert not (tmp_path / "out").exists()


def test_auto_with_the_portable_engine_is_refused(tmp_path, capsys):
    status = evaluate.main(["alodlm-jax-evaluate", "--model", str(DEMO), "--input",
                            str(_tasks(tmp_path, 1)), "--output", str(tmp_path / "out"),
                            "--device", "cpu", "--engine", "portable", "--batch_size", "auto"])
    line = suites.error_after_phases(capsys.readouterr().err)
    assert status == 2 and "--engine compiled" in line


@pytest.mark.slow
@pytest.mark.jax_backend
def test_auto_takes_every_task_when_memory_allows_and_records_why(tmp_path, capsys):
    out = tmp_path / "out"
    status = evaluate.main(["alodlm-jax-evaluate", "--model", str(DEMO), "--input",
                            str(_tasks(tmp_path, 3)), "--output", str(out), "--device", "cpu",
                            "--batch_size", "auto", "--max_new_tokens", "8", "--window_size", "4",
                            "--workers", "1"])
    assert status == 0, capsys.readouterr().err
    protocol = json.loads((out / "summary.json").read_text())["protocol"]
    assert protocol["batch_size"] == 3
    auto = protocol["batch_size_auto"]
    assert auto["chosen"] == 3 and auto["tasks"] == 3 and auto["largest_that_fits"] >= 3
    assert auto["capacity_bytes"] > 0 and auto["probe_batch"] == 2
    assert set(auto["probe_device_memory_bytes"]) == {"batch", "admit"}
