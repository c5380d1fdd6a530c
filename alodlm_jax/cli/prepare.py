"""Prepare an evaluation suite from the benchmarks' own files.

Reads each benchmark's source (by default its usual Hugging Face dataset, or the EvalPlus release
file for HumanEval, HumanEval+ and MBPP+), renders every row's prompt from a template (ours, not
the paper's; --template replaces it), wraps it in the checkpoint's chat template with --model,
measures EvalPlus expected outputs and reference timings by running the canonical solutions in
the scorer's code sandbox, checks every row with the evaluate command's own loader and writes the suite
atomically with a manifest (<output>.manifest.json) that evaluate copies into summary.json.

Example: alodlm-jax-prepare --benchmark ARC-C,GSM8K,HumanEval+ --model amazon/ALoDLM-1.7B
  --output suite.jsonl

--source, --split, --config, --revision and --template take VALUE (every benchmark named; for
--split, --config and --revision every one read through datasets) or BENCHMARK=VALUE (that
benchmark; repeat the flag for several). This command imports no JAX.
"""

from __future__ import annotations

import sys
from typing import Sequence

from absl import flags

from alodlm_jax.cli.flags import error_line, run_command

PROG = "alodlm-jax-prepare"
FLAGS = flags.FlagValues()
_D = {"flag_values": FLAGS}

flags.DEFINE_string("benchmark", None, "Comma-separated benchmark names (case-insensitive): ARC-C, "
                    "ARC-E, MMLU, MMLU-Pro, GPQA-Diamond, GSM8K, MATH-500, MBPP, MBPP+, HumanEval, "
                    "HumanEval+.", **_D)
flags.DEFINE_string("output", None, "The suite to write (JSONL); its manifest goes next to it as "
                    "<output>.manifest.json. An existing file is replaced atomically.", **_D)
flags.DEFINE_multi_string("source", [], "A Hugging Face dataset id or a local parquet, JSON, JSONL "
                          "or CSV file or directory (.gz too); for HumanEval, HumanEval+ and MBPP+ "
                          "an EvalPlus release file (.jsonl or .jsonl.gz). Default: the "
                          "benchmark's usual dataset (docs/prepare.md).", **_D)
flags.DEFINE_multi_string("split", [], "Split to prepare. Default: the benchmark's usual split "
                          "(test; train for GPQA), or the only split of a local file.", **_D)
flags.DEFINE_multi_string("config", [], "Dataset configuration of a hub source. Default: the "
                          "benchmark's (e.g. ARC-Challenge, all, gpqa_diamond, main, full) for its "
                          "default dataset.", **_D)
flags.DEFINE_multi_string("revision", [], "Hub revision (branch, tag or commit) of a hub source; "
                          "the manifest records the commit that was read.", **_D)
flags.DEFINE_multi_string("template", [], "A Jinja prompt template file replacing the default one "
                          "(variables: docs/prepare.md).", **_D)
flags.DEFINE_integer("limit", None, "Prepare only the first N rows of each benchmark.", **_D)
flags.DEFINE_string("model", None, "Checkpoint (local directory or Hugging Face id) whose chat "
                    "template wraps each prompt as one user turn with the generation prompt. "
                    "Without it the rendered template is the prompt.", **_D)
flags.DEFINE_integer("fewshot", 0, "GSM8K: this many worked examples from the source's train split "
                     "before the question.", **_D)
flags.DEFINE_integer("seed", 0, "Seed of GPQA's option permutations.", **_D)
flags.DEFINE_boolean("thinking", False, "Chat templates with an enable_thinking switch (Qwen3's): "
                     "turn it on (off by default). Refused for templates without the switch.", **_D)
flags.DEFINE_boolean("groundtruth_cache", True, "Read and store measured EvalPlus ground truth in "
                     "$XDG_CACHE_HOME/alodlm-jax/groundtruth (~/.cache by default), so that a rerun "
                     "on the same source writes the same bytes. --nogroundtruth_cache measures "
                     "again and stores nothing.", **_D)
flags.DEFINE_integer("workers", None, "Interpreters measuring ground truth at once. Default: "
                     "min(4, CPU count).", **_D)


def per_benchmark(flag: str, values: Sequence[str], names: Sequence[str],
                  applicable: Sequence[str] | None = None) -> dict[str, str]:
    """``VALUE`` or ``BENCHMARK=VALUE`` entries, by guide name.

    ``BENCHMARK=VALUE`` sets one of ``names``; a plain ``VALUE`` sets every benchmark of
    ``applicable`` (default: all of ``names``).
    """
    from alodlm_prepare.benchmarks import lookup

    chosen: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        benchmark = None
        if sep:
            try:
                benchmark = lookup([name])[0].name
            except ValueError:
                benchmark = None
        if sep and benchmark is not None:
            if benchmark not in names:
                raise ValueError(f"--{flag}={value}: {benchmark} is not among --benchmark")
            targets, value = [benchmark], rest
        else:
            targets = list(names if applicable is None else applicable)
        for target in targets:
            if target in chosen:
                raise ValueError(f"--{flag}: {target} is given twice")
            chosen[target] = value
    return chosen


def _prepare() -> int:
    from alodlm_prepare.benchmarks import lookup
    from alodlm_prepare.suite import Options, prepare_suite
    from alodlm_prepare.templates import template_from_file

    benchmarks = lookup(FLAGS.benchmark.split(","))
    names = [b.name for b in benchmarks]
    hub = [b.name for b in benchmarks if b.release is None]  # EvalPlus release files: no splits
    if FLAGS.workers is not None and FLAGS.workers < 1:
        raise ValueError("--workers must be at least 1")
    options = Options(
        benchmarks=benchmarks,
        output=FLAGS.output,
        sources=per_benchmark("source", FLAGS.source, names),
        splits=per_benchmark("split", FLAGS.split, names, hub),
        configs=per_benchmark("config", FLAGS.config, names, hub),
        revisions=per_benchmark("revision", FLAGS.revision, names, hub),
        templates={name: template_from_file(path)
                   for name, path in per_benchmark("template", FLAGS.template, names).items()},
        limit=FLAGS.limit, model=FLAGS.model, fewshot=FLAGS.fewshot, seed=FLAGS.seed,
        thinking=FLAGS.thinking, groundtruth_cache=FLAGS.groundtruth_cache, workers=FLAGS.workers,
    )
    prepared = prepare_suite(options, stream=sys.stderr)
    for name, record in prepared.manifest["benchmarks"].items():
        sys.stderr.write(f"{PROG}: {name}: {record['rows']} row(s), metric {record['metric']}\n")
    sys.stderr.write(f"{PROG}: wrote {len(prepared.rows)} row(s) to {prepared.path}\n")
    print(prepared.path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status.

    Bad input: one line, exit status 2. A prepared row that the evaluate command's loader rejects
    is a bug here: one line, exit status 1, nothing written.
    """
    from alodlm_prepare.suite import PrepareBug

    def guarded() -> int:
        try:
            return _prepare()
        except PrepareBug as error:
            print(error_line(PROG, error), file=sys.stderr, flush=True)
            return 1

    return run_command(guarded, prog=PROG, description=__doc__, flag_values=FLAGS, argv=argv,
                       required=("benchmark", "output"))


def run() -> None:
    """Console entry point ``alodlm-jax-prepare``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
