"""The scoring package must never load a deep-learning framework (DESIGN.md, SCORING.md §9).

Checked in a fresh interpreter: import every module of ``alodlm_scoring`` and exercise the lazily
imported scorers (math-verify, evalplus), then look at ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

FRAMEWORKS = ("jax", "jaxlib", "flax", "torch")

PROBE = r"""
import importlib, json, pkgutil, sys
import alodlm_scoring
names = ["alodlm_scoring"]
for info in pkgutil.walk_packages(alodlm_scoring.__path__, "alodlm_scoring."):
    if info.name.endswith("__main__"):
        continue  # running a package's __main__ module has side effects
    importlib.import_module(info.name)
    names.append(info.name)
from alodlm_scoring.metrics import score
score({"metric": "math", "answer": "1/2"}, "\\boxed{0.5}")
from alodlm_scoring import metrics
metrics._ensure_grader_works()
loaded = sorted({name.split(".")[0] for name in sys.modules})
print(json.dumps({"modules": names, "loaded": loaded}))
"""


def test_no_framework_is_imported():
    # evalplus 0.3.1 cannot read EVALPLUS_TIMEOUT_PER_TASK (SCORING.md §5.4): keep it out.
    env = {k: v for k, v in os.environ.items() if k != "EVALPLUS_TIMEOUT_PER_TASK"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"alodlm_scoring.tasks", "alodlm_scoring.metrics", "alodlm_scoring.extract"} <= set(
        report["modules"]
    )
    assert "math_verify" in report["loaded"] and "evalplus" in report["loaded"]
    assert not set(FRAMEWORKS) & set(report["loaded"])


def test_package_import_is_light():
    probe = (
        "import sys, json, alodlm_scoring, alodlm_scoring.tasks\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(json.loads(result.stdout))
    assert not {"math_verify", "evalplus", "sympy", "numpy", *FRAMEWORKS} & loaded
