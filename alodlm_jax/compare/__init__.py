"""Comparing alodlm-jax against PyTorch: the metrics, the checks and the report dict.

Two comparisons share one report shape (``kind``, the measured numbers, ``checks``, ``passed``):

* **model level** — the same checkpoint run by JAX and by a PyTorch side (:mod:`.model`): per-depth
  forward metrics (:mod:`.per_depth`) over every row of every prompt (:mod:`.prompts`), then a
  greedy decode both ways with the same ``DecodeConfig``; the PyTorch side is the reference
  package when installed (:mod:`.official`) or the project's torch reference;
* **predictions level** — two ``predictions.jsonl`` files (:mod:`.predictions`, read by
  ``alodlm_scoring.predictions``, the evaluate command's reader).

Thresholds and checks: :mod:`.tolerances`; the printed table: :mod:`.report_text`; bad input:
:class:`CompareInputError` (:mod:`.errors`). Only :mod:`.model` imports JAX or torch, lazily, so
the predictions path stays JAX-free (SCORING.md D6).

Sign convention: every delta and ratio is **B relative to A** (``b - a``, ``b / a``); at model level
A is PyTorch and B is JAX.

This package re-exports the public names of its modules, so ``from alodlm_jax import compare;
compare.compare_predictions(...)`` keeps working.
"""

from __future__ import annotations

from .per_depth import depth_metrics, merge_depth_metrics
from .errors import CompareInputError
from .model import (TORCH_DEVICES, decode_pair_metrics, model_report, perturb_core_q,
                    resolve_torch_device, run_model_comparison)
from .official import TORCH_SIDE_OFFICIAL, TORCH_SIDE_REFERENCE, official_alodlm_available
from .predictions import compare_predictions, first_divergence, load_prediction_rows, sha256_file
from .prompts import PromptSpec, encode_prompts, load_prompts
from .report_text import format_report
from .tolerances import Tolerances, default_tolerances, exit_status

__all__ = [
    "CompareInputError",
    "Tolerances",
    "default_tolerances",
    "exit_status",
    # predictions level
    "load_prediction_rows",
    "first_divergence",
    "compare_predictions",
    "sha256_file",
    # model level
    "depth_metrics",
    "merge_depth_metrics",
    "decode_pair_metrics",
    "model_report",
    "load_prompts",
    "encode_prompts",
    "PromptSpec",
    "perturb_core_q",
    "run_model_comparison",
    "resolve_torch_device",
    "TORCH_DEVICES",
    "official_alodlm_available",
    "TORCH_SIDE_OFFICIAL",
    "TORCH_SIDE_REFERENCE",
    # both
    "format_report",
]
