"""Compile targets: an accelerator this machine does not have, described as data, or the devices
this process has.

``alodlm_jax/data/targets/`` holds one file per named target; adding a target is adding a file:

* ``NAME.txtpb``: a GPU, as XLA:GPU's target description (``GpuTargetConfigProto`` text) written
  from the vendor's public specifications; the plan reads its ``device_memory_size`` (capacity)
  and ``memory_bandwidth`` (bytes/s), and from a comment line ``# matrix_flops_per_second: N`` the
  dense bf16 matrix rate (the plan's FLOP floor). Compiled with ``jax-cuda12-plugin`` and ``jax-cuda12-pjrt``
  and the CUDA compiler (``ptxas``: ``nvidia-cuda-nvcc-cu12`` or a CUDA toolkit); no CUDA runtime
  libraries, no GPU.
* ``NAME.json``: a TPU, by libtpu's topology name (``"topology"``), with its HBM per chip
  (``"memory_bytes_per_chip"``) and bandwidth (``"bandwidth_bytes_per_second"``). Compiled with
  libtpu (``jax[tpu]``), no TPU attached.

Two more names: ``cpu`` (XLA:CPU, this process; capacity: the machine's memory) and ``attached``
(the devices this process's default backend has; capacity from the device's own memory
statistics where it reports them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import re
import shutil

from alodlm_jax.data import DATA_DIR

__all__ = ["Target", "TARGETS_DIR", "target_names", "load_target", "attached_target",
           "missing_extra", "AOT_INSTALL"]

TARGETS_DIR = DATA_DIR / "targets"
AOT_INSTALL = "python -m pip install 'alodlm-jax[aot]' (from a checkout: python -m pip install -e '.[aot]')"


@dataclasses.dataclass(frozen=True)
class Target:
    """A compile target. ``kind``: ``gpu``, ``tpu``, ``cpu`` or ``attached``; ``capacity_bytes``
    and ``bandwidth_bytes_per_second`` per device (None where unknown)."""

    name: str
    kind: str
    description: str
    capacity_bytes: int | None = None
    bandwidth_bytes_per_second: float | None = None
    matrix_flops_per_second: float | None = None  # dense bf16 matrix products (gpu)
    topology: str | None = None  # libtpu's topology name (tpu)
    target_config: str | None = None  # GpuTargetConfigProto text (gpu)
    source: str | None = None  # the data file
    platform: str | None = None  # attached: the JAX platform (None: the default backend)

    def devices(self) -> list:
        """The target's devices: compile-only ones for a named accelerator."""
        import jax

        if self.kind == "cpu":
            return jax.devices("cpu")
        if self.kind == "attached":
            return jax.devices(self.platform) if self.platform else jax.devices()
        from jax.experimental import topologies

        if self.kind == "tpu":
            try:
                return list(topologies.get_topology_desc(topology_name=self.topology,
                                                         platform="tpu").devices)
            except jax.errors.JaxRuntimeError as error:
                if "lockfile" not in str(error):
                    raise
                raise ValueError("libtpu is held by another process on this machine (one at a "
                                 "time; a JAX process started without JAX_PLATFORMS=cpu holds it "
                                 "while it runs): wait for it, or start it with JAX_PLATFORMS=cpu"
                                 ) from None
        return list(topologies.get_topology_desc(self.name, "cuda", target_config=self.target_config,
                                                 topology="1x1x1").devices)

    def record(self) -> dict:
        return {"name": self.name, "kind": self.kind, "description": self.description,
                "capacity_bytes": self.capacity_bytes,
                "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
                "matrix_flops_per_second": self.matrix_flops_per_second,
                "topology": self.topology, "source": self.source}


def target_names() -> list[str]:
    """Every target name: the data files' and ``cpu``, ``attached``."""
    files = sorted(p.stem for p in TARGETS_DIR.glob("*") if p.suffix in (".txtpb", ".json"))
    return files + ["cpu", "attached"]


def _field(text: str, name: str) -> str | None:
    match = re.search(rf"^\s*{name}\s*:\s*\"?([^\"\n]+)\"?\s*$", text, re.M)
    return match.group(1).strip() if match else None


def load_target(name: str) -> Target:
    """The target called ``name`` (ValueError naming ``--target`` and the choices if unknown)."""
    if name == "cpu":
        import psutil

        return Target("cpu", "cpu", "XLA:CPU on this machine", psutil.virtual_memory().total)
    if name == "attached":
        return attached_target()
    gpu, tpu = TARGETS_DIR / f"{name}.txtpb", TARGETS_DIR / f"{name}.json"
    if "/" not in name and gpu.is_file():
        text = gpu.read_text()
        memory, bandwidth = _field(text, "device_memory_size"), _field(text, "memory_bandwidth")
        if memory is None or bandwidth is None:
            raise ValueError(f"{gpu}: needs device_memory_size and memory_bandwidth in gpu_device_info")
        rate = re.search(r"^#\s*matrix_flops_per_second:\s*([0-9.eE+]+)\s*$", text, re.M)
        return Target(name, "gpu", _field(text, "device_description_str") or name, int(memory),
                      float(bandwidth), rate and float(rate.group(1)), target_config=text,
                      source=str(gpu))
    if "/" not in name and tpu.is_file():
        try:
            data = json.loads(tpu.read_text())
            return Target(name, "tpu", data.get("description", name),
                          int(data["memory_bytes_per_chip"]),
                          float(data["bandwidth_bytes_per_second"]), topology=data["topology"],
                          source=str(tpu))
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(f"{tpu}: bad target description ({error})") from None
    raise ValueError(f"--target: unknown target {name!r}; choose one of: {', '.join(target_names())}")


def attached_target(platform: str | None = None) -> Target:
    """The devices this process has on ``platform`` (None: JAX's default backend); capacity from
    the first device's ``bytes_limit`` (the machine's memory on a CPU)."""
    import jax

    device = (jax.devices(platform) if platform else jax.devices())[0]
    capacity = None
    try:
        stats = device.memory_stats() or {}
        capacity = stats.get("bytes_limit")
    except Exception:  # noqa: BLE001 - backends without memory statistics
        stats = {}
    if capacity is None and device.platform == "cpu":
        import psutil

        capacity = psutil.virtual_memory().total
    return Target("attached", "attached", f"{device.platform}: {device.device_kind}",
                  None if capacity is None else int(capacity), platform=platform)


def missing_extra(target: Target) -> str | None:
    """None when this install can compile for ``target``; otherwise one line saying what to
    install (the ``aot`` extra)."""
    if target.kind == "tpu":
        needed = {"libtpu": "jax[tpu]"}
    elif target.kind == "gpu":
        # JAX's CUDA 12 plugin, or its CUDA 13 one (the only one from JAX 0.12.1 on)
        cuda = 13 if _importable("jax_cuda13_plugin") else 12
        needed = {f"jax_cuda{cuda}_plugin": f"jax-cuda{cuda}-plugin",
                  f"jax_plugins.xla_cuda{cuda}": f"jax-cuda{cuda}-pjrt"}
        if not (_importable("nvidia.cuda_nvcc") or _importable("nvidia.cu13")
                or shutil.which("ptxas") or pathlib.Path("/usr/local/cuda/bin/ptxas").is_file()):
            needed["nvidia.cuda_nvcc"] = "nvidia-cuda-nvcc-cu12 (ptxas)"
    else:
        return None
    absent = [package for module, package in needed.items() if not _importable(module)]
    if not absent:
        return None
    return (f"compiling for --target {target.name} needs {', '.join(absent)} (the aot extra); "
            f"install it with: {AOT_INSTALL}")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
