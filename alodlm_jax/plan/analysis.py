"""Analysis of the compiled programs, for the benchmarks and the tests that read them: XLA's cost
and memory figures of one batch step (:func:`step_analysis`) and the collectives of an optimized
HLO module's text (:func:`collectives`, :func:`step_collectives`). Nothing here decodes.
"""

from __future__ import annotations

import collections
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.network import cache as KC
from alodlm_jax.network import rows as R
from alodlm_jax.decode import batched as B
from alodlm_jax.decode import window as W

# ---------------------------------------------------------------------------------------------
# One batch step's cost and memory
# ---------------------------------------------------------------------------------------------


def step_analysis(cfg, params, bucket: W.Bucket, *, mode: str = "entropy", dtype=None,
                  shapes: str = R.BUCKETED) -> dict:
    """XLA's own cost and memory analysis of one batch step (:func:`alodlm_jax.decode.batched.batch_step` compiled alone for
    ``bucket``), beside the step's physical floor; compiles, never decodes.

    ``params`` may be arrays or ``jax.ShapeDtypeStruct``s (the 1.7B and 8B shapes need no memory).
    XLA's cost analysis takes the costliest branch of every ``lax.switch``, so the figures are
    those of the heaviest step the bucket allows: every slot live with a full window, attending
    over the whole cache buffer. The floor is what such a step must move at least: every weight it
    multiplies, once (layer weights, final norm, LM head, gate; the embedding is read by rows),
    plus each request's K/V for the ``cache_slots`` prefix slots at one depth of every layer and
    its window rows written back.

    XLA's cost model charges a gather its whole operand (``bytes accessed0{}`` of ``x[i]`` on a
    4 MiB array is 4 MiB for 8 rows), while the gather reads only the rows it selects. A step
    gathers each request's prefix at its own depth from the batch's cache (two gathers per layer)
    and its window's embeddings from the table (two lookups), so ``gather_overcharge`` computes
    what the model charges beyond the gathered bytes, and ``bytes_moved`` is ``bytes_accessed``
    less it. ``shapes``: the step's :mod:`alodlm_jax.network.rows` policy (an engine's ``shapes``).
    Returns plain numbers (see the keys).
    """
    dtype = jnp.dtype(dtype or jax.tree_util.tree_leaves(params)[0].dtype)
    window_size = bucket.window_size
    rows = 2 * window_size
    params_spec = W.abstract(params)
    cache = B.batched_spec(bucket, jax.eval_shape(lambda: KC.init_cache(cfg, bucket.t_max, dtype)))
    vocab, hidden = params_spec["embed"].shape
    one = jax.eval_shape(lambda: B.fresh_slot(
        {"embed": jnp.zeros((1, hidden), dtype)}, cfg, window_size, bucket.capacity, 0,
        analysis_consts(), finished=True))
    slots = B.batched_spec(bucket, one)
    consts = W.abstract(analysis_consts())
    step = jax.jit(functools.partial(B.batch_step, cfg=cfg, window_size=window_size, mode=mode,
                                     shapes=shapes), donate_argnums=(1, 2))
    compiled = step.lower(params_spec, cache, slots, consts).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    memory = compiled.memory_analysis()
    item = dtype.itemsize
    batch, slots_attended = bucket.batch, bucket.t_max
    weights = sum(x.size * jnp.dtype(x.dtype).itemsize
                  for path, x in jax.tree_util.tree_leaves_with_path(params_spec)
                  if jax.tree_util.keystr(path[:1]) != "['embed']")
    row_kv = cfg.num_key_value_heads * cfg.head_dim * item  # one slot of one layer's K (or V)
    layers = cfg.num_prelude_layers + cfg.num_core_layers + cfg.num_coda_layers
    kv = 2 * batch * layers * row_kv * (slots_attended + rows)
    gathered = 2 * batch * slots_attended * row_kv  # one layer's K and V prefix reads
    overcharge = sum(2 * n * (buffer.size * item - gathered // 2) for n, buffer in (
        (cfg.num_prelude_layers, cache.prelude_k), (cfg.num_core_layers, cache.core_k),
        (cfg.num_coda_layers, cache.coda_k)))
    overcharge += 2 * (vocab * hidden - batch * rows * hidden) * item
    accessed = float(cost.get("bytes accessed", 0.0))
    return {"batch": batch, "cache_slots": slots_attended, "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": accessed, "gather_overcharge": float(overcharge),
            "bytes_moved": accessed - overcharge, "temp_bytes": int(memory.temp_size_in_bytes),
            "argument_bytes": int(memory.argument_size_in_bytes), "weight_bytes": int(weights),
            "kv_bytes": int(kv), "floor_bytes": int(weights + kv),
            "moved_over_floor": (accessed - overcharge) / (weights + kv)}


def analysis_consts() -> dict:
    """Runtime decoding inputs of the right shapes for an analysis (their values are unused)."""
    return {"max_new_tokens": jnp.int32(1), "stop_ids": jnp.full((W.STOP_ID_SLOTS,), -1, jnp.int32),
            "penalty": jnp.float32(0), "q": jnp.float32(0.5), "tau": jnp.float32(0.4)}


# ---------------------------------------------------------------------------------------------
# Collectives in an optimized program's text
# ---------------------------------------------------------------------------------------------


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")


def collectives(hlo_text: str) -> list[dict]:
    """The collective instructions of an optimized HLO module's text (``compiled.as_text()``).

    Each: ``kind``, ``op_name`` (the JAX operation it came from, from the metadata),
    ``replica_groups`` (lists of device ids; ``None`` where the text does not say) and
    ``branches`` (the ``lax.switch``/``lax.cond`` branch indices on its path). An async
    ``-start``/``-done`` pair is one instruction.
    """
    found = []
    for line in hlo_text.splitlines():
        match = re.search(r"(?<![\w.%-])(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", line)
        if match is None or " = " not in line:
            continue
        name = re.search(r'op_name="([^"]*)"', line)
        op_name = name.group(1) if name else ""
        found.append({"kind": match.group(1), "op_name": op_name,
                      "replica_groups": _replica_groups(line),
                      "branches": tuple(int(b) for b in re.findall(r"branch_(\d+)_fun", op_name))})
    return found


def _replica_groups(line: str):
    """``replica_groups=`` as lists of ids: the explicit form ``{{0,1},{2,3}}``, the iota form
    ``[G,S]<=[N]`` (optionally ``<=[a,b]T(1,0)``) or the mesh-axes form ``mesh['a'=2,'b'=2]
    {'b'}``; None if absent or another form."""
    explicit = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
    if explicit:
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", explicit.group(1))]
    named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if named:  # mesh['a'=2,'b'=1] {'a'}: devices (row-major ids) varying along the named axes
        axes = re.findall(r"'([^']+)'=(\d+)", named.group(1))
        over = set(re.findall(r"'([^']+)'", named.group(2)))
        ids = np.arange(int(np.prod([int(n) for _, n in axes]) or 1)).reshape([int(n) for _, n in axes])
        moved = [i for i, (a, _) in enumerate(axes) if a not in over] + \
                [i for i, (a, _) in enumerate(axes) if a in over]
        size = int(np.prod([int(n) for a, n in axes if a in over]))
        return ids.transpose(moved).reshape(-1, size).tolist()
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if not iota:
        return None
    shape = [int(x) for x in iota.group(1).split(",")]
    dims = [int(x) for x in iota.group(2).split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if iota.group(3):
        ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
    return ids.reshape(shape).tolist()


def step_collectives(hlo_text: str) -> dict[str, int]:
    """Collectives one execution of the program's text runs, by ``kind`` and source operation.

    Of a ``lax.switch`` (the engine's row and prefix buckets) only one branch runs: each source is
    counted in the branch where it occurs most. A loop body counts once: for a batch program (one
    ``while`` step) that is one step, with a layer stack that runs as a loop counted once per
    stack (its collectives run once per layer). Keys:
    ``"<kind> <op>"``, where ``<op>`` is the last two parts of the JAX operation's name (e.g.
    ``"all-reduce ti,ih->th/dot_general"``, ``"all-reduce jit(_take)/gather"``).
    """
    per_branch: collections.Counter = collections.Counter()
    for c in collectives(hlo_text):
        normal = re.sub(r"branch_\d+_fun", "branch", c["op_name"])
        per_branch[(c["kind"], normal, c["branches"])] += 1
    best: dict[tuple[str, str], int] = {}
    for (kind, normal, _), count in per_branch.items():
        best[(kind, normal)] = max(best.get((kind, normal), 0), count)
    counts: collections.Counter = collections.Counter()
    for (kind, normal), count in best.items():
        source = "/".join(normal.split("/")[-2:])
        counts[f"{kind} {source}"] += count
    return dict(sorted(counts.items()))
