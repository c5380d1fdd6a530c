"""fp32 parity of the compiled engine on an accelerator against the CPU, one request at a time and
with continuous batching, in one process and a few minutes.

Builds random checkpoints of several small topologies (numpy-free JAX params made on the CPU and
copied to the device, so both sides decode the same weights), decodes a set of prompts (1-120
tokens) per setting on the CPU one request at a time (the engine the PyTorch parity suites
check), then on ``--device`` one request at a time and at each ``--batches`` size, and prints
how many requests are identical per batch size: tokens, exit depths, the §6.6 counters and stop
reason exactly, first-pass halting probabilities to ``--halt_tolerance``. Exit status 1 on any
difference, 0 when all are identical.

Runs from a checkout without installing it (``scripts/source_tree.py``)::

    python scripts/gpu_parity.py                   # the GPU (or TPU) against the CPU
    python scripts/gpu_parity.py --device cpu --shapes fixed --quick   # no accelerator
    bash scripts/gpu_check.sh --parity             # the same

The settings cover both modes, windows 7, 10, 16 and 20, a position penalty, a stop id, a
sandwich topology (prelude, core, coda; the one where batch 8 first disagreed on an H200: 7
layers, loop [2, 5), hidden 128, 4/2 heads of 32, vocabulary 224, rope theta 20000, RMSNorm
weights jittered by 5 %) and an all-layer one (the 1.7B's form). On one GPU the batch step of a
16-slot window (32 rows) attends in the Triton kernel (alodlm_jax/kernels/window.py), the others
in XLA's form.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import source_tree  # noqa: E402

source_tree.use()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from alodlm_convert.config import ModelConfig  # noqa: E402
from alodlm_jax.network import rows as R  # noqa: E402
from alodlm_jax.config import DecodeConfig  # noqa: E402
from alodlm_jax.decode.compiled import CompiledEngine  # noqa: E402
from alodlm_jax.testing.released_shapes import random_params  # noqa: E402
from gpu_check.common import difference  # noqa: E402  (scripts/, this script's folder)

TOPOLOGIES = {
    # The sandwich of the first H200 disagreement (module docstring).
    "sandwich7": dict(num_hidden_layers=7, loop_start=2, loop_end=5, hidden_size=128,
                      intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, vocab_size=224, rope_theta=20000.0),
    # All layers looped, as the 1.7B; heads of 16.
    "all4": dict(num_hidden_layers=4, loop_start=0, loop_end=4, hidden_size=64,
                 intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, vocab_size=256, rope_theta=1_000_000.0),
    # One prelude, two core and one coda layer, 8/2 heads (a group of 4 queries per KV head).
    "sandwich4": dict(num_hidden_layers=4, loop_start=1, loop_end=3, hidden_size=96,
                      intermediate_size=192, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=16, vocab_size=200, rope_theta=1_000_000.0),
}


@dataclasses.dataclass(frozen=True)
class Setting:
    topology: str
    decode: DecodeConfig
    seed: int
    head_scale: float

    def label(self) -> str:
        d = self.decode
        penalty = "" if d.position_penalty is None else f" penalty {d.position_penalty:g}"
        return (f"{self.topology} {d.mode} q {d.q:g} tau {d.tau:g} window {d.window_size} "
                f"budget {d.max_new_tokens}{penalty}")


SETTINGS = (
    Setting("sandwich7", DecodeConfig(q=0.65, tau=0.4, window_size=7, max_new_tokens=33,
                                      mode="left1"), seed=1, head_scale=8.0),
    Setting("sandwich7", DecodeConfig(q=0.5, tau=0.35, window_size=10, max_new_tokens=47,
                                      mode="entropy"), seed=1, head_scale=8.0),
    Setting("all4", DecodeConfig(q=0.5, tau=2.0, window_size=16, max_new_tokens=40,
                                 position_penalty=0.1, mode="entropy"), seed=2, head_scale=24.0),
    Setting("sandwich4", DecodeConfig(q=0.4, tau=1.0, window_size=20, max_new_tokens=48,
                                      mode="left1"), seed=3, head_scale=12.0),
    # Not in the default run: the first two settings with their modes swapped (--diagnose runs
    # them where those differ, to tell the mode from the window's shapes).
    Setting("sandwich7", DecodeConfig(q=0.65, tau=0.4, window_size=7, max_new_tokens=33,
                                      mode="entropy"), seed=1, head_scale=8.0),
    Setting("sandwich7", DecodeConfig(q=0.5, tau=0.35, window_size=10, max_new_tokens=47,
                                      mode="left1"), seed=1, head_scale=8.0),
)
DEFAULT_SETTINGS = (0, 1, 2, 3)
SWAPPED_MODES = {0: 4, 1: 5}
# One setting per window size (each its own programs: a window size, a mode and a topology are
# static). Prompt lengths from 1 to 120 tokens, in two prompt buckets (16 and 128 slots), so one
# request at a time compiles two programs per setting.
PROMPT_LENGTHS = (1, 120, 7, 97, 16, 70, 3, 111, 12, 88)
STOP_IDS = (2,)
# XLA:GPU options that --diagnose tries one at a time (a child process each, XLA_FLAGS): the
# command buffers (CUDA graphs, conditional and while nodes included), Triton's matrix products
# and normalization fusions, autotuning, the latency-hiding scheduler. A flag this XLA does not
# know ends its child at once ("not accepted").
DIAGNOSE_FLAGS = (
    "--xla_gpu_enable_command_buffer=",
    "--xla_gpu_enable_triton_gemm=false",
    "--xla_gpu_experimental_enable_triton_softmax_priority_fusion=false",
    "--xla_gpu_autotune_level=0",
    "--xla_gpu_enable_latency_hiding_scheduler=false",
)


def model_config(topology: str) -> ModelConfig:
    return ModelConfig(rms_norm_eps=1e-6, max_position_embeddings=512, max_depth=4,
                       mask_token_id=3, **TOPOLOGIES[topology])


def prompts_for(setting: Setting, count: int) -> list[list[int]]:
    """``count`` prompts (lengths from :data:`PROMPT_LENGTHS`), ids from the setting's seed."""
    vocab = TOPOLOGIES[setting.topology]["vocab_size"]
    key = jax.random.PRNGKey(1000 + setting.seed)
    out = []
    for i, n in enumerate(PROMPT_LENGTHS[:count]):
        ids = jax.random.randint(jax.random.fold_in(key, i), (n,), 4, vocab)
        out.append([int(t) for t in ids])
    return out


def run(args) -> int:
    cpu = jax.devices("cpu")[0]
    device = jax.devices(args.device)[0]
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    settings = [SETTINGS[i] for i in args.settings]
    count = args.prompts
    print(f"parity: {device.platform} ({device.device_kind}) against the CPU, fp32, "
          f"{len(settings)} settings x {count} prompts, batches {batches}, "
          f"{'loops and branches in command buffers, ' if args.graphs else ''}"
          f"halting probabilities to {args.halt_tolerance:g}; JAX {jax.__version__}", flush=True)
    totals = {b: [0, 0] for b in batches}
    failed = []  # (setting index, batch)
    started = time.perf_counter()
    for index, setting in zip(args.settings, settings):
        cfg = model_config(setting.topology)
        with jax.default_device(cpu):
            params = random_params(cfg, jnp.float32, seed=setting.seed,
                                   head_scale=setting.head_scale, norm_jitter=0.05)
        on_device = jax.device_put(params, device)
        prompts = prompts_for(setting, count)
        t0 = time.perf_counter()
        with jax.default_device(cpu):
            reference = CompiledEngine(cfg, params, setting.decode, STOP_IDS,
                                       measure_prefill=False)
            expected = [reference.generate(p) for p in prompts]
        shapes = None if args.shapes == "platform" else args.shapes
        line = []
        with jax.default_device(device):
            for batch in batches:
                engine = CompiledEngine(cfg, on_device, setting.decode, STOP_IDS, batch_size=batch,
                                        measure_prefill=False, shapes=shapes, graphs=args.graphs)
                if batch == 1:
                    outs = [engine.generate(p) for p in prompts]
                else:
                    outs = engine.generate_batch(prompts)
                diffs = [difference(o, e, args.halt_tolerance) for o, e in zip(outs, expected)]
                same = sum(d is None for d in diffs)
                totals[batch][0] += same
                totals[batch][1] += len(prompts)
                line.append(f"batch {batch} {same}/{len(prompts)}")
                if same < len(prompts):
                    failed.append((index, batch))
                for i, d in enumerate(diffs):
                    if d is not None:
                        print(f"    batch {batch}, prompt {i} ({len(prompts[i])} tokens): {d}",
                              flush=True)
        print(f"  {setting.label()} [{engine.shapes}]: {', '.join(line)} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    ok = all(same == total for same, total in totals.values())
    summary = ", ".join(f"batch {b}: {s}/{t} identical" for b, (s, t) in totals.items())
    print(f"parity {'PASSED' if ok else 'FAILED'}: {summary} "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    if failed and args.diagnose:
        diagnose(args, failed)
    return 0 if ok else 1


def diagnose(args, failed) -> None:
    """Reruns the settings and batch sizes that differed with each other shape policy of the
    engine, then with each of :data:`DIAGNOSE_FLAGS` (the platform's policy), so that one run
    says which program form or compiler pass the difference follows."""
    settings = ",".join(str(i) for i in sorted({i for i, _ in failed}))
    batches = ",".join(str(b) for b in sorted({b for _, b in failed}))
    base = [sys.executable, __file__, "--device", args.device, "--settings", settings,
            "--batches", batches, "--prompts", str(args.prompts),
            "--halt_tolerance", str(args.halt_tolerance)] + (["--graphs"] if args.graphs else [])
    own = (R.shapes_for(jax.devices(args.device)[0].platform) if args.shapes == "platform"
           else args.shapes)
    variants = [(f"shapes {shapes}", ["--shapes", shapes], {}) for shapes in R.SHAPES
                if shapes != own]
    if args.device != "cpu":  # this JAX's CPU with the device's shapes: the JAX or the device?
        variants.insert(0, ("the CPU on both sides, the device's shapes", [
            "--device", "cpu", "--shapes", own if own != R.KERNEL else R.FIXED], {}))
    swapped = sorted({SWAPPED_MODES[i] for i, _ in failed if i in SWAPPED_MODES})
    if swapped:
        listed = ",".join(str(i) for i in swapped)
        variants.insert(0, (f"the other mode at the same window (settings {listed})",
                            ["--shapes", args.shapes, "--settings", listed], {}))
    if args.device == "gpu":
        variants += [(f"XLA_FLAGS={flag}", ["--shapes", args.shapes],
                      {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()})
                     for flag in DIAGNOSE_FLAGS]
    print(f"diagnose: settings {settings}, batches {batches}", flush=True)
    for label, extra, env in variants:
        done = subprocess.run(base + extra, env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=args.diagnose_timeout)
        lines = done.stdout.splitlines()
        last = [line for line in lines if line.startswith("parity ")]
        verdict = last[-1] if last else (
            f"not accepted (exit {done.returncode}): "
            + (done.stderr.strip().splitlines() or ["no output"])[-1][:200])
        print(f"  {label}: {verdict}", flush=True)
        for line in lines:  # each setting's counts
            if line.startswith("  ") and "]: batch" in line:
                print(f"  {line}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None,
                        help="JAX platform decoded against the CPU: gpu, tpu or cpu (default: the "
                             "default backend's)")
    parser.add_argument("--batches", default="1,8,32",
                        help="comma-separated batch sizes (1: one request at a time)")
    parser.add_argument("--shapes", default="platform", choices=("platform",) + R.SHAPES,
                        help="the device side's shape policy (alodlm_jax/network/rows.py); default: the "
                             "one evaluate uses on that platform")
    parser.add_argument("--prompts", type=int, default=len(PROMPT_LENGTHS),
                        help=f"prompts per setting (1-{len(PROMPT_LENGTHS)})")
    parser.add_argument("--quick", action="store_true",
                        help="the two settings of the sandwich where batching first disagreed "
                             "(--settings 0,1)")
    parser.add_argument("--settings", default=None,
                        help=f"comma-separated indices into the settings (0-{len(SETTINGS) - 1}; "
                             "default: 0-3; 4 and 5 are 0 and 1 with their modes swapped)")
    parser.add_argument("--halt_tolerance", type=float, default=1e-5,
                        help="largest accepted difference of a first-pass halting probability "
                             "(a negative one reports every request: a check of the report)")
    parser.add_argument("--graphs", action="store_true",
                        help="compile the device's programs with loops and branches in command "
                             "buffers (CUDA graphs: CompiledEngine(..., graphs=True)); elsewhere "
                             "nothing changes")
    parser.add_argument("--diagnose", action="store_true",
                        help="where a setting differs, rerun it with each other shape policy "
                             "and, on a GPU, with each of a few XLA:GPU options off (a child "
                             "process each), and print which of them agree")
    parser.add_argument("--diagnose_timeout", type=float, default=300,
                        help="seconds for each --diagnose child")
    args = parser.parse_args(argv)
    try:
        args.settings = ([0, 1] if args.quick else list(DEFAULT_SETTINGS)
                         if args.settings is None else
                         [int(i) for i in args.settings.split(",") if i.strip()])
    except ValueError:
        parser.error("--settings takes comma-separated integers")
    if not args.settings or any(not 0 <= i < len(SETTINGS) for i in args.settings):
        parser.error(f"--settings: indices in 0-{len(SETTINGS) - 1}")
    if not 1 <= args.prompts <= len(PROMPT_LENGTHS):
        parser.error(f"--prompts must be in 1-{len(PROMPT_LENGTHS)}")
    if args.device is None:
        args.device = jax.default_backend()
    try:
        jax.devices(args.device)
    except RuntimeError as error:
        parser.error(f"--device {args.device}: {error}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
