"""The programs ``alodlm-jax-evaluate`` would run, as ``(jitted, abstract arguments)``: the plan's
one adapter onto the decoding engines.

With ``--batch_size 1`` evaluate decodes each task with the compiled engine's single-request
program (and times its prefill program); with a larger batch, the batch program (its loop of
steps) and the admit program (a request's prefill into its slot). The portable engine runs
jitted passes from a host loop; the plan covers the compiled engine, evaluate's default.

Everything here builds what the engine itself builds (:meth:`CompiledEngine.cache_spec`,
``compile_batch``'s arguments), from abstract parameters, so nothing is allocated; the caller
places every input on its target's devices (:func:`place`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["PlannedProgram", "evaluate_programs", "place"]


@dataclasses.dataclass
class PlannedProgram:
    """One program: its ``name``, its ``jax.jit``, positional abstract ``args`` and static
    ``kwargs``; ``step_depth``: how many loops of unknown trip count enclose one step (the batch
    program: 1, its loop of steps; the single-request program: 2, windows then passes; 0: the
    program runs once, no step); ``batch``: requests a step serves; ``weight_args``,
    ``cache_args``: indices of the parameter and KV cache arguments."""

    name: str
    jitted: Any
    args: tuple
    kwargs: dict
    step_depth: int
    batch: int
    weight_args: tuple[int, ...] = (0,)
    cache_args: tuple[int, ...] = (1,)


def evaluate_programs(cfg, params_spec, decode, *, prompt_tokens: int, batch_size: int,
                      layout=None, batch_programs: bool = False,
                      shapes: str | None = None) -> tuple[list[PlannedProgram], Any]:
    """The programs evaluate compiles for a suite whose longest prompt has ``prompt_tokens``
    tokens, and the bucket they share. ``layout``: a :class:`alodlm_jax.decode.layout.Layout`
    (a mesh), or None for one device. ``batch_programs``: the batch and admit programs even at
    batch 1 (what ``CompiledEngine.generate_batch`` runs there). ``shapes``: the programs' shape
    policy (:mod:`alodlm_jax.network.rows`; the engine picks it from its platform, which for a target
    compiled deviceless is not this process's, so the caller names it)."""
    from alodlm_jax.decode import batched
    from alodlm_jax.decode import compiled as C
    from alodlm_jax.decode.layout import ONE_DEVICE

    layout = layout or ONE_DEVICE
    engine = C.CompiledEngine(cfg, params_spec, decode, [], batch_size=batch_size,
                              measure_prefill=False, layout=layout, shapes=shapes)
    shapes = engine.shapes
    params = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        params_spec)
    consts = layout.spec(jax.eval_shape(engine.consts))
    i32 = layout.spec(jax.ShapeDtypeStruct((), jnp.int32))
    if batch_size == 1 and not batch_programs:
        bucket = engine.bucket_for(prompt_tokens)
        cache = engine.cache_spec(bucket, batched=False)
        prompt = layout.spec(jax.ShapeDtypeStruct((bucket.prompt_bucket,), jnp.int32))
        single = C.JIT["single"]
        prefill = C.JIT["prefill"]
        statics = dict(cfg=cfg, window_size=bucket.window_size, mode=decode.mode,
                       capacity=bucket.capacity, shapes=shapes)
        return [PlannedProgram("single", layout.jit(single), (params, cache, prompt, i32, consts),
                               statics, step_depth=2, batch=1),
                PlannedProgram("prefill", layout.jit(prefill), (params, cache, prompt),
                               {"cfg": cfg, "shapes": shapes}, step_depth=0, batch=1)], bucket
    bucket = engine.bucket_for(prompt_tokens, batch=batch_size)
    cache = engine.cache_spec(bucket, batched=True)
    slots = jax.eval_shape(lambda: batched.new_slots(engine, bucket))
    slots = layout.spec(slots, layout.slots_shardings(slots))
    prompt = layout.spec(jax.ShapeDtypeStruct((bucket.prompt_bucket,), jnp.int32))
    flag = layout.spec(jax.ShapeDtypeStruct((), jnp.bool_))
    return [PlannedProgram("batch", layout.jit(batched.JIT["batch"]),
                           (params, cache, slots, consts, flag),
                           dict(cfg=cfg, window_size=bucket.window_size, mode=decode.mode,
                                shapes=shapes),
                           step_depth=1, batch=batch_size),
            PlannedProgram("admit", layout.jit(batched.JIT["admit"]),
                           (params, cache, slots, i32, prompt, i32, consts),
                           dict(cfg=cfg, window_size=bucket.window_size, capacity=bucket.capacity,
                                shapes=shapes),
                           step_depth=0, batch=batch_size)], bucket


def place(tree, device):
    """Abstract values of ``tree`` on ``device`` (a compile-only device of a target) wherever they
    carry no sharding yet."""
    sharding = jax.sharding.SingleDeviceSharding(device)

    def put(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding or sharding)

    return jax.tree_util.tree_map(put, tree)
