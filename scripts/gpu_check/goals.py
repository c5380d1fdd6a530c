"""The decode-speed goals of docs/plan.md in one run within a budget (block GOALS)."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.plan.fit import tree_bytes
from alodlm_jax.testing.released_shapes import model_config, random_params

from gpu_check.common import device_rates, ms_per_pass, pass_bytes, random_prompts, tb_per_s
from gpu_check.engines import print_plan, run_batch
from gpu_check.kernel_checks import combined_attention_check, window_heads


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
