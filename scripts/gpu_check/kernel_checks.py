"""The kernels alone on the device against XLA's form (block ATTENTION): the attention kernel,
the heads' norms, the attention kernel that normalizes its window, the combined attention,
a window layer's products."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from alodlm_jax.plan.fit import tree_bytes

from gpu_check.common import agreement


# ---- ATTENTION (the Triton kernel alone: its prefix in parts or in one) -----------------------
def attention_check(cfg, args) -> None:
    """The window attention kernel alone (alodlm_jax/kernels/window.py) at this model's heads,
    each batch size and prefix: its time per call with the prefix split in parts
    (kernels.window.gpu_splits; a second kernel combines them) and walked whole by one program per
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
    the heads' norms and RoPE itself (kernels.window.window_attention_qkv) against the heads'
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


def layer_kernels_check(cfg, params, args) -> None:
    """A window layer's products with their norms and residual adds (alodlm_jax/kernels/matmul.py)
    and its heads' norms (kernels/head_norm.py) in Triton kernels, what a window layer of one
    request (or two, in a batch step) runs on one GPU in bf16, against XLA's form of the same
    parts (network.layers.qkv and attention_out_and_mlp with and without ``kernel``), on this
    device: time per layer over 8 of the model's layers in turn (more weights than the L2 holds),
    the layer's weights read per second, the share of outputs equal bit for bit and the largest
    difference. Without a GPU both forms are XLA's (the kernels run only where the platform is
    CUDA)."""
    from alodlm_jax.kernels import matmul as MK
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
