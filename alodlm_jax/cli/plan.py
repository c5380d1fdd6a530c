"""Compile the programs alodlm-jax-evaluate would run for a target this machine need not have, and
print what XLA says about them: compile seconds, program size, device memory against the target's
capacity (fits?), the largest batch that fits, and per step the bytes moved (each loop counted as
often as it runs) against the floor, the kernels launched, and the steps/s and request-passes/s
those bytes allow at the target's bandwidth.

Targets: h100, h200, b200, a100 (XLA:GPU, deviceless; needs jax-cuda12-plugin and
jax-cuda12-pjrt), v5e, v5p, v6e (XLA:TPU via libtpu; needs jax[tpu]) -- both in the aot extra --,
cpu (XLA:CPU here) and attached (this process's devices). docs/plan.md explains every figure.

  alodlm-jax-plan --model released:8b --precision bf16 --target h200 --batch_size 8 \\
      --prompt_tokens 1024 --max_new_tokens 4096 --json plan.json
"""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from absl import flags

from alodlm_jax.cli.flags import FlagError, decode_config_from_flags, define_decode_flags, run_command

PROG = "alodlm-jax-plan"
FLAGS = flags.FlagValues()
RELEASED = {"released:1.7b": "1.7b", "released:8b": "8b"}

flags.DEFINE_string("model", None, "Local model directory (HF or converted), Hugging Face model id "
                    "(its config and tokenizer are read, never its weights), or released:1.7b / "
                    "released:8b (the released models' shapes, nothing read).", flag_values=FLAGS)
flags.DEFINE_string("target", None, "What to compile for: h100, h200, b200, a100, v5e, v5p, v6e "
                    "(alodlm_jax/data/targets/), cpu, or attached (this process's devices).",
                    flag_values=FLAGS)
flags.DEFINE_string("model_config", None, "As for evaluate: YAML file whose `model` section builds "
                    "the recurrence config for checkpoints without ALoDLM metadata.", flag_values=FLAGS)
flags.DEFINE_enum("precision", "fp32", ["fp32", "bf16"], "Weight and activation precision, as "
                  "evaluate's.", flag_values=FLAGS)
define_decode_flags(FLAGS)
flags.DEFINE_integer("batch_size", 1, "As evaluate's --batch_size: 1 plans the single-request "
                     "programs, more the batch and admit programs.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("mesh", None, "As evaluate's --mesh (data=D,model=M), over the target's "
                    "topology (a TPU target's host slice, e.g. 4 chips of v5p).", flag_values=FLAGS)
flags.DEFINE_string("input", None, "Task JSONL file: its longest prompt, tokenized as evaluate "
                    "does, sets the prompt bucket.", flag_values=FLAGS)
flags.DEFINE_integer("prompt_tokens", None, "Prompt length in tokens (instead of --input).",
                     lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("programs", None, "Comma-separated subset of the programs to compile "
                    "(single, prefill at batch 1; batch, admit above). Default: all.",
                    flag_values=FLAGS)
flags.DEFINE_string("json", None, "Also write the plan as JSON to this file.", flag_values=FLAGS)
flags.DEFINE_enum("command_buffers", "engine", ["engine", "xla", "graphs"], "GPU targets: compile "
                  "with the engine's XLA options (engine: XLA's defaults), XLA's defaults (xla), or "
                  "with loops and branches in command buffers too (graphs: CUDA graph conditional "
                  "nodes).", flag_values=FLAGS)
flags.DEFINE_string("save_hlo", None, "Also write each optimized program's text to "
                    "DIR/NAME.hlo.gz (to read it again without compiling).", flag_values=FLAGS)


def _model(fv):
    """``(cfg, abstract params, tokenizer or None)`` of ``--model``, no weights read."""
    import jax.numpy as jnp

    from alodlm_jax.testing.released_shapes import model_config, param_specs

    dtype = {"fp32": jnp.float32, "bf16": jnp.bfloat16}[fv.precision]
    if fv.model in RELEASED:
        if fv.model_config:
            raise FlagError("model_config", f"does not apply to {fv.model}")
        cfg = model_config(RELEASED[fv.model])
        return cfg, param_specs(cfg, dtype), None
    from alodlm_convert.resolve import resolve_model
    from alodlm_convert.sources import open_checkpoint

    model_dir = resolve_model(fv.model)
    cfg = open_checkpoint(str(model_dir), fv.precision, fv.model_config).config
    tokenizer = None
    if fv.input is not None:
        from alodlm_jax.generate import load_tokenizer

        tokenizer = load_tokenizer(model_dir)
    return cfg, param_specs(cfg, dtype), tokenizer


def _prompt_tokens(fv, tokenizer) -> tuple[int, int | None]:
    """``(longest prompt in tokens, number of tasks or None)``."""
    if (fv.input is None) == (fv.prompt_tokens is None):
        raise FlagError("input", "give exactly one of --input SUITE.jsonl and --prompt_tokens N")
    if fv.input is None:
        return fv.prompt_tokens, None
    if tokenizer is None:
        raise FlagError("input", f"{fv.model} has no tokenizer; give --prompt_tokens N instead")
    from alodlm_scoring.tasks import load_tasks

    tasks = load_tasks(fv.input)
    if not tasks:
        raise FlagError("input", f"{fv.input}: no tasks")
    lengths = [len(tokenizer(t["prompt"], add_special_tokens=False)["input_ids"]) for t in tasks]
    return max(lengths), len(tasks)


def _use_cpu_backend() -> None:
    """A named accelerator compiles deviceless: JAX's own backend stays the CPU (the CUDA plugin
    must not look for a GPU)."""
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"
        return
    import jax

    try:
        jax.config.update("jax_platforms", "cpu")
    except Exception:  # noqa: BLE001 - backends already initialized: keep them
        pass


def _gb(value) -> str:
    if value is None:
        return "-"
    if abs(value) < 1e9:
        return f"{value / 1e6:.2f} MB"
    return f"{value / 1e9:.2f} GB"


def format_plan(record: dict) -> str:
    """The plan as text, one block per program."""
    target = record["target"]
    bandwidth = target["bandwidth_bytes_per_second"]
    bandwidth = "-" if not bandwidth else f"{bandwidth / 1e12:.2f} TB/s"
    lines = [f"target {target['name']} ({record['device']}), capacity {_gb(target['capacity_bytes'])}"
             f" (a JAX process gets {_gb(record['usable_bytes'])}: {record['usable_basis']})"
             f", bandwidth {bandwidth}",
             f"model {record['model']['num_hidden_layers']} layers, H {record['model']['hidden_size']}"
             f" ({record['layer_layout']} weights, {record['shapes']} shapes), {record['dtype']}"
             f", batch {record['batch_size']}"
             f", prompt bucket "
             f"{record['bucket']['prompt_bucket']}, cache slots {record['bucket']['cache_slots']}"]
    for p in record["programs"]:
        if p.get("compile_error"):
            lines.append(f"  {p['name']}: does NOT fit: {p['compile_error']}")
            continue
        lines.append(f"  {p['name']}: compile {p['compile_seconds']:.1f} s, program "
                     f"{p['program_bytes'] / 1e6:.1f} MB ({p['fusions']} fusions)")
        lines.append(f"    device memory {_gb(p['device_memory_bytes'])} (weights {_gb(p['weight_bytes'])}"
                     f", cache {_gb(p['cache_bytes'])}, other arguments "
                     f"{_gb(max(0, p['argument_bytes'] - p['weight_bytes'] - p['cache_bytes']))}, temporaries "
                     f"{_gb(p['temp_bytes'])}) of {_gb(p['usable_bytes'])} usable: "
                     f"{'fits' if p['fits'] else 'does NOT fit' if p['fits'] is False else 'capacity unknown'}")
        if p["bytes_per_step"] is not None:
            ratio = p["bytes_per_step"] / p["floor_bytes_per_step"]
            rate = ("" if p["steps_per_second"] is None else
                    f"; at the bandwidth {p['steps_per_second']:.1f} steps/s, "
                    f"{p['request_passes_per_second']:.1f} request-passes/s")
            lines.append(f"    per step: {_gb(p['bytes_per_step'])} moved, floor "
                         f"{_gb(p['floor_bytes_per_step'])} ({ratio:.2f}x), {p['kernels_per_step']} "
                         f"kernels{rate}")
            if p.get("predicted_step_seconds") is not None:
                launched = ("" if p.get("kernels_outside_command_buffers") is None else
                            f"; {p['kernels_outside_command_buffers']} kernels launched outside "
                            f"command buffers, {p['command_buffer_launches']} command buffers, "
                            f"{p['host_syncs']} host syncs")
                few = p.get("few_programs_seconds") or 0
                few = (f"; {1e3 * few:.3f} ms of it kernels of few programs below the bandwidth"
                       if few else "")
                lines.append(f"    predicted step {1e3 * p['predicted_step_seconds']:.3f} ms "
                             f"({(p.get('flops_per_step') or 0) / 1e12:.3f} TFLOP){launched}{few}")
    lines.append(f"largest batch that fits: {record['max_batch_size']} (from "
                 f"{record['max_batch_size_basis']})")
    return "\n".join(lines) + "\n"


def _plan() -> int:
    fv = FLAGS
    from alodlm_jax.plan.targets import load_target, missing_extra

    target = load_target(fv.target)
    missing = missing_extra(target)
    if missing:
        raise ValueError(missing)
    if target.kind != "attached":
        _use_cpu_backend()
    from alodlm_jax.network import sharding

    mesh_spec = sharding.MeshSpec.parse(fv.mesh)
    if mesh_spec.num_devices > 1:
        sharding.check_layout(mesh_spec, "compiled", fv.batch_size)
    decode = decode_config_from_flags(fv)
    cfg, params, tokenizer = _model(fv)
    prompt_tokens, tasks = _prompt_tokens(fv, tokenizer)
    if prompt_tokens + decode.max_new_tokens > cfg.max_position_embeddings:
        raise FlagError("max_new_tokens", f"{prompt_tokens} prompt tokens + {decode.max_new_tokens} "
                        f"exceed the model's {cfg.max_position_embeddings} positions")
    from alodlm_jax.plan.compile import plan

    wanted = None if fv.programs is None else {p.strip() for p in fv.programs.split(",") if p.strip()}
    known = {"single", "prefill"} if fv.batch_size == 1 else {"batch", "admit"}
    if wanted is not None and not wanted <= known:
        raise FlagError("programs", f"unknown program(s) {sorted(wanted - known)} at --batch_size "
                        f"{fv.batch_size}; choose from {sorted(known)}")
    record = plan(target, cfg, params, decode, prompt_tokens=prompt_tokens,
                  batch_size=fv.batch_size, mesh_spec=mesh_spec if mesh_spec.num_devices > 1 else None,
                  programs=wanted, save_hlo=fv.save_hlo, command_buffers=fv.command_buffers,
                  log=lambda text: print(f"{PROG}: {text}", file=sys.stderr, flush=True))
    record["model"]["name"] = fv.model
    record["tasks"] = tasks
    sys.stdout.write(format_plan(record))
    if fv.json:
        with open(fv.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
            handle.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (``sys.argv`` by default); returns the exit status."""
    return run_command(_plan, prog=PROG, description=__doc__, flag_values=FLAGS, argv=argv,
                       required=("model", "target"))


def run() -> None:
    """Console entry point ``alodlm-jax-plan``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
