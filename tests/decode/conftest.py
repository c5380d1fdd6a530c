"""Fixtures for the decoding tests: peaked tiny checkpoints of both topologies, loaded once per
session into JAX (through the real loader) and into the PyTorch reference (the oracle).

``lm_head_scale = 64`` makes the tiny model's logits peaked enough that entropy mode commits
several tokens in one pass in some windows (tau 2: ~4 tokens per window forward) while exit depths
still vary between 1 and 4 (q = 1), so the parity grid exercises every decision branch.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

TOPOLOGIES = ("sandwich", "all_layer")
PEAKED_SCALE = 64.0


@dataclasses.dataclass
class Tiny:
    topology: str
    path: pathlib.Path
    cfg: object
    params: dict
    ref: object  # TorchALoDLM

    def engine(self, decode, stop_ids=None, cfg=None, params=None):
        from alodlm_jax.decode.portable import PortableEngine

        stops = self.ref.default_stop_ids() if stop_ids is None else stop_ids
        return PortableEngine(cfg or self.cfg, params or self.params, decode, stops)


def with_max_depth(cfg, depth: int):
    """A copy of a ModelConfig with another max_depth, bypassing validation (K = 1 is a test-only
    configuration of §12.2 property 4; real checkpoints need K >= 2)."""
    new = object.__new__(type(cfg))
    for field in dataclasses.fields(cfg):
        object.__setattr__(new, field.name, getattr(cfg, field.name))
    object.__setattr__(new, "max_depth", depth)
    return new


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Tiny]:
    pytest.importorskip("torch")
    import transformers

    from alodlm_jax.network.params import load_model
    from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint
    from alodlm_jax.compare.torch_reference import TorchALoDLM

    transformers.logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("decode_tiny")
    out = {}
    for topology in TOPOLOGIES:
        path = build_tiny_checkpoint(root / topology,
                                     TinySpec.for_topology(topology, lm_head_scale=PEAKED_SCALE))
        cfg, params = load_model(str(path), "fp32")
        out[topology] = Tiny(topology, path, cfg, params, TorchALoDLM.from_checkpoint(path, "fp32"))
    return out


@pytest.fixture(params=TOPOLOGIES)
def tiny(request, tiny_models) -> Tiny:
    return tiny_models[request.param]


@pytest.fixture()
def sandwich(tiny_models) -> Tiny:
    return tiny_models["sandwich"]
