"""The evaluation flow shared by generate and rescore modes (SCORING.md §6, §7; D3, D8).

The flow, as functions the command line strings together:

1. ``load_tasks`` (``alodlm_scoring.tasks``): every task check, up front (D9);
2. :func:`prepare_output_directory` — check the directory without touching it: refuse one that
   already holds ``predictions.jsonl`` or ``summary.json`` unless resuming, or a path that cannot
   become a directory;
3. (the command validates the decoding configuration, in both modes);
4. rescore mode: :func:`load_predictions` (``alodlm_scoring.predictions``, the one reader of
   prediction files) validates *every* supplied row before anything is written (D8) and
   :func:`rescore_source` feeds them; generate mode: the generator feeds result dicts;
5. :func:`evaluate` creates the directory (only now, when work starts) and scores each task in
   task order — non-code metrics on the calling (main)
   thread, because math-verify's timeouts need ``SIGALRM``; code metrics in the fresh-interpreter
   pool, concurrently (when rescoring with two or more workers, math too: each worker scores on its
   own main thread) — and writes each row as soon as it and every row before it are scored, so
   ``predictions.jsonl`` is always a prefix of the final file, one write per row (the file is
   created with the first row);
6. aggregate, protocol block, atomic ``summary.json``.

A failed command leaves ``--output`` as it found it: nothing is created before step 5, and when
:func:`evaluate` fails before its first row, the directories it created are removed again (only
those, and only while empty: a user's directory or file is never touched). Once a row is written
it stays, so ``--resume`` can continue the run.

``--resume`` continues a killed run: the existing rows must be a prefix of what the run would
write (checked against the tasks, and in rescore mode against what rescoring writes); a torn final
line is cut off; the rest is scored; the files come out byte-identical to an uninterrupted run. D3
failures are logged, one JSON line each, to ``scoring_failures.jsonl`` (created only when a failure
happens) so that a resumed run can still report them in ``protocol.scoring_failures``.

No JAX here: rescoring must not load an accelerator runtime.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

from . import outputs, run_record
from .pool import Outcome, ScoringPool, is_code_task
from .predictions import RESCORE_FIELDS, load_predictions  # noqa: F401 - load_predictions: re-exported
from .tasks import CODE_METRICS, sha256_file, task_key

__all__ = [
    "PREDICTIONS_FILE",
    "SUMMARY_FILE",
    "FAILURES_FILE",
    "PREDICTION_FIELDS",
    "OutputState",
    "missing_directories",
    "make_directories",
    "remove_directories",
    "prepare_output_directory",
    "load_predictions",
    "rescore_source",
    "rescore_row_checker",
    "rescore_protocol",
    "rescore_settings",
    "evaluate",
    "rescore",
    "rescore_pool_metrics",
]

PREDICTIONS_FILE = "predictions.jsonl"
SUMMARY_FILE = "summary.json"
FAILURES_FILE = "scoring_failures.jsonl"
PREDICTION_FIELDS = RESCORE_FIELDS.required
FRESH_DIRECTORY_MESSAGE = "Use a fresh evaluation output directory"
# How many scored-but-unwritten rows may wait behind a slow code task before the main thread
# stops producing more (bounds memory; the pool stays busy well below this).
_MAX_PENDING_ROWS = 4096

ScoreFunction = Callable[[Mapping[str, Any], str], "tuple[bool, str | None]"]
RowsSource = Callable[[int], Iterable[Mapping[str, Any]]]
RowChecker = Callable[[int, Mapping[str, Any], str], None]
Progress = Callable[[int, int], None]


# --------------------------------------------------------------------------------------------
# Output directory
# --------------------------------------------------------------------------------------------


def missing_directories(directory: str | os.PathLike) -> list[str]:
    """The directories :func:`make_directories` would create for ``directory``, outermost first.

    Raises ``NotADirectoryError`` when the path, or the nearest of its ancestors that exists, is
    not a directory, and ``PermissionError`` when that directory is not writable; creates nothing.
    """
    target = os.path.abspath(os.fspath(directory))
    missing: list[str] = []
    path = target
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not os.path.isdir(path):
        raise NotADirectoryError(f"output directory {os.fspath(directory)}: {path} is not a "
                                 "directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"output directory {os.fspath(directory)}: {path} is not writable")
    return missing[::-1]


def make_directories(directory: str | os.PathLike) -> list[str]:
    """``os.makedirs(directory, exist_ok=True)`` that returns the directories it created,
    outermost first, for :func:`remove_directories`."""
    created = []
    for path in missing_directories(directory):
        try:
            os.mkdir(path)
        except FileExistsError:  # made meanwhile by someone else: not ours to remove
            continue
        created.append(path)
    return created


def remove_directories(created: Sequence[str]) -> None:
    """Remove directories :func:`make_directories` created, innermost first, while they are
    empty (a directory holding anything, a row for ``--resume`` say, stays with its parents)."""
    for path in reversed(created):
        try:
            os.rmdir(path)
        except OSError:
            return


@dataclasses.dataclass
class OutputState:
    """The output directory and, when resuming, what a previous run left in it.

    Nothing is created until :meth:`create_directory`; :meth:`remove_created_directories`
    undoes exactly what it created, while that is still empty.
    """

    directory: str
    resume: bool
    existing_lines: list[str]  # complete rows already in predictions.jsonl (each ends "\n")
    complete_bytes: int  # length of those lines in bytes; anything after is a torn line
    file_exists: bool
    existing_failures: list[dict]
    summary_exists: bool
    created_directories: list[str] = dataclasses.field(default_factory=list)

    def create_directory(self) -> None:
        """Create the directory (with parents) if it does not exist yet; remember what was made."""
        self.created_directories += make_directories(self.directory)

    def remove_created_directories(self) -> None:
        """Undo :meth:`create_directory` where nothing has been written since."""
        remove_directories(self.created_directories)
        self.created_directories = [path for path in self.created_directories
                                    if os.path.lexists(path)]

    @property
    def predictions_path(self) -> str:
        return os.path.join(self.directory, PREDICTIONS_FILE)

    @property
    def summary_path(self) -> str:
        return os.path.join(self.directory, SUMMARY_FILE)

    @property
    def failures_path(self) -> str:
        return os.path.join(self.directory, FAILURES_FILE)

    @property
    def record_path(self) -> str:
        return os.path.join(self.directory, run_record.RECORD_FILE)

    @property
    def has_rows(self) -> bool:
        """Whether a previous run left rows (or a summary) that a resume would continue."""
        return bool(self.existing_lines) or self.summary_exists


def prepare_output_directory(directory: str | os.PathLike, *, resume: bool = False) -> OutputState:
    """Check that the output directory may be written (§6.2 step 2), creating nothing.

    The directory itself is created (with parents) by :func:`evaluate`, when work starts. Without
    ``resume`` a directory holding ``predictions.jsonl`` or ``summary.json`` is refused with the
    reference's ``FileExistsError``. With ``resume`` the complete lines of an existing
    ``predictions.jsonl`` are read (nothing is modified yet).
    """
    directory = os.fspath(directory)
    missing_directories(directory)
    state = OutputState(directory, resume, [], 0, False, [], False)
    state.file_exists = os.path.exists(state.predictions_path)
    state.summary_exists = os.path.exists(state.summary_path)
    if not resume:
        for path in (state.predictions_path, state.summary_path):
            if os.path.exists(path):
                raise FileExistsError(f"{FRESH_DIRECTORY_MESSAGE}: {path} already exists "
                                      "(pass --resume to continue an interrupted run)")
        return state
    if not state.file_exists and state.summary_exists:
        raise FileExistsError(f"{FRESH_DIRECTORY_MESSAGE}: {state.summary_path} exists without "
                              f"{PREDICTIONS_FILE}; cannot resume")
    return read_previous_run(state)


def read_previous_run(state: OutputState) -> OutputState:
    """Fills ``state`` with what an interrupted run left: its complete prediction lines (a torn
    last line is not counted; it is cut off when evaluation starts) and its recorded failures."""
    if state.file_exists:
        complete = _complete_lines(state.predictions_path)
        state.complete_bytes = len(complete)
        state.existing_lines = [line + "\n" for line in complete.decode("utf-8").split("\n")[:-1]]
    if os.path.exists(state.failures_path):
        for line in _complete_lines(state.failures_path).decode("utf-8").splitlines():
            state.existing_failures.append(json.loads(line))
    return state


def _complete_lines(path: str) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read()
    return data[: data.rfind(b"\n") + 1]


# --------------------------------------------------------------------------------------------
# Rescore mode (§6.3, D8)
# --------------------------------------------------------------------------------------------


def rescore_source(predictions: Sequence[Mapping[str, Any]]) -> RowsSource:
    """Rows for :func:`evaluate` in rescore mode: copies of the supplied rows, from ``start``."""

    def rows(start: int) -> Iterator[Mapping[str, Any]]:
        # No copy: rows are only read (``prediction_row`` builds a new dict).
        for index in range(start, len(predictions)):
            yield predictions[index]

    return rows


def rescore_row_checker(predictions: Sequence[Mapping[str, Any]],
                        score: ScoreFunction | None = None) -> RowChecker:
    """For ``--resume`` in rescore mode: an existing row must equal what rescoring writes.

    Non-code rows are rescored (cheap) and compared byte for byte. Code rows are not re-executed;
    everything but the verdict is compared byte for byte and the verdict must be a boolean with
    ``extracted`` null.
    """
    if score is None:
        from .metrics import score as default_score

        score = default_score

    def check(index: int, task: Mapping[str, Any], line: str) -> None:
        if is_code_task(task):
            existing = json.loads(line)
            correct = existing.get("correct")
            if not isinstance(correct, bool):
                raise ValueError("verdict is not a boolean")
            extracted = None
        else:
            correct, extracted = score(task, predictions[index]["text"])
        expected = outputs.row_line(outputs.prediction_row(predictions[index], task, correct, extracted))
        if expected != line:
            raise ValueError("row differs from what rescoring writes")

    return check


def rescore_protocol(input_path: str | os.PathLike,
                     predictions_path: str | os.PathLike) -> Callable[[Sequence[dict]], dict]:
    """The protocol block of a rescore run (§7.4), given the D3 failures at the end."""
    from .manifest import suite_manifest

    input_sha256 = sha256_file(input_path)
    predictions_sha256 = sha256_file(predictions_path)
    manifest = suite_manifest(input_path)

    def make(failures: Sequence[dict]) -> dict:
        return outputs.protocol_block(
            decoder=outputs.RESCORE_DECODER,
            input_sha256=input_sha256,
            decode=None,
            precision=None,
            device=None,
            timing=outputs.RESCORE_TIMING,
            predictions_sha256=predictions_sha256,
            scoring_failures=failures,
            suite_manifest=manifest,
        )

    return make


def rescore_settings(input_path: str | os.PathLike, predictions_path: str | os.PathLike, *,
                     code_sandbox: str = "on", code_verdicts: str = "reference"
                     ) -> run_record.RunSettings:
    """What a resumed rescore run must share with the run it continues: both files' contents and
    the code-scoring settings (``--workers`` and ``--math_in_workers`` change no verdict)."""
    return run_record.RunSettings(bound={
        "--input": run_record.file_digest(input_path),
        "--predictions": run_record.file_digest(predictions_path),
        "--code_verdicts": code_verdicts,
        "--code_sandbox": code_sandbox,
    })


# --------------------------------------------------------------------------------------------
# Scoring and writing
# --------------------------------------------------------------------------------------------


def _aggregate_fields(row: Mapping[str, Any]) -> dict:
    """The four fields the summary needs (rows themselves are not kept in memory)."""
    return {key: row[key] for key in ("benchmark", "correct", "wall_seconds", "generated_tokens")}


def _same_id(a: Any, b: Any) -> bool:
    return json.dumps(a) == json.dumps(b)


def _resume_prefix(state: OutputState, tasks: Sequence[Mapping[str, Any]],
                   check_existing_row: RowChecker | None) -> list[dict]:
    """Validate the rows a previous run wrote; return them parsed."""
    if len(state.existing_lines) > len(tasks):
        raise ValueError(f"cannot resume: {state.predictions_path} has more rows "
                         f"({len(state.existing_lines)}) than there are tasks ({len(tasks)})")
    rows = []
    for index, line in enumerate(state.existing_lines):
        where = f"cannot resume: {state.predictions_path}:{index + 1}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: invalid JSON: {error}") from None
        task = tasks[index]
        if not isinstance(row, dict) or row.get("benchmark") != task["benchmark"] or not _same_id(
            row.get("id"), task["id"]
        ):
            raise ValueError(f"{where}: row does not belong to task {task_key(task)!r} "
                             "(was the run started with other inputs?)")
        if check_existing_row is not None:
            try:
                check_existing_row(index, task, line)
            except Exception as error:
                raise ValueError(f"{where}: {error}") from None
        rows.append(row)
    return rows


def _reset_to_prefix(state: OutputState, rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Cut a torn final line off predictions.jsonl and keep only the failures of kept rows."""
    if state.file_exists:
        with open(state.predictions_path, "r+b") as handle:
            handle.truncate(state.complete_bytes)
    kept_keys = {task_key(row) for row in rows}
    failures = [f for f in state.existing_failures if task_key(f) in kept_keys]
    if failures:
        with open(state.failures_path, "w", encoding="utf-8") as handle:
            handle.writelines(outputs.row_line(f) for f in failures)
    elif os.path.exists(state.failures_path):
        os.unlink(state.failures_path)
    return failures


def evaluate(
    tasks: Sequence[Mapping[str, Any]],
    state: OutputState,
    *,
    rows_source: RowsSource,
    make_protocol: Callable[[Sequence[dict]], dict],
    workers: int | None = None,
    progress: Progress | None = None,
    check_existing_row: RowChecker | None = None,
    score: ScoreFunction | None = None,
    pool: ScoringPool | None = None,
    pool_metrics: Collection[str] = CODE_METRICS,
    overlap: bool = True,
    code_sandbox: str = "on",
    code_verdicts: str = "reference",
    settings: run_record.RunSettings | None = None,
) -> dict:
    """Score every task, write ``predictions.jsonl`` and ``summary.json``; return the summary.

    ``rows_source(start)`` yields the result dict for ``tasks[start]``, ``tasks[start + 1]``, … in
    order (the decoder's result in generate mode, a supplied row in rescore mode); its ``"text"``
    is scored. ``make_protocol(failures)`` builds the protocol block at the end. Non-code tasks are
    scored on the calling thread with ``score``; code tasks in ``pool`` (or a pool of ``workers``
    fresh-interpreter workers started on demand). ``pool_metrics`` names the metrics sent to the
    pool: the code metrics, plus ``math`` when rescoring in parallel (each worker scores on its
    own main thread, where math-verify's ``SIGALRM`` timeouts work, so verdicts are unchanged).
    With ``overlap=False`` every queued task is finished before the next result is requested, so
    scoring never runs while the generator is being timed (generate mode's default).
    ``code_sandbox`` (``on``/``off``) and ``code_verdicts`` (``reference``/``strict``) configure
    the pool the call starts (a given ``pool`` keeps its own); both are recorded in the
    protocol (``code_verdicts``, ``code_sandbox``).

    ``settings`` (the run's :class:`~alodlm_scoring.run_record.RunSettings`) are checked against
    the run record of a resumed run before anything is touched, and written to the record
    (``run.json``) when the work starts; ``protocol.parts`` then says which free settings wrote
    which rows when they differ. Without ``settings`` no record is kept or checked.
    """
    if score is None:
        from .metrics import score as default_score

        score = default_score
    previous = None
    if settings is not None and state.resume:
        previous = run_record.check(state.record_path, settings, has_rows=state.has_rows)
    existing = _resume_prefix(state, tasks, check_existing_row) if state.resume else []
    state.create_directory()
    created_record = False
    try:
        if settings is not None:
            created_record = run_record.begin(state.record_path, settings, previous, len(existing))
        summary = _evaluate_into(tasks, state, existing, rows_source, make_protocol, workers,
                                 progress, score, pool, pool_metrics, overlap, code_sandbox,
                                 code_verdicts, settings is not None)
    except BaseException:
        if created_record and not os.path.exists(state.predictions_path):
            run_record.discard(state.record_path)  # nothing written: the directory as it was
        state.remove_created_directories()  # only while empty: written rows stay for --resume
        raise
    return summary


def _evaluate_into(tasks, state, existing, rows_source, make_protocol, workers, progress, score,
                   pool, pool_metrics, overlap, code_sandbox, code_verdicts, recorded) -> dict:
    failures = _reset_to_prefix(state, existing) if state.resume else []
    aggregated = [_aggregate_fields(row) for row in existing]
    start = len(existing)
    if progress is not None:
        progress(start, len(tasks))
    if start < len(tasks):
        owned_pool = pool is None
        active_pool = (ScoringPool(workers, sandbox=code_sandbox, rules=code_verdicts)
                       if owned_pool else pool)
        try:
            with outputs.RowWriter(state.predictions_path, append=state.file_exists,
                                   lazy=True) as writer:
                _score_and_write(
                    tasks, start, rows_source(start), score, active_pool, writer, state,
                    aggregated, failures, progress, frozenset(pool_metrics), overlap,
                )
            code_scoring = _code_scoring(active_pool, tasks)
        except BaseException:
            if owned_pool:
                active_pool.close(kill=True)
            raise
        if owned_pool:
            active_pool.close()
    elif pool is not None:
        code_scoring = _code_scoring(pool, tasks)
    else:  # nothing left to score (a finished run resumed): the same record all the same
        with ScoringPool(1, sandbox=code_sandbox, rules=code_verdicts) as described:
            code_scoring = _code_scoring(described, tasks)
    summary = outputs.aggregate(aggregated)
    summary["protocol"] = outputs.with_code_scoring(make_protocol(failures), **code_scoring)
    parts = run_record.protocol_parts(state.record_path, len(tasks)) if recorded else None
    if parts is not None:  # rows written with different free settings: say which wrote which
        summary["protocol"]["parts"] = parts
    outputs.write_summary(state.summary_path, summary)
    return summary


def _code_scoring(pool: ScoringPool, tasks: Sequence[Mapping[str, Any]]) -> dict:
    """``protocol.code_verdicts`` and ``code_sandbox``, a function of the settings and the task
    file (so a resumed run records the same): the mechanisms are found only for a suite with
    code tasks (a worker is started to find them when none ran in this process)."""
    if any(task["metric"] in CODE_METRICS for task in tasks):
        return {"verdicts": pool.rules, "sandbox": pool.code_sandbox}
    return {"verdicts": pool.rules, "sandbox": pool.unused_code_sandbox}


def _score_and_write(tasks, start, results, score, pool, writer, state, aggregated, failures,
                     progress, pool_metrics, overlap=True) -> None:
    """Score ``tasks[start:]`` in order; write each row once it and all earlier rows are scored.

    Non-code tasks are scored here, on the calling thread; code tasks go to the pool and their
    futures wait in ``pending`` (with any later rows) until they resolve.
    """
    pending: collections.deque = collections.deque()
    results = iter(results)
    total = len(tasks)
    make_row = outputs.prediction_row

    def emit(task, result, correct, extracted, failure) -> None:
        if failure is not None:
            record = {"benchmark": task["benchmark"], "id": task["id"], "reason": failure}
            with open(state.failures_path, "a", encoding="utf-8") as handle:
                handle.write(outputs.row_line(record))
            failures.append(record)
        row = make_row(result, task, correct, extracted)
        writer.write(row)
        aggregated.append({"benchmark": row["benchmark"], "correct": row["correct"],
                           "wall_seconds": row["wall_seconds"],
                           "generated_tokens": row["generated_tokens"]})
        if progress is not None:
            progress(len(aggregated), total)

    def write_front() -> None:
        task, result, outcome = pending.popleft()
        if not isinstance(outcome, Outcome):
            outcome = outcome.result()
        emit(task, result, outcome.correct, outcome.extracted, outcome.failure)

    for index in range(start, total):
        task = tasks[index]
        if not overlap:
            while pending:
                write_front()
        try:
            result = next(results)
        except StopIteration:
            raise RuntimeError(f"no result for task {index + 1} {task_key(task)!r}") from None
        generation = result["text"]
        if task["metric"] in pool_metrics:
            pending.append((task, result, pool.submit(task, generation)))
        elif not pending:  # fast path: nothing queued ahead, write at once
            correct, extracted = score(task, generation)
            emit(task, result, correct, extracted, None)
            continue
        else:
            pending.append((task, result, Outcome(*score(task, generation))))
        while pending and (isinstance(pending[0][2], Outcome) or pending[0][2].done()
                           or len(pending) > _MAX_PENDING_ROWS):
            write_front()
    while pending:
        write_front()


def rescore(
    input_path: str | os.PathLike,
    predictions_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    resume: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    tasks: Sequence[Mapping[str, Any]] | None = None,
    state: OutputState | None = None,
    math_in_pool: bool = True,
    code_sandbox: str = "on",
    code_verdicts: str = "reference",
) -> dict:
    """The whole rescore-mode flow (§6.2 without the decoding-flag check, §6.3) as one call.

    With more than one worker and ``math_in_pool``, math tasks are scored in the pool as well.
    """
    from .tasks import load_tasks

    if tasks is None:
        tasks = load_tasks(input_path)
    if state is None:
        state = prepare_output_directory(output_dir, resume=resume)
    predictions = load_predictions(predictions_path, tasks)
    return evaluate(
        tasks,
        state,
        rows_source=rescore_source(predictions),
        make_protocol=rescore_protocol(input_path, predictions_path),
        workers=workers,
        progress=progress,
        check_existing_row=rescore_row_checker(predictions) if state.resume else None,
        pool_metrics=rescore_pool_metrics(workers, math_in_pool),
        code_sandbox=code_sandbox,
        code_verdicts=code_verdicts,
        settings=rescore_settings(input_path, predictions_path, code_sandbox=code_sandbox,
                                  code_verdicts=code_verdicts),
    )


def rescore_pool_metrics(workers: int | None, math_in_pool: bool = True) -> tuple[str, ...]:
    """Metrics scored in the pool when rescoring: code, plus math with a pool of two or more."""
    size = (os.cpu_count() or 1) if workers is None else workers
    return CODE_METRICS + ("math",) if math_in_pool and size > 1 else CODE_METRICS
