"""Fixtures of the compiled-engine tests: tiny checkpoints built on demand, once per session."""

from __future__ import annotations

import pytest

from .cases import Checkpoints


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Checkpoints:
    pytest.importorskip("torch")
    return Checkpoints(tmp_path_factory.mktemp("decode_compiled"))
