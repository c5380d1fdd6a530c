"""Validate a Hugging Face ALoDLM checkpoint directory before any weight data is read.

:func:`plan_hf_checkpoint` reads the configs, the safetensors headers (never their data) and the
small exit gate, checks every tensor's name, shape and dtype against the config, and returns a
:class:`CheckpointPlan` that says where each backbone tensor lives. All problems — missing or
unexpected tensors, wrong shapes, unsupported dtypes, gate layout — are reported together in one
:class:`CheckpointError`. Both the streaming converter and :func:`load_params` start from a plan,
so they accept and reject exactly the same checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import ml_dtypes
import numpy as np

from alodlm_convert.config import ModelConfig, load_model_config, recurrence_dict
from alodlm_convert.errors import CheckpointError, raise_if_problems
from alodlm_convert.mapping import Entry, backbone_entries, gate_shapes
from alodlm_convert.safetensors_io import SafetensorsFile, TensorInfo
from alodlm_convert.torch_pickle import read_state_dict

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
GATE_FILE = "exit_gate.pt"
# Backbone dtypes we accept (floating, as released checkpoints are).
SOURCE_DTYPES = ("F32", "BF16", "F16")
DTYPE_CHOICES = ("keep", "fp32", "bf16")
DTYPE_LABELS = {np.dtype(np.float32): "fp32", np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype(np.float16): "fp16"}


@dataclasses.dataclass(frozen=True)
class PlannedTensor:
    entry: Entry
    file: SafetensorsFile
    info: TensorInfo


@dataclasses.dataclass(frozen=True)
class CheckpointPlan:
    """A validated checkpoint: config, where every backbone tensor is, the gate, the dtype."""

    model_dir: pathlib.Path
    config: ModelConfig
    recurrence: dict[str, Any]
    tensors: list[PlannedTensor]
    gate: dict[str, np.ndarray]          # exit_gate.pt as read (source dtype, source shapes)
    weight_files: list[pathlib.Path]
    target_dtype: np.dtype

    @property
    def total_bytes(self) -> int:
        return sum(t.info.nbytes for t in self.tensors)


def resolve_target_dtype(requested: str, source: set[np.dtype], problems: list[str]) -> np.dtype | None:
    """``fp32``/``bf16`` as asked; ``keep`` needs one source dtype for the whole backbone."""
    if requested == "fp32":
        return np.dtype(np.float32)
    if requested == "bf16":
        return np.dtype(ml_dtypes.bfloat16)
    if requested != "keep":
        problems.append(f"dtype: must be one of {DTYPE_CHOICES}, got {requested!r}")
        return None
    if len(source) > 1:
        problems.append(f"--dtype keep needs one backbone dtype, found {sorted(map(str, source))}; "
                        f"pass --dtype fp32 or bf16")
        return None
    return next(iter(source)) if source else None


def _weight_locations(model_dir: pathlib.Path, problems: list[str]) -> tuple[dict[str, str], list[str]]:
    """tensor name -> file name (from the index, or the single file's header), and the files."""
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            problems.append(f"{INDEX_FILE}: unreadable ({type(exc).__name__}: {exc})")
            return {}, []
        files = sorted(set(weight_map.values()))
        bad = [f for f in files if pathlib.PurePosixPath(f).name != f]
        if bad:
            problems.append(f"{INDEX_FILE}: weight_map names files outside the directory: {bad[:3]}")
            return {}, []
        return dict(weight_map), files
    if (model_dir / SINGLE_FILE).is_file():
        return {}, [SINGLE_FILE]
    found = sorted(p.name for p in model_dir.glob("*.safetensors"))
    problems.append(f"{SINGLE_FILE}: missing (and no {INDEX_FILE}); safetensors files present: {found or 'none'}")
    return {}, []


def _check_gate(model_dir: pathlib.Path, cfg: ModelConfig | None, problems: list[str]) -> dict[str, np.ndarray]:
    """Reads ``exit_gate.pt`` and checks keys (and shapes, when the config is known)."""
    path = model_dir / GATE_FILE
    if not path.is_file():
        problems.append(f"{GATE_FILE}: missing (the trained exit gate is required for inference)")
        return {}
    try:
        state = read_state_dict(path)
    except CheckpointError as exc:
        problems.append(f"{GATE_FILE}: {'; '.join(exc.problems)}")
        return {}
    expected = gate_shapes(cfg) if cfg is not None else {"net.weight": None, "net.bias": None, "depth_bias": None}
    if any(k.startswith("net.0.") or k.startswith("net.2.") for k in state):
        problems.append(f"{GATE_FILE}: legacy MLP gate layout (net.0/net.2) is not supported; "
                        f"expected the linear gate keys {sorted(expected)}")
        return {}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        problems.append(f"{GATE_FILE}: missing key(s) {missing}")
    if unexpected:
        problems.append(f"{GATE_FILE}: unexpected key(s) {unexpected}")
    for key, shape in expected.items():
        if key in state:
            arr = state[key]
            if shape is not None and tuple(arr.shape) != shape:
                problems.append(f"{GATE_FILE}: {key}: shape {list(arr.shape)} != expected {list(shape)}")
            if arr.dtype.kind != "f" and arr.dtype != np.dtype(ml_dtypes.bfloat16):
                problems.append(f"{GATE_FILE}: {key}: dtype {arr.dtype} is not floating point")
    return state


def _some(names: list[str], limit: int = 8) -> str:
    """``'a', 'b', ... and N more`` — long lists stay readable on one line."""
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def plan_hf_checkpoint(model_dir: str | pathlib.Path, dtype: str = "keep",
                       model_config_yaml: str | pathlib.Path | None = None) -> CheckpointPlan:
    """Validates a Hugging Face checkpoint directory from configs, headers and gate alone."""
    model_dir = pathlib.Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory {model_dir} does not exist")
    problems: list[str] = []
    cfg: ModelConfig | None = None
    try:
        cfg = load_model_config(model_dir, model_config_yaml)
        recurrence = recurrence_dict(model_dir, model_config_yaml)
    except CheckpointError as exc:  # keep going: report file and gate problems in the same error
        problems.extend(exc.problems)
    if dtype not in DTYPE_CHOICES:
        problems.append(f"dtype: must be one of {DTYPE_CHOICES}, got {dtype!r}")
    weight_map, file_names = _weight_locations(model_dir, problems)
    files: dict[str, SafetensorsFile] = {}
    for name in file_names:
        path = model_dir / name
        if not path.is_file():
            problems.append(f"{name}: missing (listed in {INDEX_FILE})")
            continue
        try:
            files[name] = SafetensorsFile(path)
        except CheckpointError as exc:
            problems.append(f"{name}: {'; '.join(exc.problems)}")

    # Where each tensor is stored: the index decides for sharded checkpoints.
    stored: dict[str, tuple[str, TensorInfo]] = {}
    for fname, f in files.items():
        for tname, info in f.tensors.items():
            if weight_map and weight_map.get(tname) != fname:
                if tname not in weight_map:
                    problems.append(f"{fname}: tensor {tname!r} is not listed in {INDEX_FILE}")
                continue
            if tname in stored:
                problems.append(f"{fname}: tensor {tname!r} also stored in {stored[tname][0]}")
                continue
            stored[tname] = (fname, info)
    for tname, fname in weight_map.items():
        if fname in files and tname not in files[fname].tensors:
            problems.append(f"{INDEX_FILE}: tensor {tname!r} is mapped to {fname} but not stored there")

    if cfg is None:
        _check_gate(model_dir, None, problems)
        raise_if_problems(list(dict.fromkeys(problems)), where=str(model_dir))
    entries = backbone_entries(cfg)
    expected = {e.hf_name: e for e in entries}
    source_dtypes: set[np.dtype] = set()
    planned: list[PlannedTensor] = []
    missing: list[str] = []
    for e in entries:
        if e.hf_name not in stored:
            home = weight_map.get(e.hf_name) if weight_map else (file_names[0] if file_names else None)
            if file_names and (home is None or home in files):  # unparsable files are reported already
                missing.append(e.hf_name)
            continue
        fname, info = stored[e.hf_name]
        if info.shape != e.hf_shape:
            problems.append(f"{fname}: tensor {e.hf_name!r}: shape {list(info.shape)} != expected "
                            f"{list(e.hf_shape)} from {model_dir.name}/config.json")
        if info.dtype not in SOURCE_DTYPES:
            problems.append(f"{fname}: tensor {e.hf_name!r}: dtype {info.dtype} not supported "
                            f"(expected one of {SOURCE_DTYPES})")
        else:
            source_dtypes.add(info.np_dtype)
        planned.append(PlannedTensor(e, files[fname], info))
    if missing:
        problems.append(f"missing tensor{'s' if len(missing) > 1 else ''} {_some(missing)}")
    unexpected = sorted(set(stored) - set(expected))
    if unexpected:
        hint = " (biases are not part of Qwen3)" if any(u.endswith(".bias") for u in unexpected) else ""
        problems.append(f"unexpected tensor(s) {_some(unexpected)}{hint}")

    gate = _check_gate(model_dir, cfg, problems)
    target = resolve_target_dtype(dtype, source_dtypes, problems) if dtype in DTYPE_CHOICES else None
    raise_if_problems(list(dict.fromkeys(problems)), where=str(model_dir))
    assert target is not None
    return CheckpointPlan(model_dir, cfg, recurrence, planned, gate,
                          [model_dir / n for n in file_names], target)
