"""The raw outcome of one generation and the §6.6 result dict built from it (no JAX here).

Both engines return a :class:`DecodeOutput`; :func:`result_dict` turns it into the exact object the
reference's generate command prints (keys and order of MODEL_AND_DECODING.md §6.6). Everything an
engine measures beyond that (token-layer calls, compile time) lives in :class:`WorkCounters` and is
reported elsewhere, never inside the result dict (§0 decision 3).
"""

from __future__ import annotations

import dataclasses
from typing import Any

RESULT_KEYS = (
    "text", "token_ids", "prompt_tokens", "generated_tokens", "wall_seconds", "prefill_seconds",
    "tokens_per_second", "mean_exit_depth", "loop_token_passes",
    "loop_token_passes_per_output_token", "outer_steps", "recurrent_passes", "exit_depths",
    "first_pass_halt_probabilities", "stop_reason",
)


@dataclasses.dataclass(frozen=True)
class WorkCounters:
    """The token-layer-call counters of MODEL_AND_DECODING.md §9.2 for one generation.

    ``token_layer_calls`` counts one decoder layer applied to one stream row once; prefill is
    included (``S = K`` passes). ``loop_passes`` counts executed non-empty layer groups (prelude,
    each core pass, each coda branch); ``loop_block_passes`` counts core passes only.
    """

    forward_calls: int
    stream_tokens: int
    token_layer_calls: int
    loop_passes: int
    loop_block_passes: int

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DecodeOutput:
    """Everything a decoder produced for one request (host values)."""

    token_ids: list[int]
    exit_depths: list[int]
    first_pass_halt_probabilities: list[float]  # exact doubles of fp32 values
    prompt_tokens: int
    wall_seconds: float
    prefill_seconds: float
    loop_token_passes: int
    outer_steps: int
    recurrent_passes: int
    stop_reason: str
    work: WorkCounters


def work_counters(*, prompt_tokens: int, max_depth: int, num_prelude: int, num_core: int,
                  num_coda: int, outer_steps: int, window_rows: int, recurrent_passes: int,
                  loop_token_passes: int) -> WorkCounters:
    """§9.2 counters from the portable counters plus the summed window lengths.

    Per forward with ``T`` rows and ``S`` executed passes:
    ``T * (L_pre + S * (L_core + L_coda))`` token-layer calls; prefill has ``S = K``.
    """
    groups_per_pass = (1 if num_core else 0) + (1 if num_coda else 0)
    prelude_groups = 1 if num_prelude else 0
    prefill_calls = prompt_tokens * (num_prelude + max_depth * (num_core + num_coda))
    window_calls = window_rows * num_prelude + loop_token_passes * (num_core + num_coda)
    return WorkCounters(
        forward_calls=1 + outer_steps,
        stream_tokens=prompt_tokens + window_rows,
        token_layer_calls=prefill_calls + window_calls,
        loop_passes=(1 + outer_steps) * prelude_groups
        + (max_depth + recurrent_passes) * groups_per_pass,
        loop_block_passes=max_depth + recurrent_passes,
    )


def result_dict(out: DecodeOutput, text: str) -> dict[str, Any]:
    """The §6.6 result object, keys in the reference's order."""
    count = len(out.token_ids)
    result = {
        "text": text,
        "token_ids": list(out.token_ids),
        "prompt_tokens": out.prompt_tokens,
        "generated_tokens": count,
        "wall_seconds": out.wall_seconds,
        "prefill_seconds": out.prefill_seconds,
        "tokens_per_second": count / out.wall_seconds,
        "mean_exit_depth": sum(out.exit_depths) / count if count else None,
        "loop_token_passes": out.loop_token_passes,
        "loop_token_passes_per_output_token": out.loop_token_passes / count if count else None,
        "outer_steps": out.outer_steps,
        "recurrent_passes": out.recurrent_passes,
        "exit_depths": list(out.exit_depths),
        "first_pass_halt_probabilities": list(out.first_pass_halt_probabilities),
        "stop_reason": out.stop_reason,
    }
    assert tuple(result) == RESULT_KEYS
    return result
