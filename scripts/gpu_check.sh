#!/usr/bin/env bash
# One self-contained decode check for a CUDA GPU: the Python package scripts/gpu_check/ (its
# docstring, scripts/gpu_check/__init__.py, says what it runs and every option).
#
# Usage:  bash scripts/gpu_check.sh [--tiny] [--max_new_tokens N] [--models 1.7b,8b] [--batches 1,8,32]
#                                  [--graphs] [--no_attention] [--xla_products] [--separate_norms]
#                                  [--separate_combine]
#                                  [--layouts | --layouts_only]
#         bash scripts/gpu_check.sh --goals [--budget_s 360] [--json goals.json] [--models ...]
#         bash scripts/gpu_check.sh --parity [gpu_parity.py's options]
# Run from a checkout, installed or not (scripts/source_tree.py), from any folder.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == "--parity" ]]; then
  shift
  exec python "${HERE}/scripts/gpu_parity.py" "$@"
fi
export PYTHONPATH="${HERE}/scripts:${HERE}${PYTHONPATH:+:${PYTHONPATH}}"
exec python -m gpu_check "$@"
