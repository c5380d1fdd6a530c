"""A cache of measured ground truth, so that preparing the same source again gives the same bytes.

Expected outputs are deterministic, but reference timings are measurements: two runs differ. Each
measured suite is therefore stored under ``$XDG_CACHE_HOME/alodlm-jax/groundtruth`` (default
``~/.cache/alodlm-jax/groundtruth``), keyed by the SHA-256 of the source's fingerprint (its file
hashes or hub revision), the task id, the entry point, the output convention, the program and the
inputs. A later run on the same source reads the stored outputs and timings instead of measuring;
``--nogroundtruth_cache`` measures everything again and stores nothing. An unreadable entry is
measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from alodlm_scoring import plaindata
from alodlm_scoring.groundtruth import Job, Measured

from alodlm_scoring.files import write_atomically

__all__ = ["GroundTruthCache", "cache_directory", "job_key"]

_VERSION = 1


def cache_directory() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "alodlm-jax" / "groundtruth"


def job_key(fingerprint: str, job: Job) -> str:
    """The cache key of one job measured from the source with ``fingerprint``."""
    material = json.dumps([_VERSION, fingerprint, job.task_id, job.entry_point,
                           bool(job.output_not_none), job.program, plaindata.encode(job.inputs)])
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


class GroundTruthCache:
    """Stored :class:`Measured` results by key; ``enabled=False`` neither reads nor writes."""

    def __init__(self, directory: pathlib.Path | None = None, *, enabled: bool = True) -> None:
        self.directory = directory or cache_directory()
        self.enabled = enabled

    def _path(self, key: str) -> pathlib.Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> Measured | None:
        if not self.enabled:
            return None
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
            return Measured(outputs=plaindata.decode(entry["outputs"]),
                            seconds=[float(s) for s in entry["seconds"]])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, measured: Measured) -> None:
        if not self.enabled:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"outputs": plaindata.encode(measured.outputs),
                                           "seconds": list(measured.seconds)}))
