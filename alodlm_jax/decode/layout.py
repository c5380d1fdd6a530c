"""Where the compiled engine's programs run: one device, or a ``("data", "model")`` mesh.

A :class:`Layout` is the compiled engine's only notion of devices. The programs themselves
(:mod:`.compiled`'s single-request program, :mod:`.batched`'s batch and admit programs) are written
for one request or one batch on one device; a layout places their inputs and says how XLA runs them:

* ``model`` (tensor parallelism) splits the weights and the KV cache by the rules of
  :mod:`alodlm_jax.network.sharding` (attention by heads, the MLP by its intermediate dimension, the
  embedding and LM head by the vocabulary). The programs are compiled for inputs with those
  ``NamedSharding``s and JAX's SPMD partitioner inserts the collectives: the two all-reduces per
  layer that Megatron-style splitting implies (after ``o`` and after ``down_proj``) plus the ones
  of the vocabulary-split embedding gather, LM head and its argmax/softmax reductions.
* ``data`` splits the batch's request slots (``B / data`` slots per data shard; ``B`` must be a
  multiple of ``data``). The batch program runs under ``jax.shard_map`` *manual over ``data``
  only* (``axis_names={"data"}``; ``model`` stays with the partitioner): every data shard runs its
  own ``while`` loop over its own slots, with its own shared buckets (the longest live prefix, the
  packed row count of its live windows) and its own stop test, and nothing is ever exchanged across ``data``. So a data
  shard is exactly a ``B / data`` batch on its ``model`` devices. With ``stop_early`` (requests
  waiting) the program returns once every data shard has had a request finish (or has none left
  live), so a shard whose slot freed early idles until the others free one too; the host then
  admits into every free slot. The admit program runs under the same ``shard_map``: the shard
  owning the slot prefills it (``lax.cond``), the others pass their state through.

One device (no mesh) is today's single-device path, untouched: no shardings, no ``shard_map``.
The layout is part of every program's store key (:attr:`Layout.key`).

Same tokens: a data shard's requests are decoded with the single-request arithmetic, as in any
batch (up to the shared buckets, which change only the length of fp32 reductions), and tensor
parallelism changes only the order of the all-reduced fp32 sums; tokens, exit depths, stop reasons
and counters equal the one-device run, first-pass hazards to rounding (tests:
``tests/sharding/test_compiled_layouts.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from alodlm_jax.network import cache as KC
from alodlm_jax.network import sharding as SH


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """A compiled-engine program: its function, ``jax.jit`` arguments and how it runs on a mesh.

    ``per_data_shard``: ``"batch"`` (``fn(params, cache, slots, consts, stop_early)`` runs on each
    data shard's slots), ``"admit"`` (``fn(params, cache, slots, slot, prompt, prompt_len,
    consts)`` runs on the data shard owning ``slot``) or None (a single-request program: no data
    axis). ``jitted`` is its one-device ``jax.jit``.
    """

    fn: Callable
    static_argnames: tuple[str, ...]
    donate_argnames: tuple[str, ...]
    per_data_shard: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "jitted", jax.jit(self.fn, static_argnames=self.static_argnames,
                                                   donate_argnames=self.donate_argnames))


_JITTED: dict = {}  # (layout key, Program) -> its jax.jit on that layout (kept for the process)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The devices of the compiled engine's programs: ``mesh=None`` is one (the default) device."""

    mesh: Mesh | None = None

    @property
    def data(self) -> int:
        return 1 if self.mesh is None else int(self.mesh.shape[SH.DATA_AXIS])

    @property
    def model(self) -> int:
        return 1 if self.mesh is None else SH.model_axis_size(self.mesh)

    @property
    def platform(self) -> str:
        """The JAX platform the programs run on (``"cpu"``, ``"gpu"``, ``"tpu"``)."""
        devices = jax.devices() if self.mesh is None else self.mesh.devices.flat
        return next(iter(devices)).platform

    @property
    def key(self) -> tuple:
        """Part of the program store key: axis sizes and the devices, in mesh order."""
        if self.mesh is None:
            return ("one-device",)
        return ("mesh", self.data, self.model, tuple(d.id for d in self.mesh.devices.flat))

    def describe(self) -> dict[str, int]:
        """The protocol's ``mesh`` record."""
        return {"data": self.data, "model": self.model}

    def check_batch(self, batch_size: int) -> None:
        """ValueError unless ``batch_size`` request slots split evenly over ``data``."""
        SH.check_batch_split(batch_size, self.data)

    # -- shardings -----------------------------------------------------------------------------

    def _named(self, spec: P) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def replicated(self) -> NamedSharding | None:
        return None if self.mesh is None else self._named(P())

    def cache_shardings(self, cfg, batched: bool):
        """The KV cache's shardings (a ``KVCache`` of them; None on one device): KV heads on
        ``model``, and with ``batched`` the leading slot axis on ``data``."""
        if self.mesh is None:
            return None
        single = SH.cache_shardings(self.mesh, cfg)
        if not batched:
            return single
        return jax.tree_util.tree_map(
            lambda s: self._named(P(SH.DATA_AXIS, *s.spec)) if s.spec else self._named(P()), single)

    def slots_shardings(self, slots_tree):
        """Every leaf of a batch carry (leading slot axis) split on ``data``."""
        if self.mesh is None:
            return None
        return jax.tree_util.tree_map(lambda _: self._named(P(SH.DATA_AXIS)), slots_tree)

    def spec(self, tree, shardings=None):
        """Abstract values of ``tree`` carrying ``shardings`` (replicated where None on a mesh)."""
        if self.mesh is None:
            return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
        if shardings is None:
            shardings = jax.tree_util.tree_map(lambda _: self.replicated(), tree)
        return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                      tree, shardings)

    def place(self, tree, shardings=None):
        """``tree`` on the layout's devices (replicated where ``shardings`` is None)."""
        if self.mesh is None:
            return tree
        if shardings is None:
            return jax.device_put(tree, self.replicated())
        return jax.device_put(tree, shardings)

    def new_cache(self, cfg, t_max: int, dtype, batch: int | None):
        """A zeroed cache (``batch`` slots, or one request's with None), created in its shards."""
        def make():
            cache = KC.init_cache(cfg, t_max, dtype)
            if batch is None:
                return cache
            return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), cache)

        if self.mesh is None:
            return jax.tree_util.tree_map(lambda x: x.copy(), make())  # own buffers (donated)
        return jax.jit(make, out_shardings=self.cache_shardings(cfg, batch is not None))()

    # -- programs --------------------------------------------------------------------------------

    def jit(self, program: Program) -> Callable:
        """``program``'s ``jax.jit`` on this layout: on one device its own; with ``data > 1`` a
        batch or admit program runs per data shard (module docstring). The input shardings come
        from the abstract arguments it is lowered with (:meth:`spec`)."""
        if self.mesh is None:
            return program.jitted
        memo = (self.key, program)
        if memo not in _JITTED:
            fn = program.fn
            if program.per_data_shard is not None and self.data > 1:
                fn = {"batch": self._per_shard_batch,
                      "admit": self._per_shard_admit}[program.per_data_shard](fn)
            _JITTED[memo] = jax.jit(fn, static_argnames=program.static_argnames,
                                    donate_argnames=program.donate_argnames)
        return _JITTED[memo]

    def _manual_over_data(self, body, in_specs, out_specs):
        return jax.shard_map(body, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs,
                             axis_names={SH.DATA_AXIS}, check_vma=False)

    def _per_shard_batch(self, run):
        split, whole = P(SH.DATA_AXIS), P()

        @functools.wraps(run)
        def per_shard(params, cache, slots, consts, stop_early, **statics):
            body = functools.partial(run, **statics)
            return self._manual_over_data(body, (whole, split, split, whole, whole), (split, split))(
                params, cache, slots, consts, stop_early)

        return per_shard

    def _per_shard_admit(self, admit):
        split, whole = P(SH.DATA_AXIS), P()
        data = self.data

        @functools.wraps(admit)
        def per_shard(params, cache, slots, slot, prompt, prompt_len, consts, **statics):
            local_batch = jax.tree_util.tree_leaves(slots)[0].shape[0] // data

            def body(params, cache, slots, slot, prompt, prompt_len, consts):
                local = slot - jax.lax.axis_index(SH.DATA_AXIS) * local_batch
                mine = (local >= 0) & (local < local_batch)
                return jax.lax.cond(
                    mine,
                    lambda c, s: admit(params, c, s, local, prompt, prompt_len, consts, **statics),
                    lambda c, s: (c, s), cache, slots)

            return self._manual_over_data(
                body, (whole, split, split, whole, whole, whole, whole), (split, split))(
                params, cache, slots, slot, prompt, prompt_len, consts)

        return per_shard


ONE_DEVICE = Layout()


def for_mesh(mesh: Mesh | None) -> Layout:
    """The layout of a ``("data", "model")`` mesh; one device for None or a 1 x 1 mesh."""
    if mesh is None or mesh.devices.size == 1:
        return ONE_DEVICE
    return Layout(mesh)
