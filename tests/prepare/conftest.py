"""Fixtures for the prepare tests: offline, and never the user's caches.

Every test here runs with ``HF_DATASETS_OFFLINE=1`` and ``HF_HUB_OFFLINE=1`` (nothing may
download) and with ``XDG_CACHE_HOME`` and the Hugging Face caches in a temporary directory, so the
ground-truth cache and the datasets cache of the user are never read or written. The libraries
read some of these settings when they are imported, which may have happened in another test
module, so their module-level copies are patched as well.

The source files are :func:`alodlm_prepare.fixtures.write_sources`'s hand-made rows in each
benchmark's real layout; ``prepared_suite`` is all eleven benchmarks prepared once from them.
"""

from __future__ import annotations

import pathlib

import pytest

from .helpers import ALL_BENCHMARKS, patch_offline


@pytest.fixture(scope="session")
def offline_root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("prepare_caches")


@pytest.fixture(autouse=True)
def offline_private_caches(offline_root, monkeypatch) -> pathlib.Path:
    """Every test here: offline, with the caches below ``offline_root``; returns XDG_CACHE_HOME."""
    patch_offline(monkeypatch, offline_root)
    return offline_root / "xdg"


@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict[str, pathlib.Path]:
    from alodlm_prepare.fixtures import write_sources

    return write_sources(tmp_path_factory.mktemp("sources"))


@pytest.fixture(scope="session")
def prepared_suite(tmp_path_factory, sources, offline_root) -> pathlib.Path:
    """All eleven benchmarks prepared from the fixture sources (one ground-truth run)."""
    from alodlm_prepare.benchmarks import lookup
    from alodlm_prepare.suite import Options, prepare_suite

    output = tmp_path_factory.mktemp("suite") / "suite.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch_offline(patch, offline_root)
        prepare_suite(Options(benchmarks=lookup(ALL_BENCHMARKS), output=str(output),
                              sources={name: str(sources[name]) for name in ALL_BENCHMARKS},
                              workers=2))
    return output
