"""``alodlm-jax-evaluate --limit N``: the first N tasks of each benchmark, in file order, and a
summary that says it is a subset (``protocol.subset``, the closing table's subset line)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from alodlm_jax.cli import evaluate
from alodlm_jax.data import resolve_builtin
from alodlm_scoring.tasks import load_tasks

PROG = "alodlm-jax-evaluate"
RESCORE = ["--input", "builtin:sample", "--predictions", "builtin:sample-predictions", "--quiet"]


def _first_of_each(limit: int) -> list[tuple[str, str]]:
    """The (benchmark, id) of the sample suite's first ``limit`` tasks of each benchmark, read
    here from the file itself."""
    counts: dict[str, int] = {}
    kept = []
    for task in load_tasks(resolve_builtin("builtin:sample")):
        counts[task["benchmark"]] = counts.get(task["benchmark"], 0) + 1
        if counts[task["benchmark"]] <= limit:
            kept.append((task["benchmark"], task["id"]))
    return kept


def _rows(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "predictions.jsonl").read_text().splitlines()]


def test_limit_rescores_the_first_tasks_of_each_benchmark(tmp_path, capsys):
    full, limited = tmp_path / "full", tmp_path / "limited"
    assert evaluate.main([PROG, *RESCORE, "--output", str(full)]) == 0
    assert "subset" not in capsys.readouterr().out  # a full run says nothing of a subset
    assert "subset" not in json.loads((full / "summary.json").read_text())["protocol"]
    assert evaluate.main([PROG, *RESCORE, "--output", str(limited), "--limit", "1"]) == 0
    table = capsys.readouterr().out
    summary = json.loads((limited / "summary.json").read_text())
    expected = _first_of_each(1)
    total = len(load_tasks(resolve_builtin("builtin:sample")))
    assert len(expected) < total  # the sample has benchmarks of several tasks
    assert summary["protocol"]["subset"] == {"limit_per_benchmark": 1, "tasks": len(expected),
                                             "tasks_in_file": total}
    assert (f"subset: the first 1 task(s) of each benchmark, {len(expected)} of the file's "
            f"{total} (--limit); not a full evaluation") in table
    assert all(values["examples"] == 1 for values in summary["benchmarks"].values())
    rows = _rows(limited)
    assert [(row["benchmark"], row["id"]) for row in rows] == expected
    # Each row is the full run's row of the same task: a subset changes no verdict.
    by_key = {(row["benchmark"], row["id"]): row for row in _rows(full)}
    assert rows == [by_key[key] for key in expected]
    # The limited run's own predictions rescore with the full task file and the same limit.
    again = tmp_path / "again"
    assert evaluate.main([PROG, "--input", "builtin:sample", "--predictions",
                          str(limited / "predictions.jsonl"), "--quiet", "--output", str(again),
                          "--limit", "1"]) == 0
    capsys.readouterr()
    assert _rows(again) == rows


def test_limit_is_bound_on_resume_and_checked(tmp_path, capsys):
    out = tmp_path / "out"
    assert evaluate.main([PROG, *RESCORE, "--output", str(out), "--limit", "1"]) == 0
    assert json.loads((out / "run.json").read_text())["bound"]["--limit"] == 1
    capsys.readouterr()
    assert evaluate.main([PROG, *RESCORE, "--output", str(out), "--limit", "2", "--resume"]) == 2
    error = capsys.readouterr().err
    assert "--limit" in error and len(error.strip().splitlines()) == 1
    assert evaluate.main([PROG, *RESCORE, "--output", str(tmp_path / "zero"), "--limit", "0"]) == 2
    assert "--limit" in capsys.readouterr().err
    assert not (tmp_path / "zero").exists()


@pytest.mark.slow  # about a minute of compiling on a 2-core CPU
def test_limit_in_generate_mode(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "alodlm_jax.cli.evaluate", "--model", "builtin:tiny", "--input",
         "builtin:sample", "--output", str(tmp_path / "out"), "--device", "cpu", "--precision",
         "fp32", "--q", "0.5", "--tau", "0.4", "--window-size", "4", "--max-new-tokens", "8",
         "--limit", "1", "--quiet"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    expected = _first_of_each(1)
    assert summary["protocol"]["subset"]["tasks"] == len(expected)
    assert [(row["benchmark"], row["id"]) for row in _rows(tmp_path / "out")] == expected
