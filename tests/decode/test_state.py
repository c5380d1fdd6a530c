"""Unit tests of the pure window-state functions (decode/state.py) on hand-made inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.decode import state as S

MASK = 3
W = 8


def window(tokens, is_mask, exits=None, halts=None, rows=W):
    n = len(tokens)
    pad = rows - n
    return S.Window(
        tokens=jnp.asarray(list(tokens) + [MASK] * pad, jnp.int32),
        is_mask=jnp.asarray(list(is_mask) + [False] * pad),
        exit=jnp.asarray(list(exits or [0] * n) + [0] * pad, jnp.int32),
        halt=jnp.asarray(list(halts or [0.0] * n) + [0.0] * pad, jnp.float32),
        length=jnp.asarray(n, jnp.int32),
    )


def test_leading_prefix():
    assert int(S.leading_prefix(window([5, 6, MASK, 7], [False, False, True, False]))) == 2
    assert int(S.leading_prefix(window([5, 6], [False, False]))) == 2
    assert int(S.leading_prefix(window([MASK, 6], [True, False]))) == 0
    assert int(S.leading_prefix(window([], []))) == 0


def test_pack_window_is_a_stable_partition():
    w = window([MASK, 5, MASK, 7, MASK], [True, False, True, False, True])
    packed = S.pack_window(w, 10, mask_id=MASK)
    assert packed.order[:5].tolist() == [1, 3, 0, 2, 4]
    assert packed.ids[:5].tolist() == [5, 7, MASK, MASK, MASK]
    assert packed.positions[:5].tolist() == [11, 13, 10, 12, 14]
    assert packed.is_mask.tolist() == [False, False, True, True, True, False, False, False]
    assert packed.valid.tolist() == [True] * 5 + [False] * 3
    assert sorted(packed.order.tolist()) == list(range(W))


def test_position_penalty_is_anchored_at_the_leftmost_mask():
    w = window([5, MASK, 7, MASK, MASK], [False, True, False, True, True])
    pst = S.init_pass_state(S.pack_window(w, 0, mask_id=MASK), 0.5)
    # packed: 5 (idx 0), 7 (idx 2), masks idx 1, 3, 4 -> offsets 0, 2, 3
    assert pst.penalty[:5].tolist() == [0.0, 0.0, 0.0, 1.0, 1.5]


def _masks(n, rows=W):
    w = window([MASK] * n, [True] * n, rows=rows)
    return S.init_pass_state(S.pack_window(w, 0, mask_id=MASK), 0.0)


def _decide(pst, entropy, hazard, s=0, q=0.5, tau=0.4, mode="entropy", pred=None):
    pad = lambda x, fill: jnp.asarray(list(x) + [fill] * (W - len(x)), jnp.float32)  # noqa: E731
    pred = jnp.asarray((pred or list(range(10, 10 + W)))[:W], jnp.int32)
    return S.decide_pass(pst, pred, pad(entropy, 9.0), pad(hazard, 0.0), s, q=q, tau=tau,
                         mode=mode, max_depth=4)


def test_entropy_commit_is_strict_and_survival_covers_committed_rows():
    pst = _masks(3)
    tau = float(np.float32(0.4))
    new, stop = _decide(pst, [0.1, tau, 0.5], [0.5, 0.5, 0.5], tau=0.4, q=0.9)
    assert new.committed[:3].tolist() == [True, False, False]  # A == tau does not commit
    assert new.tok[0] == 10 and new.exit[0] == 1 and new.newly[:3].tolist() == [True, False, False]
    assert new.survival[:3].tolist() == [0.5, 0.5, 0.5]
    assert not bool(stop)  # mean over uncommitted of 1-S = 0.5 < 0.9
    new2, stop2 = _decide(new, [9.0, 9.0, 9.0], [0.2, 0.2, 0.2], s=1, q=0.59)
    assert new2.survival[0] == np.float32(0.5) * np.float32(0.8)  # committed rows keep updating
    assert new2.newly[:3].tolist() == [False, False, False]
    assert bool(stop2)  # 1 - 0.4 = 0.6 >= 0.59
    assert new2.halt1[:3].tolist() == [0.5, 0.5, 0.5]  # first-pass hazard kept


def test_stop_mean_uses_rows_uncommitted_after_this_pass():
    pst = _masks(2)
    # row 0 commits now with a huge CDF; row 1 remains with CDF 0.1 -> no stop at q=0.5
    new, stop = _decide(pst, [0.0, 9.0], [0.99, 0.1], q=0.5)
    assert not bool(stop)


def test_left1_commits_the_leftmost_uncommitted_mask():
    w = window([5, MASK, MASK, MASK], [False, True, True, True])
    pst = S.init_pass_state(S.pack_window(w, 0, mask_id=MASK), 0.0)
    new, _ = _decide(pst, [0.0, 9.0, 0.0, 0.0], [0.1] * 4, mode="left1", q=1.0)
    assert new.committed[:4].tolist() == [False, True, False, False]
    new, _ = _decide(new, [0.0] * 4, [0.1] * 4, s=1, mode="left1", q=1.0)
    assert new.committed[:4].tolist() == [False, True, True, False]
    assert new.exit[:4].tolist() == [0, 1, 2, 0]


def test_fallback_only_when_nothing_committed_and_lowest_index_on_ties():
    pst = _masks(3)
    new, stop = _decide(pst, [2.0, 1.0, 1.0], [0.9, 0.9, 0.9], q=0.5)
    assert bool(stop)
    assert new.committed[:3].tolist() == [False, True, False]  # argmin, first of the tie
    assert new.exit[1] == 1
    # something committed earlier -> no fallback at the stop pass
    first, _ = _decide(pst, [0.0, 9.0, 9.0], [0.1, 0.1, 0.1], q=0.9)
    later, stop = _decide(first, [9.0, 1.0, 2.0], [0.9, 0.9, 0.9], s=1, q=0.5)
    assert bool(stop) and later.committed[:3].tolist() == [True, False, False]


def test_last_pass_always_stops():
    pst = _masks(2)
    _, stop = _decide(pst, [9.0, 9.0], [0.0, 0.0], s=3, q=1.0)
    assert bool(stop)


def _state(w, cache_len=10, capacity=16):
    st = S.DecodeState.initial(rows=W, capacity=capacity, mask_id=MASK, cache_len=cache_len)
    return st.replace(window=w)


def test_begin_window_finish_test_emits_up_to_the_stop_id():
    w = window([5, 2, 7, MASK], [False, False, False, True], exits=[1, 2, 3, 0], halts=[.1, .2, .3, 0])
    st = S.begin_window(_state(w), window_size=4, max_new_tokens=20,
                        stop_ids=S.stop_id_vector([2]), mask_id=MASK)
    assert bool(st.finished) and bool(st.hit_stop)
    assert int(st.num_generated) == 1
    assert st.out_tokens[:1].tolist() == [5] and st.out_exit[:1].tolist() == [1]


def test_begin_window_budget_finish_and_capped_top_up():
    w = window([5, 6, MASK], [False, False, True])
    st = _state(w).replace(num_generated=jnp.asarray(17, jnp.int32))
    done = S.begin_window(st, window_size=4, max_new_tokens=19, stop_ids=S.stop_id_vector([]),
                          mask_id=MASK)
    assert bool(done.finished) and not bool(done.hit_stop) and int(done.num_generated) == 19
    st = _state(w).replace(num_generated=jnp.asarray(10, jnp.int32))
    grown = S.begin_window(st, window_size=4, max_new_tokens=15, stop_ids=S.stop_id_vector([2]),
                           mask_id=MASK)
    # prefix 2, desired = min(4, 15 - 10 - 2) = 3 -> 5 entries
    assert not bool(grown.finished) and int(grown.window.length) == 5 and int(grown.prefix) == 2
    assert grown.window.is_mask[:5].tolist() == [False, False, True, True, True]


def test_end_window_persists_records_and_drops():
    w = window([5, MASK, 8, MASK], [False, True, False, True], exits=[2, 0, 1, 0],
               halts=[.5, 0, .25, 0])
    st = S.begin_window(_state(w, capacity=16), window_size=2, max_new_tokens=30,
                        stop_ids=S.stop_id_vector([2]), mask_id=MASK)
    packed = S.pack_window(st.window, st.cache_len, mask_id=MASK)
    pst = S.init_pass_state(packed, 0.0)
    # packed order: 5, 8, then masks at window 1 and 3; commit the mask at window index 3 only
    pst = pst.replace(committed=pst.is_mask & (packed.order == 3),
                      tok=jnp.full((W,), 42, jnp.int32), exit=jnp.full((W,), 3, jnp.int32),
                      halt1=jnp.full((W,), 0.75, jnp.float32))
    end = S.end_window(st, packed, pst, 3)
    assert int(end.cache_len) == 11 and int(end.num_generated) == 1
    assert end.out_tokens[:1].tolist() == [5] and end.out_exit[:1].tolist() == [2]
    assert int(end.outer_steps) == 1 and int(end.recurrent_passes) == 3
    assert int(end.loop_token_passes) == 4 * 3
    assert int(end.window.length) == 3
    assert end.window.tokens[:3].tolist() == [MASK, 8, 42]
    assert end.window.is_mask[:3].tolist() == [True, False, False]
    assert end.window.exit[:3].tolist() == [0, 1, 3]
    assert end.window.halt[:3].tolist() == [0.0, 0.25, 0.75]


def test_decisions_vmap_and_jit():
    """The compiled engine batches these functions: they must vmap and jit unchanged."""
    pst = _masks(3)
    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), pst)
    entropy = jnp.asarray([[0.1] + [9.0] * (W - 1), [9.0] * W], jnp.float32)
    hazard = jnp.full((2, W), 0.3, jnp.float32)
    pred = jnp.tile(jnp.arange(W, dtype=jnp.int32), (2, 1))
    fn = jax.jit(jax.vmap(lambda p, e, h, t: S.decide_pass(p, t, e, h, 0, q=0.5, tau=0.4,
                                                           mode="entropy", max_depth=4)))
    new, stop = fn(batch, entropy, hazard, pred)
    assert new.committed[:, :3].tolist() == [[True, False, False], [False, False, False]]
    assert stop.tolist() == [False, False]


def test_greedy_tokens_is_argmax_with_ties_and_infinities():
    rng = np.random.default_rng(0)
    logits = rng.integers(-3, 4, size=(64, 40)).astype(np.float32)  # many ties: the first index wins
    logits[5] = -np.inf
    logits[6, 7] = np.inf
    logits[7, 3] = logits[7, 30] = np.inf
    got = np.asarray(S.greedy_tokens(jnp.asarray(logits)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argmax(logits, axis=-1))
    batched = logits.reshape(4, 16, 40)
    np.testing.assert_array_equal(np.asarray(S.greedy_tokens(jnp.asarray(batched))), np.argmax(batched, -1))
