#!/usr/bin/env bash
# One self-contained decode check for a CUDA GPU (e.g. an H200 with JAX+CUDA preinstalled).
#
# Builds random bf16 checkpoints with the released models' shapes directly as JAX params on the
# device (no torch, no files, nothing downloaded), runs the portable and the compiled engine on
# them, and prints tokens/s, ms per recurrent pass, compile seconds, and the per-pass time against
# the HBM roofline (bytes of the weights one pass reads at the device's bandwidth: the plan's
# target of its kind, alodlm_jax/data/targets, else the H200's 4.8 TB/s); then the batch sweep:
# the compiled engine with continuous batching at each --batches size on the same prompts, suite
# tokens/s against one request at a time, the seconds of its first run (the batch and admit
# programs compiled, the first prompts admitted and decoded), and XLA's cost analysis of one batch
# step (bytes moved at the bandwidth: the step time it allows) beside the measured time per step,
# and the plan's prediction for the same batch program (alodlm-jax-plan's figures for this device:
# compile seconds, device memory, bytes, FLOPs and kernels per step, the kernels launched outside
# command buffers, its predicted ms/step; block "PLAN" below) beside the measured ms/step (the
# batch program's run time over its own count of steps; the single-request program's time per
# pass), so one run recalibrates the plan (alodlm_jax/plan/launches.py: TIME_MODEL). On a GPU the
# compiled engine runs the accelerators' fixed shapes (one row shape, attention over the whole
# cache: alodlm_jax/network/rows.py), and on one GPU every pass attends in the Triton kernel
# (alodlm_jax/kernels/window.py; "shapes fixed-kernel"), as evaluate does. In bf16 a batch's
# products run over more rows (other tiles, other sums) than one request's, so "same tokens" may
# read False at a near tie; in fp32 it is expected True.
#
#   1.7B-shaped: 28 layers, loop [0,28), H 2048, I 6144, 16/8 heads x 128, vocab 151936
#   8B-shaped:   36 layers, loop [10,26), H 4096, I 12288, 32/8 heads x 128, vocab 151936
#
# Usage:  bash scripts/gpu_check.sh [--tiny] [--max_new_tokens N] [--models 1.7b,8b] [--batches 1,8,32]
#                                  [--graphs] [--no_attention] [--xla_products] [--separate_norms]
#                                  [--separate_combine]
#                                  [--layouts | --layouts_only]
#         bash scripts/gpu_check.sh --goals [--budget_s 360] [--json goals.json] [--models ...]
#         bash scripts/gpu_check.sh --parity [gpu_parity.py's options]
#   --goals    only the decode-speed goals of docs/plan.md, in one run that starts nothing after
#              --budget_s seconds (block GOALS below: what it runs, in which order): a 256-token
#              prompt and 128 new by default, batch 1 against its weights at the bandwidth,
#              batches 8 and 32 (first run, step against the floors, tokens/s against one at a
#              time), each measured step against the plan's prediction, the combined attention's
#              ordering, and graphs; a verdict a goal at the end ("GOALS"), and in --json.
#   --parity   only the fp32 parity check against the CPU (scripts/gpu_parity.py: several small
#              topologies, one request at a time and batches 8 and 32; exit status 1 on any
#              difference); the other options are gpu_parity.py's.
#   --tiny     small shapes of both topologies, for a CPU smoke test of this script.
#   --graphs   also the compiled engine with loops and branches in command buffers (CUDA graph
#              conditional nodes: CompiledEngine(..., graphs=True), alodlm-jax-plan
#              --command_buffers graphs) beside XLA's defaults, for the single-request program and
#              at each batch size: measured against predicted ms, and whether its tokens equal the
#              defaults' (the same program under other launch machinery: expected equal).
#   --no_attention  skip the first block of each model (block "ATTENTION" below): the Triton
#              attention kernel alone at each --batches size and a short, a long and a full
#              prefix of a 5,376-slot cache (a 1,024-token prompt and 4,096 new), its prefix
#              walked in parts (flash-decoding, window_kernel.gpu_splits: what the engine runs)
#              and in one part per request and KV head: us per call, K/V read per second, and
#              how far apart their outputs are; the heads' norms and RoPE in their Triton
#              kernel (alodlm_jax/kernels/head_norm.py) against XLA's form on this device, and
#              (one request's window) the attention kernel that applies them itself against
#              that kernel and the attention kernel ("normed attention"), and the attention
#              kernel's last part combining a long prefix's parts against a second kernel
#              combining them, 100 calls each ("combined attention"); and a
#              window layer's products with their norms and residual adds in Triton kernels
#              (alodlm_jax/kernels/matmul.py, one request's rows and two requests') against
#              XLA's form: us per layer, weights read per second, outputs equal.
#   --xla_products  the engines run a window layer's products in XLA's form
#              (matmul_kernel.MAX_ROWS = 0), to compare their ms/pass with a run without it.
#   --separate_norms  the engines apply the heads' norms and RoPE in a kernel of their own, not
#              in the attention kernel (window_kernel.NORMS_IN_ATTENTION = False), likewise.
#   --separate_combine  the single-request program combines a prefix's parts in a kernel of
#              their own, not in the attention kernel's last part to finish
#              (window_kernel.COMBINE_IN_ATTENTION = False), likewise.
#   --layouts  (block "LAYOUTS" below) also the compiled engine with continuous batching
#              on every ("data", "model") mesh the visible devices allow (one H200: data=1,model=1
#              through the mesh path), against one-device batch 1: tokens/s, same tokens, and the
#              collectives of one batch step. --layouts_only runs only that block.
# Run from a checkout, installed or not (scripts/source_tree.py), from any folder.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == "--parity" ]]; then
  shift
  exec python "${HERE}/scripts/gpu_parity.py" "$@"
fi
export PYTHONPATH="${HERE}/scripts:${HERE}${PYTHONPATH:+:${PYTHONPATH}}"
exec python - "$@" <<'PY'
import argparse
import functools
import sys
import time

import source_tree

source_tree.use()

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.plan.analysis import step_analysis
from alodlm_jax.config import DecodeConfig, DecodeConfigError
from alodlm_jax.decode import batched
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.decode.portable import PortableEngine
from alodlm_jax.plan.fit import tree_bytes
from alodlm_jax.testing.released_shapes import SHAPES, model_config, random_params


@functools.cache
def device_rates():
    """The plan's target (alodlm_jax/data/targets) whose memory bandwidth and dense bf16 matrix
    rate this script measures against: the attached GPU's kind where the plan describes it (A100,
    H100, H200, B200), else the H200's (a CPU's --tiny run)."""
    from alodlm_jax.plan.targets import load_target

    kind = jax.devices()[0].device_kind.upper()
    return load_target(next((n for n in ("h200", "h100", "b200", "a100") if n.upper() in kind),
                            "h200"))


def tb_per_s() -> str:
    return f"{device_rates().bandwidth_bytes_per_second / 1e12:.2f} TB/s ({device_rates().name})"


def pass_bytes(params) -> int:
    """Weight bytes one recurrent pass reads: core + coda layers, final norm, LM head, gate."""
    return tree_bytes((params["core"], params["coda"], params["final_norm"], params["lm_head"],
                       params["gate"]))


def random_prompts(cfg, count: int, tokens: int, seed: int = 2) -> list[list[int]]:
    """``count`` prompts of ``tokens`` random ids below the mask token (the same for a seed)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.mask_token_id, size=tokens).tolist() for _ in range(count)]


def ms_per_pass(*outs) -> float:
    """Single requests' decode time per recurrent pass, their prefills left out (ms)."""
    return (1e3 * sum(o.wall_seconds - o.prefill_seconds for o in outs)
            / max(sum(o.recurrent_passes for o in outs), 1))


def run_batch(cfg, params, decode, prompts, batch, graphs):
    """A batch engine's first run (its batch and admit programs compiled, ``batch`` prompts
    admitted and decoded; seconds) and then ``prompts`` decoded with continuous batching:
    (engine, outputs, wall seconds, first-run seconds, ms per batch step, steps), the steps and
    their seconds the engine's own count of its batch program's runs."""
    engine = CompiledEngine(cfg, params, decode, [], batch_size=batch, graphs=graphs)
    t0 = time.perf_counter()
    engine.generate_batch(prompts[:batch])
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = engine.generate_batch(prompts)
    wall = time.perf_counter() - t0
    steps = engine.last_batch_steps
    return engine, outs, wall, first, 1e3 * engine.last_batch_seconds / max(steps, 1), steps


def batch_sweep(cfg, params, batches, args) -> bool:
    """Suite tokens/s of continuous batching at each batch size against one request at a time
    (the same 2 * max(batches) prompts, entropy mode), and per step: measured ms against XLA's
    cost analysis of one step on this backend (bytes moved at the device's bandwidth)."""
    prompts = random_prompts(cfg, 2 * max(batches), args.prompt_tokens)
    decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                          max_new_tokens=args.max_new_tokens, mode="entropy")
    single = CompiledEngine(cfg, params, decode, [])
    single.generate(prompts[0])
    alone = [single.generate(p) for p in prompts]
    base = sum(len(o.token_ids) for o in alone) / sum(o.wall_seconds for o in alone)
    print(f"  batch sweep ({len(prompts)} prompts): one at a time {base:9.1f} tok/s", flush=True)
    same_all = True
    for b, graphs in [(b, g) for b in batches for g in ((False, True) if args.graphs else (False,))]:
        engine, outs, wall, first, ms_step, steps = run_batch(cfg, params, decode, prompts, b,
                                                               graphs)
        tokens = sum(len(o.token_ids) for o in outs)
        same = all(a.token_ids == o.token_ids for a, o in zip(alone, outs))
        if graphs:  # the same program as the defaults' just measured: its tokens
            same = [o.token_ids for o in outs] == defaults
            print(f"  batch {b:>3} graphs: {tokens / wall:9.1f} tok/s  {ms_step:7.3f} ms/step "
                  f"({steps} steps); same tokens as XLA's defaults: {same}; first run {first:.1f} s "
                  f"(compiles included)", flush=True)
            same_all &= same
            print_plan(cfg, params, decode, args, b, "batch", measured_ms=ms_step,
                       measured_compile=engine.compile_seconds, command_buffers="graphs")
            continue
        defaults = [o.token_ids for o in outs]
        same_all &= same
        cost = step_analysis(cfg, params, engine.bucket_for(args.prompt_tokens, batch=b),
                             shapes=engine.shapes)
        floor_ms = 1e3 * cost["bytes_moved"] / device_rates().bandwidth_bytes_per_second
        print(f"  batch {b:>3}: {tokens / wall:9.1f} tok/s (x{tokens / wall / base:5.2f} one at a "
              f"time)  {ms_step:7.3f} ms/step ({steps} steps); XLA step: "
              f"{cost['bytes_moved'] / 1e9:.3f} GB moved (floor {cost['floor_bytes'] / 1e9:.3f}, "
              f"x{cost['moved_over_floor']:.2f}) -> {floor_ms:.3f} ms at {tb_per_s()}; "
              f"{cost['flops'] / 1e9:.0f} GFLOP; same tokens: {same}; shapes {engine.shapes}; "
              f"first run {first:.1f} s (compiles included)", flush=True)
        print_plan(cfg, params, decode, args, b, "batch", measured_ms=ms_step,
                   measured_compile=engine.compile_seconds)
    return same_all


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.sh")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--models", default="1.7b,8b")
    parser.add_argument("--goals", action="store_true",
                        help="only the decode-speed goals, in one run bounded by --budget_s "
                             "(block GOALS below)")
    parser.add_argument("--budget_s", type=float, default=360,
                        help="--goals: start no item after this many seconds")
    parser.add_argument("--single_prompts", type=int, default=4,
                        help="--goals: prompts timed one at a time for ms per pass")
    parser.add_argument("--json", help="--goals: also write the verdicts to this file")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--window_size", type=int, default=16)
    parser.add_argument("--prompt_tokens", type=int,
                        help="prompt length (default 64; --goals: 256)")
    parser.add_argument("--head_scale", type=float, default=8.0)
    parser.add_argument("--batches",
                        help="batch sizes of the continuous-batching sweep ('' to skip it; "
                             "default 1,8,32; --goals: 8,32)")
    parser.add_argument("--graphs", action="store_true",
                        help="also loops and branches in command buffers (CUDA graphs)")
    parser.add_argument("--no_attention", action="store_true",
                        help="skip the attention kernel's timing (parts of a prefix vs one)")
    parser.add_argument("--xla_products", action="store_true",
                        help="the engines' layer products in XLA's form, not matmul_kernel's")
    parser.add_argument("--separate_norms", action="store_true",
                        help="the engines' heads' norms in a kernel of their own, not the "
                             "attention kernel's")
    parser.add_argument("--separate_combine", action="store_true",
                        help="a split prefix's parts combined by a kernel of their own, not by "
                             "the attention kernel's last part")
    parser.add_argument("--layouts", action="store_true")
    parser.add_argument("--layouts_only", action="store_true")
    parser.add_argument("--layout_batch", type=int, default=8)
    parser.add_argument("--layout_prompts", type=int, default=16)
    args = parser.parse_args()
    if args.prompt_tokens is None:
        args.prompt_tokens = 256 if args.goals else 64
    if args.batches is None:
        args.batches = "8,32" if args.goals else "1,8,32"
    if args.goals and not [b for b in args.batches.split(",") if b]:
        parser.error("--goals needs at least one batch size in --batches")
    unknown = [m for m in args.models.split(",") if m and m not in SHAPES]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)} (the shapes: {', '.join(SHAPES)})")
    try:
        DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                     max_new_tokens=args.max_new_tokens)
    except DecodeConfigError as error:
        parser.error(f"--window_size / --max_new_tokens: {error}")
    if args.xla_products:
        from alodlm_jax.kernels import matmul as matmul_kernel

        matmul_kernel.MAX_ROWS = 0  # supported() says no: the model keeps XLA's form
    if args.separate_norms:
        from alodlm_jax.kernels import window as window_kernel

        window_kernel.NORMS_IN_ATTENTION = False  # the model keeps head_norm_kernel's
    if args.separate_combine:
        from alodlm_jax.kernels import window as window_kernel

        window_kernel.COMBINE_IN_ATTENTION = False  # the combining kernel, as for a batch
    dev = jax.devices()[0]
    print(f"jax {jax.__version__}; device {dev.platform} {dev.device_kind}; tiny={args.tiny}; "
          f"layer products in {'XLA' if args.xla_products else 'matmul_kernel'}; heads' norms "
          f"in {'their own kernel' if args.separate_norms else 'the attention kernel'}; a "
          f"prefix's parts combined by "
          f"{'their own kernel' if args.separate_combine else 'the attention kernel'}",
          flush=True)
    if dev.platform != "gpu" and not args.tiny:
        print("warning: no GPU visible; the full shapes will be slow here (use --tiny)", flush=True)
    if args.goals:
        ok = goals(args)
        print("\nGPU_CHECK_DONE", "ok" if ok else "a goal's check failed (see GOALS)")
        return 0
    dtype = jnp.bfloat16
    ok = True
    for name in [m for m in args.models.split(",") if m and not args.layouts_only]:
        cfg = model_config(name, tiny=args.tiny)
        t0 = time.perf_counter()
        # Per-layer weights: the ordinary load's layout (a stacked group would copy each
        # layer's weights out of the stack on every call, doubling a pass's memory traffic).
        params = random_params(cfg, dtype, seed=0, head_scale=args.head_scale)
        jax.block_until_ready(params)
        weight_bytes = tree_bytes(params)
        per_pass = pass_bytes(params)
        roofline_ms = 1e3 * per_pass / device_rates().bandwidth_bytes_per_second
        print(f"\n== {name}-shaped ({'tiny' if args.tiny else 'full'}): {weight_bytes / 1e9:.2f} GB "
              f"of bf16 weights built in {time.perf_counter() - t0:.1f} s; one pass reads "
              f"{per_pass / 1e9:.3f} GB -> HBM roofline {roofline_ms:.3f} ms/pass at {tb_per_s()}",
              flush=True)
        if not args.no_attention:
            attention_check(cfg, args)
            head_norm_check(cfg, args)
            layer_kernels_check(cfg, params, args)
        (prompt,) = random_prompts(cfg, 1, args.prompt_tokens, seed=1)
        for mode in ("entropy", "left1"):
            decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                                  max_new_tokens=args.max_new_tokens, mode=mode)
            tokens = {}
            for label, engine in (("portable", PortableEngine(cfg, params, decode, [])),
                                  ("compiled", CompiledEngine(cfg, params, decode, []))):
                engine.generate(prompt)  # warmup: compiles
                out = engine.generate(prompt)
                tokens[label] = out.token_ids
                ms_pass = ms_per_pass(out)
                print(f"  {mode:<8}{label:<10} {len(out.token_ids) / out.wall_seconds:9.1f} tok/s  "
                      f"{ms_pass:8.3f} ms/pass (x{ms_pass / roofline_ms:.1f} roofline)  "
                      f"passes {out.recurrent_passes:4d}  windows {out.outer_steps:4d}  "
                      f"prefill {1e3 * out.prefill_seconds:7.2f} ms  compile "
                      f"{engine.compile_seconds:6.1f} s"
                      + (f"  shapes {engine.shapes}" if label == "compiled" else ""), flush=True)
                if label == "compiled" and mode == "entropy":
                    print_plan(cfg, params, decode, args, 1, "single", measured_ms=ms_pass,
                               measured_compile=engine.compile_seconds)
                if label == "compiled" and args.graphs:
                    graphs = CompiledEngine(cfg, params, decode, [], graphs=True)
                    graphs.generate(prompt)
                    g = graphs.generate(prompt)
                    g_ms = ms_per_pass(g)
                    same_graphs = g.token_ids == out.token_ids
                    ok &= same_graphs
                    print(f"  {mode:<8}{'graphs':<10} {len(g.token_ids) / g.wall_seconds:9.1f} "
                          f"tok/s  {g_ms:8.3f} ms/pass (x{g_ms / roofline_ms:.1f} roofline)  "
                          f"compile {graphs.compile_seconds:6.1f} s  same tokens as XLA's "
                          f"defaults: {same_graphs}", flush=True)
                    if mode == "entropy":
                        print_plan(cfg, params, decode, args, 1, "single", measured_ms=g_ms,
                                   measured_compile=graphs.compile_seconds,
                                   command_buffers="graphs")
                    del graphs
                if name == "1.7b" and label == "compiled" and not args.tiny:
                    met = ms_pass <= 1.5 * roofline_ms
                    print(f"  goal compiled ms/pass <= 1.5x roofline (batch 1): "
                          f"{'met' if met else 'NOT met'} ({ms_pass / roofline_ms:.2f}x)", flush=True)
            same = tokens["portable"] == tokens["compiled"]
            ok &= same
            print(f"  {mode:<8}same tokens portable/compiled: {same}", flush=True)
        batches = [int(b) for b in args.batches.split(",") if b]
        if batches:
            ok &= batch_sweep(cfg, params, batches, args)
        del params
    if args.layouts or args.layouts_only:
        ok &= check_layouts(args, dtype)
    print("\nGPU_CHECK_DONE", "ok" if ok else "token mismatch (bf16: see the spec's §8 note)")
    return 0


# ---- GOALS (the decode-speed goals of docs/plan.md in one bounded run) -----------------------
def goals(args) -> bool:
    """The decode-speed goals (docs/plan.md, "Launches and the predicted step": against the
    goals) measured in one run that stops starting work once --budget_s seconds are spent, its
    items in order of what they settle:

      1. the first of --models (the 1.7B): the attention kernel's last part combining a split
         prefix's parts against a second kernel, 100 calls at two prefixes (goal: no call
         differs; a part read before its program wrote it would make one differ); its
         single-request program (XLA's defaults) over --single_prompts prompts: ms per pass
         against 1.3x the time of all its weights at the bandwidth (goal: 1.1 ms for the 1.7B,
         4.4 ms for the 8B on an H200; the pass itself reads the layers it loops, the head and
         the gate: "HBM roofline") and against the plan's prediction (within 1.3x); max(--batches)
         prompts one at a time, then each batch size on them: the first run's seconds (goal 15),
         ms per step against the plan's (within 1.3x), the largest batch's step against 1.5x
         max(floor bytes, FLOPs) at the device's rates (goal) and its suite tokens/s against
         one at a time (goal 20x), requests whose tokens equal one at a time's (bf16: a near tie
         may differ; fp32 identity is gpu_parity's);
      2. each other model (the 8B): the combined attention, the single-request program, the
         largest batch (no one-at-a-time run);
      3. with loops and branches in command buffers (graphs), the first model's single-request
         program and largest batch (the same tokens as XLA's defaults expected);
      4. the other models' one-at-a-time runs and other batch sizes.

    Every line is flushed as it is measured and --json rewritten after every item, so a run cut
    short keeps what it measured; an item that fails (or a plan of a measured program) is
    reported and the next one runs. The verdicts are printed at the end ("GOALS"). True where
    no item failed, no call of the combined attention differed and graphs gave the defaults'
    tokens."""
    import json
    from types import SimpleNamespace

    on_gpu = jax.devices()[0].platform == "gpu"
    rates = device_rates()
    batches = [int(b) for b in args.batches.split(",") if b]
    models = [m for m in args.models.split(",") if m]
    began, verdicts, failed, ok = time.perf_counter(), [], [], True
    setups = {}

    def verdict(goal, model, measured, limit, met):
        verdicts.append({"goal": goal, "model": model, "measured": measured, "limit": limit,
                         "met": met})

    def setup(name):
        if name not in setups:
            cfg = model_config(name, tiny=args.tiny)
            params = random_params(cfg, jnp.bfloat16, seed=0, head_scale=args.head_scale)
            prompts = random_prompts(cfg, max(batches + [args.single_prompts]),
                                     args.prompt_tokens)
            decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                                  max_new_tokens=args.max_new_tokens, mode="entropy")
            per_pass, weights = pass_bytes(params), tree_bytes(params)
            roofline, goal = (1e3 * n / rates.bandwidth_bytes_per_second
                              for n in (per_pass, weights))
            print(f"\n== {name}-shaped ({'tiny' if args.tiny else 'full'}); one pass reads "
                  f"{per_pass / 1e9:.3f} GB -> HBM roofline {roofline:.3f} ms/pass at "
                  f"{tb_per_s()}; all {weights / 1e9:.3f} GB of weights (the batch-1 goal's "
                  f"roofline) {goal:.3f} ms", flush=True)
            setups[name] = SimpleNamespace(cfg=cfg, params=params, prompts=prompts, decode=decode,
                                           roofline_ms=roofline, goal_ms=goal, single=None,
                                           alone=None, defaults={})
        return setups[name]

    def planned(name, program, *plan_args, **plan_kwargs):
        """print_plan's record of the program just measured, and its verdicts; None (and a line
        saying why) where planning it failed, the measurement's own verdicts kept."""
        try:
            plan = print_plan(*plan_args, **plan_kwargs)
        except Exception as error:  # noqa: BLE001 - the measurements stand without the plan
            print(f"  plan of {program} failed: {type(error).__name__}: {str(error)[:300]}",
                  flush=True)
            failed.append(f"{name} plan of {program}: {type(error).__name__}")
            return None
        plan_verdicts(name, program, plan_kwargs["measured_ms"], plan)
        return plan

    def plan_verdicts(name, program, measured_ms, plan):
        predicted, outside = plan["predicted_step_seconds"], plan["kernels_outside_command_buffers"]
        if predicted:
            ratio = measured_ms / (1e3 * predicted)
            verdict(f"{program}: measured / predicted ms per step", name, round(ratio, 3),
                    "1/1.3 to 1.3", 1 / 1.3 <= ratio <= 1.3)
        if outside is not None:
            verdict(f"{program}: kernels launched outside command buffers per step (plan)", name,
                    outside, 50, outside <= 50)

    def combined(name):
        nonlocal ok
        s = setup(name)
        got = combined_attention_check(s.cfg, args, *window_heads(s.cfg, args,
                                                                  2 * args.window_size), on_gpu)
        if got is not None:
            verdict("combined attention: calls that differ", name, got[0], f"0 of {got[1]}",
                    got[0] == 0)
            ok &= got[0] == 0

    def single(name, graphs=False):
        nonlocal ok
        s = setup(name)
        engine = CompiledEngine(s.cfg, s.params, s.decode, [], graphs=graphs)
        engine.generate(s.prompts[0])  # compiles
        outs = [engine.generate(p) for p in s.prompts[:args.single_prompts]]
        ms = ms_per_pass(*outs)
        label = "graphs" if graphs else "XLA's defaults"
        same = ""
        if graphs and s.single is not None:
            equal = [o.token_ids for o in outs] == [o.token_ids for o in s.alone[:len(outs)]]
            same, ok = f"; same tokens as XLA's defaults: {equal}", ok & equal
        print(f"  single, {label}: {ms:.3f} ms/pass (x{ms / s.roofline_ms:.2f} roofline) over "
              f"{sum(o.recurrent_passes for o in outs)} passes of {len(outs)} prompts; compile "
              f"{engine.compile_seconds:.1f} s{same}", flush=True)
        if not graphs:
            s.single, s.alone = engine, outs
        verdict(f"single ({label}): ms per pass / all weights at the bandwidth", name,
                round(ms / s.goal_ms, 3), 1.3, ms <= 1.3 * s.goal_ms)
        planned(name, f"single ({label})", s.cfg, s.params, s.decode, args, 1, "single",
                measured_ms=ms, measured_compile=engine.compile_seconds,
                command_buffers="graphs" if graphs else "engine")

    def alone(name):
        s = setup(name)
        if s.single is None:
            single(name)
        t0 = time.perf_counter()
        s.alone += [s.single.generate(p) for p in s.prompts[len(s.alone):max(batches)]]
        print(f"  one at a time: {len(s.alone)} prompts in {time.perf_counter() - t0:.1f} s "
              f"(the first {args.single_prompts} timed above)", flush=True)

    def batch(name, b, graphs=False):
        nonlocal ok
        s = setup(name)
        prompts = s.prompts[:max(batches)]
        engine, outs, wall, first, ms, steps = run_batch(s.cfg, s.params, s.decode, prompts, b,
                                                         graphs)
        label = "graphs" if graphs else "XLA's defaults"
        tokens = sum(len(o.token_ids) for o in outs)
        line = (f"  batch {b:>3}, {label}: {tokens / wall:9.1f} tok/s, {ms:.3f} ms/step ({steps} "
                f"steps), first run {first:.1f} s (compiles included, {engine.compile_seconds:.1f} "
                f"s of them)")
        full = s.alone is not None and len(s.alone) >= len(prompts)
        if full:
            base = (sum(len(o.token_ids) for o in s.alone[:len(prompts)])
                    / sum(o.wall_seconds for o in s.alone[:len(prompts)]))
            same = sum(a.token_ids == o.token_ids for a, o in zip(s.alone, outs))
            line += (f"; x{tokens / wall / base:.2f} one at a time ({base:.1f} tok/s); "
                     f"{same} of {len(outs)} requests the same tokens as one at a time")
        if graphs and b in s.defaults:
            equal = [o.token_ids for o in outs] == s.defaults[b]
            line, ok = line + f"; same tokens as XLA's defaults: {equal}", ok & equal
        elif not graphs:
            s.defaults[b] = [o.token_ids for o in outs]
        print(line, flush=True)
        verdict(f"batch {b} ({label}): first run s", name, round(first, 1), 15, first <= 15)
        if b == max(batches) and full and not graphs:
            verdict(f"batch {b}: suite tok/s / one at a time", name,
                    round(tokens / wall / base, 2), 20, tokens / wall >= 20 * base)
        compiled = engine.compile_seconds
        del engine
        plan = planned(name, f"batch {b} ({label})", s.cfg, s.params, s.decode, args, b,
                       "batch", measured_ms=ms, measured_compile=compiled,
                       command_buffers="graphs" if graphs else "engine")
        if b == max(batches) and plan is not None:
            floor = max(plan["floor_bytes_per_step"] / rates.bandwidth_bytes_per_second,
                        (plan["flops_per_step"] or 0) / rates.matrix_flops_per_second)
            verdict(f"batch {b} ({label}): ms per step / max(floor bytes, FLOPs)", name,
                    round(ms / (1e3 * floor), 3), 1.5, ms <= 1.5e3 * floor)

    first, rest = models[0], models[1:]
    items = [(f"{first} combined attention", functools.partial(combined, first)),
             (f"{first} single", functools.partial(single, first)),
             (f"{first} one at a time", functools.partial(alone, first))]
    items += [(f"{first} batch {b}", functools.partial(batch, first, b)) for b in batches]
    for name in rest:
        items += [(f"{name} combined attention", functools.partial(combined, name)),
                  (f"{name} single", functools.partial(single, name)),
                  (f"{name} batch {max(batches)}", functools.partial(batch, name, max(batches)))]
    items += [(f"{first} single graphs", functools.partial(single, first, True)),
              (f"{first} batch {max(batches)} graphs",
               functools.partial(batch, first, max(batches), True))]
    for name in rest:
        items += [(f"{name} one at a time", functools.partial(alone, name))]
        items += [(f"{name} batch {b}", functools.partial(batch, name, b)) for b in batches[:-1]]
    skipped = []

    def report():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                           "rates": rates.name, "setting": {k: getattr(args, k) for k in (
                               "prompt_tokens", "max_new_tokens", "window_size", "batches",
                               "single_prompts", "budget_s")},
                           "verdicts": verdicts, "failed": failed, "not_measured": skipped},
                          f, indent=1)

    for label, item in items:
        spent = time.perf_counter() - began
        if spent > args.budget_s:
            skipped.append(label)
            continue
        print(f"-- {label} ({spent:.0f} of {args.budget_s:.0f} s spent)", flush=True)
        try:
            item()
        except Exception as error:  # noqa: BLE001 - one item's failure leaves the others
            print(f"  {label} failed: {type(error).__name__}: {str(error)[:500]}", flush=True)
            failed.append(f"{label}: {type(error).__name__}")
            ok = False
        report()  # after every item: a run cut short keeps what it measured
    print(f"\nGOALS ({time.perf_counter() - began:.0f} s; device {jax.devices()[0].device_kind}, "
          f"rates of {rates.name}; prompt {args.prompt_tokens}, {args.max_new_tokens} new, window "
          f"{args.window_size}, bf16)")
    for v in verdicts:
        print(f"  {v['model']:>4} {v['goal']}: {v['measured']} (goal {v['limit']}): "
              f"{'met' if v['met'] else 'NOT met'}")
    for label in failed:
        print(f"  failed: {label}")
    for label in skipped:
        print(f"  not measured (the budget of {args.budget_s:.0f} s was spent): {label}")
    report()
    return ok
# ---- end GOALS --------------------------------------------------------------------------------


# ---- ATTENTION (the Triton kernel alone: its prefix in parts or in one) -----------------------
def attention_check(cfg, args) -> None:
    """The window attention kernel alone (alodlm_jax/kernels/window.py) at this model's heads,
    each batch size and prefix: its time per call with the prefix split in parts
    (window_kernel.gpu_splits; a second kernel combines them) and walked whole by one program per
    request and KV head, the bytes of K/V it reads at that prefix per second, and how far apart
    the two outputs are. The calls run in one program, cycling over 28 layers of cache, so that
    the K/V they read (at least 117 MB: one request, 1,024 slots) come from device memory, not
    the L2 (50 MB on an H100 or H200); each call's output is the next one's queries."""
    from alodlm_jax.kernels import window as WK

    on_gpu = jax.devices()[0].platform == "gpu"
    rows, n_q, n_kv, d_h = (2 * args.window_size, cfg.num_attention_heads,
                            cfg.num_key_value_heads, cfg.head_dim)
    slots = -(-(args.prompt_tokens + args.max_new_tokens + args.window_size) // 64) * 64
    if not args.tiny:
        slots = 5376  # the cache of a 1024-token prompt bucket and 4096 new tokens
    layers, calls = 28, 64 if on_gpu else 2
    for batch in [int(b) for b in args.batches.split(",") if b] or [1]:
        keys = iter(jax.random.split(jax.random.key(3), 5))  # drawn on the device (GBs of cache)
        draw = lambda *shape: jax.random.normal(next(keys), shape, jnp.bfloat16)  # noqa: E731
        q = draw(batch, rows, n_q, d_h)
        k, v = draw(batch, rows, n_kv, d_h), draw(batch, rows, n_kv, d_h)
        k_all, v_all = draw(batch, layers, slots, n_kv, d_h), draw(batch, layers, slots, n_kv, d_h)

        def run(splits, prefix):
            @jax.jit
            def many(q, k, v, k_all, v_all, start):
                def body(i, q):
                    return WK.window_attention(q, k, v, k_all, v_all, i % layers, None, start,
                                               backend="gpu", interpret=not on_gpu, splits=splits)
                return jax.lax.fori_loop(0, calls, body, q)
            start = jnp.full((batch,), prefix, jnp.int32)
            jax.block_until_ready(many(q, k, v, k_all, v_all, start))  # compiles
            t0 = time.perf_counter()
            out = jax.block_until_ready(many(q, k, v, k_all, v_all, start))
            return (time.perf_counter() - t0) / calls, out

        parts = WK.gpu_splits(batch, n_kv, slots)
        for prefix in sorted({min(1024, slots - rows), slots - 256, slots - rows}):
            (split_s, split_out), (whole_s, whole_out) = run(None, prefix), run(1, prefix)
            read = 2 * batch * prefix * n_kv * d_h * 2
            diff = float(jnp.max(jnp.abs(split_out.astype(jnp.float32)
                                         - whole_out.astype(jnp.float32))))
            print(f"  attention batch {batch:>3} prefix {prefix:>5}: {parts:>2} parts "
                  f"{1e6 * split_s:8.1f} us ({read / split_s / 1e12:5.2f} TB/s of K/V), one part "
                  f"{1e6 * whole_s:8.1f} us ({read / whole_s / 1e12:5.2f} TB/s); "
                  f"{batch * n_kv * parts} vs {batch * n_kv} programs; max |difference| after "
                  f"{calls} calls {diff:.3g}", flush=True)
        del k_all, v_all


def head_norm_check(cfg, args) -> None:
    """The queries' and keys' norms and RoPE in one Triton kernel (alodlm_jax/kernels/head_norm.py,
    what a window layer runs on one GPU in bf16) against XLA's form of them, on this device, at
    one request's window rows and at 8 requests': the share of outputs equal bit for bit and the
    largest difference (the norm's sum of squares is added in another order)."""
    from alodlm_jax.kernels import head_norm as HK
    from alodlm_jax.network import model as M
    from alodlm_jax.network import layers as L

    on_gpu = jax.devices()[0].platform == "gpu"
    n_q, n_kv, d_h, eps = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                           cfg.rms_norm_eps)
    for rows in (2 * args.window_size, 16 * args.window_size):
        if not HK.supported((rows, n_q, d_h), (rows, n_kv, d_h), jnp.bfloat16):
            print(f"  head norms rows {rows:>4}: XLA's form (the kernel does not take them)")
            continue
        qkv, q_w, k_w, cos, sin = window_heads(cfg, args, rows)

        @jax.jit
        def xla(qkv):
            q, k, v = qkv[:, :n_q], qkv[:, n_q:n_q + n_kv], qkv[:, n_q + n_kv:]
            return (L.apply_rope(L.rms_norm(q, q_w, eps), cos, sin),
                    L.apply_rope(L.rms_norm(k, k_w, eps), cos, sin), v)

        kernel = jax.jit(lambda qkv: HK.norm_rope(qkv, n_q, n_kv, q_w, k_w, cos, sin, eps,
                                                  interpret=not on_gpu))
        equal, diff = agreement(xla(qkv), kernel(qkv))
        print(f"  head norms rows {rows:>4}: kernel vs XLA's form {100 * equal:.3f}% equal, "
              f"max |difference| {diff:.3g}", flush=True)
        if rows == 2 * args.window_size:  # one request's window: the attention kernel does them
            normed_attention_check(cfg, args, qkv, q_w, k_w, cos, sin, kernel, on_gpu)
            combined_attention_check(cfg, args, qkv, q_w, k_w, cos, sin, on_gpu)


def window_heads(cfg, args, rows):
    """Random inputs of a window's heads as its layer's products leave them (``rows`` rows of
    queries, keys and values, bf16), the heads' norm weights, and the window's RoPE tables after
    the prompt: (qkv, q_w, k_w, cos, sin)."""
    from alodlm_jax.network import model as M
    from alodlm_jax.network import layers as L

    n_q, n_kv, d_h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    keys = iter(jax.random.split(jax.random.key(4), 3))
    qkv = jax.random.normal(next(keys), (rows, n_q + 2 * n_kv, d_h), jnp.bfloat16)
    q_w, k_w = (1 + 0.1 * jax.random.normal(next(keys), (2, d_h))).astype(jnp.bfloat16)
    cos, sin = L.rope_tables(jnp.arange(rows) + args.prompt_tokens, d_h, cfg.rope_theta,
                             jnp.bfloat16)
    return qkv, q_w, k_w, cos, sin


def normed_attention_check(cfg, args, qkv, q_w, k_w, cos, sin, norm_rope, on_gpu) -> None:
    """One request's window as its layer runs on one GPU in bf16: the attention kernel applying
    the heads' norms and RoPE itself (window_kernel.window_attention_qkv) against the heads'
    norm kernel and then the attention kernel, over a prefix of the prompt's length in a cache of
    one layer: the share of outputs (attention and the window's keys) equal bit for bit, and the
    largest difference."""
    from alodlm_jax.kernels import window as WK

    rows = qkv.shape[0]
    n_q, n_kv, d_h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    slots = -(-(args.prompt_tokens + rows) // WK.GPU_BLOCK_SLOTS) * WK.GPU_BLOCK_SLOTS
    if not WK.supported("gpu", slots=slots, n_kv=n_kv, head_dim=d_h, rows=rows,
                        group=n_q // n_kv, dtype=jnp.bfloat16):
        print(f"  normed attention rows {rows:>4}: XLA's form (the kernel does not take them)")
        return
    k_all, v_all = (jax.random.normal(key, (1, 1, slots, n_kv, d_h), jnp.bfloat16)
                    for key in jax.random.split(jax.random.key(5)))
    start = jnp.asarray([args.prompt_tokens], jnp.int32)
    attend = dict(layer=jnp.int32(0), depth=None, start=start, interpret=not on_gpu)

    @jax.jit
    def two(qkv):
        q, k, v = (x[None] for x in norm_rope(qkv))
        return WK.window_attention(q, k, v, k_all, v_all, backend="gpu", **attend), k

    one = jax.jit(lambda qkv: WK.window_attention_qkv(qkv[None], n_q, q_w, k_w, cos[None],
                                                      sin[None], cfg.rms_norm_eps, k_all,
                                                      v_all, **attend))
    equal, diff = agreement(two(qkv), one(qkv))
    print(f"  normed attention rows {rows:>4}: one kernel vs two {100 * equal:.3f}% equal, "
          f"max |difference| {diff:.3g}", flush=True)


def combined_attention_check(cfg, args, qkv, q_w, k_w, cos, sin, on_gpu):
    """One request's window over a prefix walked in parts, as the single-request program runs
    it: the attention kernel's last part to finish combining its head's parts (given the counts,
    as model.run_window_stack gives them) against a second kernel combining them, over a quarter
    and the whole of a cache of one layer, 100 calls each on a GPU (a part read before its
    program wrote it would make a call differ): the share of the outputs equal bit for bit,
    the calls that differed, and the largest difference. Returns (calls that differed, calls),
    or None where the kernel does not combine them."""
    from alodlm_jax.kernels import window as WK

    rows = qkv.shape[0]
    n_q, n_kv, d_h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    slots = 512 if args.tiny else 5376
    if not (WK.COMBINE_IN_ATTENTION and WK.supported(
            "gpu", slots=slots, n_kv=n_kv, head_dim=d_h, rows=rows, group=n_q // n_kv,
            dtype=jnp.bfloat16)):
        print(f"  combined attention rows {rows:>4}: parts combined by a second kernel")
        return None
    k_all, v_all = (jax.random.normal(key, (1, 1, slots, n_kv, d_h), jnp.bfloat16)
                    for key in jax.random.split(jax.random.key(6)))

    @functools.partial(jax.jit, static_argnums=0)
    def attend(counting, qkv, k_all, v_all, start):
        counts = jnp.zeros((1, 1, n_kv), jnp.int32) if counting else None
        return WK.window_attention_qkv(qkv[None], n_q, q_w, k_w, cos[None], sin[None],
                                       cfg.rms_norm_eps, k_all, v_all, jnp.int32(0), None,
                                       start, interpret=not on_gpu, counts=counts)[:2]

    calls, all_differed = 100 if on_gpu else 2, 0
    for prefix in (slots // 4, slots - rows):
        start = jnp.asarray([prefix], jnp.int32)
        want = attend(False, qkv, k_all, v_all, start)
        shares, differed, worst = [], 0, 0.0
        for _ in range(calls):
            equal, diff = agreement(want, attend(True, qkv, k_all, v_all, start))
            shares.append(equal)
            differed += equal < 1
            worst = max(worst, diff)
        print(f"  combined attention rows {rows:>4}, prefix {prefix:>5}: in the kernel vs a "
              f"second kernel {100 * min(shares):.3f}% equal, {differed} of {calls} calls "
              f"differ, max |difference| {worst:.3g}", flush=True)
        all_differed += differed
    del k_all, v_all
    return all_differed, 2 * calls


def agreement(want, got) -> tuple[float, float]:
    """The share of the outputs ``got`` equal bit for bit to ``want`` (two lists of arrays, pair
    by pair), and the largest difference between them."""
    pairs = list(zip(want, got, strict=True))
    equal = sum(int(jnp.sum(a == b)) for a, b in pairs) / sum(a.size for a, _ in pairs)
    diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
               for a, b in pairs)
    return equal, diff


def layer_kernels_check(cfg, params, args) -> None:
    """A window layer's products with their norms and residual adds (alodlm_jax/kernels/matmul.py)
    and its heads' norms (head_norm_kernel.py) in Triton kernels, what a window layer of one
    request (or two, in a batch step) runs on one GPU in bf16, against XLA's form of the same
    parts (model._qkv and model._attention_out_and_mlp with and without ``kernel``), on this
    device: time per layer over 8 of the model's layers in turn (more weights than the L2 holds),
    the layer's weights read per second, the share of outputs equal bit for bit and the largest
    difference. Without a GPU both forms are XLA's (the kernels run only where the platform is
    CUDA)."""
    from alodlm_jax.kernels import matmul as MK
    from alodlm_jax.network import model as M
    from alodlm_jax.network import layers as L

    on_gpu = jax.devices()[0].platform == "gpu"
    hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
    layers = (tuple(params["prelude"]) + tuple(params["core"]) + tuple(params["coda"]))[:8]
    weights = tree_bytes(layers[0])
    reps = 20 if on_gpu else 1
    for rows in (2 * args.window_size, 4 * args.window_size):
        if not MK.supported(rows, hidden, (hidden,), jnp.bfloat16):
            print(f"  layer products rows {rows:>4}: XLA's form (the kernels do not take them)")
            continue
        keys = iter(jax.random.split(jax.random.key(5), 2))
        h = jax.random.normal(next(keys), (rows, hidden), jnp.bfloat16)
        attn = jax.random.normal(next(keys), (rows, cfg.num_attention_heads, cfg.head_dim),
                                 jnp.bfloat16)
        cos, sin = L.rope_tables(jnp.arange(rows) + args.prompt_tokens, cfg.head_dim,
                                 cfg.rope_theta, jnp.bfloat16)
        timed = {}
        for kernel in (False, True):
            @jax.jit
            def run(layers, h, attn):
                return [(L.qkv(lp, eps, h, cos, sin, kernel),
                         L.attention_out_and_mlp(lp, eps, h, attn, kernel)) for lp in layers]

            out = jax.block_until_ready(run(layers, h, attn))  # compiles
            t0 = time.perf_counter()
            for _ in range(reps):
                out = run(layers, h, attn)
            jax.block_until_ready(out)
            timed[kernel] = ((time.perf_counter() - t0) / reps / len(layers),
                             jax.tree_util.tree_leaves(out))
        equal, diff = agreement(timed[False][1], timed[True][1])
        (xla_s, _), (kernel_s, _) = timed[False], timed[True]
        print(f"  layer products rows {rows:>4}: XLA's form {1e6 * xla_s:7.1f} us/layer "
              f"({weights / xla_s / 1e12:4.2f} TB/s of weights), kernels "
              f"{1e6 * kernel_s:7.1f} us/layer ({weights / kernel_s / 1e12:4.2f} TB/s)"
              f"{'' if on_gpu else ' (no GPU: both XLA)'}; kernels vs XLA's form "
              f"{100 * equal:.3f}% equal, max |difference| {diff:.3g}", flush=True)
# ---- end ATTENTION ----------------------------------------------------------------------------


# ---- PLAN (alodlm-jax-plan's prediction beside the measured step) ----------------------------
def print_plan(cfg, params, decode, args, batch, program, *, measured_ms, measured_compile,
               command_buffers="engine") -> dict:
    """The plan of the program just measured (alodlm_jax.plan on this device, with the engine's
    XLA options): its predicted ms per step (the single-request program: per pass) beside the
    measured one, what it is made of (bytes and FLOPs at the device's rates, kernels launched
    outside command buffers, host syncs), compile seconds, and its device memory
    beside the device's measured peak and its allocator's limit (bytes_limit: what the plan of a
    named GPU takes as usable, alodlm_jax.plan.fit). Returns the program's record of the plan."""
    import dataclasses

    from alodlm_jax.plan.compile import plan
    from alodlm_jax.plan.targets import attached_target

    rates = device_rates()
    target = dataclasses.replace(attached_target(), bandwidth_bytes_per_second=rates.bandwidth_bytes_per_second,
                                 matrix_flops_per_second=rates.matrix_flops_per_second)
    spec = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    record = plan(target, cfg, spec, decode, prompt_tokens=args.prompt_tokens,
                  batch_size=batch, programs={program}, batch_programs=program == "batch",
                  command_buffers=command_buffers)
    (p,) = record["programs"]
    stats = jax.devices()[0].memory_stats() or {}
    peak, limit = stats.get("peak_bytes_in_use"), stats.get("bytes_limit")
    predicted = p["predicted_step_seconds"]
    predicted_ms = None if predicted is None else 1e3 * predicted
    ratio = "-" if not predicted_ms else f"{measured_ms / predicted_ms:.2f}"
    print(f"  plan {program:>6} {batch:>3}: predicted "
          f"{'-' if predicted_ms is None else f'{predicted_ms:.3f}'} ms/step vs measured "
          f"{measured_ms:.3f} ms/step (measured/predicted {ratio}): bytes "
          f"{p['bytes_per_step'] / 1e9:.3f} GB ({1e3 * p['bytes_per_step'] / rates.bandwidth_bytes_per_second:.3f} ms; "
          f"floor {p['floor_bytes_per_step'] / 1e9:.3f} GB), {(p['flops_per_step'] or 0) / 1e12:.3f} TFLOP "
          f"({1e3 * (p['flops_per_step'] or 0) / rates.matrix_flops_per_second:.3f} ms), "
          f"kernels of few programs {1e3 * (p['few_programs_seconds'] or 0):.3f} ms, "
          f"{p['kernels_per_step']} kernels, {p['kernels_outside_command_buffers']} launched outside "
          f"command buffers, {p['command_buffer_launches']} command buffers, {p['host_syncs']} host "
          f"syncs; options {record['xla_options']}; compile {p['compile_seconds']:.1f} s (engine "
          f"measured {measured_compile:.1f} s); device memory {p['device_memory_bytes'] / 1e9:.3f} GB "
          f"planned, peak in use {'-' if peak is None else f'{peak / 1e9:.3f} GB'} (the "
          f"process's, this batch's engine and the one-request engine's cache included) of an "
          f"allocator limit of {'-' if limit is None else f'{limit / 1e9:.3f} GB'}; the plan's "
          f"largest batch {record['max_batch_size']}", flush=True)
    return p


# ---- end PLAN ---------------------------------------------------------------------------------


# ---- LAYOUTS (the compiled engine with batching on a mesh) ------------------------------------
def mesh_layouts(count: int, batch: int) -> list:
    """(mesh text, batch) for the meshes ``count`` devices allow: data=1 (the mesh path on one
    device), then data=count, model=count and data=count/2,model=2."""
    out = [("data=1", batch)]
    if count > 1:
        out += [(f"data={count}", batch * count), (f"model={count}", batch)]
    if count >= 4 and count % 2 == 0:
        out.append((f"data={count // 2},model=2", batch * count // 2))
    return out


def check_layouts(args, dtype) -> bool:
    from alodlm_jax.network import sharding
    from alodlm_jax.plan.analysis import collectives, step_collectives
    from alodlm_jax.decode import batched
    from alodlm_jax.decode.layout import Layout

    ok = True
    count = len(jax.local_devices())
    for name in [m for m in args.models.split(",") if m]:
        cfg = model_config(name, tiny=args.tiny)
        prompts = random_prompts(cfg, args.layout_prompts, args.prompt_tokens)
        decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                              max_new_tokens=args.max_new_tokens)
        stacked = random_params(cfg, dtype, seed=0, head_scale=args.head_scale)
        print(f"\n== layouts, {name}-shaped, {len(prompts)} prompts, {count} device(s)", flush=True)
        base = CompiledEngine(cfg, unstack_layers(stacked), decode, [])
        base.generate(prompts[0])
        t0 = time.perf_counter()
        want = [base.generate(p) for p in prompts]
        wall = time.perf_counter() - t0
        print(f"  one device, batch 1 (per-layer weights): "
              f"{sum(len(o.token_ids) for o in want) / wall:9.1f} tok/s", flush=True)
        del base
        for mesh_text, batch in mesh_layouts(count, args.layout_batch):
            if batch > len(prompts):
                continue
            mesh = sharding.make_mesh(mesh_text)
            try:
                params = sharding.shard_params(stacked, mesh, cfg)
            except ValueError as error:
                print(f"  {mesh_text}: skipped ({error})", flush=True)
                continue
            engine = CompiledEngine(cfg, params, decode, [], batch_size=batch,
                                    layout=Layout(mesh), measure_prefill=False)
            bucket = engine.bucket_for(args.prompt_tokens, batch=batch)
            text = batched.compile_batch(engine, bucket)[0].as_text()
            engine.generate_batch(prompts[:1])  # warm execution
            t0 = time.perf_counter()
            outs = engine.generate_batch(prompts)
            wall = time.perf_counter() - t0
            same = [o.token_ids for o in outs] == [o.token_ids for o in want]
            ok &= same
            kinds = sorted({c["kind"] for c in collectives(text)})
            print(f"  {mesh_text:<16} batch {batch:3d}: "
                  f"{sum(len(o.token_ids) for o in outs) / wall:9.1f} tok/s  same tokens: {same}  "
                  f"compile {engine.compile_seconds:6.1f} s  collective kinds {kinds or 'none'}; "
                  f"one step: {sum(step_collectives(text).values())} {step_collectives(text)}",
                  flush=True)
            del engine, params
    return ok
# ---- end LAYOUTS ------------------------------------------------------------------------------


sys.exit(main())
PY
