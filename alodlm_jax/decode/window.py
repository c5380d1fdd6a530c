"""One request's window life cycle as the pieces both compiled programs call, and their shapes.

The single-request program (:mod:`.compiled`) and the batch program (:mod:`.batched`, which
``vmap``s them over its slots) are built from exactly these pieces, so they share one definition
of every step of MODEL_AND_DECODING.md §6.5 (begin: finish test and top-up; open; pass; close:
completion and bookkeeping) on top of :mod:`.state`'s decisions and :mod:`.portable`'s window
forward, and one definition of a program's static shapes (:class:`Bucket`). Neither engine module
is imported here, so :mod:`.compiled` can import :mod:`.batched` and not the other way round.
"""

from __future__ import annotations

import collections
import dataclasses

from alodlm_jax import model as M
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode import portable as P
from alodlm_jax.decode import state as S

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
    """Static shapes of one compiled program (everything else is a runtime input).

    ``t_max`` follows the portable engine's rule (``next_pow2(prompt_bucket + max_new_tokens + W)``,
    at least 64) on purpose: XLA:CPU's attention reductions over the cache are not bitwise
    independent of the buffer length (masked slots included), so equal cache sizes are part of what
    makes the two engines' fp32 outputs identical. A batch adds ``W`` scratch slots.
    """

    prompt_bucket: int
    window_size: int
    capacity: int  # output buffer length, next_pow2(max_new_tokens)
    cache_slots: int  # the portable engine's t_max for this prompt bucket and budget
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
    def for_request(cls, prompt_len: int, decode: DecodeConfig, batch: int = 1) -> "Bucket":
        prompt_bucket = next_pow2(prompt_len)
        rows = 2 * decode.window_size
        slots = next_pow2(prompt_bucket + decode.max_new_tokens + rows, minimum=64)
        return cls(prompt_bucket, decode.window_size, next_pow2(decode.max_new_tokens), slots, batch)


# ---------------------------------------------------------------------------------------------
# Per-request pieces (pure; the batched program vmaps exactly these)
# ---------------------------------------------------------------------------------------------


def begin(dstate, consts, *, cfg, window_size):
    """§6.5 steps 1-3 (finish test, top-up): the identity on a finished state."""
    return S.begin_window(dstate, window_size=window_size, max_new_tokens=consts["max_new_tokens"],
                          stop_ids=consts["stop_ids"], mask_id=cfg.mask_token_id)


def open_window(params, cache, dstate, consts, *, cfg, prefix_limit=None, rows_needed=None):
    """§6.5 step 4 and the window's one-time part of §2.4: packing, embedding, prelude.

    ``prefix_limit``, ``rows_needed``: a batch passes values shared by its requests
    (:func:`.portable.window_prelude`)."""
    packed = S.pack_window(dstate.window, dstate.cache_len, mask_id=cfg.mask_token_id)
    pst = S.init_pass_state(packed, consts["penalty"])
    cache, h = P.window_prelude(params, cache, packed, cfg=cfg, prefix_limit=prefix_limit,
                                rows_needed=rows_needed)
    return cache, h, packed, pst


def window_pass(params, cache, h, packed, pst, depth, consts, *, cfg, mode, prefix_limit=None,
                rows_needed=None):
    """One recurrent pass (§6.4), exactly the portable engine's (:func:`.portable.window_pass`)."""
    cache, h, pst, stop, _ = P.window_pass(params, cache, h, packed, pst, depth, consts["q"],
                                           consts["tau"], cfg=cfg, mode=mode,
                                           prefix_limit=prefix_limit, rows_needed=rows_needed)
    return cache, h, pst, stop


def close_window(cache, dstate, packed, pst, executed, consts, *, cfg, window_size):
    """§5 completion, §6.5 steps 5-8, then the next window's finish test and top-up."""
    cache = M.complete_depths(cache, packed.start, packed.ids.shape[0], executed)
    return cache, end_and_begin(dstate, packed, pst, executed, consts, cfg=cfg, window_size=window_size)


def end_and_begin(dstate, packed, pst, executed, consts, *, cfg, window_size):
    """:func:`close_window` without the cache completion (§6.5 steps 5-8, finish test, top-up)."""
    dstate = S.end_window(dstate, packed, pst, executed)
    return begin(dstate, consts, cfg=cfg, window_size=window_size)
