"""The check's command line and its default run: per model, the kernels alone, the engines,
the batch sweep; --goals, --layouts and --parity elsewhere."""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from alodlm_jax.config import DecodeConfig, DecodeConfigError
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.decode.portable import PortableEngine
from alodlm_jax.kernels.select import FORMS
from alodlm_jax.plan.fit import tree_bytes
from alodlm_jax.testing.released_shapes import SHAPES, model_config, random_params

from gpu_check.common import device_rates, ms_per_pass, pass_bytes, random_prompts, tb_per_s
from gpu_check.engines import batch_sweep, print_plan
from gpu_check.goals import goals
from gpu_check.kernel_checks import attention_check, head_norm_check, layer_kernels_check
from gpu_check.layouts import check_layouts


def main(argv=None) -> int:
    """Run the check with ``argv`` (``sys.argv`` by default); returns the exit status."""
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
    args = parser.parse_args(argv)
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
    platform = {"gpu": "cuda"}.get(dev.platform, dev.platform)  # platform_dependent's names
    for form in FORMS:
        if platform in form.platforms:
            print(f"  kernel on {platform} under {form.policy} shapes: {form.operation}: "
                  f"{form.kernel}, where {form.when}", flush=True)
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
