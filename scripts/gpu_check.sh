#!/usr/bin/env bash
# One self-contained decode check for a CUDA GPU (e.g. an H200 with JAX+CUDA preinstalled).
#
# Builds random bf16 checkpoints with the released models' shapes directly as JAX params on the
# device (no torch, no files, nothing downloaded), runs the portable and the compiled engine on
# them, and prints tokens/s, ms per recurrent pass, compile seconds, and the per-pass time against
# the HBM roofline (bytes of the weights one pass reads / 4.8 TB/s); then the batch sweep: the
# compiled engine with continuous batching at each --batches size on the same prompts, suite
# tokens/s against one request at a time, and XLA's cost analysis of one batch step (bytes moved
# / 4.8 TB/s: the step time the bandwidth allows) beside the measured time per step.
#
#   1.7B-shaped: 28 layers, loop [0,28), H 2048, I 6144, 16/8 heads x 128, vocab 151936
#   8B-shaped:   36 layers, loop [10,26), H 4096, I 12288, 32/8 heads x 128, vocab 151936
#
# Usage:  bash scripts/gpu_check.sh [--tiny] [--max_new_tokens N] [--models 1.7b,8b] [--batches 1,8,32]
#   --tiny   small shapes of both topologies, for a CPU smoke test of this script.
# Run from the repository root (or anywhere: it adds the repository to PYTHONPATH).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${HERE}${PYTHONPATH:+:${PYTHONPATH}}"
exec python - "$@" <<'PY'
import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import batched
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.decode.portable import PortableEngine
from alodlm_jax.testing.released_shapes import model_config, random_params

HBM_BYTES_PER_SECOND = 4.8e12  # H200


def pass_bytes(params) -> int:
    """Weight bytes one recurrent pass reads: core + coda layers, final norm, LM head, gate."""
    leaves = jax.tree_util.tree_leaves((params["core"], params["coda"], params["final_norm"],
                                        params["lm_head"], params["gate"]))
    return int(sum(x.size * x.dtype.itemsize for x in leaves))


def batch_sweep(cfg, params, batches, args) -> bool:
    """Suite tokens/s of continuous batching at each batch size against one request at a time
    (the same 2 * max(batches) prompts, entropy mode), and per step: measured ms against XLA's
    cost analysis of one step on this backend (bytes moved / 4.8 TB/s)."""
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, cfg.mask_token_id, size=args.prompt_tokens).tolist()
               for _ in range(2 * max(batches))]
    decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                          max_new_tokens=args.max_new_tokens, mode="entropy")
    single = CompiledEngine(cfg, params, decode, [])
    single.generate(prompts[0])
    alone = [single.generate(p) for p in prompts]
    base = sum(len(o.token_ids) for o in alone) / sum(o.wall_seconds for o in alone)
    print(f"  batch sweep ({len(prompts)} prompts): one at a time {base:9.1f} tok/s", flush=True)
    same_all = True
    for b in batches:
        engine = CompiledEngine(cfg, params, decode, [], batch_size=b)
        engine.generate_batch(prompts[:b])  # compiles, warms
        t0 = time.perf_counter()
        outs = engine.generate_batch(prompts)
        wall = time.perf_counter() - t0
        tokens = sum(len(o.token_ids) for o in outs)
        steps = sum(engine.last_live_steps.values()) / b  # request-passes / slots ~ steps
        same = all(a.token_ids == o.token_ids for a, o in zip(alone, outs))
        same_all &= same
        cost = batched.step_analysis(cfg, params, engine.bucket_for(args.prompt_tokens, batch=b))
        floor_ms = 1e3 * cost["bytes_moved"] / HBM_BYTES_PER_SECOND
        print(f"  batch {b:>3}: {tokens / wall:9.1f} tok/s (x{tokens / wall / base:5.2f} one at a "
              f"time)  ~{1e3 * wall / max(steps, 1):7.3f} ms/step; XLA step: "
              f"{cost['bytes_moved'] / 1e9:.3f} GB moved (floor {cost['floor_bytes'] / 1e9:.3f}, "
              f"x{cost['moved_over_floor']:.2f}) -> {floor_ms:.3f} ms at 4.8 TB/s; "
              f"{cost['flops'] / 1e9:.0f} GFLOP; same tokens: {same}", flush=True)
    return same_all


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--models", default="1.7b,8b")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--window_size", type=int, default=16)
    parser.add_argument("--prompt_tokens", type=int, default=64)
    parser.add_argument("--head_scale", type=float, default=8.0)
    parser.add_argument("--batches", default="1,8,32",
                        help="batch sizes of the continuous-batching sweep ('' to skip it)")
    args = parser.parse_args()
    dev = jax.devices()[0]
    print(f"jax {jax.__version__}; device {dev.platform} {dev.device_kind}; tiny={args.tiny}",
          flush=True)
    if dev.platform != "gpu" and not args.tiny:
        print("warning: no GPU visible; the full shapes will be slow here (use --tiny)", flush=True)
    dtype = jnp.bfloat16
    ok = True
    for name in [m for m in args.models.split(",") if m]:
        cfg = model_config(name, tiny=args.tiny)
        t0 = time.perf_counter()
        # Per-layer weights: the layout Generator.load uses (a stacked group would copy each
        # layer's weights out of the stack on every call, doubling a pass's memory traffic).
        params = random_params(cfg, dtype, seed=0, head_scale=args.head_scale)
        jax.block_until_ready(params)
        weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
        per_pass = pass_bytes(params)
        roofline_ms = 1e3 * per_pass / HBM_BYTES_PER_SECOND
        print(f"\n== {name}-shaped ({'tiny' if args.tiny else 'full'}): {weight_bytes / 1e9:.2f} GB "
              f"of bf16 weights built in {time.perf_counter() - t0:.1f} s; one pass reads "
              f"{per_pass / 1e9:.3f} GB -> HBM roofline {roofline_ms:.3f} ms/pass", flush=True)
        rng = np.random.default_rng(1)
        prompt = rng.integers(0, cfg.mask_token_id, size=args.prompt_tokens).tolist()
        for mode in ("entropy", "left1"):
            decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                                  max_new_tokens=args.max_new_tokens, mode=mode)
            tokens = {}
            for label, engine in (("portable", PortableEngine(cfg, params, decode, [])),
                                  ("compiled", CompiledEngine(cfg, params, decode, []))):
                engine.generate(prompt)  # warmup: compiles
                out = engine.generate(prompt)
                tokens[label] = out.token_ids
                passes = max(out.recurrent_passes, 1)
                ms_pass = 1e3 * (out.wall_seconds - out.prefill_seconds) / passes
                print(f"  {mode:<8}{label:<10} {len(out.token_ids) / out.wall_seconds:9.1f} tok/s  "
                      f"{ms_pass:8.3f} ms/pass (x{ms_pass / roofline_ms:.1f} roofline)  "
                      f"passes {out.recurrent_passes:4d}  windows {out.outer_steps:4d}  "
                      f"prefill {1e3 * out.prefill_seconds:7.2f} ms  compile "
                      f"{engine.compile_seconds:6.1f} s", flush=True)
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
    print("\nGPU_CHECK_DONE", "ok" if ok else "token mismatch (bf16: see the spec's §8 note)")
    return 0


sys.exit(main())
PY
