"""Load a checkpoint (Hugging Face or converted directory) into the numpy params pytree.

The pytree is DESIGN.md's: top-level ``embed``/``final_norm``/``lm_head``, an fp32 ``gate``, and
three layer stacks (``prelude``, ``core``, ``coda``) whose arrays carry a leading layer axis (length
0 for an empty group, with the right trailing shapes). Arrays are allocated once at their final
size and dtype and filled tensor by tensor, so peak memory is about the model plus one tensor.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from alodlm_convert.checkpoint import DTYPE_CHOICES, plan_hf_checkpoint, resolve_target_dtype
from alodlm_convert.config import ModelConfig, load_model_config
from alodlm_convert.errors import CheckpointError, raise_if_problems
from alodlm_convert.mapping import (GATE_KEYS, LAYER_GROUPS, Entry, backbone_entries,
                                    converted_gate_shapes, fill_ours, gate_to_ours, layer_shapes)
from alodlm_convert.transforms import cast
from alodlm_convert.safetensors_io import SafetensorsFile

Params = dict[str, Any]
MANIFEST_FILE = "manifest.json"
PARAMS_FILE = "params.safetensors"
MANIFEST_FORMAT = "alodlm-jax-params"


def allocate_params(cfg: ModelConfig, dtype: np.dtype) -> Params:
    """Uninitialised params of the right shapes: backbone in ``dtype``, gate in fp32."""
    H, V = cfg.hidden_size, cfg.vocab_size
    sizes = {"prelude": cfg.num_prelude_layers, "core": cfg.num_core_layers, "coda": cfg.num_coda_layers}
    shapes = layer_shapes(cfg)
    params: Params = {
        "embed": np.empty((V, H), dtype),
        "final_norm": np.empty((H,), dtype),
        "lm_head": np.empty((H, V), dtype),
        "gate": {k: np.empty(s, np.float32) for k, s in converted_gate_shapes(cfg).items()},
    }
    for group in LAYER_GROUPS:
        params[group] = {k: np.empty((sizes[group], *s), dtype) for k, s in shapes.items()}
    return params


def slot(params: Params, entry: Entry) -> np.ndarray:
    """The destination array of one backbone tensor (a contiguous slice of a stack, or a leaf)."""
    if entry.group is None:
        return params[entry.key]
    return params[entry.group][entry.key][entry.index]


def is_converted_dir(path: str | pathlib.Path) -> bool:
    return (pathlib.Path(path) / MANIFEST_FILE).is_file()


def _load_hf(model_dir: pathlib.Path, dtype: str, model_config_yaml) -> tuple[ModelConfig, Params]:
    plan = plan_hf_checkpoint(model_dir, dtype, model_config_yaml)
    params = allocate_params(plan.config, plan.target_dtype)
    for t in plan.tensors:
        dst = slot(params, t.entry)
        if t.entry.transform == "copy" and t.info.np_dtype == dst.dtype:
            t.file.read_into(t.info.name, dst)
        else:
            fill_ours(dst, t.entry, t.file.read(t.info.name))
    for key, value in gate_to_ours(plan.gate).items():
        np.copyto(params["gate"][key], value)
    return plan.config, params


def read_manifest(model_dir: pathlib.Path) -> dict[str, Any]:
    path = model_dir / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{MANIFEST_FILE}: unreadable ({exc})", where=str(model_dir)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{MANIFEST_FILE}: format must be {MANIFEST_FORMAT!r}", where=str(model_dir))
    return manifest


def _load_converted(model_dir: pathlib.Path, dtype: str) -> tuple[ModelConfig, Params]:
    read_manifest(model_dir)
    cfg = load_model_config(model_dir)
    where = str(model_dir)
    if not (model_dir / PARAMS_FILE).is_file():
        raise CheckpointError(f"{PARAMS_FILE}: missing", where=where)
    f = SafetensorsFile(model_dir / PARAMS_FILE)
    problems: list[str] = []
    entries = backbone_entries(cfg)
    gate_shapes = converted_gate_shapes(cfg)
    expected = {e.name: e.shape for e in entries}
    expected.update({f"gate.{k}": s for k, s in gate_shapes.items()})
    missing = [n for n in expected if n not in f.tensors]
    unexpected = sorted(set(f.tensors) - set(expected))
    if missing:
        problems.append(f"{PARAMS_FILE}: missing tensor(s) {missing[:8]}")
    if unexpected:
        problems.append(f"{PARAMS_FILE}: unexpected tensor(s) {unexpected[:8]}")
    source: set[np.dtype] = set()
    for name, shape in expected.items():
        info = f.tensors.get(name)
        if info is None:
            continue
        if info.shape != shape:
            problems.append(f"{PARAMS_FILE}: {name}: shape {list(info.shape)} != expected {list(shape)}")
        if name.startswith("gate."):
            if info.dtype != "F32":
                problems.append(f"{PARAMS_FILE}: {name}: gate must be F32, got {info.dtype}")
        else:
            source.add(info.np_dtype)
    target = resolve_target_dtype(dtype, source, problems)
    raise_if_problems(problems, where=where)
    params = allocate_params(cfg, target)
    for e in entries:
        dst = slot(params, e)
        if f.tensors[e.name].np_dtype == dst.dtype:
            f.read_into(e.name, dst)
        else:
            np.copyto(dst, cast(f.read(e.name), dst.dtype))
    for key in GATE_KEYS:
        f.read_into(f"gate.{key}", params["gate"][key])
    return cfg, params


def load_params(model: str | pathlib.Path, dtype: str = "keep",
                model_config_yaml: str | pathlib.Path | None = None) -> tuple[ModelConfig, Params]:
    """``(config, params)`` from a converted directory, an HF checkpoint directory or a Hub id.

    ``dtype``: ``"keep"`` (the stored dtype), ``"fp32"`` or ``"bf16"``; the gate is always fp32.
    ``model_config_yaml`` replaces ``alodlm_config.json`` for HF checkpoints (the reference's
    ``--model-config``); a converted directory always carries its own recurrence config.
    """
    path, converted = locate_checkpoint(model, dtype, model_config_yaml)
    if converted:
        return _load_converted(path, dtype)
    return _load_hf(path, dtype, model_config_yaml)


def locate_checkpoint(model: str | pathlib.Path, dtype: str,
                      model_config_yaml: str | pathlib.Path | None = None) -> tuple[pathlib.Path, bool]:
    """Checks the load arguments and finds the directory: ``(path, is_converted_dir)``.

    A directory is used as is; anything else goes through :func:`resolve_model` (a Hub id is
    downloaded). Shared by every loader (numpy here, sharded JAX arrays in ``alodlm_jax.sharding``).
    """
    if dtype not in DTYPE_CHOICES:
        raise CheckpointError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    path = pathlib.Path(model)
    if not path.is_dir():
        from alodlm_convert.resolve import resolve_model

        path = resolve_model(str(model))
    converted = is_converted_dir(path)
    if converted and model_config_yaml is not None:
        raise CheckpointError("a converted directory carries its own alodlm_config.json; "
                              "--model_config applies to Hugging Face checkpoints only", where=str(path))
    return path, converted
