"""Decoding configuration: the reference's fields, order, defaults and validation messages.

This module imports no JAX, so the rescoring path of the evaluate command can validate decoding
flags (the reference validates them in both modes) without loading an accelerator runtime.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from typing import Any

MODES = ("entropy", "left1")
ENGINES = ("portable", "compiled")
DEFAULT_ENGINE = "compiled"  # the whole generation is one XLA program per shape bucket
ENGINE_NAMES = {"portable": "jax-xla-portable", "compiled": "jax-xla-compiled"}
# Compiled programs a process keeps in memory (alodlm_jax.decode.programs), and the size bound of
# JAX's persistent compilation cache on disk (the commands turn it on by default).
DEFAULT_MAX_PROGRAMS = 32
DEFAULT_COMPILATION_CACHE_BYTES = 4 * 10**9


def default_compilation_cache_dir() -> pathlib.Path:
    """Where the commands keep JAX's persistent compilation cache by default:
    ``$XDG_CACHE_HOME/alodlm-jax/xla``, or ``~/.cache/alodlm-jax/xla`` when ``XDG_CACHE_HOME`` is
    unset or not absolute (the XDG base directory rule)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = pathlib.Path(base) if base and os.path.isabs(base) else pathlib.Path.home() / ".cache"
    return root / "alodlm-jax" / "xla"


class DecodeConfigError(ValueError):
    """An invalid decoding setting: ``str(error)`` is the reference's message; ``field`` names the
    first offending :class:`DecodeConfig` field (so a command can name its flag)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


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
        q_ok = _is_real(self.q) and 0.0 <= self.q <= 1.0
        tau_ok = _is_real(self.tau) and math.isfinite(self.tau) and self.tau >= 0.0
        if not (q_ok and tau_ok):
            raise DecodeConfigError("q must be in [0,1] and tau must be finite and nonnegative",
                                    field="q" if not q_ok else "tau")
        window_ok = _is_int(self.window_size) and self.window_size >= 1
        budget_ok = _is_int(self.max_new_tokens) and self.max_new_tokens >= 1
        if not (window_ok and budget_ok):
            raise DecodeConfigError("Window size and generation budget must be positive",
                                    field="window_size" if not window_ok else "max_new_tokens")
        if self.mode not in MODES:
            raise DecodeConfigError("mode must be entropy or left1", field="mode")
        if self.position_penalty is not None:
            p = self.position_penalty
            if not _is_real(p) or not math.isfinite(p) or p < 0.0:
                raise DecodeConfigError("position_penalty must be finite and nonnegative",
                                        field="position_penalty")

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
