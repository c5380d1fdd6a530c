#!/usr/bin/env python
"""Where the first-pass hazards' fp32 rounding comes from on long prompts (fp32, CPU).

The case is the long-prompt parity test's (``tests/decode/test_long_prompt_parity.py``): a 6-layer
sandwich, hidden 192, 6/3 heads of 32, vocabulary 300, rope theta 5e5, init std 0.07; random
prompt ids in [4, 120); entropy mode, q 0.55, tau 0.4, window 32, 96 new tokens. Three parts:

* ``decode``: the portable engine, the PyTorch reference in fp32 (1 and 2 threads) and the
  reference in fp64 (the exact computation, to fp32's eyes) decode each prompt; the first-pass
  hazards' largest difference between each pair, and the same in logit units (a hazard's
  difference divided by ``λ(1-λ)``, the sigmoid's slope, so that saturated hazards count too);
* ``layers``: the first window's pass 0 after the prompt, every layer from the reference's fp32
  input and prefix cache (``local``) or chained (``chained``): ours against the reference, and
  each side's local error against fp64;
* ``budget``: the reference's window pass 0 with one class of operations in fp64 (attention,
  projections, MLP, norms, residual adds), the rest in fp32: the gate logit's largest error
  against the all-fp64 pass, with the prompt's cache exact (fp64) or the fp32 prefill's;
* ``dot`` (not by default): the attention's probabilities-times-values product over a bucket of
  the prompt's length, alone: ours, the reference's, and ours as partial sums over blocks of 256
  slots, each one's error against fp64 and time.

    python scripts/hazard_rounding.py --lengths 400 1600 1900 --parts decode layers budget

Needs torch and transformers (the ``test`` extra). ``docs/compare.md`` ("Long prompts: hazards
and fp32 rounding") has the figures.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys
import tempfile

import numpy as np

from alodlm_jax.config import DecodeConfig

WINDOW = 32
DECODE = DecodeConfig(q=0.55, tau=0.4, window_size=WINDOW, max_new_tokens=96, mode="entropy")


def case_spec(seed: int):
    from alodlm_jax.testing.tiny_checkpoint import TinySpec

    return TinySpec(topology="sandwich", num_layers=6, loop_start=1, loop_end=5, max_depth=3,
                    hidden_size=192, intermediate_size=512, num_heads=6, num_kv_heads=3,
                    head_dim=32, vocab_size=300, max_position_embeddings=2048, rope_theta=5e5,
                    norm_jitter=0.03, init_std=0.07, seed=seed)


def prompt_of(length: int) -> list[int]:
    return [random.Random(length).randrange(4, 120) for _ in range(length)]


def load_sides(path):
    from alodlm_jax.network.params import load_model
    from alodlm_jax.compare.torch_reference import TorchALoDLM

    cfg, params = load_model(str(path), "fp32")
    ref = TorchALoDLM.from_checkpoint(path, "fp32")
    exact = TorchALoDLM.from_checkpoint(path, "fp32")
    exact.model.double()
    exact.gate.double()
    return cfg, params, ref, exact


def decode_part(sides, lengths) -> None:
    import torch

    from alodlm_jax.decode.portable import PortableEngine

    cfg, params, ref, exact = sides
    engine = PortableEngine(cfg, params, DECODE, [])
    print("decode: max |Δλ| (and in logit units) of the first-pass hazards")
    for length in lengths:
        prompt = prompt_of(length)
        torch.set_num_threads(1)
        one = ref.generate(prompt, DECODE, stop_ids=[])
        truth = exact.generate(prompt, DECODE, stop_ids=[])
        torch.set_num_threads(2)
        two = ref.generate(prompt, DECODE, stop_ids=[])
        torch.set_num_threads(1)
        ours = engine.generate(prompt)
        h = {name: np.asarray(x["first_pass_halt_probabilities"] if isinstance(x, dict)
                              else x.first_pass_halt_probabilities, np.float64)
             for name, x in (("ours", ours), ("ref", one), ("ref2", two), ("fp64", truth))}
        slope = h["fp64"] * (1 - h["fp64"])

        def pair(a, b):
            d = np.abs(h[a] - h[b])
            logit = np.divide(d, slope, out=np.zeros_like(d), where=slope > 0)
            return f"{d.max():.2g} ({logit.max():.2g})"

        same = ours.token_ids == one["token_ids"] == truth["token_ids"]
        print(f"  {length:5d} tokens: tokens identical {same}, median λ {np.median(h['fp64']):.3f}"
              f" | ours-ref {pair('ours', 'ref')} | ours-fp64 {pair('ours', 'fp64')}"
              f" | ref-fp64 {pair('ref', 'fp64')} | ref 2 threads-1 thread {pair('ref2', 'ref')}",
              flush=True)


def _prefill(side, prompt):
    import torch

    from alodlm_jax.compare.torch_reference import DepthCache, append_rows

    cache = DepthCache()
    with torch.no_grad():
        kv, _ = side.all_passes(prompt, range(len(prompt)), cache)
    append_rows(cache, kv, range(len(prompt)))
    return cache


def layers_part(sides, lengths) -> None:
    import jax
    import jax.numpy as jnp
    import torch

    from alodlm_jax.network import cache as C
    from alodlm_jax.network import layers as L
    from alodlm_jax.network import model as M
    from alodlm_jax.network import window_layers as WL
    from alodlm_jax.decode.window import Bucket
    from alodlm_jax.compare.torch_reference import DepthCache

    cfg, params, ref, exact = sides
    params = M.unstack_layers(params)
    stack = params["prelude"] + params["core"] + params["coda"]
    eps = cfg.rms_norm_eps
    print("layers: the first window's pass 0 from the reference's fp32 prefix cache, max |Δ|")
    for n in lengths:
        cache = _prefill(ref, prompt_of(n))
        exact_cache = DepthCache({key: (k.double(), v.double())
                                  for key, (k, v) in cache.entries.items()}, n)
        pos = torch.arange(n, n + WINDOW)
        ins, outs, truth = [], [], []
        with torch.no_grad():
            h = ref.embed([3] * WINDOW)
            for i in range(len(stack)):
                ins.append(h)
                truth.append(exact.layer(i, h.double(), pos, exact_cache.entries[(i, 0)])[0])
                h, _ = ref.layer(i, h, pos, cache.entries[(i, 0)])
                outs.append(h)
        t_max = Bucket.for_request(n, DECODE).t_max  # the portable engine's cache
        sizes = C.kv_buckets(t_max)
        bucket = C.kv_bucket_index(sizes, n)
        cos, sin = L.rope_tables(jnp.arange(n, n + WINDOW, dtype=jnp.int32), cfg.head_dim,
                                 cfg.rope_theta, jnp.float32)

        @jax.jit
        def layer(lp, h, k_all, v_all):
            return WL.window_layer(lp, eps, h, cos, sin, k_all, v_all, (jnp.int32(0),),
                                    jnp.int32(n), bucket)[0]

        def buffers(i):
            k, v = cache.entries[(i, 0)]
            kb = np.zeros((1, t_max) + tuple(k.shape[1:]), np.float32)
            vb = kb.copy()
            kb[0, :n], vb[0, :n] = k.numpy(), v.numpy()
            return jnp.asarray(kb), jnp.asarray(vb)

        chained = jnp.asarray(ins[0].numpy())
        print(f"  {n} tokens (bucket {sizes[int(bucket)]}):")
        for i, lp in enumerate(stack):
            kb, vb = buffers(i)
            local = np.asarray(layer(lp, jnp.asarray(ins[i].numpy()), kb, vb))
            chained = layer(lp, chained, kb, vb)
            t32, t64 = outs[i].numpy(), truth[i].numpy()
            print(f"    layer {i}: ours-ref local {np.abs(local - t32).max():.2g} chained "
                  f"{np.abs(np.asarray(chained) - t32).max():.2g} | local error against fp64: "
                  f"ours {np.abs(local - t64).max():.2g} ref {np.abs(t32 - t64).max():.2g}",
                  flush=True)


def budget_part(sides, lengths) -> None:
    import torch
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    _, _, r32, r64 = sides
    # RoPE's tables stay fp32 (transformers makes them in fp32 in an fp64 module too); its
    # products count as attention.
    classes = ("attn", "proj", "mlp", "norm", "resid")

    def layer(i, h, pos, prefix, hi):
        l32, l64 = r32.model.model.layers[i], r64.model.model.layers[i]
        a32, a64 = l32.self_attn, l64.self_attn

        def run(m32, m64, x, cls):
            return m64(x.double()) if cls in hi else m32(x.float())

        rows, nh, nkv, dh = h.shape[0], r32.num_heads, r32.num_kv_heads, r32.head_dim
        a = run(l32.input_layernorm, l64.input_layernorm, h, "norm")
        q = run(a32.q_norm, a64.q_norm, run(a32.q_proj, a64.q_proj, a, "proj").view(rows, nh, dh),
                "norm")
        k = run(a32.k_norm, a64.k_norm,
                run(a32.k_proj, a64.k_proj, a, "proj").view(rows, nkv, dh), "norm")
        v = run(a32.v_proj, a64.v_proj, a, "proj").view(rows, nkv, dh)
        dt = torch.float64 if "attn" in hi else torch.float32  # RoPE's products included
        cos, sin = (t.to(dt) for t in r32.model.model.rotary_emb(q.float(), pos[None, :]))
        q, k = apply_rotary_pos_emb(q.to(dt), k.to(dt), cos[0], sin[0], unsqueeze_dim=1)
        n, group = prefix[0].shape[0], nh // nkv
        keys = torch.cat([prefix[0].to(dt), k.to(dt)]).repeat_interleave(group, 1)
        values = torch.cat([prefix[1].to(dt), v.to(dt)]).repeat_interleave(group, 1)
        scores = torch.einsum("thd,shd->hts", q.to(dt), keys) * a32.scaling
        key = torch.arange(n + rows)
        allowed = (key[None] < n) | (key[None] - n <= torch.arange(rows)[:, None])
        probs = torch.softmax(scores.masked_fill(~allowed[None], float("-inf")), -1)
        out = torch.einsum("hts,shd->thd", probs, values).reshape(rows, -1)
        rd = torch.float64 if "resid" in hi else torch.float32
        x = h.to(rd) + run(a32.o_proj, a64.o_proj, out, "proj").to(rd)
        b = run(l32.post_attention_layernorm, l64.post_attention_layernorm, x, "norm")
        return x + run(l32.mlp, l64.mlp, b, "mlp").to(rd)

    def gate_logit(cache, hi, n):
        pos = torch.arange(n, n + WINDOW)
        with torch.no_grad():
            h = r32.embed([3] * WINDOW)
            for i in range(r32.num_layers):
                h = layer(i, h, pos, cache.entries[(i, 0)], hi)
            final = r64.final_norm(h.double()) if "norm" in hi else r32.final_norm(h.float())
            gate = r64.gate if "gate" in hi else r32.gate
            return gate(final.to(gate.net.weight.dtype), 0).double()

    torch.set_num_threads(1)
    print("budget: max |gate logit error| against the all-fp64 pass, with these in fp64:")
    for n in lengths:
        caches = {"fp64": _prefill(r64, prompt_of(n)), "fp32": _prefill(r32, prompt_of(n))}
        everything = classes + ("gate",)
        truth = gate_logit(caches["fp64"], everything, n)
        for name, cache in caches.items():
            cells = []
            for hi in ((), ("attn",), ("proj",), ("mlp",), ("norm",), ("resid",),
                       ("attn", "proj", "mlp"), everything):
                err = (gate_logit(cache, hi, n) - truth).abs().max().item()
                label = "all" if hi == everything else "+".join(hi) or "none"
                cells.append(f"{label} {err:.2g}")
            print(f"  {n} tokens, prefix cache {name}: " + ", ".join(cells), flush=True)


def blocked_values(probs, v, block: int = 256):
    """The attention's ``probs [n_kv, rows, S] x v [S, n_kv, d_h]`` as partial sums over blocks
    of ``block`` slots, then their sum (``S`` of at least two blocks; else the library's form)."""
    import jax
    import jax.numpy as jnp

    if v.shape[0] < 2 * block or v.shape[0] % block:
        return jnp.einsum("kqs,skd->kqd", probs, v, precision=jax.lax.Precision.HIGHEST,
                          preferred_element_type=jnp.float32)
    parts = jnp.einsum("kqbs,bskd->kqbd", probs.reshape(probs.shape[:2] + (-1, block)),
                       v.reshape((-1, block) + v.shape[1:]), precision=jax.lax.Precision.HIGHEST,
                       preferred_element_type=jnp.float32)
    return parts.sum(axis=2)


def dot_part(_sides, lengths) -> None:
    """The attention's probabilities times values over ``S`` slots alone: each form's relative
    RMS error against fp64, and its time (XLA:CPU, best of 5 runs of 20)."""
    import time

    import jax
    import torch

    from alodlm_jax.network import attention as A

    def error(y, truth):
        y = np.asarray(y, np.float64)
        return np.sqrt(np.mean((y - truth) ** 2) / np.mean(truth ** 2))

    def best(f, *args):
        f(*args).block_until_ready()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(20):
                f(*args).block_until_ready()
            times.append((time.perf_counter() - start) / 20)
        return min(times)

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print("dot: probabilities [3, 64, S] times values [S, 3, 32]: relative error, time")
    for size in sorted({max(256, 1 << (n - 1).bit_length()) for n in lengths}):
        scores = rng.standard_normal((3, 64, size)) * 1.5
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
        v = rng.standard_normal((size, 3, 32)).astype(np.float32)
        truth = np.einsum("kqs,skd->kqd", p.astype(np.float64), v.astype(np.float64))
        theirs = torch.einsum("kqs,skd->kqd", torch.from_numpy(p), torch.from_numpy(v)).numpy()
        ours, split = jax.jit(A._values), jax.jit(blocked_values)
        print(f"  S={size}: reference (torch) {error(theirs, truth):.2g} | ours "
              f"{error(ours(p, v), truth):.2g} in {best(ours, p, v) * 1e6:.0f} us | blocks of 256 "
              f"summed {error(split(p, v), truth):.2g} in {best(split, p, v) * 1e6:.0f} us",
              flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[400, 1600, 1900])
    parser.add_argument("--parts", nargs="+", choices=["decode", "layers", "budget", "dot"],
                        default=["decode", "layers", "budget"])
    parser.add_argument("--seed", type=int, default=1, help="the checkpoint's seed (default 1)")
    parser.add_argument("--blocked-values", action="store_true",
                        help="an experiment: our side with the attention's probabilities times "
                             "values as partial sums over blocks of 256 slots (blocked_values), "
                             "not the library's form")
    args = parser.parse_args(argv)
    if any(not 1 <= n <= 2048 - 96 for n in args.lengths):
        parser.error("--lengths must be in [1, 1952] (the case's context is 2,048 positions)")
    import transformers

    from alodlm_jax.network import attention
    from alodlm_jax.testing.tiny_checkpoint import build_tiny_checkpoint

    transformers.logging.set_verbosity_error()
    if args.blocked_values:
        attention._values = blocked_values
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_checkpoint(pathlib.Path(tmp) / "case", case_spec(args.seed))
        sides = load_sides(path)
        for part in args.parts:
            {"decode": decode_part, "layers": layers_part, "budget": budget_part,
             "dot": dot_part}[part](sides, args.lengths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
