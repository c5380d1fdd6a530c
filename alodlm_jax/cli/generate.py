"""Generate one completion with adaptive decoding and print the result as JSON.

--prompt applies the checkpoint's chat template (one user turn, generation prompt; --thinking
enables the thinking section); --prompt_ids passes raw token ids (comma-separated) with no template.
The printed object has exactly the reference generate command's keys. With --stats, compile time and
the token-layer-call counters go to stderr as one JSON line.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence

from absl import flags

from alodlm_jax.cli.flags import (FlagError, apply_compilation_flags, decode_config_from_flags,
                                  define_compilation_flags, define_decode_flags,
                                  define_model_flags, run_command)
from alodlm_jax.config import DEFAULT_ENGINE, ENGINES

PROG = "alodlm-jax-generate"
FLAGS = flags.FlagValues()

flags.DEFINE_string("model", None, "Local model directory (HF or converted) or Hugging Face model "
                    "id (required).", flag_values=FLAGS)
define_model_flags(FLAGS)
flags.DEFINE_string("prompt", None, "User message; the chat template is applied.", flag_values=FLAGS)
flags.DEFINE_boolean("thinking", False, "Enable the thinking section of the chat template.",
                     flag_values=FLAGS)
flags.DEFINE_string("prompt_ids", None, "Raw prompt token ids, comma-separated (no template).",
                    flag_values=FLAGS)
flags.DEFINE_enum("engine", DEFAULT_ENGINE, list(ENGINES), "Decoder engine: compiled (the default: "
                  "the whole generation is one XLA program per shape bucket) or portable (jitted "
                  "passes, Python host loop); their outputs are identical.", flag_values=FLAGS)
define_decode_flags(FLAGS)
define_compilation_flags(FLAGS)
flags.DEFINE_string("mesh", None, "A (data, model) mesh over this process's local devices; "
                    "model=N splits the weights and KV cache over N devices (tensor parallelism; "
                    "a single prompt has no batch for a data axis to split). Default: one device.",
                    flag_values=FLAGS)
flags.DEFINE_boolean("stats", False, "Print compile seconds and token-layer counters to stderr.",
                     flag_values=FLAGS)


def parse_prompt_ids(text: str) -> list[int]:
    """``"4,7,9"`` -> ``[4, 7, 9]`` (ValueError naming the flag otherwise)."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--prompt_ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise ValueError("--prompt_ids must contain at least one token id")
    return ids


def _generate() -> int:
    if (FLAGS.prompt is None) == (FLAGS.prompt_ids is None):
        raise ValueError("give exactly one of --prompt and --prompt_ids")
    decode = decode_config_from_flags(FLAGS)
    prompt_ids = parse_prompt_ids(FLAGS.prompt_ids) if FLAGS.prompt_ids is not None else None

    from alodlm_jax.generate import build_generator, default_device

    device = FLAGS.device or default_device()
    cache_dir = apply_compilation_flags(FLAGS)
    if FLAGS.mesh is not None:
        from alodlm_jax.network import sharding

        if sharding.MeshSpec.parse(FLAGS.mesh).data > 1:
            raise FlagError("mesh", "the data axis splits a batch of requests and this command "
                            "decodes one prompt; use model=N here, or alodlm-jax-evaluate "
                            "--mesh data=D --batch_size B for many prompts")
    generator = build_generator(
        model=FLAGS.model, mesh=FLAGS.mesh, model_config=FLAGS.model_config, device=device,
        precision=FLAGS.precision, decode_config=decode, engine=FLAGS.engine,
        compilation_cache_dir=cache_dir)
    if prompt_ids is None:
        prompt_ids = generator.chat_prompt_ids(FLAGS.prompt, thinking=FLAGS.thinking)
    try:
        generator.check_prompt_ids(prompt_ids)
    except ValueError as error:
        raise FlagError("prompt" if FLAGS.prompt is not None else "prompt_ids", str(error)) from None
    result = generator.generate_ids(prompt_ids)
    print(json.dumps(result), flush=True)
    if FLAGS.stats:
        stats = {"decoder": generator.protocol_fields()["decoder"],
                 "compile_seconds": generator.compile_seconds, **generator.last_work.as_dict()}
        print(json.dumps(stats), file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status."""
    return run_command(_generate, prog=PROG, description=__doc__, flag_values=FLAGS, argv=argv,
                       required=("model",))


def run() -> None:
    """Console entry point ``alodlm-jax-generate``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
