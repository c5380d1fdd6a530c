"""Moving the converter's numpy params pytree onto JAX devices.

``alodlm_convert`` never imports jax, so it hands over numpy arrays (``ml_dtypes.bfloat16`` for bf16);
this module turns them into jax arrays in the requested dtype. The exit gate stays fp32 whatever the
model dtype (it is cast to the model dtype at use, as the portable decoder's ``F.linear`` does).

A sharding hook is an optional callable ``(path, array) -> jax.sharding.Sharding | None``; ``path``
is the tuple of pytree keys, e.g. ``("core", "q")``. ``None`` (or no hook) means the default device.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.network.cache import resolve_dtype
from alodlm_jax.network.layers import Params
from alodlm_jax.network.model import unstack_layers

ShardingHook = Callable[[tuple[str, ...], np.ndarray], Any]


def _target_dtype(path: tuple[str, ...], array, dtype):
    if path and path[0] == "gate":
        return jnp.float32
    if dtype is None or (isinstance(dtype, str) and dtype == "keep"):
        return array.dtype
    return resolve_dtype(dtype)


def _put(keys: tuple[str, ...], leaf, dtype, sharding: ShardingHook | None) -> jax.Array:
    """One leaf on its device (``sharding``'s placement, or the default device), cast to its target
    dtype on the host first; returns once the transfer is complete.

    JAX itself may keep the host array alive a little longer: measured with jax 0.10.2 on a CPU,
    it lets go of a transferred numpy array at a later transfer, not when the transfer completes.
    """
    target = _target_dtype(keys, leaf, dtype)
    host = np.asarray(leaf)
    if host.dtype != target:
        host = host.astype(target)
    placement = sharding(keys, host) if sharding is not None else None
    array = jax.device_put(host, placement) if placement is not None else jnp.asarray(host)
    return jax.block_until_ready(array)


def per_layer_weights(platform: str) -> bool:
    """Whether one device of JAX ``platform`` decodes with per-layer weight arrays (a Python loop
    of layers in the programs) rather than stacked layer groups (one ``lax.scan``).

    Per-layer on CPUs and GPUs: XLA:CPU and XLA:GPU copy a layer's weights out of a stack on every
    call (XLA:CPU: 29 % of a pass of the 1 GB bench model; XLA:GPU, the 1.7B's batch-8 step for
    an H200: 5.4 GB of copies, 58.8 GB per step stacked against 53.4 GB per-layer). Stacked on
    TPUs: XLA:TPU reads a layer's weights out of the stack as they are (50.6 GB per step
    per-layer, 51.2 GB stacked) and compiles the loop once (19 s instead of 55 s, a 1.1 MB
    program instead of 5.9 MB). ``docs/plan.md`` has the figures."""
    return platform != "tpu"


def to_device(params: Params, dtype="keep", sharding: ShardingHook | None = None, *,
              per_layer: bool = False) -> Params:
    """Numpy (or jax) params -> jax arrays; every tensor cast to ``dtype`` except the fp32 gate.

    ``dtype`` is ``"fp32"``, ``"bf16"``, ``"keep"`` or a dtype. Casting happens on the host before
    transfer, so a bf16 model never occupies fp32 device memory. ``per_layer`` splits the layer
    groups into tuples of per-layer dicts on the host first (:func:`alodlm_jax.network.model.unstack_layers`,
    the fast layout for decoding; the sharding hook then sees paths like ``("core", "0", "q")``).
    The whole numpy pytree stays alive until the end; :func:`load_model` streams instead.
    """
    if per_layer:
        params = unstack_layers(params)

    def convert(path, leaf):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        return _put(keys, leaf, dtype, sharding)

    return jax.tree_util.tree_map_with_path(convert, params)


def load_model(model: str, dtype="bf16", sharding: ShardingHook | None = None, model_config_yaml=None,
               *, per_layer: bool = False):
    """``(ModelConfig, jax params)`` from an HF checkpoint dir, a converted dir or a hub id.

    Resolution (hub download when ``model`` is not a local directory) and validation are the
    converter's; the arrays are cast to ``dtype`` (``"fp32"``, ``"bf16"`` or ``"keep"``).
    ``per_layer``: see :func:`to_device` (the sharding hook sees the same paths).

    Streaming: each leaf is read from the files into a fresh host array in its final layout and
    dtype, put on its device, and dropped before the next is read, so this loader holds no more
    than the device copies (host memory themselves on a CPU) plus one leaf (one tensor with
    ``per_layer``; one layer group's stack of one tensor otherwise) and a block of rows; JAX may
    hold the previous leaf until the next transfer (:func:`_put`), and small leaves lie between
    the large ones (``embed``, ``final_norm``, ``lm_head``, the gate, then the layers).
    """
    from alodlm_convert.load import assemble_params, params_leaves
    from alodlm_convert.sources import open_checkpoint

    sources = open_checkpoint(model, dtype, model_config_yaml)
    on_device = []
    for path, host in params_leaves(sources, per_layer=per_layer):
        on_device.append((path, _put(path, host, dtype, sharding)))
        del host  # before the next leaf is read
    return sources.config, assemble_params(on_device, per_layer=per_layer)


def param_count(params: Params) -> int:
    """Total number of scalars in a params pytree."""
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
