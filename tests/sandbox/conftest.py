"""Fixtures of the sandbox tests: what this machine's sandbox provides, found once."""

from __future__ import annotations

import os

import pytest

from alodlm_scoring.pool import ScoringPool


@pytest.fixture(scope="session")
def sandbox_mechanisms() -> frozenset[str]:
    """The mechanisms a scoring worker's sandbox has here (probed by one worker), plus
    ``process-limit`` where the number of processes is bounded (a pids cgroup, or
    ``RLIMIT_NPROC``, which binds every user but root)."""
    with ScoringPool(1) as pool:
        described = pool.code_sandbox
    found = set(described["mechanisms"] or ())
    if "pids-cgroup" in found or (os.geteuid() != 0 and "hard-rlimits" in found):
        found.add("process-limit")
    return frozenset(found)


def require(mechanisms: frozenset[str], needs=(), needs_any=()) -> None:
    """Skip, naming what is missing, when the machine lacks what a case depends on."""
    missing = [name for name in needs if name not in mechanisms]
    if missing:
        pytest.skip("this machine's sandbox lacks " + ", ".join(missing))
    if needs_any and not any(name in mechanisms for name in needs_any):
        pytest.skip("this machine's sandbox has none of " + ", ".join(needs_any))
