"""The packed-row and lane layout of a batch step: several requests' window rows as one matrix.

A batch step (:mod:`alodlm_jax.decode.batched`) runs the network on the valid rows of its live
requests' windows packed together (:class:`RowMap`, :func:`to_rows` / :func:`from_rows`), and
attention and the heads per request in *lanes*, the padded layout of the requests with rows
(:func:`to_lanes` / :func:`from_lanes`, :func:`lanes_to_batch`); :func:`step_shapes` are the
``(rows, lanes)`` shapes a step may take. Pure index arithmetic: no weights here.

Three shape policies (a static argument of the compiled programs, :func:`shapes_for`):

* :data:`BUCKETED` (XLA:CPU): a step runs on the smallest of several row shapes holding its rows
  and attends over the smallest power-of-two part of the cache holding its prefix, each a
  ``lax.switch`` whose every branch is a copy of the network in the program. On a CPU the work
  scales with the rows and slots, so the buckets pay for their compile time.
* :data:`FIXED` (GPUs, TPUs): one row shape (every row of the batch), lane ``b`` holding request
  ``b``, attention over the whole cache buffer (sized to a multiple of :data:`FIXED_SLOT_MULTIPLE`
  slots rather than a power of two): no switch. A weight-bound step on an accelerator costs about
  the same for 64 or 512 rows, and each branch multiplies the compile time (the 1.7B's batch-8
  program for a v5p, layers stacked: 312 s bucketed, 19 s fixed; ``docs/plan.md``).

* :data:`KERNEL` (one GPU or TPU): :data:`FIXED`'s shapes, and every window's attention (a batch
  step's, and a single request's as a batch of one) in a Pallas kernel that reads each request's
  K/V where it lies in the cache
  (:mod:`alodlm_jax.kernels.window`) instead of XLA's copy of each request's prefix (which XLA:TPU
  expands into loops: the 8B's batch-32 step had 33.7k kernels). On a mesh the programs keep
  :data:`FIXED` (the kernel is not partitioned across devices).

All give the same tokens: buckets change only the number of rows of matrix products and the
length of fp32 attention reductions over masked slots (exact zeros), as batching does; the
kernel sums the same softmax in blocks (equal to rounding in fp32, tested in interpret mode).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

BUCKETED = "bucketed"
FIXED = "fixed"
KERNEL = "fixed-kernel"
SHAPES = (BUCKETED, FIXED, KERNEL)
# FIXED's cache: every step attends over every slot, so the slot count is the prompt bucket plus
# the budget plus a window rounded up to a multiple of this (TPU tiles are 8 x 128, GPU blocks 128
# wide) rather than to a power of two (:meth:`alodlm_jax.decode.window.Bucket.for_request`).
FIXED_SLOT_MULTIPLE = 256


def shapes_for(platform: str, devices: int = 1) -> str:
    """The shape policy of the programs compiled for a JAX ``platform`` on ``devices`` devices
    (module docstring): :data:`BUCKETED` on ``"cpu"``, :data:`KERNEL` on one accelerator,
    :data:`FIXED` on several."""
    if platform == "cpu":
        return BUCKETED
    return KERNEL if devices == 1 else FIXED


def is_fixed(shapes: str) -> bool:
    """Whether ``shapes`` is one fixed shape per program (:data:`FIXED`, :data:`KERNEL`)."""
    return shapes != BUCKETED


@struct.dataclass
class RowMap:
    """The valid rows of ``B`` requests' windows packed into ``R`` matrix rows (ragged batching),
    and the requests that have rows in ``A`` attention lanes.

    Request ``b``'s padded window rows ``0 .. count[b]-1`` (layout ``[B, W, ...]``) sit at compact
    rows ``offset[b] .. offset[b]+count[b]-1``, in request order; compact rows past the total are
    padding (``valid`` false). Every row-wise operation (norms, projections, MLP, RoPE) runs on the
    ``R`` compact rows, so a batch step multiplies only the rows its requests need rather than
    ``B`` times the largest window. Attention and the heads, which work per request, run on the
    padded layout of the ``A`` lanes (``[A, W, ...]``): lane ``a`` holds request ``lane[a]``, the
    requests with rows first in request order, so a step with few live requests attends for those
    alone rather than for all ``B`` slots (:func:`step_shapes`).

    Attributes:
      slot, row: int32[R] — the padded position ``(b, a)`` of each compact row (0 for padding).
      valid: bool[R] — a real row.
      offset, count: int32[B] — each request's first compact row and number of rows.
      lane: int32[A] — the request in each lane (0 for a lane left over).
      lane_valid: bool[A] — a lane holding a request with rows.
      lane_of: int32[B] — each request's lane (0 for a request without rows; ``b`` with
        ``in_order``).
      in_order: static — lane ``b`` is request ``b`` (``A == B``; :data:`FIXED`), so attention
        takes lane ``b``'s cache at batch index ``b`` rather than looking its request up (each
        request's depth is still a per-request read, :func:`alodlm_jax.network.attention.attend_in_copy`).
    """

    slot: jax.Array
    row: jax.Array
    valid: jax.Array
    offset: jax.Array
    count: jax.Array
    lane: jax.Array
    lane_valid: jax.Array
    lane_of: jax.Array
    in_order: bool = struct.field(pytree_node=False, default=False)


def row_map(counts: jax.Array, size: int, lanes: int | None = None, *,
            in_order: bool = False) -> RowMap:
    """:class:`RowMap` of ``counts[b]`` rows per request in ``size`` compact rows and ``lanes``
    attention lanes (all ``B`` by default). Needs ``sum(counts) <= size`` and at most ``lanes``
    requests with rows; the caller picks the shape from :func:`step_shapes`. ``in_order``: lane
    ``b`` holds request ``b`` (needs ``lanes == B``), valid where it has rows."""
    counts = jnp.asarray(counts, jnp.int32)
    batch = counts.shape[0]
    lanes = batch if lanes is None else lanes
    ends = jnp.cumsum(counts)
    offset = ends - counts
    r = jnp.arange(size, dtype=jnp.int32)
    slot = jnp.minimum(jnp.sum((ends[None, :] <= r[:, None]).astype(jnp.int32), axis=1), batch - 1)
    valid = r < ends[-1]
    row = jnp.where(valid, r - offset[slot], 0)
    has = counts > 0
    if in_order:
        if lanes != batch:
            raise ValueError(f"in-order lanes need one lane per request ({batch}), not {lanes}")
        order = jnp.arange(batch, dtype=jnp.int32)
        return RowMap(slot=jnp.where(valid, slot, 0), row=row, valid=valid, offset=offset,
                      count=counts, lane=order, lane_valid=has, lane_of=order, in_order=True)
    (lane,) = jnp.nonzero(has, size=lanes, fill_value=0)
    ranks = jnp.cumsum(has.astype(jnp.int32))
    lane_of = jnp.where(has, jnp.minimum(ranks - 1, lanes - 1), 0)
    lane_valid = jnp.arange(lanes, dtype=jnp.int32) < ranks[-1]
    return RowMap(slot=jnp.where(valid, slot, 0), row=row, valid=valid, offset=offset, count=counts,
                  lane=lane.astype(jnp.int32), lane_valid=lane_valid, lane_of=lane_of)


def row_totals(batch: int, rows: int) -> tuple[int, ...]:
    """Compact row counts a batch step runs at: 1/4, 1/2, 5/8, 3/4 and all of ``batch * rows``.

    With every request live a step needs between ``batch * rows / 2`` (each window holds at least
    its ``rows / 2`` masks) and ``batch * rows`` rows, the range the upper four cover as the
    single-request row buckets do (:func:`alodlm_jax.decode.window.row_buckets`); 1/4 serves a
    batch that is emptying."""
    full = batch * rows
    return tuple(sorted({max(1, -(-full * f // 8)) for f in (2, 4, 5, 6, 8)}))


def step_shapes(batch: int, rows: int, shapes: str = BUCKETED) -> tuple[tuple[int, int], ...]:
    """The ``(R, A)`` shapes a batch step runs at, ascending: ``R`` compact rows, ``A`` lanes.
    :data:`FIXED`: one, every row and a lane per request.

    Each of :func:`row_totals`, with as many lanes as it can hold requests of ``rows / 2`` rows
    (every live window's least), and all ``batch`` for the largest. A step takes the first shape
    holding both its rows and its requests with rows (:func:`step_shape_index`), so the lane
    bound is about speed only: the last shape holds every step. A batch that is emptying thus
    attends and runs its heads in half the lanes (the 1/4 row total); a separate shape per lane
    count would save more in the tail but costs compilation (one more copy of the network per
    shape: +53 % compile time for the small bench model at batch 8 with one single-lane shape).
    """
    if is_fixed(shapes):
        return ((batch * rows, batch),)
    totals = row_totals(batch, rows)
    half = max(1, rows // 2)
    return tuple(sorted({(r, min(batch, max(1, r // half))) for r in totals[:-1]}
                        | {(totals[-1], batch)}))


def step_shape_index(shapes: tuple[tuple[int, int], ...], counts: jax.Array) -> jax.Array:
    """Index of the first of ``shapes`` holding ``sum(counts)`` rows and the requests with rows."""
    counts = jnp.asarray(counts, jnp.int32)
    total = jnp.sum(counts)
    requests = jnp.sum((counts > 0).astype(jnp.int32))
    fits = (jnp.asarray([r for r, _ in shapes], jnp.int32) >= total) & \
        (jnp.asarray([a for _, a in shapes], jnp.int32) >= requests)
    fits = fits.at[-1].set(True)
    return jnp.argmax(fits).astype(jnp.int32)


def _compact(x: jax.Array, m: RowMap, slot: jax.Array) -> jax.Array:
    """Padded ``x[slot[r], m.row[r]]`` for each compact row ``r`` (zeros for padding rows)."""
    out = x[slot, m.row]
    return jnp.where(m.valid.reshape((-1,) + (1,) * (out.ndim - 1)), out, jnp.zeros((), x.dtype))


def _padded(x: jax.Array, offset: jax.Array, count: jax.Array, rows: int, fill) -> jax.Array:
    """Compact ``[R, ...]`` -> ``[N, rows, ...]``: entry ``n`` holds compact rows ``offset[n] ..
    offset[n]+count[n]-1``, then ``fill``'s rows."""
    a = jnp.arange(rows, dtype=jnp.int32)
    index = jnp.minimum(offset[:, None] + a[None, :], x.shape[0] - 1)  # [N, rows]
    inside = a[None, :] < count[:, None]
    return jnp.where(inside.reshape(inside.shape + (1,) * (x.ndim - 1)), x[index], fill)


def to_rows(x: jax.Array, m: RowMap) -> jax.Array:
    """Padded ``[B, W, ...]`` -> compact ``[R, ...]`` (padding rows are zeros)."""
    return _compact(x, m, m.slot)


def from_rows(x: jax.Array, m: RowMap, rows: int, fill: jax.Array | None = None) -> jax.Array:
    """Compact ``[R, ...]`` -> padded ``[B, rows, ...]``; rows past a request's count take
    ``fill``'s rows (zeros by default)."""
    return _padded(x, m.offset, m.count, rows, jnp.zeros((), x.dtype) if fill is None else fill)


def to_lanes(x: jax.Array, m: RowMap, rows: int) -> jax.Array:
    """Compact ``[R, ...]`` -> the lanes' padded layout ``[A, rows, ...]`` (zeros past each lane's
    request's rows, and in lanes left over)."""
    count = jnp.where(m.lane_valid, m.count[m.lane], 0)
    return _padded(x, m.offset[m.lane], count, rows, jnp.zeros((), x.dtype))


def from_lanes(x: jax.Array, m: RowMap) -> jax.Array:
    """The lanes' padded layout ``[A, W, ...]`` -> compact ``[R, ...]`` (padding rows are zeros)."""
    return _compact(x, m, m.lane_of[m.slot])


def by_lane(x: jax.Array, m: RowMap) -> jax.Array:
    """Per-request ``[B, ...]`` -> per-lane ``[A, ...]`` (each lane's request's entry)."""
    return x if m.in_order else x[m.lane]


def lanes_to_batch(x: jax.Array, m: RowMap) -> jax.Array:
    """Per-lane ``[A, ...]`` -> per-request ``[B, ...]`` (zeros for requests without rows)."""
    out = x[m.lane_of]
    has = m.count > 0
    return jnp.where(has.reshape((-1,) + (1,) * (out.ndim - 1)), out, jnp.zeros((), x.dtype))
