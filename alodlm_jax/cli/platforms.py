"""Which JAX platforms a command starts, fixed from its ``--device`` before JAX is imported.

JAX imports every installed accelerator plugin as it is imported and starts its first backend:
with the ``aot`` extra installed (JAX's CUDA plugin and libtpu) on a machine without a GPU, every
JAX process writes about 30 lines to stderr (the CUDA libraries' "Could not find cuda drivers",
the CUDA plugin's configuration traceback, libtpu's hostname errors). A command that runs on the
CPU needs none of them, so :func:`start_jax_for` makes the process a CPU-only JAX process before
JAX is imported:

* ``JAX_PLATFORMS=cpu``: JAX starts no accelerator backend (libtpu and the CUDA plugin's
  backend are never initialized);
* JAX's CUDA plugin packages are hidden from this process (JAX imports them to look for a GPU
  even when only the CPU is asked for, and loading them logs), as if not installed.

A command runs on the CPU when its ``--device`` is ``cpu``, or when ``--device`` is left to its
default (``cuda`` when JAX sees a GPU, ``tpu`` on a TPU, else ``cpu``) and the machine can have
neither: no CUDA plugin installed or no NVIDIA device node (the ones JAX looks for), and no
libtpu installed or no Google TPU on the PCI bus. A ``JAX_PLATFORMS`` of the user's own is kept
when ``--device`` is left to its default. ``cuda``, ``gpu`` and ``tpu`` (and the default on a
machine that may have an accelerator) leave JAX's platforms as they are.

Nothing is changed in a process that has already imported JAX (its platforms are decided; tests
run commands inside the suite's process). This module imports no JAX.
"""

from __future__ import annotations

import glob
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

__all__ = ["start_jax_for", "runs_on_cpu", "CUDA_PLUGIN_MODULES"]

# JAX's CUDA plugin: its libraries' package and the PJRT plugin module JAX discovers.
CUDA_PLUGIN_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12",
                       "jax_plugins.xla_cuda13")
# The device nodes whose presence makes JAX look for an NVIDIA GPU (jax._src.hardware_utils).
_NVIDIA_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")
_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPUs (and other Google devices) on the PCI bus


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _may_have_gpu() -> bool:
    plugin = any(_installed(name) for name in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
    return plugin and any(os.path.exists(node) for node in _NVIDIA_DEVICE_NODES)


def _may_have_tpu() -> bool:
    if not _installed("libtpu"):
        return False
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor, encoding="ascii") as handle:
                if handle.read().strip() == _GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            return True  # cannot tell: JAX decides
    return False


def runs_on_cpu(device: str | None) -> bool:
    """Whether a command with this ``--device`` value runs on the CPU whatever JAX finds: ``cpu``,
    or the default on a machine where JAX can find no GPU or TPU (or whose own
    ``JAX_PLATFORMS`` is ``cpu``)."""
    if device is not None:
        return device == "cpu"
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms == "cpu"
    return not (_may_have_gpu() or _may_have_tpu())


class _StubPlugin(importlib.abc.Loader):
    """JAX's discovery of ``jax_plugins.xla_cuda*`` finds this empty plugin: nothing registered."""

    def create_module(self, spec):
        module = types.ModuleType(spec.name, "JAX's CUDA plugin, hidden: this process runs on the "
                                  "CPU (alodlm_jax.cli.platforms).")
        module.initialize = lambda: None
        return module

    def exec_module(self, module) -> None:
        pass


class _HideCudaPlugin(importlib.abc.MetaPathFinder):
    """Hides JAX's CUDA plugin from this process: its packages cannot be imported (JAX then uses
    none of their libraries) and the PJRT plugin JAX discovers registers nothing."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith("jax_plugins.xla_cuda"):
            return importlib.machinery.ModuleSpec(name, _StubPlugin())
        if name.split(".")[0] in CUDA_PLUGIN_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: this process runs on "
                                      "the CPU)", name=name)
        return None


def start_jax_for(device: str | None) -> bool:
    """Before JAX is imported: when a command with this ``--device`` runs on the CPU
    (:func:`runs_on_cpu`), set ``JAX_PLATFORMS=cpu`` (inherited by the processes it starts) and
    hide JAX's CUDA plugin from this process. Returns whether it did; a process that has imported
    JAX already is left as it is (False)."""
    if "jax" in sys.modules or not runs_on_cpu(device):
        return False
    os.environ["JAX_PLATFORMS"] = "cpu"
    if not any(isinstance(finder, _HideCudaPlugin) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HideCudaPlugin())
    return True
