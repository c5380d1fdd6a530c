"""Shared tiny checkpoints (reference format, built once per session with torch + transformers)."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("tiny_checkpoints")


def _build(root: pathlib.Path, name: str, spec: TinySpec) -> pathlib.Path:
    out = root / name
    if not out.exists():
        build_tiny_checkpoint(out, spec)
    return out


@pytest.fixture(scope="session")
def sandwich_fp32(tiny_root) -> pathlib.Path:
    return _build(tiny_root, "sandwich_fp32", TinySpec.for_topology("sandwich"))


@pytest.fixture(scope="session")
def all_layer_bf16_sharded(tiny_root) -> pathlib.Path:
    return _build(tiny_root, "all_layer_bf16_sharded",
                  TinySpec.for_topology("all_layer", dtype="bf16", max_shard_size="20KB"))


@pytest.fixture(scope="session")
def sandwich_bf16(tiny_root) -> pathlib.Path:
    return _build(tiny_root, "sandwich_bf16", TinySpec.for_topology("sandwich", dtype="bf16"))


@pytest.fixture
def copy_of(tmp_path):
    """Copies a session checkpoint into a per-test directory that the test may damage."""

    def make(src: pathlib.Path, name: str = "ckpt") -> pathlib.Path:
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst

    return make
