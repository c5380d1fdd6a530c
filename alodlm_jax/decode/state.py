"""Window state and the per-pass decisions of adaptive decoding, as pure fixed-shape jnp functions.

Every function here works on fixed-shape arrays with no Python control flow on traced values, so
the same functions serve the portable engine (one jitted call per pass, a host loop) and the
compiled engine (everything inside ``jax.lax.while_loop``, batched with ``jax.vmap``). Static
arguments are marked as keyword-only Python values (``mode``, ``max_depth``); everything else may
be traced.

Shapes. ``W = 2 * window_size`` is the fixed row count of a window (``W_max`` in
MODEL_AND_DECODING.md §11): the portable window never holds more than the leading committed prefix
(at most ``window_size``) plus ``window_size`` further entries. Unused rows are marked invalid.

Two orders are used (§3):

* **logical order** — :class:`Window`, the outer loop's lists ``tokens, is_mask, win_exit,
  win_halt`` of §6.5, indexed by window index ``0 .. length-1``;
* **packed order** — :class:`Packed` and :class:`PassState`: observed entries first, then masks,
  each ascending by window index, then the invalid rows. Packed row ``a`` is the model row whose K/V
  go to cache slot ``cache_len + a``; ``Packed.order[a]`` is its window index.

Life of one window (the compiled engine runs exactly this sequence inside its loops)::

    dstate, finished = begin_window(dstate, ...)           # §6.5 steps 1-3 (finish test, top-up)
    packed = pack_window(dstate.window, ...)               # §6.5 step 4
    pst = init_pass_state(packed, penalty)                 # §6.3
    for s in range(K):                                     # §6.4
        rows = injection_rows(pst)                         # carry <- E[pst.tok] where rows
        ... core(s), readout, heads: pred, entropy, hazard for every packed row ...
        pst, stop = decide_pass(pst, pred, entropy, hazard, s, ...)
        if stop: break
        ... carry <- FinalNorm(carry) ...
    dstate = end_window(dstate, packed, pst, executed=s + 1)   # §6.5 steps 5-8

All decision arithmetic is fp32, as the reference does it (§8): survival products, the mean of
``1 - S`` over uncommitted rows, adjusted entropies, and comparisons against ``tau`` and ``q``
(scalars cast to fp32 first, as PyTorch casts a Python scalar against an fp32 tensor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

F32 = jnp.float32
I32 = jnp.int32


@struct.dataclass
class Window:
    """The outer loop's window lists in logical order (§6.5), padded to ``W`` rows.

    Attributes:
      tokens: int32[W] — committed token id, or the mask id for a mask entry.
      is_mask: bool[W] — True for an entry still masked (invalid rows are False).
      exit: int32[W] — recorded 1-based exit depth of a committed entry (0 for masks / prompt).
      halt: float32[W] — recorded first-pass hazard of the window where the entry committed.
      length: int32[] — number of valid entries; rows ``>= length`` are padding.
    """

    tokens: jax.Array
    is_mask: jax.Array
    exit: jax.Array
    halt: jax.Array
    length: jax.Array

    @classmethod
    def empty(cls, rows: int, mask_id: int) -> "Window":
        return cls(
            tokens=jnp.full((rows,), mask_id, I32),
            is_mask=jnp.zeros((rows,), bool),
            exit=jnp.zeros((rows,), I32),
            halt=jnp.zeros((rows,), F32),
            length=jnp.zeros((), I32),
        )


@struct.dataclass
class Packed:
    """A window in packed order, ready for the model (§3, §6.5 step 4).

    Attributes:
      order: int32[W] — window index of each packed row (a permutation of ``0..W-1``; the invalid
        rows map to the window's padding indices).
      ids: int32[W] — input id per packed row (the mask id for masks; padding rows get ``mask_id``).
      positions: int32[W] — logical RoPE position ``cache_len + window index`` (padding rows get
        ``cache_len + packed row`` so they stay in range).
      valid: bool[W] — row is a real window entry.
      is_mask: bool[W] — row is a real mask entry (the tail of the valid rows).
      num_rows: int32[] — number of valid rows (the window length ``T`` of the counters).
      start: int32[] — the cache slot of packed row 0 (= prefix-cache length ``cache_len``).
      observed, rope: what every pass of the window reads, where an engine made it once when the
        window opened (:func:`alodlm_jax.decode.window.open_window`), else None (each pass makes
        its own): int32[] the number of valid rows that are not masks (:func:`observed_rows`),
        and the model's RoPE tables ``(cos, sin)`` of ``positions``.
    """

    order: jax.Array
    ids: jax.Array
    positions: jax.Array
    valid: jax.Array
    is_mask: jax.Array
    num_rows: jax.Array
    start: jax.Array
    observed: jax.Array | None = None
    rope: tuple | None = None


@struct.dataclass
class PassState:
    """Per-row decision state of one window forward (§6.3), in packed order.

    Only rows with ``is_mask`` take part in decisions; the other rows keep their initial values.

    Attributes:
      committed: bool[W] — mask row committed at some pass of this window.
      newly: bool[W] — committed at the pass just finished (gets ``E[tok]`` injected next pass).
      tok: int32[W] — committed token (greedy prediction at the commit pass).
      exit: int32[W] — 1-based pass of the commit (0 while uncommitted).
      survival: float32[W] — ``S_i = prod_j (1 - lambda_i(j))`` over executed passes.
      halt1: float32[W] — first-pass hazard ``lambda_i(0)``.
      penalty: float32[W] — position penalty ``(m_i - m_0) * penalty``, fixed at window start.
      is_mask: bool[W] — the row is a valid mask row.
    """

    committed: jax.Array
    newly: jax.Array
    tok: jax.Array
    exit: jax.Array
    survival: jax.Array
    halt1: jax.Array
    penalty: jax.Array
    is_mask: jax.Array


@struct.dataclass
class DecodeState:
    """Everything the outer loop carries between windows (§6.5), fixed shapes.

    Attributes:
      window: the current :class:`Window`.
      prefix: int32[] — leading committed entries of the window, computed by :func:`begin_window`
        before the window's forward and persisted/emitted by :func:`end_window`.
      cache_len: int32[] — tokens in the prefix cache (prompt + persisted tokens).
      num_generated: int32[] — tokens emitted so far (``len(generated)``).
      out_tokens, out_exit, out_halt: [C] — emitted tokens, their exit depths and first-pass
        hazards; entries ``>= num_generated`` are meaningless.
      outer_steps, recurrent_passes, loop_token_passes: int32[] — the §6.6 counters.
      window_rows: int32[] — sum of window lengths over window forwards (for §9.2 counters).
      finished: bool[] — the finish test fired; nothing more will run.
      hit_stop: bool[] — decoding ended on a stop id (``stop_reason == "eos"``).
    """

    window: Window
    prefix: jax.Array
    cache_len: jax.Array
    num_generated: jax.Array
    out_tokens: jax.Array
    out_exit: jax.Array
    out_halt: jax.Array
    outer_steps: jax.Array
    recurrent_passes: jax.Array
    loop_token_passes: jax.Array
    window_rows: jax.Array
    finished: jax.Array
    hit_stop: jax.Array

    @classmethod
    def initial(cls, *, rows: int, capacity: int, mask_id: int, cache_len) -> "DecodeState":
        """State after prefill: empty window, ``cache_len`` = prompt length."""
        zero = jnp.zeros((), I32)
        return cls(
            window=Window.empty(rows, mask_id),
            prefix=zero,
            cache_len=jnp.asarray(cache_len, I32),
            num_generated=zero,
            out_tokens=jnp.zeros((capacity,), I32),
            out_exit=jnp.zeros((capacity,), I32),
            out_halt=jnp.zeros((capacity,), F32),
            outer_steps=zero,
            recurrent_passes=zero,
            loop_token_passes=zero,
            window_rows=zero,
            finished=jnp.zeros((), bool),
            hit_stop=jnp.zeros((), bool),
        )


# ---------------------------------------------------------------------------------------------
# Outer loop (§6.5)
# ---------------------------------------------------------------------------------------------


def leading_prefix(window: Window) -> jax.Array:
    """Number of leading committed entries: the first mask's index, or the length if none."""
    rows = window.tokens.shape[0]
    blocking = window.is_mask | (jnp.arange(rows) >= window.length)
    return jnp.sum(jnp.cumprod(~blocking).astype(I32))


def _emit(state: DecodeState, count: jax.Array) -> DecodeState:
    """Appends ``window[:count]`` (tokens, exits, halts) to the output buffers."""
    window = state.window
    rows = window.tokens.shape[0]
    capacity = state.out_tokens.shape[0]
    idx = jnp.arange(rows)
    slots = jnp.where(idx < count, state.num_generated + idx, capacity)  # capacity = dropped
    return state.replace(
        out_tokens=state.out_tokens.at[slots].set(window.tokens, mode="drop"),
        out_exit=state.out_exit.at[slots].set(window.exit, mode="drop"),
        out_halt=state.out_halt.at[slots].set(window.halt, mode="drop"),
        num_generated=state.num_generated + count,
    )


def begin_window(
    state: DecodeState,
    *,
    window_size,
    max_new_tokens,
    stop_ids: jax.Array,
    mask_id: int,
) -> DecodeState:
    """§6.5 steps 1-3: leading prefix, finish test (emitting the final prefix), budget-capped top-up.

    Runs only while ``not state.finished`` and ``num_generated < max_new_tokens`` (the caller's
    loop condition); applied to a finished state it is the identity.

    If the finish test fires (budget reached by the prefix, or a stop id inside the prefix), the
    prefix is emitted up to but excluding the first stop id, ``finished`` is set, and no top-up
    happens — no refresh forward runs for this final prefix (§0 decision 1).

    ``stop_ids`` is an int32 vector; pad it with ``-1`` (never matches a token) to a fixed length.
    """
    window = state.window
    rows = window.tokens.shape[0]
    idx = jnp.arange(rows)
    prefix = leading_prefix(window)
    in_prefix = idx < prefix
    is_stop = jnp.any(window.tokens[:, None] == stop_ids[None, :], axis=-1) & in_prefix
    found_stop = jnp.any(is_stop)
    first_stop = jnp.argmax(is_stop).astype(I32)
    # The outer loop runs while len(generated) < max_new_tokens; at the budget nothing is emitted
    # (the window is empty then: its entries always fit in the remaining budget).
    budget_done = state.num_generated >= max_new_tokens
    found_stop = found_stop & ~budget_done
    ends = (~state.finished) & (
        budget_done | (state.num_generated + prefix >= max_new_tokens) | found_stop
    )
    # Top-up: the window grows to prefix + desired entries with masks (never shrinks).
    desired = jnp.minimum(window_size, max_new_tokens - state.num_generated - prefix)
    emit_count = jnp.where(ends & ~budget_done, jnp.where(found_stop, first_stop, prefix), 0)
    state = _emit(state, emit_count)
    target = jnp.where(ends | state.finished, window.length,
                       jnp.maximum(window.length, prefix + desired))
    new_rows = (idx >= window.length) & (idx < target)
    window = window.replace(
        tokens=jnp.where(new_rows, mask_id, window.tokens),
        is_mask=window.is_mask | new_rows,
        exit=jnp.where(new_rows, 0, window.exit),
        halt=jnp.where(new_rows, 0.0, window.halt),
        length=target.astype(I32),
    )
    return state.replace(
        window=window,
        prefix=prefix,
        finished=state.finished | ends,
        hit_stop=state.hit_stop | (ends & found_stop),
    )


def pack_window(window: Window, cache_len, *, mask_id: int) -> Packed:
    """§6.5 step 4: the packed order (stable partition observed / masks / padding) and model inputs."""
    rows = window.tokens.shape[0]
    idx = jnp.arange(rows, dtype=I32)
    valid = idx < window.length
    group = jnp.where(valid, jnp.where(window.is_mask, 1, 0), 2)
    order = jnp.argsort(group * rows + idx).astype(I32)  # keys are distinct: a stable partition
    p_valid = valid[order]
    p_mask = (window.is_mask & valid)[order]
    ids = jnp.where(p_valid, window.tokens[order], mask_id).astype(I32)
    positions = (cache_len + jnp.where(p_valid, order, idx)).astype(I32)
    return Packed(order=order, ids=ids, positions=positions, valid=p_valid, is_mask=p_mask,
                  num_rows=window.length, start=jnp.asarray(cache_len, I32))


def observed_rows(packed: Packed) -> jax.Array:
    """The packed window's valid rows that are not masks (int32[]: the packed row of its first
    mask): :attr:`Packed.observed` where it was made when the window opened, else counted."""
    if packed.observed is not None:
        return packed.observed
    return jnp.sum((packed.valid & ~packed.is_mask).astype(I32))


def end_window(state: DecodeState, packed: Packed, pst: PassState, executed) -> DecodeState:
    """§6.5 steps 5-8 after a window forward that ran ``executed`` passes.

    Counters; persist and emit the prefix (``cache_len += prefix``: the prefix rows are packed rows
    ``0..prefix-1``, already in their cache slots — the caller completes the cache depths first);
    record this window's commits into the window; drop the prefix.
    """
    executed = jnp.asarray(executed, I32)
    prefix = state.prefix
    state = state.replace(
        outer_steps=state.outer_steps + 1,
        recurrent_passes=state.recurrent_passes + executed,
        loop_token_passes=state.loop_token_passes + packed.num_rows * executed,
        window_rows=state.window_rows + packed.num_rows,
        cache_len=state.cache_len + prefix,
    )
    state = _emit(state, prefix)

    # Record commits (packed row a -> window index order[a]); order is a permutation.
    window = state.window
    commit = pst.is_mask & pst.committed
    gather = lambda a: a[packed.order]
    window = window.replace(
        tokens=window.tokens.at[packed.order].set(jnp.where(commit, pst.tok, gather(window.tokens))),
        is_mask=window.is_mask.at[packed.order].set(gather(window.is_mask) & ~commit),
        exit=window.exit.at[packed.order].set(jnp.where(commit, pst.exit, gather(window.exit))),
        halt=window.halt.at[packed.order].set(jnp.where(commit, pst.halt1, gather(window.halt))),
    )

    # Drop the first `prefix` entries.
    rows = window.tokens.shape[0]
    src = jnp.arange(rows) + prefix
    keep = src < window.length
    src = jnp.minimum(src, rows - 1)
    shift = lambda a, fill: jnp.where(keep, a[src], fill)
    window = Window(
        tokens=shift(window.tokens, 0),
        is_mask=shift(window.is_mask, False),
        exit=shift(window.exit, 0),
        halt=shift(window.halt, 0.0),
        length=(window.length - prefix).astype(I32),
    )
    return state.replace(window=window)


# ---------------------------------------------------------------------------------------------
# Window step (§6.3, §6.4)
# ---------------------------------------------------------------------------------------------


def init_pass_state(packed: Packed, penalty) -> PassState:
    """§6.3: fresh per-row state; the position penalty anchored at the leftmost mask."""
    rows = packed.ids.shape[0]
    first_mask = jnp.argmax(packed.is_mask)  # masks are ascending by window index
    offset = (packed.order - packed.order[first_mask]).astype(F32)
    pen = jnp.where(packed.is_mask, offset * jnp.asarray(penalty, F32), 0.0).astype(F32)
    return PassState(
        committed=jnp.zeros((rows,), bool),
        newly=jnp.zeros((rows,), bool),
        tok=jnp.zeros((rows,), I32),
        exit=jnp.zeros((rows,), I32),
        survival=jnp.ones((rows,), F32),
        halt1=jnp.zeros((rows,), F32),
        penalty=pen,
        is_mask=packed.is_mask,
    )


def injection_rows(pst: PassState) -> tuple[jax.Array, jax.Array]:
    """Rows whose carry is overwritten by the raw embedding ``E[tok]`` before the next core pass.

    Returns ``(rows bool[W], tok int32[W])``: exactly the rows committed at the previous pass
    (``newly``); all False before pass 0. The carry update is
    ``jnp.where(rows[:, None], E[tok], carry)``.
    """
    return pst.newly, pst.tok


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """``argmax`` over the last axis (the first maximal index), int32.

    Written as a max and a min over the indices holding it: XLA:CPU runs ``jnp.argmax`` (one
    variadic reduce) about 6x slower (measured on [16, 32768] fp32: 2.4 ms against 0.4 ms). Finite
    logits give exactly argmax's answer; a row holding a NaN gives the last index.
    """
    top = jnp.max(logits, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(I32, logits.shape, logits.ndim - 1)
    first = jnp.min(jnp.where(logits == top, index, logits.shape[-1]), axis=-1)
    return jnp.minimum(first, logits.shape[-1] - 1)


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Entropy in nats of ``softmax(logits)`` over the last axis, fp32 (§2.6).

    Computed as ``logsumexp(l) - sum(softmax(l) * l)``, the formula the torch reference uses, so
    the two agree to rounding.
    """
    logits = logits.astype(F32)
    probs = jax.nn.softmax(logits, axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(probs * logits, axis=-1)


def decide_pass(
    pst: PassState,
    pred: jax.Array,
    entropy: jax.Array,
    hazard: jax.Array,
    s,
    *,
    q,
    tau,
    mode: str,
    max_depth: int,
) -> tuple[PassState, jax.Array]:
    """§6.4 steps 3-8 for pass ``s`` (0-based): survival, commits, stop test, fallback.

    Args:
      pst: the state before this pass.
      pred: int32[W] greedy token per packed row (argmax of fp32 logits, first maximal index).
      entropy: float32[W] entropy per packed row.
      hazard: float32[W] gate hazard ``sigmoid(g(r, s))`` per packed row.
      s: the pass index (traced int).
      q, tau: thresholds (cast to fp32).
      mode: ``"entropy"`` or ``"left1"`` (static).
      max_depth: ``K`` (static).

    Returns:
      ``(new_state, stop)``; ``new_state.newly`` marks the rows to inject at the next pass. When
      ``stop`` is True the caller ends the window with ``executed = s + 1``.
    """
    s = jnp.asarray(s, I32)
    mask = pst.is_mask
    hazard = hazard.astype(F32)
    halt1 = jnp.where(s == 0, hazard, pst.halt1)
    survival = jnp.where(mask, pst.survival * (jnp.float32(1.0) - hazard), pst.survival)
    adjusted = entropy.astype(F32) + pst.penalty
    uncommitted = mask & ~pst.committed
    if mode == "entropy":
        agree = uncommitted & (adjusted < jnp.asarray(tau, F32))
    elif mode == "left1":
        agree = uncommitted & (jnp.cumsum(uncommitted.astype(I32)) == 1)
    else:  # static configuration error, not a traced condition
        raise ValueError("mode must be entropy or left1")
    committed = pst.committed | agree
    tok = jnp.where(agree, pred.astype(I32), pst.tok)
    exit_ = jnp.where(agree, s + 1, pst.exit)

    still = mask & ~committed
    n_still = jnp.sum(still.astype(I32))
    cdf_sum = jnp.sum(jnp.where(still, jnp.float32(1.0) - survival, jnp.float32(0.0)))
    mean_cdf = cdf_sum / jnp.maximum(n_still, 1).astype(F32)
    stop = (s == max_depth - 1) | (n_still == 0) | (mean_cdf >= jnp.asarray(q, F32))

    # Fallback: nothing in the window committed at the stop pass -> commit argmin adjusted entropy.
    fallback = stop & ~jnp.any(committed & mask)
    j = jnp.argmin(jnp.where(mask, adjusted, jnp.inf))  # first minimal index = lowest window index
    pick = fallback & (jnp.arange(mask.shape[0]) == j)
    committed = committed | pick
    tok = jnp.where(pick, pred.astype(I32), tok)
    exit_ = jnp.where(pick, s + 1, exit_)
    newly = agree | pick

    return pst.replace(committed=committed, newly=newly, tok=tok, exit=exit_,
                       survival=survival, halt1=halt1), stop


def stop_id_vector(stop_ids, length: int = 8) -> jax.Array:
    """Stop ids as a fixed-length int32 vector padded with -1 (for a fixed compiled shape)."""
    ids = sorted({int(i) for i in stop_ids})
    if len(ids) > length:
        length = len(ids)
    return jnp.asarray(ids + [-1] * (length - len(ids)), I32)
