"""The suite manifest that ``alodlm-jax-prepare`` writes next to a task file.

A suite written to ``suite.jsonl`` comes with ``suite.jsonl.manifest.json``: where its rows came
from (sources with revisions or file hashes), counts, template hashes, seed and versions. When it
is present the evaluate command copies it into ``summary.json``'s protocol (``suite_manifest``),
so a score names the data it was measured on. A task file without one is evaluated as before.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .tasks import sha256_file

__all__ = ["MANIFEST_SUFFIX", "manifest_path", "suite_manifest"]

MANIFEST_SUFFIX = ".manifest.json"


def manifest_path(input_path: str | os.PathLike) -> str:
    """``<input>.manifest.json``, next to the task file."""
    return os.fspath(input_path) + MANIFEST_SUFFIX


def suite_manifest(input_path: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of the task file ``input_path``, or ``None`` when there is none.

    Raises ``ValueError`` (one line naming the manifest) when it is not a JSON object, or when
    its ``suite_sha256`` is not the task file's: it then describes another suite.
    """
    path = manifest_path(input_path)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as handle:
            manifest = json.loads(handle.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a valid suite manifest: {error}") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a valid suite manifest: expected a JSON object")
    recorded = manifest.get("suite_sha256")
    if recorded is not None and recorded != sha256_file(input_path):
        raise ValueError(f"{path}: the manifest describes another suite (its suite_sha256 is not "
                         f"the SHA-256 of {os.fspath(input_path)}); regenerate the suite or delete "
                         "the manifest")
    return manifest
