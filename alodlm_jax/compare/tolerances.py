"""Pass/fail thresholds of a comparison and the named checks a report is made of.

A check is ``{"name", [where,] "value", "threshold", "comparison", "passed"}``; a report passes when
every check does (:func:`exit_status`).
"""

from __future__ import annotations

import dataclasses
import math

from .errors import CompareInputError

__all__ = ["Tolerances", "default_tolerances", "check", "check_label", "exit_status"]


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """Pass/fail thresholds.

    ``atol`` bounds max |Δ hazard| at every depth, and |Δ logits| together with ``rtol``:
    ``|Δ| ≤ atol + rtol · s`` for every logit, where ``s`` is the row's largest |torch logit| (the
    row's scale; ``rtol`` is 0 in fp32). BF16 needs the relative part: a bf16 hidden state carries
    relative errors of about 2^-8 into the head, so logit differences scale with the logits
    themselves (measured on the tiny models: max |Δ| / s ≈ 0.008-0.009, about one bf16 ulp of the
    row's scale, for rows with s from 3 to 44); real logits reach 20-40, where that is 0.2-0.4, over
    any useful absolute bound. ``min_token_agreement`` is
    the fraction of prompts (model level) or examples (predictions level: exact text) whose outputs
    must be identical. ``min_exit_depth_agreement`` is the fraction of positions, over the common
    token prefix of every prompt, whose exit depths must be equal: FP32 must reproduce exit depths
    exactly, BF16 only statistically because exit depths sit on the ``tau``/``q`` thresholds.
    """

    atol: float
    min_token_agreement: float
    min_exit_depth_agreement: float
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise CompareInputError(f"--{name} must be finite and nonnegative")
        for name in ("min_token_agreement", "min_exit_depth_agreement"):
            value = getattr(self, name)
            if not (0.0 <= value <= 1.0):
                raise CompareInputError(f"--{name} must be in [0, 1]")


_DEFAULTS = {
    "fp32": dict(atol=1e-4, min_token_agreement=1.0, min_exit_depth_agreement=1.0, rtol=0.0),
    # rtol 2^-5 of the row's scale: about four bf16 ulps (measured differences are about one).
    "bf16": dict(atol=0.1, min_token_agreement=0.95, min_exit_depth_agreement=0.9, rtol=2.0 ** -5),
}


def default_tolerances(precision: str, *, atol: float | None = None,
                       min_token_agreement: float | None = None,
                       min_exit_depth_agreement: float | None = None,
                       rtol: float | None = None) -> Tolerances:
    """The precision's defaults, with any explicitly given value taking precedence."""
    if precision not in _DEFAULTS:
        raise CompareInputError(f"--precision must be fp32 or bf16, got {precision!r}")
    values = dict(_DEFAULTS[precision])
    for name, value in (("atol", atol), ("min_token_agreement", min_token_agreement),
                        ("min_exit_depth_agreement", min_exit_depth_agreement), ("rtol", rtol)):
        if value is not None:
            values[name] = float(value)
    return Tolerances(**values)


def check(name: str, value: float | None, threshold: float, *, at_most: bool, **where) -> dict:
    """One named check. A missing value (``None``) or NaN fails: nothing measured, nothing proven."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        passed = False
    else:
        passed = value <= threshold if at_most else value >= threshold
    return {"name": name, **where, "value": value, "threshold": threshold,
            "comparison": "<=" if at_most else ">=", "passed": bool(passed)}


def exit_status(report: dict) -> int:
    """0 when every check passed, 1 otherwise (2, bad input, is decided before a report exists)."""
    return 0 if report.get("passed") else 1



def check_label(check: dict) -> str:
    where = f" at depth {check['depth']}" if "depth" in check else ""
    return f"{check['name']}{where}: {check['value']} (must be {check['comparison']} {check['threshold']})"

