"""Model level, forward: per-depth agreement of the JAX and PyTorch all-passes forwards.

Per depth (1-based, as exit depths are): max |Δ logits|, the excess over the ``rtol`` part of the
bound, mean KL(torch ‖ jax) in fp64, top-1 agreement and max |Δ hazard|, accumulated per prompt
and merged exactly across prompts of different lengths.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["depth_metrics", "merge_depth_metrics", "log_softmax64"]

_KL_ROW_CHUNK = 64


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def depth_metrics(torch_logits: np.ndarray, jax_logits: np.ndarray, torch_hazards: np.ndarray,
                  jax_hazards: np.ndarray, *, rtol: float = 0.0) -> list[dict]:
    """Per-depth accumulators for one prompt: ``[K, T, V]`` logits and ``[K, T]`` hazards per side.

    KL(torch ‖ jax) = Σ_v p_torch (log p_torch − log p_jax), in float64 from the fp32 logits.
    ``logits_excess`` is max over logits of |Δ| − rtol · (the row's max |torch logit|), the quantity
    bounded by ``atol`` (it equals max |Δ logits| when ``rtol`` is 0).
    Returns, per depth, maxima and sums with the row count so prompts of different lengths merge
    exactly (:func:`merge_depth_metrics`).
    """
    tl, jl = np.asarray(torch_logits, np.float32), np.asarray(jax_logits, np.float32)
    th, jh = np.asarray(torch_hazards, np.float32), np.asarray(jax_hazards, np.float32)
    if tl.shape != jl.shape or th.shape != jh.shape or tl.shape[:2] != th.shape:
        raise ValueError(f"shape mismatch: logits {tl.shape} vs {jl.shape}, hazards {th.shape} vs {jh.shape}")
    out = []
    for depth in range(tl.shape[0]):
        kl_sums = []
        for lo in range(0, tl.shape[1], _KL_ROW_CHUNK):  # bounded float64 temporaries at V = 151936
            lt = log_softmax64(tl[depth, lo:lo + _KL_ROW_CHUNK])
            lj = log_softmax64(jl[depth, lo:lo + _KL_ROW_CHUNK])
            kl_sums.extend((np.exp(lt) * (lt - lj)).sum(axis=-1).tolist())
        out.append({
            "rows": int(tl.shape[1]),
            "max_abs_logits": float(np.abs(tl[depth].astype(np.float64) - jl[depth]).max(initial=0.0)),
            "logits_excess": float((np.abs(tl[depth].astype(np.float64) - jl[depth])
                                    - rtol * np.abs(tl[depth].astype(np.float64)).max(axis=-1, keepdims=True)
                                    ).max(initial=-np.inf)),
            "kl_sum": float(math.fsum(kl_sums)),
            "top1_agree": int((tl[depth].argmax(-1) == jl[depth].argmax(-1)).sum()),
            "max_abs_hazard": float(np.abs(th[depth].astype(np.float64) - jh[depth]).max(initial=0.0)),
        })
    return out


def merge_depth_metrics(per_prompt: list[list[dict]]) -> list[dict]:
    """Merges per-prompt accumulators into the report's per-depth rows (depths 1-based)."""
    if not per_prompt:
        return []
    merged = []
    for depth in range(len(per_prompt[0])):
        items = [p[depth] for p in per_prompt]
        rows = sum(i["rows"] for i in items)
        merged.append({
            "depth": depth + 1,
            "rows": rows,
            "max_abs_logits": max(i["max_abs_logits"] for i in items),
            "max_logits_excess": max(i.get("logits_excess", i["max_abs_logits"]) for i in items),
            "mean_kl": math.fsum(i["kl_sum"] for i in items) / rows if rows else None,
            "top1_agreement": sum(i["top1_agree"] for i in items) / rows if rows else None,
            "max_abs_hazard": max(i["max_abs_hazard"] for i in items),
        })
    return merged

