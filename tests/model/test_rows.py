"""Packed rows of several requests (model.RowMap): the batch step's row layout."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import rows as R


@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 0, 0, 0], [8, 8, 8, 8], [0, 2, 0, 0]])
def test_row_map_packs_each_requests_rows_in_order(counts):
    batch, rows = len(counts), 8
    size = max(R.row_totals(batch, rows))
    x = jnp.arange(batch * rows * 3, dtype=jnp.float32).reshape(batch, rows, 3) + 1
    m = R.row_map(jnp.asarray(counts), size)
    packed = np.asarray(R.to_rows(x, m))
    expected = [np.asarray(x[b, a]) for b in range(batch) for a in range(counts[b])]
    total = sum(counts)
    np.testing.assert_array_equal(packed[:total], np.asarray(expected).reshape(total, 3))
    assert not packed[total:].any()  # padding rows are zeros
    np.testing.assert_array_equal(np.asarray(m.valid), np.arange(size) < total)
    # Back to the padded layout: each request's rows, the fill elsewhere.
    fill = jnp.full_like(x, -1.0)
    back = np.asarray(R.from_rows(R.to_rows(x, m), m, rows, fill=fill))
    for b in range(batch):
        np.testing.assert_array_equal(back[b, :counts[b]], np.asarray(x[b, :counts[b]]))
        assert (back[b, counts[b]:] == -1).all()


def test_row_totals_cover_a_full_batch_and_an_emptying_one():
    assert R.row_totals(8, 32) == (64, 128, 160, 192, 256)
    assert R.row_totals(1, 8) == (2, 4, 5, 6, 8)
    assert max(R.row_totals(3, 6)) == 18


@pytest.mark.parametrize("counts,lanes", [([3, 0, 5, 1], 3), ([0, 2, 0, 0], 1), ([0, 2, 0, 0], 2),
                                          ([8, 8, 8, 8], 4), ([0, 0, 0, 0], 2)])
def test_lanes_hold_the_requests_with_rows_in_order(counts, lanes):
    batch, rows = len(counts), 8
    size = max(R.row_totals(batch, rows))
    x = jnp.arange(batch * rows * 3, dtype=jnp.float32).reshape(batch, rows, 3) + 1
    m = R.row_map(jnp.asarray(counts), size, lanes)
    with_rows = [b for b in range(batch) if counts[b]]
    assert np.asarray(m.lane)[:len(with_rows)].tolist() == with_rows
    assert np.asarray(m.lane_valid).tolist() == [a < len(with_rows) for a in range(lanes)]
    # Compact rows -> lanes: each lane holds its request's rows, zeros past them and in lanes
    # left over; and back to compact rows unchanged.
    compact = R.to_rows(x, m)
    in_lanes = np.asarray(R.to_lanes(compact, m, rows))
    assert in_lanes.shape == (lanes, rows, 3)
    for a in range(lanes):
        b = with_rows[a] if a < len(with_rows) else None
        n = counts[b] if b is not None else 0
        if b is not None:
            np.testing.assert_array_equal(in_lanes[a, :n], np.asarray(x[b, :n]))
        assert not in_lanes[a, n:].any()
    np.testing.assert_array_equal(np.asarray(R.from_lanes(jnp.asarray(in_lanes), m)), np.asarray(compact))
    # Per-lane values back to their requests; requests without rows get zeros.
    per_lane = jnp.arange(lanes, dtype=jnp.int32) + 10
    expected = [10 + with_rows.index(b) if counts[b] else 0 for b in range(batch)]
    assert np.asarray(R.lanes_to_batch(per_lane, m)).tolist() == expected


def test_step_shapes_bound_the_lanes_and_the_last_holds_every_step():
    assert R.step_shapes(8, 32) == ((64, 4), (128, 8), (160, 8), (192, 8), (256, 8))
    assert R.step_shapes(1, 32) == ((8, 1), (16, 1), (20, 1), (24, 1), (32, 1))
    shapes = R.step_shapes(8, 32)
    pick = lambda counts: shapes[int(R.step_shape_index(shapes, jnp.asarray(counts)))]  # noqa: E731
    assert pick([20, 0, 0, 0, 0, 0, 0, 0]) == (64, 4)  # the tail: one request, half the lanes
    assert pick([16, 16, 16, 16, 0, 0, 0, 0]) == (64, 4)
    # Few rows but more requests than the small shape's lanes: a larger shape, never a wrong one.
    assert pick([8, 8, 8, 8, 8, 0, 0, 0]) == (128, 8)
    assert pick([32] * 8) == (256, 8)
    assert pick([0] * 8) == (64, 4)
    assert pick([33] * 8) == (256, 8)  # nothing holds it: the last shape


@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 2, 0, 0], [0, 0, 0, 0]])
def test_in_order_lanes_hold_each_request_in_its_own_lane(counts):
    """FIXED's lanes: lane b is request b (valid where it has rows), and the lane layout round-trips
    as the compacted lanes do."""
    batch, rows = len(counts), 8
    (size, lanes), = R.step_shapes(batch, rows, R.FIXED)
    assert (size, lanes) == (batch * rows, batch)
    x = jnp.arange(batch * rows * 3, dtype=jnp.float32).reshape(batch, rows, 3) + 1
    m = R.row_map(jnp.asarray(counts), size, lanes, in_order=True)
    assert m.in_order and np.asarray(m.lane).tolist() == list(range(batch))
    assert np.asarray(m.lane_valid).tolist() == [c > 0 for c in counts]
    compact = R.to_rows(x, m)
    in_lanes = np.asarray(R.to_lanes(compact, m, rows))
    for b in range(batch):
        np.testing.assert_array_equal(in_lanes[b, :counts[b]], np.asarray(x[b, :counts[b]]))
        assert not in_lanes[b, counts[b]:].any()
    np.testing.assert_array_equal(np.asarray(R.from_lanes(jnp.asarray(in_lanes), m)),
                                  np.asarray(compact))
    per_lane = jnp.arange(batch, dtype=jnp.int32) + 10
    assert np.asarray(R.lanes_to_batch(per_lane, m)).tolist() == [
        10 + b if counts[b] else 0 for b in range(batch)]
    np.testing.assert_array_equal(np.asarray(R.by_lane(per_lane, m)), np.asarray(per_lane))
    with pytest.raises(ValueError, match="one lane per request"):
        R.row_map(jnp.asarray(counts), size, batch - 1, in_order=True)


def test_each_platform_has_its_shape_policy_and_layer_layout():
    from alodlm_jax.network.params import per_layer_weights

    assert R.shapes_for("cpu") == R.shapes_for("cpu", 4) == R.BUCKETED
    # The attention kernel on one accelerator; a mesh keeps XLA's attention (the kernel is not
    # split across devices).
    assert R.shapes_for("gpu") == R.shapes_for("cuda") == R.shapes_for("tpu") == R.KERNEL
    assert R.shapes_for("gpu", 8) == R.shapes_for("tpu", 4) == R.FIXED
    assert [R.is_fixed(s) for s in R.SHAPES] == [False, True, True]
    assert per_layer_weights("cpu") and per_layer_weights("gpu") and not per_layer_weights("tpu")


def test_fixed_shapes_size_the_cache_to_a_multiple_not_a_power_of_two():
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.decode.window import Bucket

    decode = DecodeConfig(window_size=16, max_new_tokens=4096)
    # A 1,000-token prompt: bucket 1,024, plus 4,096 new tokens and a 32-row window = 5,152 slots.
    assert Bucket.for_request(1000, decode).cache_slots == 8192
    single = Bucket.for_request(1000, decode, slot_multiple=R.FIXED_SLOT_MULTIPLE)
    assert single.cache_slots == single.t_max == 5376
    # A batch adds 32 scratch slots; the whole buffer is the multiple (the TPU kernel's blocks).
    fixed = Bucket.for_request(1000, decode, 8, slot_multiple=R.FIXED_SLOT_MULTIPLE)
    assert fixed.t_max == 5376 and fixed.cache_slots == 5376 - 32
