"""Streaming load (alodlm_jax.network.params.load_model): each tensor is read, put on its device and dropped
before the next one is read, and the result equals loading the whole numpy pytree first.

The "one host copy at a time" check instruments the converter's one allocation point for leaves
(``alodlm_convert.load.new_leaf``): when a leaf is allocated, no leaf allocated before it may still
be alive (weak references; no timing involved). JAX itself keeps a transferred numpy array alive
until some later call (measured: at the next transfer, most of the time), which says nothing
about the loader, so the check hands JAX a copy of each leaf; the peak memory JAX adds is what
``scripts/bench_load.py`` measures."""

from __future__ import annotations

import weakref

import jax
import numpy as np
import pytest

from alodlm_convert import load as convert_load
from alodlm_jax.network import params as params_mod
from alodlm_jax.data import BUILTINS
from alodlm_jax.network.params import load_model, to_device

TINY = BUILTINS["builtin:tiny"]


class LeafWatch:
    """Wraps ``new_leaf``: records, at every allocation, how many earlier leaves are alive; JAX
    gets a copy of every leaf (see the module docstring)."""

    def __init__(self, monkeypatch):
        self.alive_at_allocation: list[int] = []
        self._refs: list[weakref.ref] = []
        real_leaf, real_put = convert_load.new_leaf, params_mod.jax.device_put

        def watched(shape, dtype):
            self.alive_at_allocation.append(sum(ref() is not None for ref in self._refs))
            leaf = real_leaf(shape, dtype)
            self._refs.append(weakref.ref(leaf))
            return leaf

        monkeypatch.setattr(convert_load, "new_leaf", watched)
        monkeypatch.setattr(params_mod.jax, "device_put",
                            lambda x, *args, **kwargs: real_put(np.array(x), *args, **kwargs))
        monkeypatch.setattr(params_mod.jnp, "asarray", lambda x: real_put(np.array(x)))


def _leaves(params):
    return jax.tree_util.tree_leaves_with_path(params)


@pytest.mark.parametrize("per_layer", [True, False])
def test_load_model_holds_one_host_leaf_at_a_time(monkeypatch, per_layer):
    watch = LeafWatch(monkeypatch)
    cfg, params = load_model(TINY, "fp32", per_layer=per_layer)
    assert len(watch.alive_at_allocation) == len(_leaves(params)) > 10
    assert max(watch.alive_at_allocation) == 0, watch.alive_at_allocation


def test_the_watch_sees_a_loader_that_keeps_the_host_pytree(monkeypatch):
    """Control: the numpy pytree first, then the device (the loader before streaming)."""
    watch = LeafWatch(monkeypatch)
    _, host = convert_load.load_params(TINY, "fp32")
    to_device(host, "fp32", per_layer=True)
    assert watch.alive_at_allocation == list(range(len(watch.alive_at_allocation)))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("per_layer", [True, False])
def test_streamed_params_equal_the_numpy_pytree_on_the_device(dtype, per_layer):
    cfg, streamed = load_model(TINY, dtype, per_layer=per_layer)
    cfg_host, host = convert_load.load_params(TINY, dtype)
    expected = to_device(host, dtype, per_layer=per_layer)
    assert cfg == cfg_host
    assert jax.tree_util.tree_structure(streamed) == jax.tree_util.tree_structure(expected)
    for (path, got), (_, want) in zip(_leaves(streamed), _leaves(expected)):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert np.array_equal(np.asarray(got).reshape(-1).view(np.uint8),
                              np.asarray(want).reshape(-1).view(np.uint8)), path
