"""Quality-speed sweep: evaluate a task suite at every point of a q x tau x mode grid.

    alodlm-jax-sweep --model DIR --input tasks.jsonl --output SWEEP_DIR \\
        --q 0.3,0.5,0.7 --tau 0.2,0.4 --mode entropy,left1 [--window-size 16 --max-new-tokens 4096
        --position-penalty P --precision fp32|bf16 --device cpu|cuda --engine compiled|portable]

Each point is written to SWEEP_DIR/q<q>_tau<tau>_<mode>/ exactly as alodlm-jax-evaluate would write
it (predictions.jsonl, summary.json), plus that point's report.html. SWEEP_DIR/sweep.json lists
every point's macro score, tokens per second and loop-token passes per output token, and
SWEEP_DIR/report.html shows the quality-speed frontiers and links every point's report. The model
is loaded once for the whole sweep. Rerunning the same command resumes: complete points are
skipped, an interrupted point is continued from its last written row, as
alodlm-jax-evaluate --resume does it: only the same run continues (each point's run.json binds the
task file's content, the model and its files, every decoding flag, precision, device and the code
verdict settings; the first that differs is refused, exit 2, before any point runs; the engine
and --workers are free). Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Sequence, TextIO

from absl import flags

from alodlm_jax.cli.flags import (apply_compilation_flags, code_scoring_from_flags,
                                  define_code_scoring_flags, define_compilation_flags,
                                  define_model_flags, generate_run_settings, naming_decode_flags,
                                  run_command)
from alodlm_jax.config import DEFAULT_ENGINE, ENGINE_NAMES, ENGINES, DecodeConfig

PROG = "alodlm-jax-sweep"
FLAGS = flags.FlagValues()

flags.DEFINE_string("model", None, "Local model directory or Hugging Face model id (needed unless "
                    "every point is already complete).", flag_values=FLAGS)
define_model_flags(FLAGS)
flags.DEFINE_string("input", None, "Task JSONL file (required).", flag_values=FLAGS)
flags.DEFINE_string("output", None, "Sweep directory (required): one subdirectory per point, "
                    "sweep.json and report.html.", flag_values=FLAGS)
flags.DEFINE_string("q", "0.5", "Comma-separated cumulative halting thresholds, each in [0, 1].",
                    flag_values=FLAGS)
flags.DEFINE_string("tau", "0.4", "Comma-separated entropy thresholds, each finite and >= 0.",
                    flag_values=FLAGS)
flags.DEFINE_string("mode", "entropy", "Comma-separated commit rules: entropy, left1.",
                    flag_values=FLAGS)
flags.DEFINE_integer("window_size", 16, "Decoding window size in tokens (>= 1), all points.",
                     flag_values=FLAGS)
flags.DEFINE_integer("max_new_tokens", 4096, "Generation budget per task (>= 1), all points.",
                     flag_values=FLAGS)
flags.DEFINE_float("position_penalty", None, "Entropy penalty per window position, finite and "
                   ">= 0, all points. Default: 0.05 * tau of each point.", flag_values=FLAGS)
flags.DEFINE_enum("engine", DEFAULT_ENGINE, list(ENGINES), "Decoder engine (recorded as "
                  "protocol.decoder): compiled (the default) or portable; their outputs are identical.",
                  flag_values=FLAGS)
define_code_scoring_flags(FLAGS)
flags.DEFINE_integer("workers", os.cpu_count() or 1, "Fresh-interpreter workers scoring code "
                     "tasks (one pool for the whole sweep).", flag_values=FLAGS)
define_compilation_flags(FLAGS)
flags.DEFINE_boolean("reports", True, "Write each point's report.html and figures (--noreports "
                     "to skip; the sweep's own report is always written).", flag_values=FLAGS)
flags.DEFINE_boolean("dry_run", False, "List the grid points and their state (complete, "
                     "partial, fresh), then exit without evaluating.", flag_values=FLAGS)


class TaskProgress:
    """Per-point progress on stderr: a line every ~10 s or ~10 % of the tasks, and at the end."""

    def __init__(self, label: str, stream: TextIO | None = None, interval: float = 10.0) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.interval = interval
        self._start = None
        self._last = (0.0, 0)

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start, self._last = now, (now, done)
            return
        step = max(1, total // 10)
        if done >= total or now - self._last[0] >= self.interval or done - self._last[1] >= step:
            self.stream.write(f"  {self.label}: {done}/{total} tasks ({now - self._start:.1f} s)\n")
            self.stream.flush()
            self._last = (now, done)


def _base_config() -> DecodeConfig:
    return DecodeConfig(window_size=FLAGS.window_size, max_new_tokens=FLAGS.max_new_tokens,
                        position_penalty=FLAGS.position_penalty)


def _sweep() -> int:
    from alodlm_jax.report import sweep
    from alodlm_scoring.tasks import load_tasks, sha256_file

    tasks = load_tasks(FLAGS.input)
    with naming_decode_flags():  # an invalid value names its flag
        base = _base_config()
        points = sweep.make_grid(sweep.parse_float_list(FLAGS.q, "q"),
                                 sweep.parse_float_list(FLAGS.tau, "tau"),
                                 sweep.parse_mode_list(FLAGS.mode), base)
    states = sweep.describe_points(points, FLAGS.output)
    if FLAGS.dry_run:
        for point, state in states:
            print(f"{point.name}\t{state}")
        return 0
    if FLAGS.workers < 1:
        raise ValueError("--workers must be at least 1")
    code_sandbox, code_verdicts = code_scoring_from_flags(FLAGS)
    pending = sum(state != "complete" for _, state in states)
    if pending and not FLAGS.model:
        raise ValueError(f"--model is required: {pending} point(s) still need generating")

    from alodlm_jax.generate import default_device
    from alodlm_jax.report.sweep_runner import (EvaluationPointRunner, SharedModelGenerators,
                                                fixed_protocol_fields)

    device = FLAGS.device or (default_device() if pending else "cpu")
    generators = SharedModelGenerators(
        FLAGS.model, precision=FLAGS.precision, device=device, engine=FLAGS.engine,
        model_config=FLAGS.model_config,
        compilation_cache_dir=apply_compilation_flags(FLAGS) if pending else None)
    settings_for = _settings_for(base, device if (pending or FLAGS.device) else None,
                                 code_sandbox, code_verdicts)
    input_sha256 = sha256_file(FLAGS.input)
    metadata = {"model": FLAGS.model, "input": os.path.abspath(FLAGS.input),
                "input_sha256": input_sha256, "engine": FLAGS.engine,
                "precision": FLAGS.precision, "device": device, "tasks": len(tasks)}
    with EvaluationPointRunner(
        tasks=tasks, input_sha256=input_sha256, generators=generators, base=base,
        fixed_protocol=fixed_protocol_fields(FLAGS.engine, FLAGS.precision, device),
        workers=FLAGS.workers, code_sandbox=code_sandbox, code_verdicts=code_verdicts,
        progress_factory=lambda point: TaskProgress(point.name), settings_for=settings_for,
    ) as runner:
        result = sweep.run_sweep(points, FLAGS.output, runner, base=base, metadata=metadata,
                                 input_sha256=input_sha256, reports=FLAGS.reports,
                                 check_point=runner.check_point)
    sys.stderr.write(f"{PROG}: model loaded {generators.loads} time(s); "
                     f"{len(result.points)} point(s) in {result.sweep_json}\n")
    print(result.html_path, flush=True)
    return 0


def _settings_for(base: DecodeConfig, device: str | None, code_sandbox: str, code_verdicts: str):
    """``point -> RunSettings``: what a rerun must share with a point's earlier run (as
    alodlm-jax-evaluate --resume); the model's files are hashed once for all points. Without
    --model (every point complete) the model is not compared, nor the device unless given."""
    from alodlm_scoring.run_record import RunSettings

    common = generate_run_settings(
        input_path=FLAGS.input, model=FLAGS.model, model_config=FLAGS.model_config,
        precision=FLAGS.precision, device=device, decode=base, code_sandbox=code_sandbox,
        code_verdicts=code_verdicts, free={"decoder": ENGINE_NAMES[FLAGS.engine]})

    def settings_for(point) -> RunSettings:
        bound = dict(common.bound)
        bound.update({f"--{key}": value for key, value in point.decode_config(base).as_dict().items()})
        return RunSettings(bound=bound, free=common.free)

    return settings_for


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status."""
    return run_command(_sweep, prog=PROG, description=__doc__, flag_values=FLAGS, argv=argv,
                       required=("input", "output"))


def run() -> None:
    """Console entry point ``alodlm-jax-sweep``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
