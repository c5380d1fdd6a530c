"""Helpers of the prepare tests: the benchmark names, the scorer's rule sets, the offline
settings and small wrappers around the command."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from alodlm_scoring.pool import score_isolated

ALL_BENCHMARKS = ("ARC-C", "ARC-E", "MMLU", "MMLU-Pro", "GPQA-Diamond", "GSM8K", "MATH-500",
                  "MBPP", "MBPP+", "HumanEval", "HumanEval+")

# The scorer's rule sets that code verdicts are checked under (SCORING.md D10).
RULE_SETS = ["reference", "strict"]


def score_under(rule_set: str, record: dict, text: str) -> tuple[bool, str | None]:
    """Score ``text`` for ``record`` in a fresh sandboxed worker under ``rule_set``."""
    return score_isolated(record, text, rules=rule_set)


def patch_offline(patch: pytest.MonkeyPatch, root: pathlib.Path) -> None:
    """Offline settings and private caches below ``root``, environment and library copies."""
    hf = root / "hf"
    for name, value in {"XDG_CACHE_HOME": root / "xdg", "HF_HOME": hf,
                        "HF_DATASETS_CACHE": hf / "datasets", "HF_HUB_CACHE": hf / "hub"}.items():
        patch.setenv(name, str(value))
    patch.setenv("HF_DATASETS_OFFLINE", "1")
    patch.setenv("HF_HUB_OFFLINE", "1")
    if "datasets" in sys.modules:
        import datasets.config

        patch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", hf / "datasets")
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.constants

        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def source_flags(sources: dict[str, pathlib.Path], names=ALL_BENCHMARKS) -> list[str]:
    return [f"--source={name}={sources[name]}" for name in names]


def run_prepare(argv: list[str], capsys) -> tuple[int, str, str]:
    from alodlm_jax.cli import prepare

    status = prepare.main(["alodlm-jax-prepare", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def read_rows(path) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
