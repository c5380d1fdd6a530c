"""lm-eval is an optional extra: the base install and the scoring package never import it."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import importlib, json, pkgutil, sys
import alodlm_scoring, alodlm_jax
names = []
for package in (alodlm_scoring, alodlm_jax):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith("__main__") or info.name in SKIP:
            continue
        importlib.import_module(info.name)
        names.append(info.name)
print(json.dumps({"modules": names, "loaded": sorted({n.split(".")[0] for n in sys.modules})}))
"""
# The lm-eval model itself, the command that runs it, and modules that need the test extra.
SKIP = ("alodlm_jax.harness.model", "alodlm_jax.cli.lm_eval", "alodlm_jax.compare.torch_reference",
        "alodlm_jax.testing.tiny_checkpoint")


def test_nothing_but_the_lm_eval_model_imports_lm_eval():
    probe = f"SKIP = {SKIP!r}\n" + PROBE
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"alodlm_scoring.metrics", "alodlm_jax.cli.evaluate", "alodlm_jax.generate",
            "alodlm_jax.harness.model_args", "alodlm_jax.harness.until"} <= set(report["modules"])
    assert "lm_eval" not in report["loaded"]
