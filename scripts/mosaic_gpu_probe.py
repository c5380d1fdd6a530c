"""Compiles one Pallas kernel through Mosaic GPU, Pallas's GPU backend that replaces Triton, for an
H200 on a machine without a GPU (the plan's compile-only device), and prints what XLA reports.

Evidence for docs/performance.md ("Pallas's Triton backend after JAX 0.11"): an elementwise
product of two 128 x 128 fp32 blocks, one grid step. It needs JAX 0.11 or newer with its CUDA 13
plugin on the path (as .ci/run's newer-JAX tier installs it), and runs from the source tree:

    JAX_PLATFORMS=cpu PYTHONPATH=PLUGIN_DIR python scripts/mosaic_gpu_probe.py
"""

from __future__ import annotations

import time

import source_tree

source_tree.use()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
# pallas_call's form for Mosaic GPU (blocks staged through shared memory by a pipeline around
# plgpu.kernel), as JAX's own Mosaic GPU tests call it: a JAX-internal module, JAX 0.11 and 0.12.
from jax._src.pallas.mosaic_gpu.pallas_call import pallas_call as mosaic_gpu_call  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

from alodlm_jax.plan import targets  # noqa: E402
from alodlm_jax.plan.compile import lowering_for  # noqa: E402

ROWS = COLS = 128


def _product(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] * w_ref[...]


def product(x, w):
    block = pl.BlockSpec((ROWS, COLS), lambda i: (0, 0))
    return mosaic_gpu_call(_product, jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
                           in_specs=[block, block], out_specs=block)(x, w)


def main() -> None:
    device = targets.load_target("h200").devices()[0]
    spec = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32, sharding=SingleDeviceSharding(device))
    start = time.perf_counter()
    with lowering_for(device):
        lowered = jax.jit(product).lower(spec, spec)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    text = compiled.as_text()
    calls = [line for line in text.splitlines() if "custom-call" in line and "mosaic" in line]
    if not calls:
        raise SystemExit("mosaic_gpu_probe: the compiled program calls no Mosaic GPU kernel")
    print(f"JAX {jax.__version__}: a Mosaic GPU Pallas kernel compiled for {device.device_kind} in "
          f"{seconds:.1f} s (program text {len(text)} characters, {len(calls)} Mosaic GPU call)")


if __name__ == "__main__":
    main()
