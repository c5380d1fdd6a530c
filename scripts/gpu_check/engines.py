"""The engines on the device: continuous batching at each batch size (the batch sweep) and
the plan's prediction for the same program beside the measured time (block PLAN)."""

from __future__ import annotations

import time

import jax

from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.plan.analysis import step_analysis

from gpu_check.common import device_rates, difference, random_prompts, tb_per_s


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
        for i, (a, o) in enumerate(zip(alone, outs)):
            if (where := difference(o, a)) is not None:
                print(f"    batch {b}, prompt {i}: {where} (against one at a time)", flush=True)
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
