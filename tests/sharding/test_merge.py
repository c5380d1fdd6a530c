"""Shard files and the merge, with a deterministic fake decoder (no JAX decoding): the merged
files must be byte-identical to a one-process run's, for both splits, after a resume too."""

from __future__ import annotations

import json
import os

import pytest

from alodlm_jax.cli import distributed
from alodlm_scoring import evaluation, outputs

GENERATE_TIMING = outputs.GENERATE_TIMING


def make_tasks():
    tasks = []
    for i in range(7):
        tasks.append({"benchmark": "mmlu", "id": i, "metric": "mmlu", "prompt": f"Q{i}?",
                      "answer": "ABCD"[i % 4]})
        tasks.append({"benchmark": "synthetic", "id": f"s{i}", "metric": "exact", "prompt": f"P{i}",
                      "answer": "one ." if i % 2 else "two ."})
    return tasks


def fake_generate(task):
    """A decoder result (§7.1 keys 1-15) that depends only on the task; seconds vary per task."""
    n = len(task["prompt"])
    text = {"mmlu": f"The answer is ({'ABCD'[n % 4]})", "exact": "one ."}[task["metric"]]
    seconds = 0.1 + 0.01 * n + (0.3 if task["metric"] == "exact" else 0.0)
    return {"text": text, "token_ids": [n, n + 1], "prompt_tokens": n, "generated_tokens": 2,
            "wall_seconds": seconds, "prefill_seconds": seconds / 3, "tokens_per_second": 2 / seconds,
            "mean_exit_depth": 1.5, "loop_token_passes": 3, "loop_token_passes_per_output_token": 1.5,
            "outer_steps": 1, "recurrent_passes": 2, "exit_depths": [1, 2],
            "first_pass_halt_probabilities": [0.25, 0.75], "stop_reason": "eos"}


def make_protocol(failures, compile_seconds=1.25):
    return outputs.protocol_block(decoder="jax-xla-portable", input_sha256="0" * 64, decode={"q": 0.5},
                                  precision="fp32", device="cpu", timing=GENERATE_TIMING,
                                  device_kind="cpu", compile_seconds=compile_seconds,
                                  scoring_failures=failures, python_version="3.x", versions={})


def single_process(tmp_path, tasks):
    out = tmp_path / "single"
    state = evaluation.prepare_output_directory(out)
    evaluation.evaluate(tasks, state, rows_source=lambda s: (fake_generate(t) for t in tasks[s:]),
                        make_protocol=make_protocol, workers=1)
    return out


def run_shards(out, tasks, num_processes, split, *, resume=False, only=None):
    for pid in range(num_processes) if only is None else only:
        info = distributed.ProcessInfo(pid, num_processes)
        state = distributed.prepare_shard_directory(out, info, resume=resume)
        indices = distributed.split_tasks(len(tasks), num_processes, pid, split)
        distributed.evaluate_shard(tasks, indices, state, generate=fake_generate,
                                   make_protocol=lambda f: make_protocol(f, 1.0), workers=1)


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


@pytest.mark.parametrize("split", distributed.SPLITS)
@pytest.mark.parametrize("num_processes", [2, 3, 20])
def test_merged_files_equal_one_process(tmp_path, split, num_processes):
    tasks = make_tasks()
    single = single_process(tmp_path, tasks)
    out = tmp_path / "multi"
    run_shards(out, tasks, num_processes, split)
    names = sorted(os.listdir(out))
    assert f"predictions.{distributed.shard_suffix(num_processes - 1, num_processes)}.jsonl" in names
    summary = distributed.merge_shards(out, tasks, num_processes, make_protocol=make_protocol, split=split)
    assert read(out / "predictions.jsonl") == read(single / "predictions.jsonl")
    single_summary = json.loads(read(single / "summary.json"))
    # compile_seconds: the sum over processes (1.0 each) instead of this process's own.
    assert read(out / "summary.json").decode() == outputs.summary_text(summary)
    assert summary["protocol"]["compile_seconds"] == float(num_processes)
    summary["protocol"]["compile_seconds"] = single_summary["protocol"]["compile_seconds"]
    assert summary == single_summary


def test_resume_a_torn_shard(tmp_path):
    tasks = make_tasks()
    single = single_process(tmp_path, tasks)
    out = tmp_path / "multi"
    run_shards(out, tasks, 2, "round_robin")
    path = distributed.shard_paths(out, 1, 2)
    data = read(path["predictions"])
    cut = data.rfind(b"\n", 0, len(data) - 1)
    with open(path["predictions"], "wb") as handle:  # two complete rows less, and a torn one
        handle.write(data[: data.rfind(b"\n", 0, cut) + 1] + b'{"text": "tor')
    os.unlink(path["summary"])
    with pytest.raises(ValueError, match="shard 1 of 2 is not complete"):
        distributed.merge_shards(out, tasks, 2, make_protocol=make_protocol)
    with pytest.raises(FileExistsError, match="fresh evaluation output directory"):
        distributed.prepare_shard_directory(out, distributed.ProcessInfo(0, 2))
    run_shards(out, tasks, 2, "round_robin", resume=True, only=[1])
    assert read(path["predictions"]) == data
    distributed.merge_shards(out, tasks, 2, make_protocol=make_protocol)
    assert read(out / "predictions.jsonl") == read(single / "predictions.jsonl")


def test_merge_refuses_a_shard_of_another_split(tmp_path):
    tasks = make_tasks()
    out = tmp_path / "multi"
    run_shards(out, tasks, 2, "contiguous")
    with pytest.raises(ValueError, match="cannot merge: .*process-00000-of-00002.jsonl:2 is task"):
        distributed.merge_shards(out, tasks, 2, make_protocol=make_protocol, split="round_robin")


def test_fresh_directory_rules(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    with pytest.raises(FileExistsError):
        distributed.prepare_shard_directory(out, distributed.ProcessInfo(1, 2))
    state = distributed.prepare_shard_directory(out, distributed.ProcessInfo(1, 2), resume=True)
    assert state.predictions_path.endswith("predictions.process-00001-of-00002.jsonl")
    assert state.summary_path.endswith("summary.process-00001-of-00002.json")
    assert state.failures_path.endswith("scoring_failures.process-00001-of-00002.jsonl")


def _settings(q=0.5, batch_size=1):
    from alodlm_scoring.run_record import RunSettings

    return RunSettings(bound={"--q": q, "--num_processes": 2, "--task_split": "round_robin"},
                       free={"decoder": "jax-xla-compiled", "batch_size": batch_size})


class Killed(Exception):
    pass


def _shard(out, tasks, pid, settings, *, resume=False, kill_after=None):
    info = distributed.ProcessInfo(pid, 2)
    state = distributed.prepare_shard_directory(out, info, resume=resume)
    indices = distributed.split_tasks(len(tasks), 2, pid, "round_robin")

    made = []

    def rows(task):
        if kill_after is not None and len(made) >= kill_after:
            raise Killed
        made.append(task)
        return fake_generate(task)

    distributed.evaluate_shard(tasks, indices, state, generate=rows,
                               make_protocol=lambda f: make_protocol(f, 1.0), workers=1,
                               settings=settings)


def test_a_shard_resumes_only_the_same_run_and_the_merge_names_its_parts(tmp_path):
    from alodlm_scoring.run_record import ResumeMismatch

    tasks = make_tasks()
    out = tmp_path / "multi"
    with pytest.raises(Killed):
        _shard(out, tasks, 0, _settings(), kill_after=2)
    _shard(out, tasks, 1, _settings())
    assert json.loads(read(out / f"run.{distributed.shard_suffix(0, 2)}.json"))["bound"]["--q"] == 0.5
    before = {name: read(out / name) for name in sorted(os.listdir(out))}
    for pid in (0, 1):  # the interrupted shard and the complete one
        with pytest.raises(ResumeMismatch, match=r"--q was 0.5 when the run started, now 0.3"):
            _shard(out, tasks, pid, _settings(q=0.3), resume=True)
    assert {name: read(out / name) for name in sorted(os.listdir(out))} == before
    _shard(out, tasks, 0, _settings(batch_size=4), resume=True)  # a free setting may differ
    summary = distributed.merge_shards(out, tasks, 2, make_protocol=make_protocol)
    common = {"decoder": "jax-xla-compiled"}
    assert summary["protocol"]["parts"] == [
        {"process": 0, "rows": [0, 2], **common, "batch_size": 1},
        {"process": 0, "rows": [2, 7], **common, "batch_size": 4}]
