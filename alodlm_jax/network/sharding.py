"""Tensor parallelism: a device mesh, partition rules for params and KV cache, sharded loading.

The mesh has two named axes, ``("data", "model")``. Only ``model`` partitions tensors (Megatron
style: attention by heads, the MLP by its intermediate dimension); ``data`` replicates them and
splits the compiled engine's batch of request slots (:mod:`alodlm_jax.decode.layout`). Across
processes and hosts, data parallelism is the task split of :mod:`alodlm_jax.cli.distributed`: every
process builds its mesh over its own *local* devices and decodes its own tasks, so no collective
ever crosses a host during decoding.

Partition rules (DESIGN.md's params pytree; a layer stack's leading ``L`` axis is never split):

========================  ====================  ===============================================
tensor                    shape                 split on ``model``
========================  ====================  ===============================================
``q``                     ``[L, H, n_q, d_h]``  ``n_q`` (query heads)
``k``, ``v``              ``[L, H, n_kv, d_h]`` ``n_kv`` (KV heads)
``o``                     ``[L, n_q, d_h, H]``  ``n_q`` (its input heads)
``gate_proj``/``up_proj`` ``[L, H, I]``         ``I`` (output)
``down_proj``             ``[L, I, H]``         ``I`` (input)
``lm_head``               ``[H, V]``            ``V``
``embed``                 ``[V, H]``            ``V``
norms, ``gate``           —                     replicated
KV cache                  ``[..., T, n_kv, d_h]`` ``n_kv``
========================  ====================  ===============================================

Why heads line up: query head ``h`` reads KV head ``h // (n_q / n_kv)``; contiguous blocks of
``n_q / m`` query heads and ``n_kv / m`` KV heads land on the same device, so attention (and the
cache it reads) is entirely local and each layer needs only the two all-reduces after ``o`` and
``down_proj``. Why the embedding is split on ``V`` rather than replicated: it is the largest
tensor after the head (``V·H`` = 0.62 G elements for the 8B, 1.24 GB in bf16) and a replicated copy
would cost that much on every device; a row gather from a ``V``-split table costs one all-reduce of
the ``[T, H]`` rows it produces (every row is non-zero on exactly one device, so the sum is exact).

Loading (:func:`load_sharded_params`) builds each array with ``jax.make_array_from_callback``: the
callback gets the index (slices) of one device's shard, maps the tensor's bytes in the safetensors
file (``np.memmap`` at the header's offsets, so nothing is read until touched), applies the
converter's view transform (transpose / head split) and copies just that slice, cast with the
converter's exact casts. A layer stack's shard is assembled from the per-layer tensors of the
requested layer range. No device (and no host buffer) ever holds a full copy of a split tensor.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from alodlm_jax.network import cache as KC

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)

Params = dict[str, Any]

# Partition specs of one LayerStack's arrays (leading layer axis first, never split).
STACK_SPECS: dict[str, P] = {
    "input_norm": P(None, None),
    "q": P(None, None, MODEL_AXIS, None),
    "k": P(None, None, MODEL_AXIS, None),
    "v": P(None, None, MODEL_AXIS, None),
    "o": P(None, MODEL_AXIS, None, None),
    "q_norm": P(None, None),
    "k_norm": P(None, None),
    "post_norm": P(None, None),
    "gate_proj": P(None, None, MODEL_AXIS),
    "up_proj": P(None, None, MODEL_AXIS),
    "down_proj": P(None, MODEL_AXIS, None),
}
TOP_SPECS: dict[str, P] = {
    "embed": P(MODEL_AXIS, None),
    "final_norm": P(None),
    "lm_head": P(None, MODEL_AXIS),
}
# KV cache buffers: prelude/coda [L, T, n_kv, d_h], core [L, K, T, n_kv, d_h].
CACHE_SPECS: dict[str, P] = {
    "prelude_k": P(None, None, MODEL_AXIS, None),
    "prelude_v": P(None, None, MODEL_AXIS, None),
    "core_k": P(None, None, None, MODEL_AXIS, None),
    "core_v": P(None, None, None, MODEL_AXIS, None),
    "coda_k": P(None, None, MODEL_AXIS, None),
    "coda_v": P(None, None, MODEL_AXIS, None),
}
LAYER_GROUPS = ("prelude", "core", "coda")


# --------------------------------------------------------------------------------------------
# The mesh
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Axis sizes of the per-process mesh: ``model`` (tensor parallel) and ``data`` (replicas)."""

    model: int = 1
    data: int = 1

    def __post_init__(self) -> None:
        for name in ("model", "data"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--mesh: {name} must be a positive integer, got {value!r}")

    @property
    def num_devices(self) -> int:
        return self.model * self.data

    @classmethod
    def parse(cls, text: str | None) -> "MeshSpec":
        """``"model=4"``, ``"model=2,data=2"`` (also ``"data=2 model=2"``); empty/None -> 1 x 1."""
        if text is None or not text.strip():
            return cls()
        sizes: dict[str, int] = {}
        for part in re.split(r"[,\s]+", text.strip()):
            match = re.fullmatch(r"(\w+)=(\d+)", part)
            if match is None:
                raise ValueError(f"--mesh: cannot parse {part!r} in {text!r}; expected AXIS=SIZE pairs "
                                 f"such as model=4 or model=2,data=2")
            axis, size = match.group(1), int(match.group(2))
            if axis not in MESH_AXES:
                raise ValueError(f"--mesh: unknown axis {axis!r} in {text!r}; axes are {list(MESH_AXES)}")
            if axis in sizes:
                raise ValueError(f"--mesh: axis {axis!r} given twice in {text!r}")
            sizes[axis] = size
        return cls(**sizes)

    def __str__(self) -> str:
        return f"model={self.model},data={self.data}"


def check_layout(spec: MeshSpec, engine: str, batch_size: int) -> None:
    """ValueError (one line saying what to use instead) unless ``engine`` can decode on ``spec``
    with ``batch_size`` request slots: the compiled engine takes any mesh and a batch that is a
    multiple of ``data``; the portable engine decodes one request at a time, so no ``data`` axis."""
    if engine == "portable" and spec.data > 1:
        raise ValueError(f"--mesh {spec}: the data axis splits a batch of requests, which only the "
                         f"compiled engine decodes; use --engine compiled --batch_size "
                         f"{2 * spec.data} (any multiple of data={spec.data})")
    check_batch_split(batch_size, spec.data)


def layout_record(spec: MeshSpec, num_processes: int) -> dict:
    """The protocol's layout keys (``mesh``: ``{"data", "model"}``, ``num_processes``) where
    decoding spans several devices or processes; empty otherwise (SCORING.md §7.4)."""
    if spec.num_devices == 1 and num_processes == 1:
        return {}
    return {"mesh": {"data": spec.data, "model": spec.model}, "num_processes": num_processes}


def check_batch_split(batch_size: int, data: int) -> None:
    """ValueError unless ``batch_size`` request slots split evenly over ``data`` shards."""
    if batch_size % data:
        raise ValueError(f"--batch_size {batch_size} is not a multiple of the mesh's data={data} (each "
                         f"data shard decodes batch_size / data requests); use a multiple of {data}")


def make_mesh(spec: MeshSpec | str | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``("data", "model")`` mesh over the first ``data·model`` devices of ``devices``.

    ``devices`` defaults to this process's local devices (``jax.local_devices()``): under
    :mod:`alodlm_jax.cli.distributed` each process decodes on its own devices.
    """
    if not isinstance(spec, MeshSpec):
        spec = MeshSpec.parse(spec)
    devices = list(jax.local_devices() if devices is None else devices)
    if spec.num_devices > len(devices):
        raise ValueError(f"--mesh {spec} needs {spec.num_devices} devices, but this process has "
                         f"{len(devices)} ({devices[0].platform if devices else 'none'})")
    grid = np.empty((spec.data, spec.model), dtype=object)
    for i, device in enumerate(devices[: spec.num_devices]):
        grid[i // spec.model, i % spec.model] = device
    return Mesh(grid, MESH_AXES)


def model_axis_size(mesh: Mesh) -> int:
    return int(mesh.shape.get(MODEL_AXIS, 1))


def check_divisibility(cfg, model: int) -> None:
    """Every split dimension must be a multiple of ``model`` (one clear line naming the sizes)."""
    dims = {
        "num_key_value_heads": cfg.num_key_value_heads,
        "num_attention_heads": cfg.num_attention_heads,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
    }
    bad = [f"{name}={value}" for name, value in dims.items() if value % model]
    if bad:
        valid = [d for d in range(1, max(dims.values()) + 1) if all(v % d == 0 for v in dims.values())]
        raise ValueError(f"--mesh model={model} does not divide {', '.join(bad)} (tensor parallelism "
                         f"splits heads, the MLP and the vocabulary evenly); model sizes that work "
                         f"for this checkpoint: {valid}")


# --------------------------------------------------------------------------------------------
# Shardings of the params pytree and the KV cache
# --------------------------------------------------------------------------------------------


def param_specs() -> Params:
    """The PartitionSpec pytree of the params (same structure as DESIGN.md's ``Params``)."""
    specs: Params = dict(TOP_SPECS)
    specs["gate"] = {"weight": P(None), "bias": P(), "depth_bias": P(None)}
    for group in LAYER_GROUPS:
        specs[group] = dict(STACK_SPECS)
    return specs


def param_shardings(mesh: Mesh, cfg=None) -> Params:
    """NamedShardings of every params leaf; checks divisibility when ``cfg`` is given."""
    if cfg is not None:
        check_divisibility(cfg, model_axis_size(mesh))
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), param_specs(),
                                  is_leaf=lambda x: isinstance(x, P))


def cache_shardings(mesh: Mesh, cfg=None):
    """A ``KVCache`` whose fields are the NamedShardings of its buffers (KV heads on ``model``).

    With ``cfg``, the buffers of an empty layer group (the 1.7B's prelude and coda) are replicated:
    XLA returns zero-size arrays unsharded, and the engine's executables must agree with that.
    """
    empty = set()
    if cfg is not None:
        empty = {g for g, n in (("prelude", cfg.num_prelude_layers), ("core", cfg.num_core_layers),
                                ("coda", cfg.num_coda_layers)) if n == 0}
    return KC.KVCache(**{name: NamedSharding(mesh, P() if name.split("_")[0] in empty else spec)
                      for name, spec in CACHE_SPECS.items()})


def init_sharded_cache(cfg, t_max: int, dtype, mesh: Mesh):
    """``model.init_cache`` created directly in its shards (each device allocates its heads)."""
    check_divisibility(cfg, model_axis_size(mesh))
    make = jax.jit(lambda: KC.init_cache(cfg, t_max, dtype), out_shardings=cache_shardings(mesh, cfg))
    return make()


def shard_params(params: Params, mesh: Mesh, cfg=None) -> Params:
    """Places an in-memory params pytree (numpy or jax) onto the mesh by the rules above.

    For tests and small models; large checkpoints should use :func:`load_sharded_params`, which
    never holds a whole tensor in one place.
    """
    shardings = param_shardings(mesh, cfg)
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, s), params, shardings)


def sharding_hook(mesh: Mesh) -> Callable[[tuple[str, ...], Any], NamedSharding]:
    """``alodlm_jax.network.params``' ``sharding`` hook form of the rules: ``(path, array) -> sharding``."""
    specs = param_specs()

    def hook(path: tuple[str, ...], array) -> NamedSharding:
        node = specs
        for key in path:
            node = node[key]
        return NamedSharding(mesh, node)

    return hook


# --------------------------------------------------------------------------------------------
# Sharded loading straight from safetensors files
# --------------------------------------------------------------------------------------------


def _read_slice(source, index: tuple, dtype: np.dtype) -> np.ndarray:
    """The requested slice of one tensor (an ``alodlm_convert.sources.TensorSource``), copied out
    of the file and cast exactly to ``dtype``."""
    from alodlm_convert.transforms import cast

    part = np.ascontiguousarray(source.view()[index])
    return np.ascontiguousarray(cast(part, dtype))


def _leaf_callback(source, dtype: np.dtype):
    """``cb(index)`` for ``make_array_from_callback``: one shard of a top-level tensor."""
    return lambda index: _read_slice(source, tuple(index), dtype)


def _make_array(shape: tuple[int, ...], sharding: NamedSharding, callback) -> jax.Array:
    return jax.make_array_from_callback(shape, sharding, callback)


def load_sharded_params(model_dir: str | pathlib.Path, cfg, mesh: Mesh, dtype: str = "bf16", *,
                        model_config_yaml=None) -> Params:
    """The params pytree as global arrays sharded on ``mesh``, read shard by shard from disk.

    ``model_dir`` is a converted directory (Flax layout, stored as is) or a Hugging Face checkpoint
    directory (the converter's transpose / head split is applied as a view before slicing).
    ``cfg`` may be ``None`` (read from the directory); if given it must equal the directory's.
    ``dtype``: ``"fp32"``, ``"bf16"`` or ``"keep"``; the gate is always fp32 (replicated).
    """
    cfg_read, params = load_sharded_model(model_dir, mesh, dtype, model_config_yaml=model_config_yaml)
    if cfg is not None and cfg != cfg_read:
        raise ValueError(f"{model_dir}: the given ModelConfig differs from the directory's")
    return params


def load_sharded_model(model: str | pathlib.Path, mesh: Mesh, dtype: str = "bf16", *,
                       model_config_yaml=None):
    """``(ModelConfig, sharded params)`` from a converted dir, an HF dir or a Hub id."""
    from alodlm_convert.sources import open_checkpoint

    checkpoint = open_checkpoint(model, dtype, model_config_yaml)
    cfg, sources, gate, target = (checkpoint.config, checkpoint.tensors, checkpoint.gate,
                                  checkpoint.target_dtype)
    shardings = param_shardings(mesh, cfg)
    sizes = {"prelude": cfg.num_prelude_layers, "core": cfg.num_core_layers, "coda": cfg.num_coda_layers}
    from alodlm_convert.mapping import layer_shapes

    shapes = layer_shapes(cfg)
    params: Params = {}
    for key in TOP_SPECS:
        src = sources[(key,)]
        params[key] = _make_array(tuple(src.entry.shape), shardings[key], _leaf_callback(src, target))
    params["gate"] = {k: jax.device_put(np.asarray(v, np.float32), shardings["gate"][k])
                      for k, v in gate.items()}
    for group in LAYER_GROUPS:
        stack = {}
        for key, shape in shapes.items():
            srcs = [sources[(group, key, i)] for i in range(sizes[group])]
            stack[key] = _make_array((sizes[group],) + tuple(shape), shardings[group][key],
                                     _stack_callback(srcs, tuple(shape), target))
        params[group] = stack
    return cfg, params


def _stack_callback(sources: Sequence, layer_shape: tuple[int, ...], dtype: np.dtype):
    def stack(index):
        index = tuple(index)
        layers = range(len(sources))[index[0]]
        rest = index[1:]
        if len(layers) == 0:
            return np.empty((0,) + tuple(len(range(n)[s]) for n, s in zip(layer_shape, rest)), dtype)
        return np.stack([_read_slice(sources[i], rest, dtype) for i in layers])

    return stack
