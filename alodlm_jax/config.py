"""Decoding configuration: the reference's fields, order, defaults and validation messages.

This module imports no JAX, so the rescoring path of the evaluate command can validate decoding
flags (the reference validates them in both modes) without loading an accelerator runtime.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

MODES = ("entropy", "left1")
ENGINES = ("portable", "compiled")
DEFAULT_ENGINE = "compiled"  # the whole generation is one XLA program per shape bucket
ENGINE_NAMES = {"portable": "jax-xla-portable", "compiled": "jax-xla-compiled"}
# Compiled programs a process keeps in memory (alodlm_jax.decode.programs), and the size bound of
# JAX's persistent compilation cache on disk (the commands turn it on by default).
DEFAULT_MAX_PROGRAMS = 32
DEFAULT_COMPILATION_CACHE_BYTES = 4 * 10**9


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Greedy adaptive decoding settings (MODEL_AND_DECODING.md §6.1).

    Field order is significant: it is the order of the ``decode`` object in ``summary.json``.
    """

    q: float = 0.5
    tau: float = 0.4
    window_size: int = 16
    max_new_tokens: int = 4096
    position_penalty: float | None = None
    mode: str = "entropy"

    def __post_init__(self) -> None:
        q, tau = self.q, self.tau
        if not (_is_real(q) and _is_real(tau)) or not (0.0 <= q <= 1.0) or not (
            math.isfinite(tau) and tau >= 0.0
        ):
            raise ValueError("q must be in [0,1] and tau must be finite and nonnegative")
        if not (_is_int(self.window_size) and _is_int(self.max_new_tokens)) or (
            self.window_size < 1 or self.max_new_tokens < 1
        ):
            raise ValueError("Window size and generation budget must be positive")
        if self.mode not in MODES:
            raise ValueError("mode must be entropy or left1")
        if self.position_penalty is not None:
            p = self.position_penalty
            if not _is_real(p) or not math.isfinite(p) or p < 0.0:
                raise ValueError("position_penalty must be finite and nonnegative")

    @property
    def effective_position_penalty(self) -> float:
        """The penalty per window index: ``position_penalty`` if given, else ``0.05 * tau``."""
        if self.position_penalty is not None:
            return float(self.position_penalty)
        return 0.05 * float(self.tau)

    def as_dict(self) -> dict[str, Any]:
        """The ``decode`` object of ``summary.json`` (field order kept)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
