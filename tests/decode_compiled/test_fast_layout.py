"""Both engines on per-layer weights (the layout ``Generator.load`` uses) and a cache large enough
for more than one attention bucket: still identical to each other, and the same decoding as the
stacked layout (tokens, exit depths, counters; hazards to fp32 rounding)."""

from __future__ import annotations

import numpy as np
import pytest

from alodlm_jax import model as M
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.compiled import Bucket, CompiledEngine
from alodlm_jax.decode.portable import PortableEngine

from .cases import observable

PROMPT = [5, 9, 13, 21, 34, 55, 8, 3, 1, 2, 4, 6, 10, 12, 14, 16]


@pytest.mark.parametrize("topology", ["sandwich", "all_layer"])
@pytest.mark.parametrize("mode", ["entropy", "left1"])
def test_per_layer_engines_identical_across_attention_buckets(checkpoints, topology, mode):
    cfg, stacked = checkpoints.get(topology, 1, 6.0)
    per_layer = M.unstack_layers(stacked)
    decode = DecodeConfig(q=0.5, tau=2.0, window_size=4, max_new_tokens=56, mode=mode)
    bucket = Bucket.for_request(len(PROMPT), decode)
    assert len(M.kv_buckets(bucket.t_max)) > 1  # the window's attention switches buckets on the way

    portable = PortableEngine(cfg, per_layer, decode, []).generate(PROMPT)
    compiled = CompiledEngine(cfg, per_layer, decode, [], measure_prefill=False).generate(PROMPT)
    assert observable(compiled) == observable(portable)
    # No stop ids: all 56 tokens, so the last windows start at slot >= 16 + 56 - 8 and need more
    # than the first bucket's 64 slots.
    assert len(portable.token_ids) == 56 and M.kv_buckets(bucket.t_max)[0] == 64

    reference = PortableEngine(cfg, stacked, decode, []).generate(PROMPT)
    same = observable(reference)
    got = observable(portable)
    hazards = (got.pop("first_pass_halt_probabilities"), same.pop("first_pass_halt_probabilities"))
    assert got == same
    np.testing.assert_allclose(*hazards, atol=1e-6, rtol=0)
