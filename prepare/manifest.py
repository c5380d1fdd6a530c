"""The manifest written next to a prepared suite (``<suite>.manifest.json``).

It says what the suite was made from and how, so that a score can be traced to its data: the
suite's SHA-256 (the evaluate command checks it before copying the manifest into ``summary.json``),
per benchmark the metric, row count, source (hub id, config and resolved revision, or each file's
SHA-256; the split), template (origin and SHA-256), few-shot count, GPQA's option orders and which
EvalPlus suites were measured in this run or read from the ground-truth cache; then the seed,
limit, chat template and package versions. It holds no time stamps, so preparing the same source
twice with the same cache gives the same manifest.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Mapping

from alodlm_scoring.outputs import installed_versions

__all__ = ["build_manifest", "MANIFEST_VERSIONS"]

MANIFEST_VERSIONS = ("alodlm-jax", "datasets", "evalplus", "transformers", "jinja2")


def build_manifest(*, suite_path: str, suite_sha256: str, benchmarks: Mapping[str, dict],
                   options, chat) -> dict[str, Any]:
    return {
        "prepared_by": "alodlm-jax-prepare",
        "suite": os.path.basename(suite_path),
        "suite_sha256": suite_sha256,
        "rows": sum(record["rows"] for record in benchmarks.values()),
        "benchmarks": dict(benchmarks),
        "seed": options.seed,
        "fewshot": options.fewshot,
        "limit": options.limit,
        "thinking": options.thinking,
        "chat_template": chat.describe() if chat is not None else None,
        "groundtruth_cache": options.groundtruth_cache,
        "python": platform.python_version(),
        "versions": installed_versions(MANIFEST_VERSIONS),
    }
