"""Load a checkpoint (Hugging Face or converted directory) into the numpy params pytree.

The pytree is DESIGN.md's: top-level ``embed``/``final_norm``/``lm_head``, an fp32 ``gate``, and
three layer groups (``prelude``, ``core``, ``coda``), each either a stack whose arrays carry a
leading layer axis (length 0 for an empty group, with the right trailing shapes) or, with
``per_layer``, a tuple of per-layer dicts (the layout decoding uses).

:func:`params_leaves` produces the leaves one at a time, each allocated at its final size and
dtype and filled straight from the files (:meth:`~alodlm_convert.sources.TensorSource.read_into`);
:func:`assemble_params` builds the pytree from them. :func:`load_params` keeps every leaf (peak
memory about the model plus one block of rows); a consumer that moves each leaf elsewhere before
asking for the next (``alodlm_jax.network.params.load_model`` puts it on the device) holds one leaf at a
time.
"""

from __future__ import annotations

import pathlib
from typing import Any, Iterable, Iterator

import numpy as np

from alodlm_convert.config import ModelConfig
from alodlm_convert.mapping import LAYER_GROUPS, layer_shapes
from alodlm_convert.sources import (MANIFEST_FILE, MANIFEST_FORMAT, PARAMS_FILE,
                                    CheckpointSources, is_converted_dir, locate_checkpoint,
                                    open_checkpoint, read_manifest)

Params = dict[str, Any]
LeafPath = tuple[str, ...]  # ("embed",), ("gate", "bias"), ("core", "q") or ("core", "0", "q")
TOP_LEVEL = ("embed", "final_norm", "lm_head")


def new_leaf(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The host array of one leaf (every leaf :func:`params_leaves` yields is made here)."""
    return np.empty(shape, dtype)


def _group_sizes(cfg: ModelConfig) -> dict[str, int]:
    return {"prelude": cfg.num_prelude_layers, "core": cfg.num_core_layers,
            "coda": cfg.num_coda_layers}


def params_leaves(sources: CheckpointSources, *, per_layer: bool = False
                  ) -> Iterator[tuple[LeafPath, np.ndarray]]:
    """``(path, host array)`` for every leaf, in pytree order, one freshly filled array at a time.

    Paths: ``(key,)`` at the top level, ``("gate", key)``, ``(group, key)`` for a stacked group's
    ``[L, ...]`` array, ``(group, str(layer), key)`` with ``per_layer``. The generator keeps no
    reference to a leaf once it has handed it out.
    """
    cfg, dtype = sources.config, sources.target_dtype
    shapes = layer_shapes(cfg)

    def read(key, shape) -> np.ndarray:
        out = new_leaf(shape, dtype)
        sources.tensors[key].read_into(out)
        return out

    for key in TOP_LEVEL:
        yield (key,), read((key,), sources.tensors[(key,)].entry.shape)
    for key, value in sources.gate.items():
        gate = new_leaf(value.shape, np.float32)
        np.copyto(gate, value)
        yield ("gate", key), gate
        del gate
    for group, size in _group_sizes(cfg).items():
        if per_layer:
            for index in range(size):
                for key, shape in shapes.items():
                    yield (group, str(index), key), read((group, key, index), shape)
            continue
        for key, shape in shapes.items():
            stack = new_leaf((size,) + shape, dtype)
            for index in range(size):
                sources.tensors[(group, key, index)].read_into(stack[index])
            yield (group, key), stack
            del stack


def assemble_params(leaves: Iterable[tuple[LeafPath, Any]], *, per_layer: bool = False) -> Params:
    """The params pytree from :func:`params_leaves`-style ``(path, value)`` pairs (values may be
    numpy or device arrays); with ``per_layer`` each group becomes a tuple of per-layer dicts."""
    params: Params = {}
    for path, value in leaves:
        node = params
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    if per_layer:
        for group in LAYER_GROUPS:
            layers = params.pop(group, {})
            params[group] = tuple(layers[str(i)] for i in range(len(layers)))
    return params


def load_params(model: str | pathlib.Path, dtype: str = "keep",
                model_config_yaml: str | pathlib.Path | None = None, *,
                per_layer: bool = False) -> tuple[ModelConfig, Params]:
    """``(config, params)`` from a converted directory, an HF checkpoint directory or a Hub id.

    ``dtype``: ``"keep"`` (the stored dtype), ``"fp32"`` or ``"bf16"``; the gate is always fp32.
    ``model_config_yaml`` replaces ``alodlm_config.json`` for HF checkpoints (the reference's
    ``--model-config``); a converted directory always carries its own recurrence config.
    """
    sources = open_checkpoint(model, dtype, model_config_yaml)
    return sources.config, assemble_params(params_leaves(sources, per_layer=per_layer),
                                           per_layer=per_layer)


__all__ = ["MANIFEST_FILE", "MANIFEST_FORMAT", "PARAMS_FILE", "Params", "assemble_params",
           "is_converted_dir", "load_params", "locate_checkpoint", "new_leaf", "params_leaves",
           "read_manifest"]
