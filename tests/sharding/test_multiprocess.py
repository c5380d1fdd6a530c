"""Data parallelism over ``jax.distributed`` on localhost: two CPU processes split the tasks and
process 0 merges; the files equal a one-process run's except for timing fields and the protocol's
layout record. Each process may batch on its own mesh (compiled engine, continuous batching), and
a multi-process batched run killed mid-way resumes to the uninterrupted run's files."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import signal
import time

import pytest

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[2]
TIMING_ROW_KEYS = ("wall_seconds", "prefill_seconds", "tokens_per_second")
TIMING_BENCHMARK_KEYS = ("wall_seconds", "tokens_per_second")
TIMING_SUITE_KEYS = ("suite_wall_seconds", "suite_tokens_per_second")


def make_tasks(repeat: int = 1):
    words = ["Return value one", "Return value two", "value three .", "one two three", "two . one",
             "Return three"] * repeat
    tasks = []
    for i, text in enumerate(words):
        tasks.append({"benchmark": "synthetic", "id": f"e{i}", "metric": "exact",
                      "prompt": f"user {text} </s> assistant ", "answer": "one ."})
        if i % 2 == 0:
            tasks.append({"benchmark": "mmlu", "id": i, "metric": "mmlu", "prompt": f"user {text} </s> assistant ",
                          "answer": "B"})
    return tasks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_with(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pytest.importorskip("torch")
    from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint

    root = tmp_path_factory.mktemp("dp")
    model = build_tiny_checkpoint(root / "tiny", TinySpec.for_topology(
        "sandwich", num_heads=4, num_kv_heads=2, lm_head_scale=64.0, seed=3))
    tasks_path = root / "tasks.jsonl"
    tasks_path.write_text("".join(json.dumps(t) + "\n" for t in make_tasks()))
    single = root / "single"
    run_processes(dict(model=str(model), tasks=str(tasks_path), output=str(single), mesh=None), 1)
    return {"root": root, "model": str(model), "tasks": str(tasks_path), "single": single}


def start_processes(args: dict, num_processes: int, devices: int = 1) -> list[subprocess.Popen]:
    """Starts ``alodlm-jax-evaluate`` as ``num_processes`` processes on localhost."""
    port = free_port()
    command = [sys.executable, "-m", "alodlm_jax.cli.evaluate", "--model", args["model"], "--input",
               args["tasks"], "--output", args["output"], "--device", "cpu", "--precision", "fp32",
               "--workers", "1", "--q", "1.0", "--tau", "1.0", "--window_size", "4", "--max_new_tokens", "16",
               "--print_summary_json"]
    for flag in ("mesh", "batch_size"):
        if args.get(flag):
            command += [f"--{flag}", str(args[flag])]
    if args.get("split"):
        command += ["--task_split", args["split"]]
    if args.get("resume"):
        command += ["--resume"]
    procs = []
    for pid in range(num_processes):
        extra = [] if num_processes == 1 else [
            "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", str(num_processes),
            "--process_id", str(pid)]
        procs.append(subprocess.Popen(command + extra, env=env_with(devices), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=str(ROOT)))
    return procs


def run_processes(args: dict, num_processes: int, devices: int = 1, timeout: int = 600) -> list[str]:
    """Runs ``alodlm-jax-evaluate`` as ``num_processes`` processes on localhost; their stdouts."""
    procs = start_processes(args, num_processes, devices)
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-4000:]
        outputs.append(out)
    return outputs


def masked_predictions(path: pathlib.Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        for key in TIMING_ROW_KEYS:
            assert key in row
            row[key] = "<timing>"
    return rows


def masked_summary(path: pathlib.Path) -> dict:
    summary = json.loads(path.read_text())
    for values in summary["benchmarks"].values():
        for key in TIMING_BENCHMARK_KEYS:
            values[key] = "<timing>"
    for key in TIMING_SUITE_KEYS:
        summary[key] = "<timing>"
    summary["protocol"]["compile_seconds"] = "<timing>"
    return summary


def pop_layout(protocol: dict) -> dict:
    """The protocol's batch and layout record (removed from ``protocol``)."""
    return {key: protocol.pop(key) for key in ("batch_size", "batch_timing", "mesh", "num_processes")
            if key in protocol}


def assert_same_as_single(setup, out: pathlib.Path, halt_tolerance: float = 0.0,
                          decoder: str = "jax-xla-compiled", layout: dict | None = None,
                          single: pathlib.Path | None = None):
    """Equal but for timings and the layout record. ``halt_tolerance``: tensor parallelism sums
    the gate's dot product in another order (and a batch shares its buckets), so fp32 halting
    probabilities may differ in the last bits. ``decoder``: the engine ``out`` must record.
    ``layout``: the protocol's batch/layout keys ``out`` must record (``single`` records none)."""
    single = single or setup["single"]
    decoders = [json.loads((d / "summary.json").read_text())["protocol"]["decoder"]
                for d in (single, out)]
    assert decoders == ["jax-xla-compiled", decoder]
    got, want = masked_predictions(out / "predictions.jsonl"), masked_predictions(single / "predictions.jsonl")
    if halt_tolerance:
        for a, b in zip(got, want, strict=True):
            pa, pb = a.pop("first_pass_halt_probabilities"), b.pop("first_pass_halt_probabilities")
            assert len(pa) == len(pb) and all(abs(x - y) <= halt_tolerance for x, y in zip(pa, pb))
    assert got == want
    got_summary, want_summary = masked_summary(out / "summary.json"), masked_summary(single / "summary.json")
    got_summary["protocol"]["decoder"] = want_summary["protocol"]["decoder"]  # checked above
    given = single != setup["single"]  # a reference run with the same layout
    assert pop_layout(got_summary["protocol"]) == (layout or {})
    assert pop_layout(want_summary["protocol"]) == ((layout or {}) if given else {})
    if layout:  # the layout keys come after every other key
        assert list(json.loads((out / "summary.json").read_text())["protocol"])[-len(layout):] == list(layout)
    assert got_summary == want_summary
    # Key order and formatting too: only the masked values may differ, line by line.
    multi_lines = (out / "predictions.jsonl").read_text().splitlines()
    assert len(multi_lines) == len((single / "predictions.jsonl").read_text().splitlines())
    assert [list(json.loads(line)) for line in multi_lines] == \
        [list(json.loads(line)) for line in (single / "predictions.jsonl").read_text().splitlines()]


def test_two_processes_equal_one(setup):
    out = setup["root"] / "two"
    stdout = run_processes(dict(model=setup["model"], tasks=setup["tasks"], output=str(out), mesh=None), 2)
    assert_same_as_single(setup, out, layout={"batch_size": 1, "mesh": {"data": 1, "model": 1},
                                              "num_processes": 2})
    for pid in range(2):
        assert (out / f"predictions.process-{pid:05d}-of-00002.jsonl").exists()
        assert (out / f"summary.process-{pid:05d}-of-00002.json").exists()
    # Process 0 prints the merged summary, process 1 its shard's.
    examples = [sum(b["examples"] for b in json.loads(out)["benchmarks"].values()) for out in stdout]
    assert examples == [len(make_tasks()), len(make_tasks()) // 2]


@pytest.mark.slow
def test_two_processes_each_tensor_parallel(setup):
    """2 processes x model=2 (2 local CPU devices each), contiguous split."""
    out = setup["root"] / "two_by_two"
    run_processes(dict(model=setup["model"], tasks=setup["tasks"], output=str(out), mesh="model=2",
                       split="contiguous"), 2, devices=2)
    assert_same_as_single(setup, out, halt_tolerance=1e-6, layout={
        "batch_size": 1, "mesh": {"data": 1, "model": 2}, "num_processes": 2})


def batched_layout() -> dict:
    """The protocol's record of 2 processes x (data=2, batch 4), in the protocol's key order."""
    from alodlm_jax.decode.scheduler import BATCH_TIMING

    return {"batch_size": 4, "batch_timing": BATCH_TIMING, "mesh": {"data": 2, "model": 1},
            "num_processes": 2}


@pytest.mark.slow  # data=2 batching: test_compiled_layouts; several processes: test_two_processes_equal_one
def test_two_processes_each_batching_on_data2(setup):
    """2 processes x (data=2, batch 4): each process batches its own share on its own mesh."""
    out = setup["root"] / "two_batched"
    run_processes(dict(model=setup["model"], tasks=setup["tasks"], output=str(out), mesh="data=2",
                       batch_size=4), 2, devices=2)
    assert_same_as_single(setup, out, halt_tolerance=1e-5, layout=batched_layout())


def shard_rows(path: pathlib.Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_killed_batched_multiprocess_run_resumes(setup):
    """2 processes x (data=2, batch 4) on 24 tasks; process 1 is killed (SIGKILL) mid-shard, the
    job dies with it, and the same command with --resume completes it: tokens, exit depths,
    counters and verdicts equal the uninterrupted run; hazards within 1e-6 (resumed rows were
    batched with other neighbours, see the README's resume guarantee)."""
    root = setup["root"] / "resume"
    root.mkdir()
    tasks = root / "tasks.jsonl"
    many = make_tasks(repeat=3)
    for i, task in enumerate(many):
        task["id"] = f"{task['id']}-{i}"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in many))
    args = dict(model=setup["model"], tasks=str(tasks), mesh="data=2", batch_size=4)
    whole = root / "whole"
    run_processes(dict(args, output=str(whole)), 2, devices=2)

    killed = root / "killed"
    procs = start_processes(dict(args, output=str(killed)), 2, devices=2)
    shard = killed / "predictions.process-00001-of-00002.jsonl"
    deadline = time.monotonic() + 600
    while shard_rows(shard) == 0 and time.monotonic() < deadline and procs[1].poll() is None:
        time.sleep(0.005)
    procs[1].send_signal(signal.SIGKILL)
    procs[0].send_signal(signal.SIGKILL)  # the job dies with it (as jax.distributed would end it)
    for proc in procs:
        proc.communicate(timeout=60)
    written = shard_rows(shard)
    assert 0 < written < len(many) // 2, written  # really killed mid-shard
    assert not (killed / "summary.json").exists()

    run_processes(dict(args, output=str(killed), resume=True), 2, devices=2)
    assert_same_as_single(setup, killed, halt_tolerance=1e-6, single=whole, layout=batched_layout())


