"""Params on device: converter output vs an independent mapping, dtype handling, round trip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import params as params_mod

from .conftest import params_from_state_dict


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_converter_params_equal_independent_mapping(tiny):
    import torch

    gate = torch.load(tiny.path / "exit_gate.pt", weights_only=True)
    mine = _flat(params_from_state_dict(tiny.hf_model.state_dict(), gate, tiny.cfg))
    theirs = _flat(tiny.np_params)
    assert mine.keys() == theirs.keys()
    for key, value in mine.items():
        assert theirs[key].shape == value.shape, key
        np.testing.assert_array_equal(np.asarray(theirs[key], np.float32), value, err_msg=key)


def test_to_device_casts_all_but_the_gate(tiny):
    on_device = params_mod.to_device(tiny.np_params, "bf16")
    for key, leaf in _flat(on_device).items():
        assert isinstance(leaf, jax.Array)
        assert leaf.dtype == (jnp.float32 if key.startswith("['gate']") else jnp.bfloat16), key
    assert on_device["prelude"]["q"].shape[0] == tiny.cfg.num_prelude_layers
    assert on_device["coda"]["o"].shape[0] == tiny.cfg.num_coda_layers
    kept = params_mod.to_device(tiny.np_params, "keep")
    assert kept["embed"].dtype == jnp.float32
    placed = []
    params_mod.to_device(tiny.np_params, "fp32", sharding=lambda path, a: placed.append(path))
    assert ("core", "q") in placed and ("gate", "depth_bias") in placed


@pytest.mark.parametrize("stored,dtype", [("keep", "fp32"), ("keep", "bf16"), ("bf16", "bf16")])
def test_load_model_round_trip_converted_equals_hf(tiny_checkpoints, tmp_path, stored, dtype):
    """``load_model(converted_dir)`` equals ``load_model(hf_dir)`` bit for bit (converted as stored
    or pre-cast to bf16, loaded as ``dtype``)."""
    convert = pytest.importorskip("alodlm_convert.convert")
    tiny = tiny_checkpoints["sandwich"]
    converted = convert.convert_checkpoint(tiny.path, tmp_path / "converted", dtype=stored)
    cfg_hf, from_hf = params_mod.load_model(str(tiny.path), dtype)
    cfg_cv, from_cv = params_mod.load_model(str(converted), dtype)
    assert cfg_hf == cfg_cv
    a, b = _flat(from_hf), _flat(from_cv)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert np.array_equal(np.asarray(a[key]).reshape(-1).view(np.uint8), np.asarray(b[key]).reshape(-1).view(np.uint8)), key
