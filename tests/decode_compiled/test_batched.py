"""Batched decoding: each request's outputs equal decoding it alone.

Tokens, exit depths, counters, stop reasons and token-layer counters must be identical. The fp32
first-pass hazards are compared to 1e-6: a batch multiplies ``B * W`` rows at once, and XLA:CPU's
matrix kernels do not promise bitwise row results independent of the row count (measured: last-bit
differences in some shapes), so only rounding-level differences are accepted.
"""

from __future__ import annotations

import numpy as np

from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.batched import BATCH_TIMING
from alodlm_jax.decode.compiled import TRACE_COUNTS, CompiledEngine
from alodlm_jax.decode.result import RESULT_KEYS

from .cases import observable


def _exact(out) -> dict:
    obs = observable(out)
    obs.pop("first_pass_halt_probabilities")
    return obs


def test_batch_equals_single_requests(checkpoints):
    cfg, params = checkpoints.get("sandwich", 1, 24.0)
    decode = DecodeConfig(q=0.5, tau=2.5, window_size=4, max_new_tokens=24)
    prompts = [[4, 7, 8, 9], [5, 6, 7, 8, 9, 10, 11], [9, 9, 9], list(range(13, 27)), [7]]
    # Token 23 appears early in the last request's output (seen on this checkpoint): that request
    # ends with "eos" and idles in its batch while the others continue.
    engine = CompiledEngine(cfg, params, decode, [2, 23], batch_size=3, measure_prefill=False)
    singles = [engine.generate(p) for p in prompts]
    before = TRACE_COUNTS["batch"]
    batched = engine.generate_batch(prompts)  # groups of 3: the second group has one idle slot
    assert TRACE_COUNTS["batch"] - before <= 1  # both groups ran the same program

    assert len(batched) == len(prompts)
    assert {s.stop_reason for s in singles} == {"eos", "length"}
    assert len({len(s.token_ids) for s in singles}) > 1
    for alone, together in zip(singles, batched):
        assert _exact(together) == _exact(alone)
        np.testing.assert_allclose(together.first_pass_halt_probabilities,
                                   alone.first_pass_halt_probabilities, rtol=0, atol=1e-6)
    # Timing: the batch's wall time split evenly, so the sum is the elapsed time of both groups.
    assert "batch wall time" in BATCH_TIMING
    first_group = {round(o.wall_seconds, 12) for o in batched[:3]}
    assert len(first_group) == 1

    dicts = engine.generate_batch(prompts[:2], text=lambda ids: " ".join(map(str, ids)))
    assert [tuple(d) for d in dicts] == [RESULT_KEYS] * 2
    assert dicts[0]["token_ids"] == singles[0].token_ids
