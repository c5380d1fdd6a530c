"""One request's window: every piece of MODEL_AND_DECODING.md §6 that all engines share.

This module is the single definition of how one request decodes, as pure functions over the
params, the KV cache and :mod:`.state`'s pytrees; the engines only drive them:

* shapes: :class:`Bucket` (the static shapes a program is compiled for), :func:`next_pow2`;
* inputs: :func:`consts` (the runtime decoding inputs), :func:`check_request` (§6.1);
* the prompt: :func:`prefill` (§6.2);
* a window (§6.5): :func:`begin` (finish test, top-up), :func:`open_window` (packing, embedding,
  prelude), :func:`window_pass` (one recurrent pass, §6.4), :func:`token_heads`,
  :func:`close_window` / :func:`end_and_begin` (completion, bookkeeping, next top-up);
* the result: :func:`decode_output` (a finished :class:`~.state.DecodeState` read back to the host);
* program keys: :func:`signature` and :func:`abstract` of a pytree.

The portable engine (:mod:`.portable`) jits these one by one; the single-request program
(:mod:`.compiled`) and the batch program (:mod:`.batched`, which vmaps them over its slots)
call them inside their loops. Nothing here imports an engine.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.network import model as M
from alodlm_jax.network import cache as KC
from alodlm_jax.network import layers as L
from alodlm_jax.network import rows as R
from alodlm_jax.config import DecodeConfig
from alodlm_jax.kernels import select
from alodlm_jax.decode import state as S
from alodlm_jax.decode.result import DecodeOutput, work_counters

STOP_ID_SLOTS = 8

# How many times each program body was traced (a trace is the first step of every compilation; a
# persistent-cache hit still traces). Tests use it to prove executables are reused per bucket.
TRACE_COUNTS: collections.Counter = collections.Counter()


def next_pow2(n: int, minimum: int = 16) -> int:
    """The smallest power of two ``>= max(n, minimum)``."""
    n = max(int(n), minimum)
    return 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Static shapes of one request's programs, in every engine (everything else is a runtime
    input).

    Every engine sizes the cache by one rule (``next_pow2(prompt_bucket + max_new_tokens + W)``,
    at least 64) on purpose: XLA:CPU's attention reductions over the cache are not bitwise
    independent of the buffer length (masked slots included), so equal cache sizes are part of what
    makes the engines' fp32 outputs identical. The compiled engine's
    :data:`~alodlm_jax.network.rows.FIXED` shapes, which attend over every slot at every step, round the
    same sum up to a multiple of :data:`~alodlm_jax.network.rows.FIXED_SLOT_MULTIPLE` instead
    (``slot_multiple``; for a batch, the sum with the scratch slots, so that :attr:`t_max` is the
    multiple: the TPU attention kernel reads the cache in blocks of 256 or 512 slots). A batch adds
    ``W`` scratch slots.
    """

    prompt_bucket: int
    window_size: int
    capacity: int  # output buffer length, next_pow2(max_new_tokens)
    cache_slots: int  # one request's cache slots for this prompt bucket and budget
    batch: int = 1

    @property
    def rows(self) -> int:
        return 2 * self.window_size

    @property
    def t_max(self) -> int:
        return self.cache_slots if self.batch == 1 else self.cache_slots + self.rows

    @property
    def scratch_start(self) -> int:
        """First of the ``W`` scratch slots written by idle batch members (never read back)."""
        return self.t_max - self.rows

    @classmethod
    def for_request(cls, prompt_len: int, decode: DecodeConfig, batch: int = 1, *,
                    slot_multiple: int | None = None) -> "Bucket":
        prompt_bucket = next_pow2(prompt_len)
        rows = 2 * decode.window_size
        needed = prompt_bucket + decode.max_new_tokens + rows
        if slot_multiple:  # the batch's t_max (with its scratch rows) a multiple
            scratch = rows if batch > 1 else 0
            slots = -(-(needed + scratch) // slot_multiple) * slot_multiple - scratch
        else:
            slots = next_pow2(needed, minimum=64)
        return cls(prompt_bucket, decode.window_size, next_pow2(decode.max_new_tokens), slots, batch)


# ---------------------------------------------------------------------------------------------
# Inputs, checks, results and program keys
# ---------------------------------------------------------------------------------------------


# The batch program's step budget when none is asked for: it runs until a request finishes.
NO_STEP_BUDGET = 2**31 - 1


def consts(decode: DecodeConfig, stop_ids: Sequence[int],
           step_budget: int = NO_STEP_BUDGET) -> dict[str, jax.Array]:
    """The runtime decoding inputs shared by every request of one decoding configuration.

    ``step_budget``: the most steps one execution of the batch program runs before it returns to
    the host (:func:`.batched.run_program`; the server's online admission and streaming); the
    other programs do not read it. It moves no token: the program resumes from its carry."""
    if not 1 <= int(step_budget) <= NO_STEP_BUDGET:
        raise ValueError(f"step_budget must be in [1, {NO_STEP_BUDGET}], got {step_budget!r}")
    return {
        "max_new_tokens": jnp.asarray(decode.max_new_tokens, jnp.int32),
        "stop_ids": S.stop_id_vector(stop_ids, STOP_ID_SLOTS),
        "penalty": jnp.asarray(decode.effective_position_penalty, jnp.float32),
        "q": jnp.asarray(decode.q, jnp.float32),
        "tau": jnp.asarray(decode.tau, jnp.float32),
        "step_budget": jnp.asarray(step_budget, jnp.int32),
    }


def check_request(cfg, decode: DecodeConfig, prompt_ids: Sequence[int]) -> list[int]:
    """§6.1 request checks (ValueError): non-empty, ids in range, fits the context."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("The prompt must contain at least one token")
    vocab = cfg.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise ValueError(f"Prompt token ids must be in [0, {vocab})")
    limit = cfg.max_position_embeddings
    if len(prompt) + decode.max_new_tokens > limit:
        raise ValueError(
            f"Prompt length {len(prompt)} plus max_new_tokens {decode.max_new_tokens} "
            f"exceeds max_position_embeddings {limit}")
    return prompt


def decode_output(cfg, host, prompt_len: int, wall_seconds: float,
                  prefill_seconds: float) -> DecodeOutput:
    """The :class:`DecodeOutput` of one finished request's state ``host`` (a
    :class:`~.state.DecodeState` read back to the host)."""
    n = int(host.num_generated)
    counters = dict(outer_steps=int(host.outer_steps),
                    recurrent_passes=int(host.recurrent_passes),
                    loop_token_passes=int(host.loop_token_passes))
    work = work_counters(prompt_tokens=prompt_len, max_depth=cfg.max_depth,
                         num_prelude=cfg.num_prelude_layers, num_core=cfg.num_core_layers,
                         num_coda=cfg.num_coda_layers, window_rows=int(host.window_rows),
                         **counters)
    return DecodeOutput(
        token_ids=np.asarray(host.out_tokens[:n]).tolist(),
        exit_depths=np.asarray(host.out_exit[:n]).tolist(),
        first_pass_halt_probabilities=[float(x) for x in np.asarray(host.out_halt[:n])],
        prompt_tokens=prompt_len, wall_seconds=wall_seconds, prefill_seconds=prefill_seconds,
        stop_reason="eos" if bool(host.hit_stop) else "length", work=work, **counters)


# Executables are shared by every engine in the process (alodlm_jax.decode.programs, a bounded
# store), keyed by function, model config, params signature (shapes, dtypes, devices) and the
# static shapes. q and tau are runtime inputs, so engines that differ only in them share everything.


def signature(tree) -> tuple:
    """A hashable key of a pytree's structure, shapes, dtypes and shardings."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (str(treedef),) + tuple(
        (tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None))) for x in leaves)


def abstract(tree):
    """Abstract values; a NamedSharding (tensor-parallel params, ``alodlm_jax.network.sharding``) is kept
    so the executables are compiled for it. Single-device values stay unspecified."""
    def spec(x):
        sharding = getattr(x, "sharding", None)
        keep = sharding if isinstance(sharding, jax.sharding.NamedSharding) else None
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=keep)

    return jax.tree_util.tree_map(spec, tree)


# ---------------------------------------------------------------------------------------------
# The model wiring of one request (pure; params and cache are arguments)
# ---------------------------------------------------------------------------------------------


def prefill(params, cache, ids, cfg, shapes=R.BUCKETED):
    """§6.2: one causal forward over the padded prompt, all K passes, K/V into slots 0..P_b-1.

    :data:`~alodlm_jax.network.rows.FIXED` attends over the prompt bucket's slots (static) instead of the
    smallest :func:`~alodlm_jax.network.cache.kv_buckets` length holding them (the same visible slots),
    and runs the ``K`` passes as one loop rather than unrolled (a quarter of the program)."""
    positions = jnp.arange(ids.shape[0], dtype=jnp.int32)
    start = jnp.int32(0)
    fixed = R.is_fixed(shapes)
    attend = dict(kv_len=ids.shape[0], bucketed=False) if fixed else {}
    h, cache = M.prelude(params, cfg, M.embed(params, ids), positions, cache, start, **attend)

    def one_pass(depth, carry):
        h, cache = carry
        h, cache = M.core_pass(params, cfg, h, positions, cache, start, depth, **attend)
        _, cache = M.readout(params, cfg, h, positions, cache, start, **attend)
        return M.carry_norm(params, cfg, h), cache  # the next pass's input

    if fixed:
        return jax.lax.fori_loop(0, cfg.max_depth, one_pass, (h, cache))[1]
    for depth in range(cfg.max_depth):
        h, cache = one_pass(jnp.int32(depth), (h, cache))
    return cache



def row_buckets(window_size: int) -> tuple[int, ...]:
    """The row counts a window's forward runs at: ``window_size``, 5/4 and 3/2 of it, and ``W``.

    A window has ``W = 2 * window_size`` rows but usually fewer valid ones (the masks plus the
    committed entries behind the first mask), which come first in packed order; its forward runs
    on the smallest bucket holding them. Never fewer than ``window_size`` rows.
    """
    ws = int(window_size)
    return tuple(sorted({ws, -(-5 * ws // 4), -(-3 * ws // 2), 2 * ws}))


def _on_row_bucket(rows: int, needed, make_branch, *operands, shapes=R.BUCKETED):
    """``make_branch(n)(*operands)`` for the smallest row bucket ``n`` holding ``needed`` rows: one
    ``lax.switch`` (``needed`` must not be batched under ``vmap``: a batch passes a shared value);
    :data:`~alodlm_jax.network.rows.FIXED`: all ``rows``, no switch."""
    if R.is_fixed(shapes):
        return make_branch(rows)(*operands)
    buckets = row_buckets(rows // 2)
    index = jnp.minimum(jnp.sum((jnp.asarray(buckets, jnp.int32) < needed).astype(jnp.int32)),
                        len(buckets) - 1)
    return jax.lax.switch(index, [make_branch(n) for n in buckets], *operands)


def _pad_rows(x, rows: int, axis: int = 0, fill=None):
    """``x`` grown to ``rows`` along ``axis``: the new rows are zeros, or ``fill``'s rows."""
    if x.shape[axis] == rows:
        return x
    if fill is None:
        shape = x.shape[:axis] + (rows,) + x.shape[axis + 1:]
        fill = jnp.zeros(shape, x.dtype)
    return jax.lax.dynamic_update_slice_in_dim(fill, x, 0, axis=axis)


def _pad_kv(kv, rows: int):
    return tuple(_pad_rows(x, rows, axis=1) for x in kv)


def window_prelude(params, cache, packed, *, cfg, prefix_limit=None, rows_needed=None,
                   shapes=R.BUCKETED):
    """Embedding and prelude of a packed window -> ``(cache, h [W, H])``.

    Row buckets and deferred writes: the forward runs on the smallest of :func:`row_buckets` holding
    the window's valid rows (``rows_needed``, default ``packed.num_rows``; a batch passes one shared
    value), reading the cache only (``model.prelude_window``); the window's K/V are stored after
    the ``lax.switch``. XLA copies a buffer that is updated inside a conditional (the whole cache,
    at every layer, when the layers wrote their slots inside the switch), so the writes stay out
    of it. Rows past the bucket are padding (zeros). ``prefix_limit``: see
    ``model.run_window_stack`` (a batch passes one limit shared by its requests). ``shapes``: the
    :mod:`alodlm_jax.network.rows` policy (:data:`~alodlm_jax.network.rows.FIXED`: every row, the whole cache).
    """
    h, kv = prelude_rows(params, cache, packed, cfg=cfg, prefix_limit=prefix_limit,
                         rows_needed=rows_needed, shapes=shapes)
    return KC.store_window(cache, packed.start, prelude=kv), h


def _rope_rows(packed, n: int):
    """The first ``n`` rows of the RoPE tables attached to ``packed`` (None if none are)."""
    return None if packed.rope is None else tuple(t[:n] for t in packed.rope)


def prelude_rows(params, cache, packed, *, cfg, prefix_limit=None, rows_needed=None,
                 shapes=R.BUCKETED):
    """:func:`window_prelude` without the store: ``(h [W, H], (k, v) [L_pre, W, n_kv, d_h])``."""
    rows = packed.ids.shape[0]

    def branch(n):
        def run(cache):
            h = M.embed(params, packed.ids[:n])
            h, kv = M.prelude_window(params, cfg, h, packed.positions[:n], cache, packed.start,
                                     prefix_limit=prefix_limit, rope=_rope_rows(packed, n),
                                     **select.attention_options(shapes))
            return _pad_rows(h, rows), _pad_kv(kv, rows)
        return run

    needed = packed.num_rows if rows_needed is None else rows_needed
    return _on_row_bucket(rows, needed, branch, cache, shapes=shapes)


def window_pass(params, cache, h, packed, pst, depth, q, tau, *, cfg, mode, prefix_limit=None,
                rows_needed=None, shapes=R.BUCKETED):
    """One recurrent pass: inject, core at ``depth``, readout, heads, decision, carry norm.

    The core and coda run on the window's row bucket, reading the cache only, and their K/V are
    stored afterwards (see :func:`window_prelude`). Returns ``(cache, h_next, pst, stop,
    core_input)`` with ``W`` rows; ``core_input`` is the carry after injection, which only a traced
    run reads back.
    """
    rows = h.shape[0]
    inject, tok = S.injection_rows(pst)
    h = jnp.where(inject[:, None], M.embed(params, tok), h)
    core_input = h

    def branch(n):
        def run(cache, h_in):
            positions = packed.positions[:n]
            attend = dict(prefix_limit=prefix_limit, rope=_rope_rows(packed, n),
                          **select.attention_options(shapes))
            h, core_kv = M.core_window(params, cfg, h_in[:n], positions, cache, packed.start, depth,
                                       **attend)
            r, coda_kv = M.readout_window(params, cfg, h, positions, cache, packed.start, **attend)
            return (_pad_rows(h, rows, fill=h_in), _pad_rows(r, rows), _pad_kv(core_kv, rows),
                    _pad_kv(coda_kv, rows))
        return run

    needed = packed.num_rows if rows_needed is None else rows_needed
    h, r, core_kv, coda_kv = _on_row_bucket(rows, needed, branch, cache, h, shapes=shapes)
    cache = KC.store_window(cache, packed.start, depth, core=core_kv, coda=coda_kv)
    pred, entropy = token_heads(params, r, packed, rows // 2)
    hazard = M.gate_hazard(params, r, depth)
    pst, stop = S.decide_pass(pst, pred, entropy, hazard, depth, q=q, tau=tau, mode=mode,
                              max_depth=cfg.max_depth)
    h = M.carry_norm(params, cfg, h)
    return cache, h, pst, stop, core_input


def token_heads(params, r, packed, heads: int):
    """Greedy token and entropy (int32[W], float32[W]) of the packed rows that are masks.

    Only mask rows are ever committed, so only they need the LM head. They are contiguous in packed
    order (after the observed rows) and number at most the window size (``heads = W / 2``): the
    head runs on the ``heads`` rows from the first mask row (moved back to fit), which halves the
    pass's largest matrix product. The other rows get token 0 and entropy 0 (never read).
    """
    rows = r.shape[0]
    lo = jnp.minimum(S.observed_rows(packed), rows - heads)
    logits = M.lm_logits(params, jax.lax.dynamic_slice_in_dim(r, lo, heads, axis=0))
    pred = S.greedy_tokens(logits)
    entropy = S.entropy_from_logits(logits)
    return (jax.lax.dynamic_update_slice(jnp.zeros((rows,), jnp.int32), pred, (lo,)),
            jax.lax.dynamic_update_slice(jnp.zeros((rows,), jnp.float32), entropy, (lo,)))


# ---------------------------------------------------------------------------------------------
# A window's life cycle (§6.5), as the compiled programs call it (the batch program vmaps these)
# ---------------------------------------------------------------------------------------------


def begin(dstate, consts, *, cfg, window_size):
    """§6.5 steps 1-3 (finish test, top-up): the identity on a finished state."""
    return S.begin_window(dstate, window_size=window_size, max_new_tokens=consts["max_new_tokens"],
                          stop_ids=consts["stop_ids"], mask_id=cfg.mask_token_id)


def open_window(params, cache, dstate, consts, *, cfg, prefix_limit=None, rows_needed=None,
                shapes=R.BUCKETED):
    """§6.5 step 4 and the window's one-time part of §2.4: packing, embedding, prelude.

    ``prefix_limit``, ``rows_needed``: a batch passes values shared by its requests
    (:func:`window_prelude`); ``shapes``: the :mod:`alodlm_jax.network.rows` policy."""
    packed = S.pack_window(dstate.window, dstate.cache_len, mask_id=cfg.mask_token_id)
    # What every pass of the window reads, made once here (the batch step packs without them:
    # carried in its state, the count cost it two kernels a step more than it saved).
    packed = packed.replace(observed=S.observed_rows(packed),
                            rope=L.rope_tables(packed.positions, cfg.head_dim, cfg.rope_theta,
                                               params["embed"].dtype))
    pst = S.init_pass_state(packed, consts["penalty"])
    cache, h = window_prelude(params, cache, packed, cfg=cfg, prefix_limit=prefix_limit,
                              rows_needed=rows_needed, shapes=shapes)
    return cache, h, packed, pst


def close_window(cache, dstate, packed, pst, executed, consts, *, cfg, window_size):
    """§5 completion, §6.5 steps 5-8, then the next window's finish test and top-up."""
    cache = KC.complete_depths(cache, packed.start, packed.ids.shape[0], executed)
    return cache, end_and_begin(dstate, packed, pst, executed, consts, cfg=cfg, window_size=window_size)


def end_and_begin(dstate, packed, pst, executed, consts, *, cfg, window_size):
    """:func:`close_window` without the cache completion (§6.5 steps 5-8, finish test, top-up)."""
    dstate = S.end_window(dstate, packed, pst, executed)
    return begin(dstate, consts, cfg=cfg, window_size=window_size)
