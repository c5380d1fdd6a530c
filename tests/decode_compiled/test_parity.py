"""The compiled engine reproduces the portable engine exactly (fp32), on random cases.

Both engines share the model and decision functions, so every observable must be identical:
tokens, exit depths, the exact fp32 first-pass hazards, the three §6.6 counters, the stop reason
and the §9.2 token-layer counters.
"""

from __future__ import annotations

import pytest

from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.decode.window import TRACE_COUNTS, Bucket
from alodlm_jax.decode.portable import PortableEngine
from .cases import make_cases, observable

DEFAULT_CASES = make_cases(20, seed=2024, modes=("entropy", "left1"))
# The slow sweep also varies the window size (a static shape: more compiled programs).
SLOW_CASES = make_cases(240, seed=7, window_sizes=(1, 4, 8), checkpoint_seeds=12, min_new=9)


def _run_case(checkpoints, case):
    cfg, params = checkpoints.get(case.topology, case.seed, case.lm_head_scale)
    stop_ids = list(case.stop_ids)
    if case.stop_from_output is not None:
        plain = PortableEngine(cfg, params, case.decode, stop_ids).generate(list(case.prompt))
        if plain.token_ids:
            stop_ids.append(plain.token_ids[int(case.stop_from_output * len(plain.token_ids))])
    portable = PortableEngine(cfg, params, case.decode, stop_ids)
    compiled = CompiledEngine(cfg, params, case.decode, stop_ids, measure_prefill=False)
    expected = portable.generate(list(case.prompt))
    got = compiled.generate(list(case.prompt))
    assert observable(got) == observable(expected), case.label()
    return expected


def test_default_sweep_matches_portable(checkpoints):
    """20 random cases (both topologies, both modes) in one test, so the programs compile once."""
    outcomes = []
    for case in DEFAULT_CASES:
        out = _run_case(checkpoints, case)
        outcomes.append((out.stop_reason, len(out.token_ids), max(out.exit_depths, default=0)))
    # The sweep is only meaningful if it covers both endings, multi-pass windows and real output.
    assert {reason for reason, _, _ in outcomes} == {"eos", "length"}
    assert any(depth > 1 for _, _, depth in outcomes)
    assert sum(n for _, n, _ in outcomes) > 100


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: c.label())
def test_slow_sweep_matches_portable(checkpoints, case):
    _run_case(checkpoints, case)


def test_programs_are_reused_per_bucket(checkpoints):
    """Requests of one bucket (prompt lengths in one bucket, any q, tau, stop ids) compile once."""
    from alodlm_jax.config import DecodeConfig

    cfg, params = checkpoints.get("sandwich", 0, 6.0)
    first = DecodeConfig(q=0.5, tau=2.0, window_size=4, max_new_tokens=20)
    engine = CompiledEngine(cfg, params, first, [2], measure_prefill=False)
    engine.generate([5, 6, 7])
    before = TRACE_COUNTS["single"]
    engine.generate([9] * 11)
    # A new engine with other runtime settings but the same bucket shares the executable.
    other = DecodeConfig(q=0.9, tau=1.0, window_size=4, max_new_tokens=20, position_penalty=0.3)
    CompiledEngine(cfg, params, other, [2, 7], measure_prefill=False).generate([4] * 16)
    assert TRACE_COUNTS["single"] == before
    assert Bucket.for_request(3, first) == Bucket.for_request(16, other)
    # A different bucket (longer prompt) is a new program.
    engine.generate([4] * 17)
    assert TRACE_COUNTS["single"] == before + 1


def test_request_checks_match_portable(checkpoints):
    from alodlm_jax.config import DecodeConfig

    cfg, params = checkpoints.get("sandwich", 0, 6.0)
    engine = CompiledEngine(cfg, params, DecodeConfig(max_new_tokens=8), [2], measure_prefill=False)
    with pytest.raises(ValueError):
        engine.generate([])
    with pytest.raises(ValueError):
        engine.generate([cfg.vocab_size])
    long = DecodeConfig(max_new_tokens=cfg.max_position_embeddings)
    with pytest.raises(ValueError):
        CompiledEngine(cfg, params, long, [2]).generate([4])
