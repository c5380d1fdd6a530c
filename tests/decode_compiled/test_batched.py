"""Batched decoding with continuous batching: each request's outputs equal decoding it alone.

Tokens, exit depths, counters, stop reasons and token-layer counters must be identical. The fp32
first-pass hazards are compared to 1e-6: a batch multiplies the rows of all its slots at once and
shares one attention and row bucket, and XLA:CPU's matrix kernels do not promise bitwise row
results independent of the row count (measured: last-bit differences in some shapes), so only
rounding-level differences are accepted.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.kernels import window as WK
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import programs
from alodlm_jax.decode.compiled import CompiledEngine
from alodlm_jax.decode.scheduler import BATCH_TIMING
from alodlm_jax.decode.window import TRACE_COUNTS
from alodlm_jax.decode.result import RESULT_KEYS

from .cases import observable

PROMPTS = [[4, 7, 8, 9], [5, 6, 7, 8, 9, 10, 11], [9, 9, 9], list(range(13, 27)), [7]]


def _exact(out) -> dict:
    obs = observable(out)
    obs.pop("first_pass_halt_probabilities")
    return obs


def _assert_same(wanted, got) -> None:
    """Each of ``got`` decoded as ``wanted``: exact but for the hazards' rounding (docstring)."""
    for want, out in zip(wanted, got, strict=True):
        assert _exact(out) == _exact(want)
        np.testing.assert_allclose(out.first_pass_halt_probabilities,
                                   want.first_pass_halt_probabilities, rtol=0, atol=1e-6)


def _engine(checkpoints, batch_size: int, mode: str = "entropy"):
    cfg, params = checkpoints.get("sandwich", 1, 24.0)
    decode = DecodeConfig(q=0.5, tau=2.5, window_size=4, max_new_tokens=24, mode=mode)
    # Token 23 appears early in the last request's output (seen on this checkpoint): that request
    # ends with "eos" after a few windows while the others continue.
    return CompiledEngine(cfg, params, decode, [2, 23], batch_size=batch_size, measure_prefill=False)


def test_batch_equals_single_requests(checkpoints):
    engine = _engine(checkpoints, batch_size=3)
    singles = [engine.generate(p) for p in PROMPTS]
    before_batch, before_admit = TRACE_COUNTS["batch"], TRACE_COUNTS["admit"]
    t0 = time.perf_counter()
    batched = engine.generate_batch(PROMPTS)  # 3 slots, 5 requests: two wait for a free slot
    elapsed = time.perf_counter() - t0
    assert TRACE_COUNTS["batch"] - before_batch <= 1 and TRACE_COUNTS["admit"] - before_admit <= 1

    assert len(batched) == len(PROMPTS)
    assert {s.stop_reason for s in singles} == {"eos", "length"}
    assert len({len(s.token_ids) for s in singles}) > 1
    _assert_same(singles, batched)
    # Windows are not synchronized across requests: each step runs one pass of every live request,
    # so a request is live for exactly its own passes (no step waits for a slower window).
    assert engine.last_live_steps == {i: s.recurrent_passes for i, s in enumerate(singles)}
    assert len({s.recurrent_passes / s.outer_steps for s in singles}) > 1  # windows differ in depth
    # Timing: every execution is charged to the requests in it, so the sum is the measured time.
    assert "continuous batching" in BATCH_TIMING
    total = sum(o.wall_seconds for o in batched)
    assert 0 < total <= elapsed
    assert all(0 < o.prefill_seconds < o.wall_seconds for o in batched)

    dicts = engine.generate_batch(PROMPTS[:2], text=lambda ids: " ".join(map(str, ids)))
    assert [tuple(d) for d in dicts] == [RESULT_KEYS] * 2
    assert dicts[0]["token_ids"] == singles[0].token_ids


def test_finished_requests_are_replaced_by_waiting_ones(checkpoints):
    """A finished request's slot takes the next waiting request while the other slot is still
    decoding (no waiting for the slowest request of a group); results still come in input order."""
    engine = _engine(checkpoints, batch_size=2)
    singles = [engine.generate(p) for p in PROMPTS]
    stream = engine.generate_stream(PROMPTS)
    first = next(stream)  # yielded as soon as it is complete, before the rest is decoded
    assert _exact(first) == _exact(singles[0])
    assert any(event == "admit" for event, _, _ in engine.last_schedule)
    rest = list(stream)
    assert [_exact(o) for o in rest] == [_exact(s) for s in singles[1:]]

    events = engine.last_schedule
    assert [i for event, _, i in events if event == "admit"] == [0, 1, 2, 3, 4]
    assert sorted(i for event, _, i in events if event == "done") == [0, 1, 2, 3, 4]
    first_done = next(k for k, e in enumerate(events) if e[0] == "done")
    freed_slot = events[first_done][1]
    other = [i for event, b, i in events[:first_done] if event == "admit" and b != freed_slot][-1]
    # Request 2 goes into the freed slot right away, before the other slot's request is done.
    assert events[first_done + 1] == ("admit", freed_slot, 2)
    assert events.index(("admit", freed_slot, 2)) < next(k for k, e in enumerate(events)
                                                        if e[0] == "done" and e[2] == other)
    assert engine.generate_batch([]) == []


@pytest.mark.parametrize("batch_size, mode", [
    (2, "left1"), pytest.param(1, "entropy", marks=pytest.mark.slow),
    pytest.param(5, "entropy", marks=pytest.mark.slow), pytest.param(4, "left1", marks=pytest.mark.slow),
    pytest.param(1, "left1", marks=pytest.mark.slow), pytest.param(8, "entropy", marks=pytest.mark.slow),
])
def test_every_batch_size_and_mode_equals_single_requests(checkpoints, batch_size, mode):
    """The packed-row step (each step multiplies only the live requests' valid rows, the prelude
    only for opening windows, completion only for stopping ones) changes no request's outputs,
    whatever the batch size (more slots than requests included) and the mode."""
    engine = _engine(checkpoints, batch_size=batch_size, mode=mode)
    singles = [engine.generate(p) for p in PROMPTS]
    batched = engine.generate_batch(PROMPTS)
    _assert_same(singles, batched)
    assert engine.last_live_steps == {i: s.recurrent_passes for i, s in enumerate(singles)}


@pytest.mark.parametrize("mode", ["entropy", "left1"])
def test_fixed_shapes_equal_bucketed(checkpoints, mode):
    """The accelerators' shape policy (one row shape, in-order lanes, attention over the whole
    cache: no switch), forced here on the CPU, decodes every request as the CPU's buckets do, alone
    and in a batch whose requests come and go."""
    cfg, params = checkpoints.get("sandwich", 1, 24.0)
    decode = DecodeConfig(q=0.5, tau=2.5, window_size=4, max_new_tokens=24, mode=mode)
    bucketed = CompiledEngine(cfg, params, decode, [2, 23], batch_size=3, measure_prefill=False)
    fixed = CompiledEngine(cfg, params, decode, [2, 23], batch_size=3, measure_prefill=False,
                           shapes="fixed")
    assert bucketed.shapes == "bucketed"  # the CPU's own policy
    reference = [bucketed.generate(p) for p in PROMPTS]
    alone = [fixed.generate(p) for p in PROMPTS[:2]]
    together = fixed.generate_batch(PROMPTS)
    _assert_same(reference[:2] + reference, alone + together)
    assert fixed.last_live_steps == {i: s.recurrent_passes for i, s in enumerate(reference)}
    with pytest.raises(ValueError, match="shapes must be one of"):
        CompiledEngine(cfg, params, decode, [2], shapes="ragged")


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_kernel_attention_equals_bucketed(checkpoints, monkeypatch, backend):
    """One TPU's or GPU's policy (FIXED's shapes, attention in the Pallas kernel, run here by
    Pallas's interpreter; the GPU's walks each prefix in parts, its batch being small: here of
    8-slot blocks, one or more each, so that these short prompts' prefixes span several) decodes
    single requests (the kernel as a batch of one) and a batch whose requests come and go as the
    CPU's buckets do."""
    if backend == "gpu":
        monkeypatch.setattr(WK, "GPU_BLOCK_SLOTS", 8)
        monkeypatch.setattr(WK, "GPU_RUN_BLOCKS", 1)
    cfg, params = checkpoints.get("sandwich", 1, 24.0)
    decode = DecodeConfig(q=0.5, tau=2.5, window_size=4, max_new_tokens=24, mode="entropy")
    bucketed = CompiledEngine(cfg, params, decode, [2, 23], batch_size=3, measure_prefill=False)
    kernel = CompiledEngine(cfg, params, decode, [2, 23], batch_size=3, measure_prefill=False,
                            shapes="fixed-kernel")
    reference = [bucketed.generate(p) for p in PROMPTS]
    traced = []  # (batch, rows) of each kernel call traced: single requests are a batch of one
    attention = WK.window_attention
    programs.PROGRAMS.clear()  # traced here, not taken from the other backend's case
    monkeypatch.setattr(WK, "window_attention", lambda q, *a, **k: (
        traced.append(q.shape[:2]), attention(q, *a, **dict(k, backend=backend)))[1])
    alone = [kernel.generate(p) for p in PROMPTS[:2]]
    assert (1, 2 * decode.window_size) in traced
    _assert_same(reference[:2] + reference, alone + kernel.generate_batch(PROMPTS))
    assert kernel.last_live_steps == {i: s.recurrent_passes for i, s in enumerate(reference)}


def _poisoned(engine, value: float):
    """``engine`` whose fresh caches hold ``value`` in every slot (what a reused slot may hold:
    anything its previous request or nothing wrote there)."""
    take = engine.take_cache

    def poisoned(bucket, batched):
        key, cache = take(bucket, batched)
        return key, jax.tree_util.tree_map(lambda x: jnp.full(x.shape, value, x.dtype), cache)

    engine.take_cache = poisoned
    return engine


@pytest.mark.parametrize("shapes,value", [
    ("bucketed", float("nan")), ("fixed", float("inf")),
    pytest.param("fixed-kernel", float("nan"), marks=pytest.mark.slow),
    pytest.param("bucketed", float("-inf"), marks=pytest.mark.slow),
])
def test_slots_a_request_does_not_see_change_nothing(checkpoints, shapes, value):
    """A request's outputs depend only on the cache slots it wrote and sees: with every slot of
    fresh caches holding NaN or inf (the masked slots' probabilities are zeros, and 0 * inf is
    NaN), single requests and a batch whose requests come and go decode as with zeroed caches."""
    cfg, params = checkpoints.get("sandwich", 1, 24.0)
    decode = DecodeConfig(q=0.5, tau=2.5, window_size=4, max_new_tokens=24, mode="left1")
    clean = CompiledEngine(cfg, params, decode, [2, 23], batch_size=3, measure_prefill=False,
                           shapes=shapes)
    reference = [clean.generate(p) for p in PROMPTS]
    dirty = _poisoned(CompiledEngine(cfg, params, decode, [2, 23], batch_size=3,
                                     measure_prefill=False, shapes=shapes), value)
    alone = [dirty.generate(p) for p in PROMPTS[:2]]
    together = dirty.generate_batch(PROMPTS)
    _assert_same(reference[:2] + reference, alone + together)


def test_the_admit_program_compiles_beside_the_batch_program(checkpoints, monkeypatch):
    """A first batch run waits for the longer of its two compiles, not their sum: the batch and
    admit programs compile at the same time (each waits, bounded, at a barrier the other must
    reach while it is still compiling), and the batch then decodes as single requests do."""
    cfg, params = checkpoints.get("sandwich", 1, 24.0)
    decode = DecodeConfig(q=0.5, tau=2.5, window_size=4, max_new_tokens=12, mode="entropy")
    engine = CompiledEngine(cfg, params, decode, [2, 23], batch_size=2, measure_prefill=False)
    reference = [engine.generate(p) for p in PROMPTS[:2]]
    together = threading.Barrier(2, timeout=60)
    compiled = []
    get = engine.get_executable

    def meeting(name, *args):
        together.wait()  # BrokenBarrierError if the other program is not compiling meanwhile
        compiled.append(name)
        return get(name, *args)

    monkeypatch.setattr(engine, "get_executable", meeting)
    _assert_same(reference, engine.generate_batch(PROMPTS[:2]))
    assert sorted(compiled) == ["admit", "batch"]


def test_a_step_budget_moves_no_token(checkpoints):
    """With a step budget the batch program returns to the host every few steps (the server's
    online admission and streaming) and the next execution continues from its carry: every output
    equals the unbudgeted batch's, a budget of one step (a return after every pass) included."""
    engine = _engine(checkpoints, batch_size=2)
    singles = [engine.generate(p) for p in PROMPTS]
    before = TRACE_COUNTS["batch"]
    whole = engine.generate_batch(PROMPTS)
    for budget in (1, 3):
        budgeted = engine.generate_batch(PROMPTS, step_budget=budget)
        assert [_exact(o) for o in budgeted] == [_exact(o) for o in whole]
        _assert_same(singles, budgeted)
        assert engine.last_live_steps == {i: s.recurrent_passes for i, s in enumerate(singles)}
    assert TRACE_COUNTS["batch"] - before <= 1  # the budget is an operand: one program
    with pytest.raises(ValueError, match="step_budget"):
        engine.consts(step_budget=0)
