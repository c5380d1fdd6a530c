"""Where every tensor of a checkpoint is, validated, and reading one tensor at a time in our layout.

:func:`open_checkpoint` takes a Hugging Face checkpoint directory, a converted directory or a Hub id,
validates it from its headers (nothing else is read, except the small exit gate), and returns
:class:`CheckpointSources`: the config, the target dtype, our fp32 gate and, for every backbone
tensor, a :class:`TensorSource` keyed by its place in the params pytree (:func:`slot_key`). Every
loader starts here (the numpy pytree of :mod:`alodlm_convert.load`, JAX's streaming loader and the
sharded one in ``alodlm_jax``), so they accept and reject exactly the same directories.

:meth:`TensorSource.read_into` fills a destination in our layout and dtype straight from the file,
a block of source rows at a time: reading a tensor never holds more than its destination and one
block, whatever the transform (transpose, head split) or the cast.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

import numpy as np

from alodlm_convert.checkpoint import DTYPE_CHOICES, plan_hf_checkpoint, resolve_target_dtype
from alodlm_convert.config import ModelConfig, load_model_config
from alodlm_convert.errors import CheckpointError, raise_if_problems
from alodlm_convert.mapping import (GATE_KEYS, Entry, backbone_entries, converted_gate_shapes,
                                    gate_to_ours, place_rows, to_ours)
from alodlm_convert.safetensors_io import SafetensorsFile, TensorInfo, read_exact

MANIFEST_FILE = "manifest.json"
PARAMS_FILE = "params.safetensors"
MANIFEST_FORMAT = "alodlm-jax-params"
READ_BLOCK_BYTES = 32 * 1024 * 1024

SlotKey = tuple  # (key,) for a top-level tensor, (group, key, index) for a layer tensor


def slot_key(entry: Entry) -> SlotKey:
    """Where a backbone tensor lives in the params pytree."""
    return (entry.key,) if entry.group is None else (entry.group, entry.key, entry.index)


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """One stored backbone tensor: its file and header entry, and how it maps to our layout.

    ``hf_layout``: stored as Hugging Face stores it (PyTorch ``[out, in]``; the entry's transform
    applies); otherwise stored in our layout already (a converted directory).
    """

    file: SafetensorsFile
    info: TensorInfo
    entry: Entry
    hf_layout: bool

    @property
    def transform(self) -> str:
        return self.entry.transform if self.hf_layout else "copy"

    def read_into(self, dst: np.ndarray, block_bytes: int = READ_BLOCK_BYTES) -> None:
        """Fills ``dst`` (our shape, any supported dtype, C-contiguous) from the file.

        A plain copy in the stored dtype is read straight into ``dst``; anything else goes through
        one reused buffer of about ``block_bytes`` of whole source rows (exact casts and the tiled
        transpose of :func:`alodlm_convert.mapping.place_rows`).
        """
        info = self.info
        if tuple(dst.shape) != self.entry.shape or not dst.flags.c_contiguous:
            raise ValueError(f"{info.name}: destination {dst.dtype}{list(dst.shape)} does not match "
                             f"{list(self.entry.shape)} (C-contiguous)")
        if self.transform == "copy" and info.np_dtype == dst.dtype:
            self.file.read_into(info.name, dst)
            return
        rows = info.shape[0]
        row_bytes = math.prod(info.shape[1:]) * info.np_dtype.itemsize
        rows_per_block = max(1, block_bytes // max(1, row_bytes))
        buffer = np.empty(min(rows, rows_per_block) * row_bytes, np.uint8)
        with open(self.file.path, "rb", buffering=0) as f:
            f.seek(info.start)
            for first in range(0, rows, rows_per_block):
                count = min(rows_per_block, rows - first)
                raw = buffer[: count * row_bytes]
                read_exact(f, memoryview(raw), self.file.path, f"tensor {info.name!r}")
                block = raw.view(info.np_dtype).reshape((count,) + tuple(info.shape[1:]))
                place_rows(dst, self.transform, first, block)

    def view(self) -> np.ndarray:
        """Our-layout view of the stored bytes (a memory map: nothing is read until it is indexed).

        For reading parts of a tensor (a shard); :meth:`read_into` is the way to read it whole.
        """
        info = self.info
        if math.prod(info.shape) == 0:
            raw = np.empty(info.shape, info.np_dtype)
        else:
            raw = np.memmap(self.file.path, dtype=info.np_dtype, mode="r", offset=info.start,
                            shape=info.shape)
        return to_ours(self.entry, raw) if self.hf_layout else raw


@dataclasses.dataclass(frozen=True)
class CheckpointSources:
    """A validated checkpoint, ready to be read tensor by tensor."""

    model_dir: pathlib.Path
    config: ModelConfig
    target_dtype: np.dtype  # of the backbone; the gate is always fp32
    tensors: dict[SlotKey, TensorSource]
    gate: dict[str, np.ndarray]  # ours (weight [H], bias [], depth_bias [K]), fp32


def is_converted_dir(path: str | pathlib.Path) -> bool:
    return (pathlib.Path(path) / MANIFEST_FILE).is_file()


def read_manifest(model_dir: pathlib.Path) -> dict[str, Any]:
    path = model_dir / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{MANIFEST_FILE}: unreadable ({exc})", where=str(model_dir)) from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{MANIFEST_FILE}: format must be {MANIFEST_FORMAT!r}", where=str(model_dir))
    return manifest


def locate_checkpoint(model: str | pathlib.Path, dtype: str,
                      model_config_yaml: str | pathlib.Path | None = None) -> tuple[pathlib.Path, bool]:
    """Checks the load arguments and finds the directory: ``(path, is_converted_dir)``.

    A directory is used as is; anything else goes through :func:`resolve_model` (a Hub id is
    downloaded).
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


def open_checkpoint(model: str | pathlib.Path, dtype: str = "keep",
                    model_config_yaml: str | pathlib.Path | None = None) -> CheckpointSources:
    """Locates and validates a converted directory, an HF checkpoint directory or a Hub id.

    ``dtype``: ``"keep"`` (the stored dtype), ``"fp32"`` or ``"bf16"``. ``model_config_yaml``
    replaces ``alodlm_config.json`` for HF checkpoints (the reference's ``--model-config``).
    """
    path, converted = locate_checkpoint(model, dtype, model_config_yaml)
    if converted:
        return _converted_sources(path, dtype)
    plan = plan_hf_checkpoint(path, dtype, model_config_yaml)
    tensors = {slot_key(t.entry): TensorSource(t.file, t.info, t.entry, hf_layout=True)
               for t in plan.tensors}
    return CheckpointSources(path, plan.config, plan.target_dtype, tensors, gate_to_ours(plan.gate))


def _converted_sources(model_dir: pathlib.Path, dtype: str) -> CheckpointSources:
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
    tensors = {slot_key(e): TensorSource(f, f.tensors[e.name], e, hf_layout=False) for e in entries}
    gate = {key: f.read(f"gate.{key}") for key in GATE_KEYS}
    return CheckpointSources(model_dir, cfg, target, tensors, gate)
