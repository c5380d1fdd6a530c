"""Preparing a suite: sources → items → ground truth → rendered rows → validated, atomic files.

:func:`prepare_suite` is the whole command without its flags. Nothing is written until every
row is built; the rows are then written to a temporary file next to ``--output``, loaded with the
evaluate command's own loader (``alodlm_scoring.tasks.load_tasks``), and only then renamed into
place, followed by the manifest ``<output>.manifest.json``. A row that the loader rejects is a
bug in this command (:class:`PrepareBug`), never the user's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from typing import Any, Mapping, Sequence, TextIO

from alodlm_scoring.groundtruth import GroundTruthError, Job, Measured, measure
from alodlm_scoring.manifest import manifest_path
from alodlm_scoring.tasks import load_tasks, sha256_file

from . import fixtures
from .benchmarks import Benchmark
from alodlm_scoring.files import temporary_next_to
from .groundtruth_cache import GroundTruthCache, job_key
from .items import BuildContext, Item, ItemError
from .literals import Unwritable, suite_field
from .manifest import build_manifest
from .sources import Source, SourceError, check_columns, open_evalplus_release, open_source
from .templates import ChatWrapper, Template, default_template

__all__ = ["FIXTURES", "Options", "PrepareBug", "prepare_suite", "Prepared"]

# The --source value that reads a benchmark from the bundled fixture files (alodlm_prepare.fixtures:
# a few hand-made rows in each source's real layout), for trying the command without a network.
FIXTURES = "builtin:fixtures"


class PrepareBug(RuntimeError):
    """A row this command wrote failed the evaluate command's validation: a bug here."""


@dataclasses.dataclass(frozen=True)
class Options:
    """What to prepare. Per-benchmark settings are keyed by the benchmark's guide name."""

    benchmarks: Sequence[Benchmark]
    output: str
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    splits: Mapping[str, str] = dataclasses.field(default_factory=dict)
    configs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    revisions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    templates: Mapping[str, Template] = dataclasses.field(default_factory=dict)
    limit: int | None = None
    model: str | None = None
    fewshot: int = 0
    seed: int = 0
    thinking: bool = False
    groundtruth_cache: bool = True
    workers: int | None = None


@dataclasses.dataclass
class _Prepared:
    """One benchmark after reading and building: its items and what the manifest says of it."""

    benchmark: Benchmark
    source: Source
    template: Template
    items: list[Item]
    record: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The result: the suite's path, its rows and its manifest."""

    path: str
    rows: list[dict[str, Any]]
    manifest: dict[str, Any]


def _check_options(options: Options) -> None:
    if options.limit is not None and options.limit < 1:
        raise ValueError("--limit must be at least 1")
    if options.fewshot < 0:
        raise ValueError("--fewshot must be at least 0")
    if options.fewshot and not any(b.shot for b in options.benchmarks):
        raise ValueError("--fewshot applies to GSM8K only, which is not among the benchmarks")
    if options.thinking and not options.model:
        raise ValueError("--thinking needs --model (it switches the checkpoint's chat template)")
    for benchmark in options.benchmarks:
        if benchmark.release and (benchmark.name in options.splits
                                  or benchmark.name in options.configs
                                  or benchmark.name in options.revisions):
            raise ValueError(f"{benchmark.name}: EvalPlus release files have no splits, configs "
                             "or revisions (--split, --config, --revision)")


def _open(benchmark: Benchmark, options: Options,
          fixtures_dir: str | None = None) -> tuple[Source, str]:
    name = benchmark.name
    given = options.sources.get(name)
    if given == FIXTURES:  # the bundled fixture file of this benchmark, written for this run
        source, split = _open(benchmark, dataclasses.replace(
            options, sources={name: os.path.join(fixtures_dir, fixtures.SOURCE_FILES[name])}))
        label = f"{FIXTURES}/{fixtures.SOURCE_FILES[name]}"  # not the temporary directory
        source.name = label
        source.description["path"] = label
        return source, split
    if benchmark.release:
        source = open_evalplus_release(given, benchmark.release, name)
        return source, source.splits()[0]
    hub_id, hub_config, default_split = benchmark.hub
    text = given or hub_id
    config = options.configs.get(name, hub_config if text == hub_id else None)
    source = open_source(text, config=config, revision=options.revisions.get(name),
                         benchmark=name)
    return source, source.resolve_split(options.splits.get(name), default_split)


def _shots(benchmark: Benchmark, source: Source, split: str, count: int) -> list[dict[str, Any]]:
    if not count or benchmark.shot is None:
        return []
    if split == "train":
        raise ValueError(f"--fewshot: {benchmark.name} draws its examples from the train split, "
                         "which is the split being prepared; prepare another split")
    if "train" not in source.splits():
        raise SourceError(f"{source.name}: --fewshot needs a train split to draw examples from "
                          f"(it has: {', '.join(source.splits())})")
    rows = source.rows("train")
    if len(rows) < count:
        raise SourceError(f"{source.name}: --fewshot {count} but its train split has {len(rows)} rows")
    check_columns(source, rows[:count], benchmark.layouts, benchmark.name)
    try:
        return [benchmark.shot(row) for row in rows[:count]]
    except ItemError as error:
        raise SourceError(f"{source.name}: {benchmark.name}: {error}") from None


def _read(benchmark: Benchmark, options: Options, fixtures_dir: str | None = None) -> _Prepared:
    template = options.templates.get(benchmark.name) or default_template(benchmark.template)
    source, split = _open(benchmark, options, fixtures_dir)
    rows = source.rows(split)
    if not rows:
        raise SourceError(f"{source.name}: split {split!r} has no rows")
    layout = check_columns(source, rows, benchmark.layouts, benchmark.name)
    rows = rows[: options.limit] if options.limit else rows
    shots = _shots(benchmark, source, split, options.fewshot)
    try:
        items = benchmark.builder(rows, layout, BuildContext(options.seed, tuple(shots), source.name))
    except ItemError as error:
        raise SourceError(f"{source.name}: {benchmark.name} {error}") from None
    seen: set[str] = set()
    for item in items:
        if str(item.id) in seen:
            raise SourceError(f"{source.name}: {benchmark.name} id {item.id!r} occurs twice")
        seen.add(str(item.id))
    record: dict[str, Any] = {
        "metric": benchmark.metric, "rows": len(items),
        "source": {**source.description, "split": split},
        "template": template.describe(),
    }
    if benchmark.shot is not None:
        record["fewshot"] = len(shots)
    orders = {str(item.id): item.fields["option_order"] for item in items
              if "option_order" in item.fields}
    if orders:
        record["option_orders"] = orders
    return _Prepared(benchmark, source, template, items, record)


# --------------------------------------------------------------------------------------------
# Ground truth
# --------------------------------------------------------------------------------------------


class _Progress:
    """A tqdm bar on a terminal; otherwise one line saying what is being measured."""

    def __init__(self, total: int, stream: TextIO) -> None:
        from tqdm import tqdm

        self.stream = stream
        self.total = total
        self.bar = tqdm(total=total, desc="ground truth", unit="suite", file=stream,
                        disable=None, dynamic_ncols=True)
        if self.bar.disable:
            stream.write(f"alodlm-jax-prepare: measuring the canonical solutions of {total} "
                         "EvalPlus suite(s)\n")
            stream.flush()

    def __call__(self, count: int) -> None:
        self.bar.update(count)

    def close(self) -> None:
        self.bar.close()


def _ground_truth(prepared: Sequence[_Prepared], options: Options,
                  stream: TextIO) -> tuple[dict[str, Measured], set[str]]:
    """Measured results by job key, and the keys that came from the cache."""
    cache = GroundTruthCache(enabled=options.groundtruth_cache)
    wanted: dict[str, Job] = {}
    for part in prepared:
        for item in part.items:
            if item.evalplus is not None:
                for job in item.evalplus.jobs:
                    wanted.setdefault(job_key(part.source.fingerprint, job), job)
    results: dict[str, Measured] = {}
    cached: set[str] = set()
    for key in wanted:
        hit = cache.get(key)
        if hit is not None and len(hit.outputs) == len(wanted[key].inputs):
            results[key] = hit
            cached.add(key)
    missing = [key for key in wanted if key not in results]
    if missing:
        progress = _Progress(len(missing), stream)
        try:
            measured = measure([wanted[key] for key in missing], workers=options.workers,
                               progress=progress)
        finally:
            progress.close()
        for key, result in zip(missing, measured):
            cache.put(key, result)
            results[key] = result
    return results, cached


def _code_tests(part: _Prepared, item: Item, results: Mapping[str, Measured]) -> dict[str, Any]:
    task = item.evalplus
    suites = []
    for job in task.jobs:
        measured = results[job_key(part.source.fingerprint, job)]
        try:
            inputs_key, inputs = suite_field("inputs", job.inputs)
            expected_key, expected = suite_field("expected", measured.outputs)
        except Unwritable as error:
            raise GroundTruthError(f"{part.benchmark.name} task {job.task_id!r}: {error}") from None
        suites.append({inputs_key: inputs, expected_key: expected,
                       "reference_seconds": list(measured.seconds)})
    return {"dataset": task.dataset, "entry_point": task.entry_point, "atol": task.atol,
            "suites": suites}


def _groundtruth_record(part: _Prepared, cached: set[str]) -> dict[str, list[str]] | None:
    jobs = [job for item in part.items if item.evalplus for job in item.evalplus.jobs]
    if not jobs:
        return None
    from_cache = [job.task_id for job in jobs if job_key(part.source.fingerprint, job) in cached]
    measured = [job.task_id for job in jobs if job_key(part.source.fingerprint, job) not in cached]
    return {"measured": measured, "from_cache": from_cache}


# --------------------------------------------------------------------------------------------
# Rows and files
# --------------------------------------------------------------------------------------------


def _rows(part: _Prepared, chat: ChatWrapper | None,
          results: Mapping[str, Measured]) -> list[dict[str, Any]]:
    compiled = part.template.compiled()
    rows = []
    for item in part.items:
        text = part.template.render({"benchmark": part.benchmark.name, **item.context}, compiled)
        if not text.strip():
            raise ValueError(f"{part.template.origin}: renders an empty prompt for "
                             f"{part.benchmark.name} id {item.id!r}")
        row = {"benchmark": part.benchmark.name, "id": item.id, "metric": part.benchmark.metric,
               "prompt": chat.wrap(text) if chat else text, **item.fields}
        if item.evalplus is not None:
            row["code_tests"] = _code_tests(part, item, results)
        rows.append(row)
    return rows


def _write(output: str, text: str, manifest_of) -> dict[str, Any]:
    """Write the suite and its manifest atomically, after the evaluate loader accepted the rows."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    temporaries = []
    try:
        suite = temporary_next_to(output, text)
        temporaries.append(suite)
        try:
            load_tasks(suite)
        except ValueError as error:
            raise PrepareBug("a prepared row failed the evaluate command's validation (a bug in "
                             f"alodlm-jax-prepare; please report it): {error}") from None
        manifest = manifest_of(sha256_file(suite))
        manifest_file = temporary_next_to(manifest_path(output),
                                          json.dumps(manifest, indent=2) + "\n")
        temporaries.append(manifest_file)
        os.replace(suite, output)
        os.replace(manifest_file, manifest_path(output))
        return manifest
    finally:
        for temporary in temporaries:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass


def prepare_suite(options: Options, *, stream: TextIO | None = None) -> Prepared:
    """Prepare the suite that ``options`` describe and write it (see the module docstring)."""
    stream = stream or sys.stderr
    _check_options(options)
    chat = ChatWrapper(options.model, thinking=options.thinking) if options.model else None
    with contextlib.ExitStack() as stack:
        fixtures_dir = None
        if FIXTURES in options.sources.values():  # read while the written fixtures exist
            fixtures_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="alodlm-fixtures-"))
            fixtures.write_sources(fixtures_dir)
        prepared = [_read(benchmark, options, fixtures_dir) for benchmark in options.benchmarks]
    results, cached = _ground_truth(prepared, options, stream)
    rows = [row for part in prepared for row in _rows(part, chat, results)]
    for part in prepared:
        record = _groundtruth_record(part, cached)
        if record is not None:
            part.record["groundtruth"] = record
    text = "".join(json.dumps(row) + "\n" for row in rows)

    def manifest_of(suite_sha256: str) -> dict[str, Any]:
        return build_manifest(suite_path=options.output, suite_sha256=suite_sha256,
                              benchmarks={p.benchmark.name: p.record for p in prepared},
                              options=options, chat=chat)

    manifest = _write(options.output, text, manifest_of)
    return Prepared(options.output, rows, manifest)
