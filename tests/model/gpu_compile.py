"""Compiling a piece of the model for an H200 without one (JAX's CUDA plugin and ptxas), in a child
process with the plugin on its path as tests/plan runs the GPU plan, and what the plan reads of
the program: its Triton calls, kernels, and each call's bytes and programs from its metadata."""

import json
import subprocess
import sys
import textwrap

from alodlm_jax.plan import aot_gpu

AVAILABLE = aot_gpu.AVAILABLE

_PRELUDE = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding
    from alodlm_jax.network import layers as L, window_layers as WL
    from alodlm_jax.plan import hlo, targets

    from alodlm_jax.plan.compile import lowering_for

    device = targets.load_target("h200").devices()[0]
    on_gpu = SingleDeviceSharding(device)
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=on_gpu)

    def report(fn, *args):
        with lowering_for(device):
            lowered = jax.jit(fn).lower(*args)
        text = lowered.compile().as_text()
        module = hlo.parse(text)
        calls = [i for c in module.computations.values() for i in c.instructions
                 if i.opcode == "custom-call"]
        return {"triton": text.count('custom_call_target="__gpu$xla.gpu.triton"'),
                "kernels": module.cost(module.entry.name).kernels,
                "bytes": sorted(module.kernel_bytes(module.entry, i) for i in calls),
                "programs": sorted(programs for i in calls for _, programs
                                   in module.instruction_cost(module.entry, i).few_programs)}
""")


def run_in_child(code: str):
    """Runs the script ``code`` in a child process with the plugin on its path and JAX on the
    CPU; it dumps its result as JSON on stdout, which this returns."""
    done = subprocess.run([sys.executable, "-c", code], env=aot_gpu.child_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def compile_in_child(body: str) -> dict:
    """Runs ``body`` after a prelude that defines ``spec(*shape)`` (a bf16 argument on the H200)
    and ``report(fn, *args)`` (the dict above); ``body`` dumps its result as JSON on stdout."""
    return run_in_child(_PRELUDE + textwrap.dedent(body))
