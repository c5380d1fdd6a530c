"""What a plan's programs need of one device's memory, from the shapes alone, and what the device
gives a JAX process.

Before anything is compiled, the programs' arguments are known exactly from their shapes: the
weights, the KV cache of the batch and each request's state (:func:`argument_bytes`, per device,
a sharded argument counted by its shard). :func:`check` refuses a plan whose arguments alone
exceed the memory the target gives a JAX process (:class:`DoesNotFit`, one line: what the batch
needs, what the device gives, and the largest batch that fits by the same arithmetic), so an
impossible batch is answered in seconds instead of after a compile that can run for an hour.

The largest batch (:func:`largest_batch`) is one figure whatever batch is planned: the batch
and admit programs' arguments at a batch ``B`` (exactly, from their shapes: fixed plus ``B``
times a request's cache and state) plus the compiled programs' memory beyond their arguments
(temporaries, outputs not aliased to an argument, generated code), the largest of them, held
fixed. So it depends on the planned batch only through those temporaries (hundreds of MB for the
released shapes, against 1.85-2.47 GB of cache a request): where they grow with the batch, the
figure errs high by their growth between the planned batch and the largest.
"""

from __future__ import annotations

import math
import os

import jax

__all__ = ["DoesNotFit", "tree_bytes", "usable_memory", "argument_bytes", "per_request", "check",
           "largest_batch", "GPU_CLIENT_FRACTION"]

# What JAX's CUDA client gives its allocator when XLA_CLIENT_MEM_FRACTION (or the older
# XLA_PYTHON_CLIENT_MEM_FRACTION) is not set (docs/plan.md: "Memory").
GPU_CLIENT_FRACTION = 0.75


class DoesNotFit(ValueError):
    """A plan whose programs' arguments alone exceed the device's usable memory (the message is
    the command's one-line error)."""


def tree_bytes(tree) -> int:
    """Bytes of ``tree``'s arrays on one device (a sharded array: its shard)."""
    def one(x):
        sharding = getattr(x, "sharding", None)
        shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
        return math.prod(shape) * jax.numpy.dtype(x.dtype).itemsize

    return int(sum(one(x) for x in jax.tree_util.tree_leaves(tree)))


def _gb(value: int) -> str:
    return f"{value / 1e9:.2f} GB" if abs(value) >= 1e9 else f"{value / 1e6:.2f} MB"


def usable_memory(target, environ=None) -> tuple[int | None, str]:
    """``(bytes, basis)``: the memory of one of ``target``'s devices that a JAX process can
    allocate. A GPU: its memory times the CUDA client's memory fraction (``XLA_CLIENT_MEM_FRACTION``
    or ``XLA_PYTHON_CLIENT_MEM_FRACTION`` from ``environ``, by default this process's environment;
    unset: :data:`GPU_CLIENT_FRACTION`). A TPU, the CPU: the whole capacity (XLA:TPU checks its
    own assignment against the HBM). ``attached``: the device's own ``bytes_limit``, already the
    allocator's."""
    capacity = target.capacity_bytes
    if capacity is None:
        return None, "capacity unknown"
    if target.kind != "gpu":
        return int(capacity), "the device's capacity"
    environ = os.environ if environ is None else environ
    name = next((n for n in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
                 if environ.get(n)), None)
    if name is None:
        fraction, source = GPU_CLIENT_FRACTION, "the default memory fraction of JAX's CUDA client"
    else:
        try:
            fraction = float(environ[name])
        except ValueError:
            raise ValueError(f"{name}={environ[name]!r}: not a number") from None
        if not 0 < fraction <= 1:
            raise ValueError(f"{name}={environ[name]!r}: must be in (0, 1]")
        source = name
    return int(capacity * fraction), f"{fraction:.0%} of {_gb(capacity)}, {source}"


def argument_bytes(program) -> dict[str, int]:
    """Bytes of one device's share of ``program``'s arguments (a
    :class:`~alodlm_jax.plan.programs.PlannedProgram`): ``weights``, ``cache``, ``other`` (the
    requests' state, the prompt, constants) and ``total``."""
    weights = sum(tree_bytes(program.args[i]) for i in program.weight_args)
    cache = sum(tree_bytes(program.args[i]) for i in program.cache_args)
    total = sum(tree_bytes(a) for a in program.args)
    return {"weights": weights, "cache": cache, "other": total - weights - cache, "total": total}


def per_request(make_programs, data: int = 1) -> dict[str, tuple[int, int]]:
    """``{name: (fixed, step)}`` of the batch and admit programs: their arguments at a batch of
    ``k * data`` requests are ``fixed + k * step`` bytes per device (exact for every batch of two
    requests or more: the cache's slots per request do not change above one).
    ``make_programs(batch)`` returns the planned programs at ``batch`` (abstract, nothing
    allocated)."""
    two = {p.name: argument_bytes(p)["total"] for p in make_programs(2 * data)}
    three = {p.name: argument_bytes(p)["total"] for p in make_programs(3 * data)}
    return {name: (two[name] - 2 * (three[name] - two[name]), three[name] - two[name])
            for name in two}


def largest_batch(linear: dict[str, tuple[int, int]], usable: int | None, extra: int = 0,
                  data: int = 1) -> int | None:
    """The largest batch (a multiple of ``data``; 0 when not even ``data`` requests fit) whose
    batch programs' arguments (``linear``, :func:`per_request`) plus ``extra`` bytes (the compiled
    programs' memory beyond their arguments) fit ``usable`` bytes; None when ``usable`` is."""
    if usable is None or not linear:
        return None
    ks = [max(0, (usable - extra - fixed) // step) if step > 0 else 0
          for fixed, step in linear.values()]
    return int(min(ks)) * data


def check(programs, linear, target, usable: int | None, basis: str, data: int = 1) -> None:
    """Raise :class:`DoesNotFit` when any of ``programs``' arguments alone exceed ``usable``."""
    if usable is None:
        return
    for program in programs:
        need = argument_bytes(program)
        if need["total"] <= usable:
            continue
        largest = largest_batch(linear, usable, 0, data)
        what = (f"batch {program.batch}" if program.name in ("batch", "admit")
                else f"one request ({program.name} program)")
        raise DoesNotFit(
            f"{what} does not fit {target.name}: its arguments alone need {_gb(need['total'])} "
            f"per device (weights {_gb(need['weights'])}, cache {_gb(need['cache'])}, request "
            f"state {_gb(need['other'])}) and a JAX process gets {_gb(usable)} of it ({basis}); "
            f"the largest batch whose arguments fit is {largest}")
