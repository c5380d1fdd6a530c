"""Suite-wide pytest configuration.

The scoring and evaluation tests run model code in-process through ``subprocess`` and evalplus's
``multiprocessing`` (fork). Forking a process whose JAX backend is running can deadlock (JAX warns
about it), so those tests run first, before any test starts a JAX backend. Production code never
does this: the evaluator scores code in fresh interpreters (``alodlm_scoring.pool``). A test
in those folders that starts a JAX backend (generate mode) is marked ``jax_backend`` and runs with
the others, later.

The commands keep JAX's persistent compilation cache in the user's cache directory by default
(``$XDG_CACHE_HOME/alodlm-jax/xla``); the suite points ``XDG_CACHE_HOME`` at a temporary directory
(inherited by every child process it starts) so that no test writes into the real one.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_RUN_FIRST = ("tests/scoring/", "tests/evaluation/", "tests/sandbox/")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        if item.get_closest_marker("jax_backend"):  # starts JAX: after every fork-sensitive test
            return 1
        path = item.nodeid
        return 0 if path.startswith(_RUN_FIRST) else 1

    items.sort(key=rank)  # stable: file order is kept inside each group


_CACHE_HOME: str | None = None


def pytest_configure(config):
    global _CACHE_HOME
    _CACHE_HOME = tempfile.mkdtemp(prefix="alodlm-jax-test-cache-")
    os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
    # The suite runs on the CPU. With the aot extra installed, JAX would otherwise start libtpu's
    # backend in every process (looking for a TPU, holding libtpu's one-process lock) and the CUDA
    # plugin's (looking for a GPU); the deviceless compiles of tests/plan need neither.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_unconfigure(config):
    if _CACHE_HOME is not None:
        shutil.rmtree(_CACHE_HOME, ignore_errors=True)
