"""The GPU half of the aot extra, for tests that compile for a GPU without one: JAX's CUDA plugin,
pjrt and ptxas, installed in this environment, or in the checkout's ``.ci/aot-gpu`` (where
``.ci/run`` puts them, off the suite's own path), which a child process puts on its path.
It lives beside the plan's targets, which it asks what is installed (the testing modules sit
below the plan and import nothing of it)."""

from __future__ import annotations

import os
import pathlib
import sys

from alodlm_jax.plan import targets

# ALODLM_AOT_GPU: another folder (.ci/run's tier for newer JAX lines: each its own plugin release)
DIR = pathlib.Path(os.environ.get("ALODLM_AOT_GPU")
                   or pathlib.Path(__file__).resolve().parents[2] / ".ci" / "aot-gpu")
INSTALLED = targets.missing_extra(targets.load_target("h200")) is None  # in this process
IN_CHECKOUT = any((DIR / f"jax_cuda{v}_plugin").is_dir() for v in (12, 13))  # for child_env
AVAILABLE = INSTALLED or IN_CHECKOUT


def child_env(*paths, cpu: bool = True) -> dict:
    """A child process's environment with :data:`DIR` (then ``paths``) before this process's
    path; ``cpu``: JAX_PLATFORMS=cpu (GPU targets compile without a GPU), else JAX_PLATFORMS
    unset (a user's environment: JAX picks its platforms)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(DIR), *map(str, paths)] + [p for p in sys.path if p]))
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
    else:
        env.pop("JAX_PLATFORMS", None)
    return env
