"""Preparing a suite never loads JAX, Flax or torch (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import importlib, json, pkgutil, sys
import alodlm_prepare
for info in pkgutil.walk_packages(alodlm_prepare.__path__, "alodlm_prepare."):
    importlib.import_module(info.name)
from alodlm_jax.cli import prepare
from alodlm_prepare.fixtures import write_sources
sources = write_sources(sys.argv[1])
status = prepare.main(["alodlm-jax-prepare", "--benchmark", "MMLU,HumanEval", "--model",
                       "builtin:tiny", "--output", sys.argv[1] + "/suite.jsonl",
                       "--source=MMLU=" + str(sources["MMLU"]),
                       "--source=HumanEval=" + str(sources["HumanEval"])])
print(json.dumps({"status": status,
                  "loaded": sorted({name.split(".")[0] for name in sys.modules})}))
"""


def test_prepare_loads_no_framework(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HF_HOME": str(tmp_path / "hf"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["status"] == 0
    assert not {"jax", "jaxlib", "flax", "torch"} & set(report["loaded"])
