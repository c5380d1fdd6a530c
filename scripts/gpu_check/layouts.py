"""The compiled engine on every mesh the visible devices allow (block LAYOUTS)."""

from __future__ import annotations

import time

import jax

from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.network.model import unstack_layers
from alodlm_jax.testing.released_shapes import model_config, random_params

from gpu_check.common import random_prompts


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
