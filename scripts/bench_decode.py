"""Decode throughput of the eager PyTorch reference, the portable engine, the compiled engine and the
batched compiled engine on two generated fp32 checkpoints (CPU), with a matmul roofline.

    python scripts/bench_decode.py                 # both models, 128 new tokens, batch 8
    python scripts/bench_decode.py --quick         # 32 new tokens, smaller scaling sweep
    python scripts/bench_decode.py --models small --json /tmp/bench.json

Checkpoints (random weights, reference file format, built once under --workdir):

* small:  6 layers, loop [2,4), H 128, 4 heads x 32, 2 KV heads, MLP 256, vocab 1024;
* medium: 8 layers, loop [2,6), H 1024, 16 heads x 64, 8 KV heads, MLP 3072, vocab 32768.

The LM head is scaled so that entropy mode (q 0.5, tau 0.4) commits a few tokens per window; the
script prints the measured tokens per window. No stop ids are used, so every run generates exactly
``max_new_tokens`` tokens and the engines do identical work.

Batch: the same ``batch_prompts`` prompts (default ``2 * batch``) decoded one at a time by the
compiled engine (``compiled-seqN``, the batch-1 baseline) and with ``batch`` slots and continuous
batching (``compiled-batchN``: a finished request's slot takes the next waiting prompt; the last
requests still run without company).

Metrics per engine and mode: tokens/s (generated tokens / wall seconds, prefill included), passes/s
and ms per pass (recurrent passes, prefill excluded from the count but not from the time),
useful GFLOP/s (``2 * P_layer * token_layer_calls + 2 * H * V * loop_token_passes`` over wall time:
real window rows only, the compiled engines' padding rows are not counted) and compile seconds.
Each goal is printed with its ceiling on this machine (see :func:`goals`).
The roofline is this machine's own jitted fp32 matmul rate for the pass's main shapes
(``[R, H] x [H, I]``, ``[R, H] x [H, V]`` with ``R = 2 * window`` rows, ``R * batch`` for the batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

MODELS = {
    "small": dict(num_layers=6, loop_start=2, loop_end=4, hidden_size=128, num_heads=4, head_dim=32,
                  num_kv_heads=2, intermediate_size=256, vocab_size=1024, lm_head_scale=48.0),
    "medium": dict(num_layers=8, loop_start=2, loop_end=6, hidden_size=1024, num_heads=16,
                   head_dim=64, num_kv_heads=8, intermediate_size=3072, vocab_size=32768,
                   lm_head_scale=14.0),
}
GOALS = {
    "small": {"compiled/torch": 10.0, "compiled/portable": 3.0, "batch/compiled": 4.0},
    "medium": {"compiled/torch": 1.5, "compiled/roofline": 0.70, "batch/compiled": 2.0},
}


def build_checkpoint(workdir: pathlib.Path, name: str, scale: float | None) -> pathlib.Path:
    from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint

    dims = dict(MODELS[name])
    dims["lm_head_scale"] = scale if scale is not None else dims["lm_head_scale"]
    out = workdir / f"{name}-x{dims['lm_head_scale']:g}"
    if not (out / "alodlm_config.json").is_file():
        t0 = time.perf_counter()
        spec = TinySpec(topology="sandwich", max_position_embeddings=2048, seed=1234, **dims)
        build_tiny_checkpoint(out, spec)
        print(f"[build] {name}: {out} in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def layer_params(cfg) -> int:
    h, i = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    return h * q + 2 * h * kv + q * h + 3 * h * i


def useful_flops(cfg, work, loop_token_passes: int) -> float:
    return 2.0 * layer_params(cfg) * work.token_layer_calls + \
        2.0 * cfg.hidden_size * cfg.vocab_size * loop_token_passes


def matmul_rate(rows: int, cfg, repeats: int = 7, iterations: int = 100) -> float:
    """GFLOP/s of fp32 matmuls of a pass's main shapes at ``rows`` rows, run the way a pass runs them.

    Each shape is timed as ``iterations`` dependent products inside one jitted ``fori_loop`` (no
    per-call dispatch in the measurement, as in a compiled pass), best of ``repeats`` (the machine's
    attainable rate: a median moves with the load of a shared machine, and a roofline should not
    flatter the engines measured against it).
    """
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    shapes = [(cfg.hidden_size, cfg.intermediate_size), (cfg.hidden_size, cfg.vocab_size)]
    total_flops = total_time = 0.0
    for k, n in shapes:
        x = jnp.asarray(rng.standard_normal((rows, k)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)

        def body(_, x, w=w, k=k):
            y = jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)
            return x + jnp.float32(1e-30) * y[:, :k]  # the next product depends on this one

        f = jax.jit(lambda x, body=body: jax.lax.fori_loop(0, iterations, body, x))
        f(x).block_until_ready()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(x).block_until_ready()
            times.append((time.perf_counter() - t0) / iterations)
        total_flops += 2.0 * rows * k * n
        total_time += min(times)
    return total_flops / total_time / 1e9


def numpy_matmul_rate(rows: int, cfg, repeats: int = 20) -> float:
    rng = np.random.default_rng(0)
    k, n = cfg.hidden_size, cfg.vocab_size
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x @ w
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x @ w
        times.append(time.perf_counter() - t0)
    return 2.0 * rows * k * n / statistics.median(times) / 1e9


@dataclasses.dataclass
class Row:
    engine: str
    tokens: int
    wall: float
    passes: int
    flops: float
    compile_seconds: float
    tokens_per_window: float

    def as_dict(self) -> dict:
        return {
            "engine": self.engine, "tokens": self.tokens, "wall_seconds": self.wall,
            "tokens_per_second": self.tokens / self.wall, "recurrent_passes": self.passes,
            "passes_per_second": self.passes / self.wall,
            "ms_per_pass": 1e3 * self.wall / max(self.passes, 1),
            "useful_gflops_per_second": self.flops / self.wall / 1e9,
            "compile_seconds": self.compile_seconds, "tokens_per_window": self.tokens_per_window,
        }


def run_model(name: str, args) -> dict:
    import jax

    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.decode.compiled import CompiledEngine
    from alodlm_jax.decode.portable import PortableEngine
    from alodlm_jax.network.params import load_model

    path = build_checkpoint(pathlib.Path(args.workdir), name, args.lm_head_scale)
    cfg, params = load_model(str(path), "fp32", per_layer=True)  # the ordinary load's layout
    rng = np.random.default_rng(7)
    prompts = [rng.integers(13, cfg.vocab_size, size=args.prompt_tokens).tolist()
               for _ in range(args.batch_prompts)]
    torch_model = None
    if not args.skip_torch:
        import torch

        from alodlm_jax.compare.torch_reference import TorchALoDLM

        torch.manual_seed(0)
        torch_model = TorchALoDLM.from_checkpoint(path, "fp32")

    report = {"model": name, "config": dataclasses.asdict(cfg), "modes": {},
              "roofline": {}, "goals": {}}
    r1, rb = 2 * args.window_size, 2 * args.window_size * args.batch
    report["roofline"] = {
        f"jax_matmul_gflops_rows{r1}": matmul_rate(r1, cfg),
        f"jax_matmul_gflops_rows{rb}": matmul_rate(rb, cfg),
        f"numpy_lm_head_gflops_rows{r1}": numpy_matmul_rate(r1, cfg),
    }
    for mode in args.modes:
        decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                              max_new_tokens=args.max_new_tokens, mode=mode)
        rows: list[Row] = []
        tokens: dict[str, list[int]] = {}

        def add(engine: str, out_tokens, wall, passes, outer, work, ltp, compile_s):
            flops = useful_flops(cfg, work, ltp)
            tokens[engine] = out_tokens
            rows.append(Row(engine, len(out_tokens), wall, passes, flops, compile_s,
                            len(out_tokens) / max(outer, 1)))

        if torch_model is not None:
            # Its token-layer counters need the summed window lengths, which the torch result does
            # not report: the compiled engine's are used (identical when the tokens agree).
            torch_res = torch_model.generate(prompts[0], decode, stop_ids=[])
        engines = {"portable": PortableEngine(cfg, params, decode, []),
                   "compiled": CompiledEngine(cfg, params, decode, [])}
        for engine in engines.values():
            warmup(engine, prompts[0], decode)
        # First executions pay allocation and thread-pool start-up: best of `repeats` runs, the
        # engines alternating so that a drift of the (shared) machine affects both alike.
        best = {}
        for _ in range(args.repeats):
            for engine_name, engine in engines.items():
                out = engine.generate(prompts[0])
                if engine_name not in best or out.wall_seconds < best[engine_name].wall_seconds:
                    best[engine_name] = out
        for engine_name, out in best.items():
            add(engine_name, out.token_ids, out.wall_seconds, out.recurrent_passes,
                out.outer_steps, out.work, out.loop_token_passes, engines[engine_name].compile_seconds)
        compiled_work = best["compiled"].work
        if torch_model is not None:
            add("torch-eager", torch_res["token_ids"], torch_res["wall_seconds"],
                torch_res["recurrent_passes"], torch_res["outer_steps"], compiled_work,
                torch_res["loop_token_passes"], 0.0)
        if args.batch > 1 and mode in args.batch_modes:
            # Batch 1 baseline on the same prompts: the compiled engine, one request at a time.
            single = CompiledEngine(cfg, params, decode, [])
            single.generate(prompts[-1])  # warm execution
            seq = [single.generate(p) for p in prompts]
            rows.append(Row(f"compiled-seq{args.batch}", sum(len(o.token_ids) for o in seq),
                            sum(o.wall_seconds for o in seq), sum(o.recurrent_passes for o in seq),
                            sum(useful_flops(cfg, o.work, o.loop_token_passes) for o in seq), 0.0,
                            sum(len(o.token_ids) for o in seq) / sum(o.outer_steps for o in seq)))
            engine = CompiledEngine(cfg, params, decode, [], batch_size=args.batch)
            from alodlm_jax.decode import batched
            from alodlm_jax.decode.window import Bucket

            batched.compile_batch(engine, Bucket.for_request(len(prompts[0]), decode, args.batch))
            engine.generate_batch(prompts[:1])  # warm execution (one live request, 7 idle)
            outs = engine.generate_batch(prompts)
            wall = sum(o.wall_seconds for o in outs)
            flops = sum(useful_flops(cfg, o.work, o.loop_token_passes) for o in outs)
            ntok = sum(len(o.token_ids) for o in outs)
            tokens[f"batch{args.batch}[0]"] = outs[0].token_ids
            batch_same = all(a.token_ids == b.token_ids for a, b in zip(seq, outs))
            rows.append(Row(f"compiled-batch{args.batch}", ntok, wall,
                            sum(o.recurrent_passes for o in outs), flops, engine.compile_seconds,
                            ntok / max(sum(o.outer_steps for o in outs), 1)))
            report.setdefault("batch_same_tokens", {})[mode] = batch_same
            report.setdefault("batch_passes", {})[mode] = [o.recurrent_passes for o in outs]
        same = len({tuple(t) for t in tokens.values()}) == 1
        report["modes"][mode] = {"rows": [r.as_dict() for r in rows], "same_tokens": same,
                                 "token_sets": {k: len(v) for k, v in tokens.items()}}
    report["goals"] = goals(name, report, args)
    return report


def warmup(engine, prompt, decode) -> None:
    """Compiles every program a request needs (no discarded full generation: saves minutes)."""
    from alodlm_jax.decode.window import Bucket

    engine.compile_for(Bucket.for_request(len(prompt), decode))


def goals(name: str, report: dict, args) -> dict:
    """Each goal's measured ratio, and its ceiling on this machine.

    The ceiling is the ratio the faster side would reach if it did only its useful work (real
    window rows) at this machine's own matmul rate for the pass shapes (the roofline above):
    ``compiled/torch`` and ``compiled/portable`` divide the other engine's wall time by
    ``useful FLOPs / rate(R rows)``; ``batch/compiled`` divides the batch-1 wall time by
    ``useful FLOPs / rate(R * batch rows)`` (ignoring that a batch also waits for its slowest
    request); ``compiled/roofline`` is 1. A target above its ceiling cannot be met on this machine.

    ``batch/compiled`` also gets ``workload_ceiling``: the speed-up the prompts allow even if a
    step of the batch cost no more than one pass. Each step runs one pass per live request, so
    ``N`` passes in all, the longest request's ``M``, need at least ``max(M, ceil(N / batch))``
    steps against ``N`` passes one at a time.
    """
    out = {}
    mode = report["modes"].get("entropy") or next(iter(report["modes"].values()))
    by = {r["engine"]: r for r in mode["rows"]}
    tps = lambda e: by[e]["tokens_per_second"] if e in by else None  # noqa: E731
    roof = report["roofline"].get(f"jax_matmul_gflops_rows{2 * args.window_size}")
    roof_batch = report["roofline"].get(f"jax_matmul_gflops_rows{2 * args.window_size * args.batch}")

    def ceiling(fast: str, slow: str, rate) -> float | None:
        if fast not in by or slow not in by or not rate:
            return None
        best_wall = by[fast]["useful_gflops_per_second"] * by[fast]["wall_seconds"] / rate
        return by[slow]["wall_seconds"] / best_wall * by[fast]["tokens"] / by[slow]["tokens"]

    batch, seq = f"compiled-batch{args.batch}", f"compiled-seq{args.batch}"
    checks = {
        "compiled/torch": (tps("compiled"), tps("torch-eager"), ceiling("compiled", "torch-eager", roof)),
        "compiled/portable": (tps("compiled"), tps("portable"), ceiling("compiled", "portable", roof)),
        "batch/compiled": (tps(batch), tps(seq), ceiling(batch, seq, roof_batch)),
    }
    if "compiled" in by and roof:
        checks["compiled/roofline"] = (by["compiled"]["useful_gflops_per_second"], roof, 1.0)
    for key, target in GOALS[name].items():
        num, den, top = checks.get(key, (None, None, None))
        if num is None or den is None:
            out[key] = {"target": target, "measured": None, "met": None, "ceiling": top}
        else:
            out[key] = {"target": target, "measured": num / den, "met": num / den >= target,
                        "ceiling": top}
    passes = report.get("batch_passes", {}).get("entropy") or next(
        iter(report.get("batch_passes", {}).values()), None)
    if passes and "batch/compiled" in out:
        steps = max(max(passes), -(-sum(passes) // args.batch))
        out["batch/compiled"]["workload_ceiling"] = sum(passes) / steps
        out["batch/compiled"]["passes"] = {"total": sum(passes), "longest": max(passes),
                                           "least_steps": steps}
    return out


def scaling(args) -> list[dict]:
    """Compiled engine, small model, entropy mode: wall time against max_new_tokens."""
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.decode.compiled import CompiledEngine
    from alodlm_jax.network.params import load_model

    path = build_checkpoint(pathlib.Path(args.workdir), "small", None)
    cfg, params = load_model(str(path), "fp32", per_layer=True)
    prompt = np.random.default_rng(7).integers(13, cfg.vocab_size, size=args.prompt_tokens).tolist()
    out = []
    # Default buckets (cache grows with the budget: attention reads every slot, so ms/pass grows),
    # then one fixed cache size: constant ms/pass there means no per-iteration whole-buffer copies
    # (the jax issue 40101 pattern), i.e. time linear in the number of passes.
    fixed = next_pow2_slots(len(prompt), max(args.scaling), args.window_size)
    for slots in (None, fixed):
        for n in args.scaling:
            decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size, max_new_tokens=n)
            engine = CompiledEngine(cfg, params, decode, [], measure_prefill=False,
                                    cache_slots=slots)
            engine.generate(prompt)
            walls = []
            for _ in range(3):
                res = engine.generate(prompt)
                walls.append(res.wall_seconds)
            wall = statistics.median(walls)
            out.append({"max_new_tokens": n, "t_max": engine.bucket_for(len(prompt)).t_max,
                        "fixed_cache": slots is not None,
                        "wall_seconds": wall, "ms_per_token": 1e3 * wall / len(res.token_ids),
                        "ms_per_pass": 1e3 * wall / res.recurrent_passes,
                        "recurrent_passes": res.recurrent_passes})
    return out


def next_pow2_slots(prompt_len: int, max_new: int, window: int) -> int:
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.decode.window import Bucket

    return Bucket.for_request(prompt_len, DecodeConfig(max_new_tokens=max_new,
                                                       window_size=window)).cache_slots


H200_BYTES_PER_SECOND = 4.8e12


def print_step_costs(title: str, rows: list[dict], tokens_per_pass: float | None) -> None:
    """One line per batch size: XLA's cost and memory analysis of one batch step beside the floor
    (``alodlm_jax.plan.analysis.step_analysis``), and what it implies on an H200's bandwidth."""
    print(f"\n== one batch step, XLA cost/memory analysis: {title} ==")
    print(f"  {'batch':>5}{'GFLOP':>10}{'GB accessed':>13}{'GB gathers':>12}{'GB moved':>10}"
          f"{'GB floor':>10}{'moved/floor':>13}{'temp MB':>9}{'H200 steps/s':>14}"
          f"{'H200 tok/s':>12}")
    for r in rows:
        steps = H200_BYTES_PER_SECOND / r["bytes_moved"]
        tok = "" if tokens_per_pass is None else f"{steps * r['batch'] * tokens_per_pass:>12.0f}"
        print(f"  {r['batch']:>5}{r['flops'] / 1e9:>10.1f}{r['bytes_accessed'] / 1e9:>13.3f}"
              f"{r['gather_overcharge'] / 1e9:>12.3f}{r['bytes_moved'] / 1e9:>10.3f}"
              f"{r['floor_bytes'] / 1e9:>10.3f}{r['moved_over_floor']:>13.2f}"
              f"{r['temp_bytes'] / 1e6:>9.1f}{steps:>14.1f}{tok}")
    if tokens_per_pass is not None:
        print(f"  (tok/s at {tokens_per_pass:.2f} tokens per request-pass, if a step took "
              f"bytes moved / 4.8 TB/s)")


def bench_step_costs(name: str, args) -> list[dict]:
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.plan.analysis import step_analysis
    from alodlm_jax.decode.window import Bucket
    from alodlm_jax.network.params import load_model

    path = build_checkpoint(pathlib.Path(args.workdir), name, args.lm_head_scale)
    cfg, params = load_model(str(path), "fp32", per_layer=True)
    decode = DecodeConfig(q=0.5, tau=0.4, window_size=args.window_size,
                          max_new_tokens=args.max_new_tokens)
    rows = [step_analysis(cfg, params, Bucket.for_request(args.prompt_tokens, decode, b))
            for b in args.step_costs]
    print_step_costs(f"{name} model, fp32, {rows[0]['cache_slots']} cache slots", rows, None)
    return rows


def layer_costs(name: str, batch: int, slots: int, args) -> dict:
    """XLA's bytes accessed for one core layer of the batch step
    (``network.window_layers.window_layer_rows`` on ``batch * W`` packed rows, prefix of ``slots``
    cache slots) and for its pieces compiled alone, beside the layer's weights and the K/V it
    attends to."""
    import jax
    import jax.numpy as jnp

    from alodlm_jax.network import attention as A, cache as KC, layers as L, rows as R
    from alodlm_jax.network import window_layers as WL
    from alodlm_jax.network.params import load_model

    path = build_checkpoint(pathlib.Path(args.workdir), name, args.lm_head_scale)
    cfg, params = load_model(str(path), "fp32", per_layer=True)
    spec = lambda shape, dt=jnp.float32: jax.ShapeDtypeStruct(shape, dt)  # noqa: E731
    lp = jax.tree_util.tree_map(lambda x: spec(x.shape, x.dtype), params["core"][0])
    rows = 2 * args.window_size
    packed, hidden, heads = batch * rows, cfg.hidden_size, cfg.num_attention_heads
    nkv, dh, eps = cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    cache = spec((batch, 1, cfg.max_depth, slots, nkv, dh))
    i32 = lambda *shape: spec(shape, jnp.int32)  # noqa: E731

    def layer(lp, h, positions, counts, k_all, v_all, start, depth):
        m = R.row_map(counts, packed)
        cos, sin = L.rope_tables(positions, dh, cfg.rope_theta, h.dtype)
        bucket = KC.kv_bucket_index(KC.kv_buckets(slots), jnp.max(start))
        return WL.window_layer_rows(lp, eps, h, cos, sin, k_all, v_all, 0, depth, start, bucket,
                                    m, rows)

    def qkv(lp, h, positions):
        return L.qkv(lp, eps, h, *L.rope_tables(positions, dh, cfg.rope_theta, h.dtype))

    pieces = {
        "layer": (layer, (lp, spec((packed, hidden)), i32(packed), i32(batch), cache, cache,
                          i32(batch), i32(batch))),
        "projections": (qkv, (lp, spec((packed, hidden)), i32(packed))),
        "attention": (jax.vmap(A.attend_window), (
            spec((batch, rows, heads, dh)), spec((batch, slots, nkv, dh)),
            spec((batch, slots, nkv, dh)), i32(batch), spec((batch, rows, nkv, dh)),
            spec((batch, rows, nkv, dh)))),
        "output+mlp": (lambda lp, h, a: L.attention_out_and_mlp(lp, eps, h, a),
                       (lp, spec((packed, hidden)), spec((packed, heads, dh)))),
    }
    out = {"weights_bytes": sum(x.size * 4 for x in jax.tree_util.tree_leaves(lp)),
           "kv_bytes": 2 * batch * slots * nkv * dh * 4}
    print(f"\n== one core layer of the batch step, {name} model, batch {batch}, {slots} slots: "
          f"weights {out['weights_bytes'] / 1e6:.1f} MB, K/V attended {out['kv_bytes'] / 1e6:.1f} MB ==")
    for key, (fn, shapes) in pieces.items():
        cost = jax.jit(fn).lower(*shapes).compile().cost_analysis()
        out[key] = float(cost["bytes accessed"])
        print(f"  {key:<12} {out[key] / 1e6:10.1f} MB accessed", flush=True)
    return out


def released_step_costs(name: str, args) -> list[dict]:
    """The batch step of a released model's shapes in bf16, compiled for this machine's backend
    from parameter shapes alone (no weights in memory, nothing decoded)."""
    from alodlm_jax.plan.analysis import step_analysis
    from alodlm_jax.decode.window import Bucket
    from alodlm_jax.testing.released_shapes import model_config, param_specs

    cfg = model_config(name)
    params = param_specs(cfg)
    rows = []
    for b in args.step_costs or [1, 8, 32]:
        bucket = Bucket(prompt_bucket=16, window_size=args.window_size, capacity=16,
                        cache_slots=args.released_cache_slots, batch=b)
        t0 = time.perf_counter()
        rows.append(step_analysis(cfg, params, bucket))
        print(f"  [{name} batch {b}: compiled in {time.perf_counter() - t0:.0f} s]", flush=True)
    print_step_costs(f"{name}-shaped, bf16, {rows[0]['cache_slots']} cache slots", rows, args.tokens_per_pass)
    return rows


def print_report(report: dict) -> None:
    print(f"\n== {report['model']} ==")
    for key, value in report["roofline"].items():
        print(f"  roofline {key}: {value:.2f}")
    for mode, body in report["modes"].items():
        print(f"  -- mode {mode} (same tokens across engines: {body['same_tokens']}, "
              f"lengths {body['token_sets']})")
        print(f"  {'engine':<18}{'tok/s':>10}{'passes/s':>10}{'ms/pass':>10}{'GFLOP/s':>10}"
              f"{'compile s':>11}{'tok/window':>11}")
        for r in body["rows"]:
            print(f"  {r['engine']:<18}{r['tokens_per_second']:>10.1f}{r['passes_per_second']:>10.1f}"
                  f"{r['ms_per_pass']:>10.2f}{r['useful_gflops_per_second']:>10.2f}"
                  f"{r['compile_seconds']:>11.1f}{r['tokens_per_window']:>11.2f}")
    if "batch_same_tokens" in report:
        print(f"  batch outputs equal one-at-a-time outputs (tokens): {report['batch_same_tokens']}")
    for key, g in report["goals"].items():
        measured = "n/a" if g["measured"] is None else f"{g['measured']:.2f}"
        status = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        top = g.get("ceiling")
        bound = "" if top is None else f"; ceiling on this machine {top:.2f}" + (
            " (target above it)" if g["target"] > top else "")
        print(f"  goal {key} >= {g['target']}: measured {measured} -> {status}{bound}")
        if "workload_ceiling" in g:
            n = g["passes"]
            print(f"    the prompts' {n['total']} passes, the longest request's {n['longest']}, need "
                  f">= {n['least_steps']} steps: at most {g['workload_ceiling']:.2f}x even if a step "
                  "cost one pass")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 new tokens, scaling 32/64/128")
    parser.add_argument("--models", default="small,medium")
    parser.add_argument("--modes", default="entropy,left1")
    parser.add_argument("--workdir", default=os.environ.get("ALODLM_BENCH_DIR", "/tmp/alodlm_bench"))
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--prompt_tokens", type=int, default=16)
    parser.add_argument("--window_size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batch_prompts", type=int, default=None,
                        help="prompts decoded at batch 1 and at --batch (default 2 x --batch, so "
                        "finished requests are replaced by waiting ones)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed runs per engine, the engines alternating (best kept)")
    parser.add_argument("--batch_modes", default="entropy",
                        help="modes that also run the batch (and its batch-1 baseline)")
    parser.add_argument("--lm_head_scale", type=float, default=None,
                        help="override the model's LM-head scale")
    parser.add_argument("--scaling", default=None,
                        help="max_new_tokens values for the time-vs-budget sweep (default "
                        "64,128,256; --quick: 32,64,128; '' to skip)")
    parser.add_argument("--skip_torch", action="store_true")
    parser.add_argument("--json", default=None, help="write the full report here")
    parser.add_argument("--step_costs", default="1,8,32",
                        help="batch sizes whose one-step XLA cost and memory analysis is printed "
                             "for each model ('' to skip)")
    parser.add_argument("--released_shapes", default="",
                        help="also analyse one batch step of these released-model shapes in bf16, "
                             "compiling only (e.g. 1.7b,8b; takes minutes)")
    parser.add_argument("--released_cache_slots", type=int, default=1024,
                        help="prefix slots of the released-shape analysis (prompt + generated)")
    parser.add_argument("--tokens_per_pass", type=float, default=1.0,
                        help="tokens a request commits per recurrent pass, for the implied H200 "
                             "tokens/s of the released shapes")
    parser.add_argument("--layer_costs", default="",
                        help="MODEL,BATCH,SLOTS: XLA's cost analysis of one packed-row core layer "
                             "and its pieces (projections, attention, output and MLP), e.g. "
                             "medium,8,288")
    parser.add_argument("--costs_only", action="store_true",
                        help="print only the step cost analyses (no decoding)")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_new_tokens = 32
    if args.batch_prompts is None:
        args.batch_prompts = 2 * args.batch
    if args.batch_prompts < 1 or args.batch < 1 or args.repeats < 1:
        print("bench_decode.py: error: --batch, --batch_prompts and --repeats must be at least 1",
              file=sys.stderr)
        return 2
    if args.scaling is None:
        args.scaling = "32,64,128" if args.quick else "64,128,256"
    if args.layer_costs:
        try:
            name, batch, slots = args.layer_costs.split(",")
            args.layer_costs = (name, int(batch), int(slots))
            if name not in MODELS or args.layer_costs[1] < 1 or args.layer_costs[2] < 1:
                raise ValueError
        except ValueError:
            print(f"bench_decode.py: error: --layer_costs takes MODEL,BATCH,SLOTS with MODEL one of "
                  f"{sorted(MODELS)} (e.g. medium,8,288), got {args.layer_costs!r}", file=sys.stderr)
            return 2
    from alodlm_jax.testing.released_shapes import SHAPES

    unknown = [m for m in args.released_shapes.split(",") if m and m not in SHAPES]
    if unknown:
        print(f"bench_decode.py: error: --released_shapes takes names from {sorted(SHAPES)}, got "
              f"{', '.join(unknown)}", file=sys.stderr)
        return 2
    args.modes = [m for m in args.modes.split(",") if m]
    args.batch_modes = [m for m in args.batch_modes.split(",") if m]
    args.scaling = [int(x) for x in args.scaling.split(",") if x]
    pathlib.Path(args.workdir).mkdir(parents=True, exist_ok=True)

    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {os.cpu_count()} CPUs; "
          f"{args.max_new_tokens} new tokens, window {args.window_size}, prompt "
          f"{args.prompt_tokens}, batch {args.batch} over {args.batch_prompts} prompts", flush=True)
    full = {"args": {k: v for k, v in vars(args).items()}, "models": [], "scaling": None}
    args.step_costs = [int(x) for x in args.step_costs.split(",") if x]
    for name in [m for m in args.models.split(",") if m]:
        if not args.costs_only:
            report = run_model(name, args)
            print_report(report)
            full["models"].append(report)
        if args.step_costs:
            full.setdefault("step_costs", {})[name] = bench_step_costs(name, args)
    if args.layer_costs:
        name, batch, slots = args.layer_costs
        full["layer_costs"] = layer_costs(name, batch, slots, args)
    for name in [m for m in args.released_shapes.split(",") if m]:
        full.setdefault("step_costs", {})[name] = released_step_costs(name, args)
    if args.scaling and not args.costs_only:
        full["scaling"] = scaling(args)
        print("\n== compiled engine, small model, entropy: time vs max_new_tokens ==")
        for s in full["scaling"]:
            print(f"  {'fixed' if s['fixed_cache'] else 'bucket':<6} max_new {s['max_new_tokens']:>5}  "
                  f"t_max {s['t_max']:>5}  wall "
                  f"{s['wall_seconds']:.4f} s  {s['ms_per_token']:.3f} ms/token  "
                  f"{s['ms_per_pass']:.3f} ms/pass  passes {s['recurrent_passes']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(full, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
