"""The bounded store of compiled programs (alodlm_jax.decode.programs): least recently used go, and
dropping one really gives its memory maps back (counted in /proc/self/maps)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from alodlm_jax.config import DecodeConfig
from alodlm_jax.data import BUILTINS
from alodlm_jax.decode import programs
from alodlm_jax.decode.programs import ProgramStore


def memory_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


_TIMING = ("wall_seconds", "prefill_seconds", "tokens_per_second")


def _decisions(results: list[dict]) -> list[dict]:
    """Result dicts without their timings."""
    return [{k: v for k, v in r.items() if k not in _TIMING} for r in results]


def _vector_program(n: int):
    return (jax.ShapeDtypeStruct((n,), jnp.float32),), {}


def test_least_recently_used_programs_go_first():
    fn = jax.jit(lambda x: x * 3.0)
    store = ProgramStore(max_programs=3)
    for n in (1, 2, 3):
        _, seconds = store.get(n, fn, lambda n=n: _vector_program(n))
        assert seconds > 0.0
    exe, seconds = store.get(1, fn, lambda: pytest.fail("a stored program is compiled again"))
    assert seconds == 0.0 and float(exe(jnp.ones(1))[0]) == 3.0
    store.get(4, fn, lambda: _vector_program(4))  # over the bound: the oldest two go
    assert [n for n in (1, 2, 3, 4) if n in store] == [1, 4]
    assert store.compiles == 4 and store.evictions == 2
    store.resize(1)
    assert [n for n in (1, 2, 3, 4) if n in store] == [4]


def test_max_programs_must_be_positive():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="--max_compiled_programs"):
            ProgramStore(max_programs=bad)


def _maps_while_compiling(store: ProgramStore, count: int) -> list[int]:
    fn = jax.jit(lambda x: jnp.sin(x) * 2.0 + x.sum())  # a fresh function: nothing cached yet
    counts = []
    for n in range(1, count + 1):
        store.get(n, fn, lambda n=n: _vector_program(n))
        counts.append(memory_maps())
    return counts


def test_dropped_programs_give_their_memory_maps_back():
    # Control: the measurement sees programs that are kept (about 8 maps each on XLA:CPU).
    kept = _maps_while_compiling(ProgramStore(max_programs=10**6), 40)
    assert kept[-1] - kept[7] > 100
    bounded = _maps_while_compiling(ProgramStore(max_programs=4), 40)
    assert bounded[-1] - bounded[7] < (kept[-1] - kept[7]) / 4


def test_engines_stay_within_a_fixed_number_of_maps():
    """More decoding shapes than the bound (three budgets: three compiled-engine buckets) with a
    bound of one program: the map count stops growing after the first (the code before the store
    grew by one program's maps, about 800 for this model, per shape)."""
    from alodlm_jax.decode.compiled import CompiledEngine
    from alodlm_jax.network.params import load_model

    cfg, params = load_model(BUILTINS["builtin:tiny"], "fp32", per_layer=True)
    before = programs.PROGRAMS.max_programs
    programs.PROGRAMS.clear()  # nothing of earlier tests in the count
    programs.set_max_programs(1)
    try:
        counts = [memory_maps()]
        for budget in (4, 20, 40):  # output capacity 16, 32 and 64: a new program each
            engine = CompiledEngine(cfg, params, DecodeConfig(max_new_tokens=budget, window_size=1),
                                    [2], measure_prefill=False)
            engine.generate([4, 5, 6])
            assert engine.compile_seconds > 0.0  # the shape was new
            counts.append(memory_maps())
        assert len(programs.PROGRAMS) == 1
    finally:
        programs.set_max_programs(before)
    one_program = counts[1] - counts[0]
    assert one_program > 200, counts
    assert counts[3] - counts[1] < one_program / 2, counts


@pytest.mark.slow
def test_a_sweep_over_windows_and_budgets_stays_within_a_fixed_number_of_maps():
    """One loaded model, a grid of windows x budgets through ``Generator.with_decode_config`` (the
    sweep's reuse of a loaded model), single requests and batches (four programs a shape) with a
    bound of four programs: the map count levels off after the first shape, and a shape decoded
    again after its programs were dropped gives the same tokens."""
    from alodlm_jax.generate import build_generator

    before = programs.PROGRAMS.max_programs
    programs.PROGRAMS.clear()  # nothing of earlier tests in the count
    programs.set_max_programs(4)
    try:
        base = build_generator(model=BUILTINS["builtin:tiny"], engine="compiled", batch_size=2)
        prompts = ["alpha beta", "gamma"]
        first, counts = None, [memory_maps()]
        for window in (1, 2):
            for budget in (4, 40):
                gen = base.with_decode_config(DecodeConfig(window_size=window, max_new_tokens=budget))
                results = _decisions(gen.generate_batch(prompts) + [gen.generate(prompts[0])])
                first = first or results
                counts.append(memory_maps())
        again = base.with_decode_config(DecodeConfig(window_size=1, max_new_tokens=4))
        assert _decisions(again.generate_batch(prompts) + [again.generate(prompts[0])]) == first
        assert programs.PROGRAMS.evictions > 0
    finally:
        programs.set_max_programs(before)
    one_shape = counts[1] - counts[0]
    assert max(counts[2:]) - counts[1] < one_shape / 2, counts
