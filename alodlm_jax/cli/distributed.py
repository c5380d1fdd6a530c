"""Data parallelism across processes and hosts: one evaluation split over ``jax.distributed``.

Every process decodes its own share of the tasks on its own (local) devices — possibly a
tensor-parallel mesh (:mod:`alodlm_jax.network.sharding`) — and writes its own shard of predictions; no
collective runs during decoding. At the end process 0 merges the shards into exactly the
``predictions.jsonl`` and ``summary.json`` that one process would have written (timings aside).

The flow (:func:`evaluate_sharded`):

1. :func:`initialize` — ``jax.distributed.initialize`` from ``--coordinator_address``,
   ``--num_processes``, ``--process_id`` (or ``--coordinator_address=auto``: JAX's own cluster
   detection on TPU pods, SLURM, Open MPI, ...). One process and no flags: nothing is initialized.
2. :func:`split_tasks` — a deterministic split of the task indices. ``round_robin`` (default):
   process ``p`` takes tasks ``p, p+P, p+2P, ...``, which balances load when a task file is sorted
   by benchmark (short multiple-choice answers first, long math and code later). ``contiguous``:
   balanced blocks (sizes differ by at most one), process 0 first.
3. Each process evaluates its tasks with the single-process flow (``alodlm_scoring.evaluation``),
   writing ``predictions.process-0000i-of-0000P.jsonl`` (one row per task, flushed per row,
   resumable with ``--resume``), ``scoring_failures.process-...jsonl`` (only on a failure) and, when
   its share is complete, ``summary.process-...json`` — the shard's completion marker.
4. A barrier (the coordination service's ``wait_at_barrier``, no device collective needed), then
   process 0 checks every marker and merges: the shard lines are copied verbatim into task order
   (``predictions.jsonl``, written to a temporary file and renamed), the summary is aggregated over
   the merged rows in task order (the same sums in the same order as one process), scoring
   failures are put in task order, and ``compile_seconds`` is the sum over processes. A second
   barrier keeps every process alive until the merge is done (the coordination service treats an
   early exit as a failure).

The output directory must be one filesystem all processes see (a local disk on a single host; a
shared mount across hosts). Shard files are kept after the merge; a re-run with ``--resume``
re-merges them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

SPLITS = ("round_robin", "contiguous")
AUTO = "auto"
BARRIER_TIMEOUT_MS = 7 * 24 * 3600 * 1000  # decoding a suite may take days; a crash ends it anyway


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the run."""

    process_id: int = 0
    num_processes: int = 1

    @property
    def is_coordinator(self) -> bool:
        return self.process_id == 0

    @property
    def suffix(self) -> str:
        """``process-00001-of-00002``: the infix of this process's shard files."""
        return shard_suffix(self.process_id, self.num_processes)


def shard_suffix(process_id: int, num_processes: int) -> str:
    return f"process-{process_id:05d}-of-{num_processes:05d}"


# --------------------------------------------------------------------------------------------
# jax.distributed
# --------------------------------------------------------------------------------------------


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, **kwargs) -> ProcessInfo:
    """``jax.distributed.initialize`` from the command-line flags; returns this process's place.

    No flags (or ``num_processes=1`` without an address): a single process, nothing initialized.
    ``coordinator_address="auto"``: JAX detects the cluster itself (the other flags optional).
    Otherwise all three are needed. Bad values raise ``ValueError`` with one clear line.
    """
    if coordinator_address is None and process_id is None and num_processes in (None, 1):
        return ProcessInfo(0, 1)
    if coordinator_address != AUTO:
        missing = [name for name, value in (("--coordinator_address", coordinator_address),
                                            ("--num_processes", num_processes),
                                            ("--process_id", process_id)) if value is None]
        if missing:
            raise ValueError(f"multi-process evaluation needs {', '.join(missing)} (or "
                             f"--coordinator_address=auto where JAX detects the cluster)")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"--num_processes must be at least 1, got {num_processes}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"--process_id must be in [0, {num_processes}), got {process_id}")
    import jax

    jax.distributed.initialize(
        coordinator_address=None if coordinator_address == AUTO else coordinator_address,
        num_processes=num_processes, process_id=process_id, **kwargs)
    return ProcessInfo(jax.process_index(), jax.process_count())


def barrier(name: str, info: ProcessInfo, timeout_ms: int = BARRIER_TIMEOUT_MS) -> None:
    """Blocks until every process reaches barrier ``name`` (a no-op for one process).

    Uses the coordination service's barrier (host-only, works on CPU without device collectives);
    falls back to ``multihost_utils.sync_global_devices`` if that client is unavailable.
    """
    if info.num_processes == 1:
        return
    from jax._src import distributed as jax_distributed

    client = getattr(jax_distributed.global_state, "client", None)
    if client is not None and hasattr(client, "wait_at_barrier"):
        client.wait_at_barrier(f"alodlm_jax:{name}", timeout_ms)
        return
    from jax.experimental import multihost_utils  # pragma: no cover - older runtimes

    multihost_utils.sync_global_devices(name)  # pragma: no cover


# --------------------------------------------------------------------------------------------
# The split
# --------------------------------------------------------------------------------------------


def split_tasks(num_tasks: int, num_processes: int, process_id: int, scheme: str = "round_robin") -> list[int]:
    """The task indices (ascending) that ``process_id`` evaluates; every index goes to exactly one."""
    if scheme not in SPLITS:
        raise ValueError(f"task split must be one of {list(SPLITS)}, got {scheme!r}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} outside [0, {num_processes})")
    if scheme == "round_robin":
        return list(range(process_id, num_tasks, num_processes))
    lo = process_id * num_tasks // num_processes
    hi = (process_id + 1) * num_tasks // num_processes
    return list(range(lo, hi))


# --------------------------------------------------------------------------------------------
# Shard files
# --------------------------------------------------------------------------------------------


def _shard_state_class():
    from alodlm_scoring.evaluation import OutputState

    @dataclasses.dataclass
    class ShardState(OutputState):
        """An ``OutputState`` whose files carry this process's shard suffix."""

        suffix: str = ""

        @property
        def predictions_path(self) -> str:
            return os.path.join(self.directory, f"predictions.{self.suffix}.jsonl")

        @property
        def summary_path(self) -> str:
            return os.path.join(self.directory, f"summary.{self.suffix}.json")

        @property
        def failures_path(self) -> str:
            return os.path.join(self.directory, f"scoring_failures.{self.suffix}.jsonl")

        @property
        def record_path(self) -> str:
            return os.path.join(self.directory, f"run.{self.suffix}.json")

    return ShardState


def shard_paths(directory: str | os.PathLike, process_id: int, num_processes: int) -> dict[str, str]:
    """``predictions``, ``summary`` (completion marker) and ``failures`` paths of one shard."""
    suffix = shard_suffix(process_id, num_processes)
    directory = os.fspath(directory)
    return {"predictions": os.path.join(directory, f"predictions.{suffix}.jsonl"),
            "summary": os.path.join(directory, f"summary.{suffix}.json"),
            "failures": os.path.join(directory, f"scoring_failures.{suffix}.jsonl")}


def prepare_shard_directory(directory: str | os.PathLike, info: ProcessInfo, *, resume: bool = False):
    """This process's ``OutputState`` (shard file names), with the single-process rules.

    Without ``resume``: the merged ``predictions.jsonl``/``summary.json`` and this shard's files
    must not exist ("Use a fresh evaluation output directory"). With ``resume``: this shard's
    complete rows are read back; a torn last line is cut off when evaluation starts.
    """
    from alodlm_scoring import evaluation
    from alodlm_scoring.evaluation import (FRESH_DIRECTORY_MESSAGE, PREDICTIONS_FILE, SUMMARY_FILE,
                                           read_previous_run)

    directory = os.fspath(directory)
    evaluation.missing_directories(directory)  # created when the shard's work starts
    state = _shard_state_class()(directory, resume, [], 0, False, [], False, suffix=info.suffix)
    state.file_exists = os.path.exists(state.predictions_path)
    state.summary_exists = os.path.exists(state.summary_path)
    if not resume:
        for path in (os.path.join(directory, PREDICTIONS_FILE), os.path.join(directory, SUMMARY_FILE),
                     state.predictions_path, state.summary_path):
            if os.path.exists(path):
                raise FileExistsError(f"{FRESH_DIRECTORY_MESSAGE}: {path} already exists "
                                      "(pass --resume to continue an interrupted run)")
        return state
    return read_previous_run(state)


# --------------------------------------------------------------------------------------------
# Evaluate one shard, then merge
# --------------------------------------------------------------------------------------------


def evaluate_shard(tasks: Sequence[Mapping[str, Any]], indices: Sequence[int], state, *,
                   generate: Callable[[Mapping[str, Any]], Mapping[str, Any]],
                   make_protocol: Callable[[Sequence[dict]], dict],
                   generate_stream: Callable[[Sequence[Mapping[str, Any]]], Iterator[Mapping[str, Any]]]
                   | None = None, **evaluate_kwargs) -> dict:
    """Evaluates ``tasks[i] for i in indices`` into the shard files; returns the shard summary.

    ``generate(task)`` returns the decoder's result dict for one task; ``generate_stream(tasks)``,
    if given, is used instead: the result dicts of all of them in order (a batched engine decodes
    the shard's pending tasks as one stream, a freed slot taking this process's next task). A
    process with no tasks (more processes than tasks) writes an empty shard and a marker with no
    benchmarks.
    """
    from alodlm_scoring import evaluation, outputs, run_record

    mine = [tasks[i] for i in indices]
    if not mine:
        settings = evaluate_kwargs.get("settings")
        previous = None
        if settings is not None and state.resume:
            previous = run_record.check(state.record_path, settings, has_rows=state.has_rows)
        state.create_directory()
        if settings is not None:
            run_record.begin(state.record_path, settings, previous, 0)
        if not state.file_exists:
            open(state.predictions_path, "ab").close()
        summary = {"benchmarks": {}, "benchmark_count": 0, "protocol": make_protocol([])}
        outputs.write_summary(state.summary_path, summary)
        return summary

    def rows(start: int) -> Iterator[Mapping[str, Any]]:
        if generate_stream is not None:
            yield from generate_stream(mine[start:])
            return
        for task in mine[start:]:
            yield generate(task)

    return evaluation.evaluate(mine, state, rows_source=rows, make_protocol=make_protocol,
                               **evaluate_kwargs)


def _read_lines(path: str) -> list[str]:
    with open(path, "rb") as handle:
        data = handle.read()
    text = data.decode("utf-8")
    if text and not text.endswith("\n"):
        raise ValueError(f"{path}: torn last line (the shard did not finish)")
    return [line + "\n" for line in text.split("\n")[:-1]]


def merge_shards(directory: str | os.PathLike, tasks: Sequence[Mapping[str, Any]], num_processes: int,
                 *, make_protocol: Callable[[Sequence[dict]], dict], split: str = "round_robin") -> dict:
    """Process 0: merge every shard into ``predictions.jsonl`` and ``summary.json``; returns it.

    Each shard must be complete (its marker present) and hold exactly its tasks' rows, in order.
    Lines are copied verbatim, so the merged file is byte-for-byte what one process writes (timing
    fields aside); the summary is aggregated over the merged rows in task order.
    """
    from alodlm_scoring import evaluation, outputs
    from alodlm_scoring.tasks import task_key

    directory = os.fspath(directory)
    lines: list[str | None] = [None] * len(tasks)
    failures_by_index: dict[int, dict] = {}
    index_of = {task_key(task): i for i, task in enumerate(tasks)}
    compile_seconds: list[float] = []
    code_scoring: dict[str, Any] = {}
    parts: list[dict] = []
    for pid in range(num_processes):
        paths = shard_paths(directory, pid, num_processes)
        indices = split_tasks(len(tasks), num_processes, pid, split)
        if not os.path.exists(paths["summary"]):
            raise ValueError(f"cannot merge: shard {pid} of {num_processes} is not complete "
                             f"({paths['summary']} is missing)")
        shard_lines = _read_lines(paths["predictions"])
        if len(shard_lines) != len(indices):
            raise ValueError(f"cannot merge: {paths['predictions']} has {len(shard_lines)} rows, expected "
                             f"{len(indices)} (was it written with another --num_processes or split?)")
        for line_number, (index, line) in enumerate(zip(indices, shard_lines), start=1):
            row = json.loads(line)
            if task_key(row) != task_key(tasks[index]):
                raise ValueError(f"cannot merge: {paths['predictions']}:{line_number} is task "
                                 f"{task_key(row)!r}, expected {task_key(tasks[index])!r}")
            lines[index] = line
        with open(paths["summary"], encoding="utf-8") as handle:
            shard_summary = json.load(handle)
        shard_protocol = shard_summary.get("protocol") or {}
        seconds = shard_protocol.get("compile_seconds")
        if "code_verdicts" in shard_protocol and (
                not code_scoring or (code_scoring["sandbox"] or {}).get("mechanisms") is None):
            code_scoring = {"verdicts": shard_protocol["code_verdicts"],
                            "sandbox": shard_protocol.get("code_sandbox")}
        if isinstance(seconds, (int, float)):
            compile_seconds.append(float(seconds))
        for span in shard_protocol.get("parts") or ():  # rows of one shard, by free settings
            parts.append({"process": pid, **span})
        if os.path.exists(paths["failures"]):
            for line in _read_lines(paths["failures"]):
                record = json.loads(line)
                failures_by_index[index_of[task_key(record)]] = record
    assert all(line is not None for line in lines)
    merged_path = os.path.join(directory, evaluation.PREDICTIONS_FILE)
    temporary = merged_path + ".merging"
    with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(lines)  # type: ignore[arg-type]
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, merged_path)
    failures = [failures_by_index[i] for i in sorted(failures_by_index)]
    if failures:
        with open(os.path.join(directory, evaluation.FAILURES_FILE), "w", encoding="utf-8") as handle:
            handle.writelines(outputs.row_line(f) for f in failures)
    rows = [json.loads(line) for line in lines]  # type: ignore[arg-type]
    summary = outputs.aggregate(rows)
    protocol = make_protocol(failures)
    if compile_seconds and "compile_seconds" in protocol:
        protocol["compile_seconds"] = outputs.python312_sum(compile_seconds)
    if code_scoring:  # the shards' code-scoring settings (a shard that scored code describes it)
        protocol = outputs.with_code_scoring(protocol, verdicts=code_scoring["verdicts"],
                                             sandbox=code_scoring["sandbox"] or {})
    if parts:  # some shard's rows were written with different free settings (its row indices)
        protocol["parts"] = parts
    summary["protocol"] = protocol
    outputs.write_summary(os.path.join(directory, evaluation.SUMMARY_FILE), summary)
    return summary


def wait_for_markers(directory: str | os.PathLike, num_processes: int, *, timeout_s: float = 600.0,
                     poll_s: float = 0.2) -> None:
    """Polls until every shard's completion marker is visible (a shared filesystem may lag)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [pid for pid in range(num_processes)
                   if not os.path.exists(shard_paths(directory, pid, num_processes)["summary"])]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"shards {missing} of {num_processes} never completed in {directory}")
        time.sleep(poll_s)


def evaluate_sharded(tasks: Sequence[Mapping[str, Any]], output: str | os.PathLike, info: ProcessInfo, *,
                     generate: Callable[[Mapping[str, Any]], Mapping[str, Any]],
                     make_protocol: Callable[[Sequence[dict]], dict], resume: bool = False,
                     split: str = "round_robin", state=None, marker_timeout_s: float = 600.0,
                     **evaluate_kwargs) -> dict:
    """The whole multi-process flow for this process; returns the merged summary on process 0
    and this process's shard summary elsewhere.

    ``state`` (from :func:`prepare_shard_directory`) may be prepared early, so that a bad output
    directory fails before the model is loaded. ``evaluate_kwargs`` go to
    ``alodlm_scoring.evaluation.evaluate`` (``workers``, ``progress``, ...).
    """
    if state is None:
        state = prepare_shard_directory(output, info, resume=resume)
    indices = split_tasks(len(tasks), info.num_processes, info.process_id, split)
    summary = evaluate_shard(tasks, indices, state, generate=generate, make_protocol=make_protocol,
                             **evaluate_kwargs)
    barrier("shards_written", info)
    if info.is_coordinator:
        wait_for_markers(output, info.num_processes, timeout_s=marker_timeout_s)
        summary = merge_shards(output, tasks, info.num_processes, make_protocol=make_protocol, split=split)
    barrier("merged", info)
    return summary
