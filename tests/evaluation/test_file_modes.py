"""Every file a run writes has the mode ``open`` gives under the umask (atomic writes included):
on a shared mount other users read what the umask lets them."""

from __future__ import annotations

import contextlib
import os
import stat

import pytest

from alodlm_scoring import evaluation
from alodlm_scoring.files import current_umask, write_atomically

from . import suites


@contextlib.contextmanager
def umask(mask):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_atomic_writes_honour_the_umask(tmp_path, mask):
    with umask(mask):
        assert current_umask() == mask
        write_atomically(tmp_path / "file.json", "{}\n")
    assert mode(tmp_path / "file.json") == 0o666 & ~mask
    assert sorted(os.listdir(tmp_path)) == ["file.json"]


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_a_runs_files_honour_the_umask(tmp_path, mask):
    pairs = [(suites.mc_task(1), "(B)"), (suites.python_task("p"), suites.identity_code("x"))]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    output = tmp_path / "out"
    with umask(mask):
        evaluation.rescore(tasks_path, predictions_path, output, workers=1)
    names = sorted(os.listdir(output))
    assert names == ["predictions.jsonl", "run.json", "summary.json"]
    assert {name: mode(output / name) for name in names} == dict.fromkeys(names, 0o666 & ~mask)
