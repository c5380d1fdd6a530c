"""Both engines on per-layer weights (the ordinary load's layout) and a cache large enough
for more than one attention bucket: still identical to each other, and the same decoding as the
stacked layout (tokens, exit depths, counters; hazards to fp32 rounding)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import model as M
from alodlm_jax.network import cache as KC
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import batched
from alodlm_jax.decode.compiled import Bucket, CompiledEngine
from alodlm_jax.decode.portable import PortableEngine

from .cases import observable

PROMPT = [5, 9, 13, 21, 34, 55, 8, 3, 1, 2, 4, 6, 10, 12, 14, 16]


# One case in the default suite (the released models' topology); the other three are slow.
@pytest.mark.parametrize("topology, mode", [
    ("sandwich", "left1"),
    pytest.param("sandwich", "entropy", marks=pytest.mark.slow),
    pytest.param("all_layer", "entropy", marks=pytest.mark.slow),
    pytest.param("all_layer", "left1", marks=pytest.mark.slow),
])
def test_per_layer_engines_identical_across_attention_buckets(checkpoints, topology, mode):
    cfg, stacked = checkpoints.get(topology, 1, 6.0)
    per_layer = M.unstack_layers(stacked)
    decode = DecodeConfig(q=0.5, tau=2.0, window_size=4, max_new_tokens=56, mode=mode)
    bucket = Bucket.for_request(len(PROMPT), decode)
    assert len(KC.kv_buckets(bucket.t_max)) > 1  # the window's attention switches buckets on the way

    portable = PortableEngine(cfg, per_layer, decode, []).generate(PROMPT)
    compiled = CompiledEngine(cfg, per_layer, decode, [], measure_prefill=False).generate(PROMPT)
    assert observable(compiled) == observable(portable)
    # No stop ids: all 56 tokens, so the last windows start at slot >= 16 + 56 - 8 and need more
    # than the first bucket's 64 slots.
    assert len(portable.token_ids) == 56 and KC.kv_buckets(bucket.t_max)[0] == 64

    reference = PortableEngine(cfg, stacked, decode, []).generate(PROMPT)
    same = observable(reference)
    got = observable(portable)
    hazards = (got.pop("first_pass_halt_probabilities"), same.pop("first_pass_halt_probabilities"))
    assert got == same
    np.testing.assert_allclose(*hazards, atol=1e-6, rtol=0)


def _cache_copies(hlo: str, cache) -> list[str]:
    """Instructions of an optimized HLO module that copy a whole cache buffer."""
    shapes = {",".join(map(str, x.shape)) for x in jax.tree_util.tree_leaves(cache)}
    hits = []
    for line in hlo.split("\n"):
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = f32\[([\d,]+)\]\S* (copy|fusion)\(", line)
        if m and m.group(2) in shapes and (m.group(3) == "copy" or "copy" in m.group(1)):
            hits.append(f"{m.group(1)} f32[{m.group(2)}]")
    return hits


@pytest.mark.parametrize("batch", [1, 2])
def test_decode_programs_never_copy_the_cache(checkpoints, batch):
    """The window forwards run inside ``lax.switch``es (row buckets, attention buckets); XLA copies
    a buffer updated inside a conditional, so the cache must only be read there. A regression
    (e.g. a layer writing its slots inside the switch) shows up as whole-cache copies in the
    optimized program: the row-bucket version of commit 8277d20 had 42 on the small bench model."""
    cfg, stacked = checkpoints.get("sandwich", 1, 6.0)
    per_layer = M.unstack_layers(stacked)
    decode = DecodeConfig(q=0.5, tau=2.0, window_size=4, max_new_tokens=56)
    engine = CompiledEngine(cfg, per_layer, decode, [], measure_prefill=False, batch_size=batch)
    bucket = engine.bucket_for(len(PROMPT), batch=batch)
    if batch == 1:
        hlo = engine.compile_for(bucket).as_text()
        cache = jax.eval_shape(lambda: KC.init_cache(cfg, bucket.t_max, np.float32))
    else:
        run, _ = batched.compile_batch(engine, bucket)
        hlo = run.as_text()
        cache = jax.eval_shape(lambda: jax.tree_util.tree_map(
            lambda x: jnp.broadcast_to(x, (batch,) + x.shape), KC.init_cache(cfg, bucket.t_max, np.float32)))
    assert "conditional" in hlo  # the switches are there
    assert _cache_copies(hlo, cache) == []
