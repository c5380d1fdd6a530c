"""Preparing without a network: a Hub source that cannot be reached is one fast line that says
what to do, and ``--source builtin:fixtures`` prepares from the bundled fixture files."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest

from alodlm_jax.data import BUILTINS
from alodlm_prepare import sources as sources_module
from alodlm_prepare.fixtures import SOURCE_FILES
from alodlm_prepare.sample_slice import GUIDE_NAMES, SLICE_ROWS

from .helpers import ALL_BENCHMARKS, read_rows, run_prepare

# huggingface_hub's retry schedule for one unreachable request is 1 + 2 + 4 + 8 + 8 s; a command
# that reached it would take longer than this.
RETRY_SECONDS = 15


def _go_online(monkeypatch):
    """Undo the prepare tests' offline settings for this test (the library copies too)."""
    import datasets.config

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


def _check_advice(line: str, benchmark: str) -> None:
    assert line.startswith("alodlm-jax-prepare: error: could not load the Hugging Face dataset")
    assert f"--source {benchmark}=PATH" in line and "--source builtin:fixtures" in line
    assert "HF_HUB_OFFLINE=1" in line


def test_a_hub_that_never_answers_is_one_line_within_the_probe_bound(tmp_path, monkeypatch,
                                                                      capsys):
    _go_online(monkeypatch)
    released = threading.Event()
    attempts = []

    def black_hole(address, timeout=None, *args, **kwargs):  # a network that drops every packet
        attempts.append(address)
        released.wait(60)
        raise OSError("released")

    monkeypatch.setattr(socket, "create_connection", black_hole)
    monkeypatch.setattr(sources_module, "HUB_PROBE_SECONDS", 0.5)
    try:
        start = time.monotonic()
        status, out, err = run_prepare(["--benchmark", "ARC-C", "--output",
                                        str(tmp_path / "s.jsonl")], capsys)
        elapsed = time.monotonic() - start
    finally:
        released.set()
    assert status == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    _check_advice(lines[0], "ARC-C")
    assert "within 0.5 s" in lines[0]
    assert len(attempts) == 1 and elapsed < 5
    assert not (tmp_path / "s.jsonl").exists()


def test_an_unreachable_hub_is_one_line_and_exit_2_without_retries(tmp_path):
    """The command itself, with the Hub's endpoint a port nothing listens on and no offline
    settings: one line naming --source and HF_HUB_OFFLINE=1, exit status 2, no retry lines."""
    with socket.socket() as probe:  # a free port on this machine, closed again: refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items()
           if not k.upper().endswith("_PROXY") and k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"),
               XDG_CACHE_HOME=str(tmp_path / "xdg"))
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "alodlm_jax.cli.prepare", "--benchmark", "GSM8K",
                          "--output", str(tmp_path / "s.jsonl")], capture_output=True, text=True,
                         env=env, timeout=120)
    elapsed = time.monotonic() - start
    assert run.returncode == 2 and run.stdout == "", run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    _check_advice(lines[0], "GSM8K")
    assert elapsed < RETRY_SECONDS, elapsed
    assert not (tmp_path / "s.jsonl").exists()


def test_builtin_fixtures_prepares_the_bundled_sample_slice(tmp_path, capsys):
    output = tmp_path / "suite.jsonl"
    status, out, err = run_prepare(["--benchmark", ",".join(ALL_BENCHMARKS), "--source",
                                    "builtin:fixtures", "--limit", str(SLICE_ROWS), "--model",
                                    "builtin:tiny", "--output", str(output), "--workers", "2"],
                                   capsys)
    assert status == 0, err
    assert out.strip() == str(output)

    def without_timings(rows):
        for row in rows:
            for suite in row.get("code_tests", {}).get("suites", []):
                suite["reference_seconds"] = len(suite["reference_seconds"])
        return rows

    bundled = [row for row in read_rows(BUILTINS["builtin:sample"]) if row["benchmark"] in GUIDE_NAMES]
    assert without_timings(read_rows(output)) == without_timings(bundled)
    manifest = json.loads(pathlib.Path(str(output) + ".manifest.json").read_text())
    for name in ALL_BENCHMARKS:  # the manifest names the bundled file, not a temporary directory
        assert manifest["benchmarks"][name]["source"]["path"] == f"builtin:fixtures/{SOURCE_FILES[name]}"


def test_builtin_fixtures_for_one_benchmark_beside_a_local_file(tmp_path, sources, capsys):
    output = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", "GSM8K,ARC-E", "--source", "GSM8K=builtin:fixtures",
                                  "--source", f"ARC-E={sources['ARC-E']}", "--output", str(output)],
                                 capsys)
    assert status == 0, err
    manifest = json.loads(pathlib.Path(str(output) + ".manifest.json").read_text())
    assert manifest["benchmarks"]["GSM8K"]["source"]["path"].startswith("builtin:fixtures/")
    assert manifest["benchmarks"]["ARC-E"]["source"]["path"] == str(sources["ARC-E"])
