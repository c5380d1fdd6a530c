"""Packed rows of several requests (model.RowMap): the batch step's row layout."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax import model as M


@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [0, 0, 0, 0], [8, 8, 8, 8], [0, 2, 0, 0]])
def test_row_map_packs_each_requests_rows_in_order(counts):
    batch, rows = len(counts), 8
    size = max(M.row_totals(batch, rows))
    x = jnp.arange(batch * rows * 3, dtype=jnp.float32).reshape(batch, rows, 3) + 1
    m = M.row_map(jnp.asarray(counts), size)
    packed = np.asarray(M.to_rows(x, m))
    expected = [np.asarray(x[b, a]) for b in range(batch) for a in range(counts[b])]
    total = sum(counts)
    np.testing.assert_array_equal(packed[:total], np.asarray(expected).reshape(total, 3))
    assert not packed[total:].any()  # padding rows are zeros
    np.testing.assert_array_equal(np.asarray(m.valid), np.arange(size) < total)
    # Back to the padded layout: each request's rows, the fill elsewhere.
    fill = jnp.full_like(x, -1.0)
    back = np.asarray(M.from_rows(M.to_rows(x, m), m, rows, fill=fill))
    for b in range(batch):
        np.testing.assert_array_equal(back[b, :counts[b]], np.asarray(x[b, :counts[b]]))
        assert (back[b, counts[b]:] == -1).all()


def test_row_totals_cover_a_full_batch_and_an_emptying_one():
    assert M.row_totals(8, 32) == (64, 128, 160, 192, 256)
    assert M.row_totals(1, 8) == (2, 4, 5, 6, 8)
    assert max(M.row_totals(3, 6)) == 18
