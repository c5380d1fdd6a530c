"""Convert an ALoDLM checkpoint (local directory or Hugging Face model id) into an alodlm-jax
params directory: params.safetensors (Flax layout, flat per-layer names, fp32 gate),
manifest.json (source files with SHA-256, dtype, converter version) and copies of the configs,
tokenizer and chat template. Everything is validated from file headers before any weight is read;
the output appears only when complete.

Example: alodlm-jax-convert --model amazon/ALoDLM-1.7B --output ./alodlm-1.7b-jax --dtype keep

This command imports no JAX and no torch.
"""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Sequence

from absl import flags

from alodlm_jax.cli.flags import run_command

PROG = "alodlm-jax-convert"
FLAGS = flags.FlagValues()

flags.DEFINE_string("model", None, "Checkpoint to convert: a local model directory or a Hugging Face "
                    "model id (downloaded with the reference's inference file patterns).", flag_values=FLAGS)
flags.DEFINE_string("output", None, "Output directory; must not exist yet (or be empty).", flag_values=FLAGS)
flags.DEFINE_enum("dtype", "keep", ["keep", "fp32", "bf16"], "Backbone dtype of the converted params: "
                  "keep (bit-exact copy of the stored dtype), fp32 (exact widening) or bf16 "
                  "(round to nearest even). The exit gate is always stored in fp32.", flag_values=FLAGS)
flags.DEFINE_string("model_config", None, "YAML file whose `model:` section gives the recurrence "
                    "config (loop_start, loop_end, max_depth, mask_token_id, ...); replaces "
                    "alodlm_config.json. Also spelled --model-config.", flag_values=FLAGS)
flags.DEFINE_boolean("quiet", False, "Do not print per-tensor progress on stderr.", flag_values=FLAGS)


class _ProgressPrinter:
    """Prints ``tensor i/N name MB MB/s`` lines on stderr, at most a few per second."""

    def __init__(self, stream):
        self.stream = stream
        self.last = 0.0

    def __call__(self, p) -> None:
        now = time.monotonic()
        if p.index != p.count and now - self.last < 0.5:
            return
        self.last = now
        self.stream.write(f"{PROG}: tensor {p.index}/{p.count} {p.name} "
                          f"{p.bytes_done / 1e6:.1f}/{p.bytes_total / 1e6:.1f} MB {p.mb_per_s:.0f} MB/s\n")
        self.stream.flush()


def _convert() -> int:
    from alodlm_convert.convert import convert_checkpoint
    from alodlm_convert.resolve import resolve_model

    model = FLAGS.model
    try:
        source = resolve_model(model)
    except ValueError:
        raise
    except Exception as exc:  # hub errors (offline, not found, auth): one line, not a traceback
        raise ValueError(f"could not fetch {model!r} from the Hugging Face Hub: "
                         f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
    start = time.perf_counter()
    progress = None if FLAGS.quiet else _ProgressPrinter(sys.stderr)
    is_local = pathlib.Path(model).expanduser().is_dir()
    out = convert_checkpoint(source, FLAGS.output, FLAGS.dtype, FLAGS.model_config, progress=progress,
                             source_name=None if is_local else model)
    seconds = time.perf_counter() - start
    sys.stderr.write(f"{PROG}: wrote {out} in {seconds:.1f} s\n")
    print(out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status."""
    return run_command(_convert, prog=PROG, description=__doc__, flag_values=FLAGS, argv=argv,
                       required=("model", "output"))


def run() -> None:
    """Console entry point ``alodlm-jax-convert``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
