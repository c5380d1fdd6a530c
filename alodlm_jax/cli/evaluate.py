"""Evaluate local JSONL tasks: generate one completion per task with an alodlm-jax decoder and
score it, or rescore existing local predictions without loading a model (--predictions).

Writes predictions.jsonl (one line per task, in task order) and summary.json (per-benchmark
percent scores, their unweighted macro average, suite wall time and tokens per second, and a
protocol block) into --output, and ends with a short table: per-benchmark scores, the macro score,
tokens per second, the generation, compile and total times and the output files
(--print_summary_json prints summary.json's JSON instead). stderr shows each phase as it starts
(loading, tokenizing, compiling) and the tasks' progress: on a terminal a task bar with the time
left, in a log or a pipe a plain line every 5 % of the tasks and at least every 30 s (--quiet:
none).
Non-code metrics are scored in this process;
code metrics in a pool of fresh Python interpreters (--workers). Rescore mode never imports JAX.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

from absl import flags

from alodlm_jax.cli.flags import (FREE_SETTINGS_HELP, code_scoring_from_flags,
                                  decode_config_from_flags, default_compilation_cache_dir,
                                  define_code_scoring_flags, define_decode_flags,
                                  define_generator_flags, generate_run_settings,
                                  generator_from_flags, require_model, run_command)
from alodlm_jax.cli.progress import Progress, compiling
from alodlm_jax.config import ENGINE_NAMES, DecodeConfig
from alodlm_jax.plan.auto import BATCH_AUTO

PROG = "alodlm-jax-evaluate"
FLAGS = flags.FlagValues()
_PROTOCOL_FIELDS_FROM_GENERATOR = ("decoder", "precision", "device", "gpu", "device_kind",
                                   "compile_seconds")

define_generator_flags(FLAGS, model_note="Required in generate mode; ignored with "
                       "--predictions.", device_note="decided only in generate mode")
define_decode_flags(FLAGS)
flags.DEFINE_string("input", None, "Task JSONL file (required): one fully formatted task per line.",
                    flag_values=FLAGS)
flags.DEFINE_string("output", None, "Output directory (required); must not already hold "
                    "predictions.jsonl or summary.json unless --resume. Created (with parents) "
                    "when work starts; a command that fails before its first row leaves it as it "
                    "was.", flag_values=FLAGS)
flags.DEFINE_string("predictions", None, "Score existing local predictions without loading "
                    "weights (rescore mode).", flag_values=FLAGS)
flags.DEFINE_integer("workers", os.cpu_count() or 1, "Number of fresh-interpreter workers that "
                     "score code tasks in parallel (verdicts equal sequential scoring).",
                     flag_values=FLAGS)
define_code_scoring_flags(FLAGS)
flags.DEFINE_boolean("math_in_workers", True, "Rescore mode with --workers > 1: score math "
                     "tasks in the worker pool too. Each worker scores on its own main thread, "
                     "where math-verify's SIGALRM timeouts work, so verdicts are unchanged. "
                     "Generate mode always scores math in this process.", flag_values=FLAGS)
flags.DEFINE_boolean("overlap_scoring", False, "Generate mode: score code tasks in the pool "
                     "while later tasks are generated. Off by default so that scoring never "
                     "competes with the timed generation for the CPU.", flag_values=FLAGS)
flags.DEFINE_boolean("print_summary_json", False, "End by printing summary.json's JSON on stdout "
                     "(the reference's output; the closing table then goes to stderr) instead "
                     "of the table of per-benchmark scores, macro score, tokens/s and output "
                     "files.", flag_values=FLAGS)
flags.DEFINE_boolean("resume", False, "Continue an interrupted run in --output: keep its "
                     "predictions.jsonl rows (checked against the tasks), drop a torn last line, "
                     "score the rest; the files equal an uninterrupted run's (with --batch_size "
                     "> 1 a resumed row's first-pass hazards only within 1e-6: its batch "
                     "neighbours changed; tokens, counters and verdicts identical). Only the same "
                     "run resumes: the task file's content, the model (its resolved directory and "
                     "files), every decoding flag, --precision, --device, --model_config, "
                     "--code_verdicts, --code_sandbox and, rescoring, the predictions file's "
                     "content must equal those recorded in --output/run.json when the run "
                     "started; the first that differs is refused before any work (exit 2). Free "
                     f"to differ: {FREE_SETTINGS_HELP}.",
                     flag_values=FLAGS)
flags.DEFINE_integer("limit", None, "Evaluate only the first N tasks of each benchmark, in "
                     "file order (as lm-eval's --limit): a smoke test of the whole pipeline "
                     "before a full run. summary.json records the subset (protocol.subset) and "
                     "the closing table says so; rescoring, the predictions file may hold rows "
                     "of every task.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_boolean("quiet", False, "Print no progress on stderr: no phase lines (loading, "
                     "tokenizing, compiling), no task bar (on a terminal) and no progress lines "
                     "(in a log or a pipe).", flag_values=FLAGS)
# Scaling out over processes (alodlm_jax.cli.distributed; docs/scaling.md).
flags.DEFINE_string("coordinator_address", None, "Generate mode, several processes: host:port of "
                    "process 0 for jax.distributed, or 'auto' (JAX's cluster detection). Each "
                    "process decodes its share of the tasks; process 0 merges the shards.",
                    flag_values=FLAGS)
flags.DEFINE_integer("num_processes", None, "Number of processes in a multi-process run.",
                     flag_values=FLAGS)
flags.DEFINE_integer("process_id", None, "This process's index in [0, --num_processes).",
                     flag_values=FLAGS)
flags.DEFINE_enum("task_split", "round_robin", ["round_robin", "contiguous"], "How a "
                  "multi-process run splits the tasks (deterministic).", flag_values=FLAGS)


_process_info = None  # alodlm_jax.cli.distributed.ProcessInfo of a multi-process run (generate mode)
_subset = None  # protocol.subset of a --limit run (alodlm_scoring.tasks.subset_record)


class CommandError(RuntimeError):
    """A user-facing failure of this command (reported as one line, exit status 2)."""


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def _generate_mode(tasks: Sequence[Mapping[str, Any]], state, decode: DecodeConfig,
                   progress) -> dict:
    from alodlm_scoring import evaluation, outputs, run_record
    from alodlm_scoring.manifest import suite_manifest
    from alodlm_scoring.tasks import sha256_file

    input_sha256 = sha256_file(FLAGS.input)
    manifest = suite_manifest(FLAGS.input)
    require_model(FLAGS)
    progress.phase(f"loading the model {FLAGS.model}")
    settings = _generate_settings(decode)
    if state.resume:  # the same run, or nothing: checked before the model is loaded
        run_record.check(state.record_path, settings, has_rows=state.has_rows)
    batch_auto = (_resolve_batch_size(tasks, decode, progress) if FLAGS.batch_size == BATCH_AUTO
                  else None)
    batch_size = FLAGS.batch_size
    if batch_auto:  # the part's batch size is the one chosen
        settings = dataclasses.replace(settings, free={**settings.free, "batch_size": batch_size})
    generator, engine, device = generator_from_flags(
        FLAGS, decode, several_processes=_process_info is not None)
    from alodlm_jax.network import sharding

    mesh = sharding.MeshSpec.parse(FLAGS.mesh)
    from alodlm_jax.generate import check_task_prompts

    progress.phase(f"tokenizing and checking {len(tasks)} prompt(s)")
    check_task_prompts(generator, tasks)  # D9: every prompt, before the first is decoded
    cache_dir = ((FLAGS.compilation_cache_dir or str(default_compilation_cache_dir()))
                 if FLAGS.compilation_cache else None)  # for the phase line only
    if batch_size == 1:
        with compiling(progress, "the decoding programs of the first prompt's shape", cache_dir):
            generator.warmup(tasks[0]["prompt"])

    def rows(start: int):
        for task in tasks[start:]:
            yield generator.generate(task["prompt"])

    def batched_stream(pending_tasks: Sequence[Mapping[str, Any]]):
        # The pending tasks as one stream through batch_size slots with continuous batching: a
        # finished task's slot takes the next waiting task. The programs are compiled first; rows
        # come back in task order as soon as they and every earlier row are complete, and
        # evaluate() writes and flushes each one.
        pending = [task["prompt"] for task in pending_tasks]
        with compiling(progress, f"the batched decoding programs for {batch_size} slots", cache_dir):
            generator.warmup_batches([pending])
        yield from generator.generate_stream(pending)

    def batched_rows(start: int):
        return batched_stream(tasks[start:])  # a resumed run starts at `start`

    def make_protocol(failures):
        fields = {"decoder": ENGINE_NAMES[engine], "precision": FLAGS.precision,
                  "device": device}
        supplied = generator.protocol_fields() or {}
        fields.update({k: v for k, v in supplied.items() if k in _PROTOCOL_FIELDS_FROM_GENERATOR})
        block = outputs.protocol_block(
            input_sha256=input_sha256,
            decode=decode.as_dict(),
            timing=outputs.GENERATE_TIMING,
            scoring_failures=failures,
            suite_manifest=manifest,
            **fields,
        )
        layout = sharding.layout_record(mesh, 1 if _process_info is None else
                                        _process_info.num_processes)
        if batch_size > 1 or layout or batch_auto:  # after the project's keys; a batch-1 block
            block["batch_size"] = batch_size            # is unchanged
        if batch_auto:
            block["batch_size_auto"] = batch_auto
        if batch_size > 1:
            from alodlm_jax.decode.scheduler import BATCH_TIMING

            block["batch_timing"] = BATCH_TIMING
        block.update(layout)
        if supplied.get("xla_options"):  # the compiled engine on a GPU: its command buffers
            block["xla_options"] = dict(supplied["xla_options"])
        return _with_subset(block)

    if _process_info is not None:
        from alodlm_jax.cli import distributed

        return distributed.evaluate_sharded(
            tasks, FLAGS.output, _process_info, generate=lambda task: generator.generate(task["prompt"]),
            generate_stream=batched_stream if batch_size > 1 else None,
            make_protocol=make_protocol, split=FLAGS.task_split, state=state,
            workers=FLAGS.workers, progress=progress, overlap=FLAGS.overlap_scoring,
            settings=settings, **_code_scoring(),
        )
    return evaluation.evaluate(
        tasks, state, rows_source=rows if batch_size == 1 else batched_rows,
        make_protocol=make_protocol,
        workers=FLAGS.workers, progress=progress, overlap=FLAGS.overlap_scoring,
        settings=settings, **_code_scoring(),
    )


def _generate_settings(decode: DecodeConfig):
    """This run's record (alodlm_scoring.run_record): what a resume must share with it, and the
    free settings of this part. Resolves the model and the device (imports JAX)."""
    from alodlm_jax.generate import default_device

    sandbox, verdicts = code_scoring_from_flags(FLAGS)
    extra = {}
    if _process_info is not None:  # which tasks a shard holds
        extra = {"--num_processes": _process_info.num_processes, "--task_split": FLAGS.task_split}
    if FLAGS.limit is not None:  # which tasks run
        extra["--limit"] = FLAGS.limit
    return generate_run_settings(
        input_path=FLAGS.input, model=FLAGS.model, model_config=FLAGS.model_config,
        precision=FLAGS.precision, device=FLAGS.device or default_device(), decode=decode,
        code_sandbox=sandbox, code_verdicts=verdicts, extra=extra,
        free={"decoder": ENGINE_NAMES[FLAGS.engine], "batch_size": FLAGS.batch_size,
              "mesh": FLAGS.mesh})


def _resolve_batch_size(tasks: Sequence[Mapping[str, Any]], decode: DecodeConfig,
                        progress: Progress) -> dict:
    """``--batch_size auto``: sets FLAGS.batch_size to the largest batch whose programs fit the
    device (alodlm_jax.plan.auto); returns the protocol's record of the choice."""
    if FLAGS.engine != "compiled":
        raise ValueError("--batch_size auto needs --engine compiled")
    from alodlm_jax.network import sharding
    from alodlm_jax.generate import default_device
    from alodlm_jax.plan.auto import auto_batch_size

    chosen, record = auto_batch_size(
        model=FLAGS.model, precision=FLAGS.precision, model_config=FLAGS.model_config,
        decode=decode, prompts=[task["prompt"] for task in tasks],
        device=FLAGS.device or default_device(), mesh_spec=sharding.MeshSpec.parse(FLAGS.mesh),
        log=lambda text: progress.phase(f"--batch_size auto: {text}"))
    FLAGS.batch_size = chosen
    progress.phase(f"--batch_size auto: {chosen} (largest that fits: "
                   f"{record['largest_that_fits']}, {len(tasks)} tasks)")
    return record


def _code_scoring() -> dict:
    sandbox, verdicts = code_scoring_from_flags(FLAGS)
    return {"code_sandbox": sandbox, "code_verdicts": verdicts}


def _rescore_mode(tasks: Sequence[Mapping[str, Any]], state, progress) -> dict:
    from alodlm_scoring import evaluation

    progress.phase(f"reading the predictions in {FLAGS.predictions}")
    predictions = evaluation.load_predictions(FLAGS.predictions, tasks,
                                              extra_rows=FLAGS.limit is not None)
    sandbox, verdicts = code_scoring_from_flags(FLAGS)
    settings = evaluation.rescore_settings(FLAGS.input, FLAGS.predictions,
                                           code_sandbox=sandbox, code_verdicts=verdicts)
    if FLAGS.limit is not None:  # which tasks run
        settings = dataclasses.replace(settings, bound={**settings.bound, "--limit": FLAGS.limit})
    protocol = evaluation.rescore_protocol(FLAGS.input, FLAGS.predictions)
    return evaluation.evaluate(
        tasks,
        state,
        rows_source=evaluation.rescore_source(predictions),
        make_protocol=lambda failures: _with_subset(protocol(failures)),
        workers=FLAGS.workers,
        progress=progress,
        check_existing_row=evaluation.rescore_row_checker(predictions) if state.resume else None,
        pool_metrics=evaluation.rescore_pool_metrics(FLAGS.workers, FLAGS.math_in_workers),
        settings=settings,
        **_code_scoring(),
    )


def _with_subset(block: dict) -> dict:
    """The protocol block, with ``subset`` last when --limit chose the tasks."""
    if _subset is not None:
        block["subset"] = dict(_subset)
    return block


def _evaluate() -> int:
    progress = Progress(PROG, sys.stderr, quiet=FLAGS.quiet,
                        label="rescored" if FLAGS.predictions else "evaluated")
    try:
        return _evaluate_with(progress)
    finally:  # also when the command fails: no progress line after its error
        progress.close()


def _evaluate_with(progress: Progress) -> int:
    from alodlm_scoring.evaluation import prepare_output_directory
    from alodlm_scoring.tasks import load_tasks

    global _process_info, _subset
    progress.phase(f"checking the tasks in {FLAGS.input}")
    tasks = load_tasks(FLAGS.input)  # every line checked, --limit or not
    _subset = None
    if FLAGS.limit is not None:
        from alodlm_scoring.tasks import first_of_each_benchmark, subset_record

        in_file = len(tasks)
        tasks = first_of_each_benchmark(tasks, FLAGS.limit)
        _subset = subset_record(FLAGS.limit, len(tasks), in_file)
    _process_info = None
    if FLAGS.predictions is None and (FLAGS.coordinator_address is not None
                                      or FLAGS.num_processes is not None or FLAGS.process_id is not None):
        from alodlm_jax.cli import distributed  # several processes: each writes its own shard

        _process_info = distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                                               FLAGS.process_id)
        if _process_info.num_processes == 1:
            _process_info = None
    if _process_info is not None:
        state = distributed.prepare_shard_directory(FLAGS.output, _process_info, resume=FLAGS.resume)
    else:
        state = prepare_output_directory(FLAGS.output, resume=FLAGS.resume)  # step 2 (checked only)
    decode = decode_config_from_flags(FLAGS)  # step 3: validated in both modes, as the reference
    code_scoring_from_flags(FLAGS)
    if FLAGS.workers < 1:
        raise ValueError("--workers must be at least 1")
    if FLAGS.batch_size != BATCH_AUTO and FLAGS.batch_size < 1:
        raise ValueError("--batch_size must be at least 1")
    try:
        if FLAGS.predictions is not None:  # step 4
            summary = _rescore_mode(tasks, state, progress)
        else:
            summary = _generate_mode(tasks, state, decode, progress)
    finally:
        progress.close()
    from alodlm_scoring.summary_table import summary_table

    table = summary_table(summary, _output_files(state),
                          elapsed_seconds=time.monotonic() - _started)
    if FLAGS.print_summary_json:  # the reference's stdout: the summary's JSON
        sys.stderr.write(table)
        sys.stderr.flush()
        print(json.dumps(summary, indent=2), flush=True)
    else:
        sys.stdout.write(table)
        sys.stdout.flush()
    return 0


def _output_files(state) -> list[str]:
    """The files the closing table names: this run's predictions and summary (a multi-process
    run's coordinator: the merged ones; another process: its shard's)."""
    from alodlm_scoring.evaluation import PREDICTIONS_FILE, SUMMARY_FILE

    if _process_info is not None and not _process_info.is_coordinator:
        return [state.predictions_path, state.summary_path]
    return [os.path.join(FLAGS.output, PREDICTIONS_FILE), os.path.join(FLAGS.output, SUMMARY_FILE)]


_started = time.monotonic()  # when the command started (main), for the closing table's elapsed time


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status."""
    global _started
    _started = time.monotonic()
    return run_command(
        _evaluate,
        prog=PROG,
        description=__doc__,
        flag_values=FLAGS,
        argv=argv,
        required=("input", "output"),
        extra_errors=(CommandError,),
    )


def run() -> None:
    """Console entry point ``alodlm-jax-evaluate``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
