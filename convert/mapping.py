"""The name and layout mapping from Hugging Face Qwen3 tensors to our params.

Every stored tensor has one :class:`Entry`: its Hugging Face name and PyTorch shape (``[out, in]``
for linear layers, MODEL_AND_DECODING.md §4.2), our flat name (the converted file's key) and our
shape (``[in, out]``, attention heads split out; DESIGN.md's params pytree), and where it lives in
the params pytree (top level, or a layer group and index). The transforms are pure views
(transpose plus a reshape of one axis), so a conversion copies each tensor's bytes once.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from alodlm_convert.config import ModelConfig
from alodlm_convert.transforms import cast, transpose_into, transposed

Transform = Literal["copy", "transpose", "transpose_split_out", "transpose_split_in"]
LAYER_GROUPS = ("prelude", "core", "coda")
LAYER_KEYS = ("input_norm", "q", "k", "v", "o", "q_norm", "k_norm", "post_norm",
              "gate_proj", "up_proj", "down_proj")
GATE_KEYS = ("weight", "bias", "depth_bias")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One backbone tensor: Hugging Face name/shape, our name/shape, transform and pytree slot."""

    hf_name: str
    hf_shape: tuple[int, ...]
    name: str
    shape: tuple[int, ...]
    transform: Transform
    group: str | None = None  # prelude/core/coda for layer tensors, None for top-level ones
    index: int = 0            # index inside the group's stack
    key: str = ""             # LayerStack key, or the top-level params key


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our per-layer shapes (one LayerStack slice, no leading layer axis)."""
    H, I, nq, nkv, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                         cfg.num_key_value_heads, cfg.head_dim)
    return {
        "input_norm": (H,), "q": (H, nq, dh), "k": (H, nkv, dh), "v": (H, nkv, dh), "o": (nq, dh, H),
        "q_norm": (dh,), "k_norm": (dh,), "post_norm": (H,),
        "gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H),
    }


def backbone_entries(cfg: ModelConfig) -> list[Entry]:
    """All backbone tensors in a canonical order: embed, layers 0..N-1, final_norm, lm_head."""
    H, I, V, nq, nkv, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size,
                            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    ours = layer_shapes(cfg)
    per_layer: list[tuple[str, str, tuple[int, ...], Transform]] = [
        ("input_layernorm", "input_norm", (H,), "copy"),
        ("self_attn.q_proj", "q", (nq * dh, H), "transpose_split_out"),
        ("self_attn.k_proj", "k", (nkv * dh, H), "transpose_split_out"),
        ("self_attn.v_proj", "v", (nkv * dh, H), "transpose_split_out"),
        ("self_attn.o_proj", "o", (H, nq * dh), "transpose_split_in"),
        ("self_attn.q_norm", "q_norm", (dh,), "copy"),
        ("self_attn.k_norm", "k_norm", (dh,), "copy"),
        ("post_attention_layernorm", "post_norm", (H,), "copy"),
        ("mlp.gate_proj", "gate_proj", (I, H), "transpose"),
        ("mlp.up_proj", "up_proj", (I, H), "transpose"),
        ("mlp.down_proj", "down_proj", (H, I), "transpose"),
    ]
    entries = [Entry("model.embed_tokens.weight", (V, H), "embed", (V, H), "copy", key="embed")]
    for layer in range(cfg.num_hidden_layers):
        group, index = cfg.layer_group(layer)
        for hf_part, key, hf_shape, transform in per_layer:
            entries.append(Entry(f"model.layers.{layer}.{hf_part}.weight", hf_shape, f"layers.{layer}.{key}",
                                 ours[key], transform, group=group, index=index, key=key))
    entries.append(Entry("model.norm.weight", (H,), "final_norm", (H,), "copy", key="final_norm"))
    entries.append(Entry("lm_head.weight", (V, H), "lm_head", (H, V), "transpose", key="lm_head"))
    return entries


def gate_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Source shapes of ``exit_gate.pt`` (§4.3)."""
    return {"net.weight": (1, cfg.hidden_size), "net.bias": (1,), "depth_bias": (cfg.max_depth,)}


def converted_gate_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our gate shapes (fp32): weight ``[H]``, bias scalar, depth_bias ``[K]``."""
    return {"weight": (cfg.hidden_size,), "bias": (), "depth_bias": (cfg.max_depth,)}


def to_ours(entry: Entry, array: np.ndarray) -> np.ndarray:
    """Hugging Face layout -> our layout, as a view (no copy)."""
    if tuple(array.shape) != entry.hf_shape:
        raise ValueError(f"{entry.hf_name}: shape {list(array.shape)} != expected {list(entry.hf_shape)}")
    if entry.transform == "copy":
        out = array
    else:
        out = array.T.reshape(entry.shape)
    assert out.shape == entry.shape, (entry.name, out.shape, entry.shape)
    return out


def place_rows(dst: np.ndarray, transform: Transform, first_row: int, block: np.ndarray) -> None:
    """Writes rows ``first_row ..`` of a stored tensor into ``dst`` (our layout, any supported dtype).

    ``block`` holds consecutive rows of the stored tensor (leading axis: rows; any dtype). For
    ``copy`` the rows keep their place; the transposes store ``[R, C]`` as our ``[C, R]`` (then the
    head split, a reshape), so source rows become columns. Casts are exact
    (:mod:`alodlm_convert.transforms`) and happen on the side of the transpose with the smaller
    element size; the transpose is tiled. A whole tensor is one block with ``first_row = 0``.
    """
    count = block.shape[0]
    rows = block.reshape(count, -1)
    if transform == "copy":
        np.copyto(dst.reshape(-1, rows.shape[1])[first_row:first_row + count], cast(rows, dst.dtype))
        return
    flat = dst.reshape(rows.shape[1], -1)  # our [C, R]: a view of the contiguous destination
    if not np.shares_memory(flat, dst):  # pragma: no cover - dst is always contiguous here
        raise ValueError("destination must be contiguous")
    part = flat[:, first_row:first_row + count]
    if rows.dtype == dst.dtype:
        transpose_into(part, rows)
    elif rows.dtype.itemsize > dst.dtype.itemsize:
        transpose_into(part, cast(rows, dst.dtype))
    else:
        np.copyto(part, cast(transposed(rows), dst.dtype))


def gate_to_ours(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``exit_gate.pt`` tensors -> our fp32 gate (exact widening from bf16/fp16)."""
    return {
        "weight": np.ascontiguousarray(state["net.weight"][0], dtype=np.float32),
        "bias": np.asarray(state["net.bias"][0], dtype=np.float32).reshape(()),
        "depth_bias": np.ascontiguousarray(state["depth_bias"], dtype=np.float32),
    }
