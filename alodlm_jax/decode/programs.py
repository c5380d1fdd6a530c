"""The compiled programs this process keeps: one bounded, least-recently-used store for all engines.

Every engine compiles ahead of time (``jax.jit(f).lower(...).compile()``) and keeps the executable,
keyed by program name, model config, params signature and static shapes, so that requests and
engines with the same shapes share it (:meth:`ProgramStore.get`). Each distinct (bucket, window,
budget, mode) is a new set of programs, and an XLA:CPU executable holds its code in hundreds of
memory maps (about 800 for one compiled-engine program of the tiny test model, measured with
``/proc/self/maps``); a process that kept every program it ever compiled ran out of maps
(``vm.max_map_count``, 65,530: ``LLVM ERROR: Unable to allocate section memory``) after about 130
shapes. The store therefore keeps at most :attr:`ProgramStore.max_programs` programs (default
:data:`DEFAULT_MAX_PROGRAMS`), dropping the least recently used ones.

Dropping our reference alone frees nothing: JAX's own caches (the jitted function's trace, its
lowering and the in-memory compilation cache, and the caches of eager operations) keep every
executable they produced, for as long as the jitted function lives (measured: the map count did not
move). So an eviction also calls :func:`jax.clear_caches`, after which the executables in this
store (held by their ``Compiled`` objects) are the only ones left; everything else JAX compiled is
compiled again on its next use. To make that rare, an eviction drops the least recently used
quarter of the store at once. The persistent compilation cache on disk is not affected: where it
is on (the commands' default), a program compiled again after an eviction is read back from it.

:func:`enable_persistent_cache` turns that on-disk cache on (the commands do by default, see
``alodlm_jax.cli.flags.define_compilation_flags``).

Every program is compiled with :func:`compiler_options` (XLA's defaults); with ``graphs`` it also
puts XLA:GPU's loops and branches whose predicate lives on the device (``WHILE``,
``CONDITIONAL``) into command buffers (CUDA graphs), however few commands a buffer holds. The
plan measures it (``alodlm-jax-plan --command_buffers graphs``) and ``CompiledEngine(...,
graphs=True)`` compiles with it; by default the engine does not: by the plan's count it removes
the few launches and host reads a step has left (``docs/plan.md``), which no GPU has yet measured.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any, Callable, Hashable

import jax

from alodlm_jax.config import DEFAULT_COMPILATION_CACHE_BYTES, DEFAULT_MAX_PROGRAMS

# XLA:GPU's command types the programs' command buffers hold on a GPU (module docstring); WHILE
# and CONDITIONAL need CUDA 12.3 or newer (XLA leaves them out on an older driver).
GPU_COMMAND_TYPES = ("FUSION", "CUBLAS", "CUBLASLT", "CUSTOM_CALL", "CUDNN", "WHILE", "CONDITIONAL")
_COMMAND_BUFFER_FLAG = "xla_gpu_enable_command_buffer"
_MIN_GRAPH_SIZE_FLAG = "xla_gpu_graph_min_graph_size"


def compiler_options(platform: str, *, graphs: bool = False) -> dict[str, str]:
    """The XLA options the programs are compiled with on ``platform`` (``compile(compiler_options=
    ...)``; a run's protocol records them as ``xla_options`` where there are any). The engine
    compiles with XLA's defaults (``{}``): with them a pass or a step is already almost all in
    command buffers (``docs/plan.md``). ``graphs``: on a GPU, command buffers of
    :data:`GPU_COMMAND_TYPES` (loops and branches included) of any size, unless the
    environment's ``XLA_FLAGS`` sets ``--xla_gpu_enable_command_buffer`` itself; what
    ``alodlm-jax-plan --command_buffers graphs`` compiles."""
    if not graphs or platform not in ("gpu", "cuda", "rocm"):
        return {}
    if _COMMAND_BUFFER_FLAG in os.environ.get("XLA_FLAGS", ""):
        return {}
    # A program's top level is its loop of steps (or windows) and a kernel or two. XLA forms no
    # command buffer of fewer commands than xla_gpu_graph_min_graph_size ("command size is less
    # than the min graph size") and, once the loop is a command, none inside it either: the 8B's
    # batch programs then ran every kernel one by one.
    return {_COMMAND_BUFFER_FLAG: ",".join(GPU_COMMAND_TYPES), _MIN_GRAPH_SIZE_FLAG: "1"}


class ProgramStore:
    """Compiled executables by key, at most ``max_programs`` of them (least recently used go)."""

    def __init__(self, max_programs: int = DEFAULT_MAX_PROGRAMS):
        self._programs: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.max_programs = check_max_programs(max_programs)
        self.compiles = 0  # programs compiled (misses), for tests and benchmarks
        self.evictions = 0  # programs dropped

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._programs

    def get(self, key: Hashable, jitted, make_args: Callable[[], tuple[tuple, dict]],
            options: dict | None = None) -> tuple[Any, float]:
        """``(executable, compile seconds)``: the stored one (0.0 seconds), or ``jitted`` lowered
        with ``make_args() -> (args, kwargs)`` and compiled (and stored) now, with XLA
        ``options`` (:func:`compiler_options`; part of the key's meaning: one key, one set)."""
        with self._lock:
            exe = self._programs.get(key)
            if exe is not None:
                self._programs.move_to_end(key)
                return exe, 0.0
        t0 = time.perf_counter()
        args, kwargs = make_args()
        lowered = jitted.lower(*args, **kwargs)
        exe = lowered.compile(compiler_options=options or None)
        seconds = time.perf_counter() - t0
        with self._lock:
            self.compiles += 1
            self._programs[key] = exe
            self._programs.move_to_end(key)
            self._shrink(self.max_programs)
        return exe, seconds

    def resize(self, max_programs: int) -> None:
        """A new bound; programs beyond it are dropped now (least recently used first)."""
        with self._lock:
            self.max_programs = check_max_programs(max_programs)
            self._shrink(self.max_programs)

    def clear(self) -> None:
        """Drops every program (and JAX's in-memory caches with them)."""
        with self._lock:
            self._drop(len(self._programs))

    def _shrink(self, bound: int) -> None:
        if len(self._programs) > bound:
            # Down to three quarters of the bound, so that JAX's caches are cleared once per
            # quarter of the bound compiled rather than once per program.
            keep = bound - max(1, bound // 4)
            self._drop(len(self._programs) - max(keep, 1))

    def _drop(self, count: int) -> None:
        for _ in range(count):
            self._programs.popitem(last=False)
            self.evictions += 1
        if count:
            jax.clear_caches()


def check_max_programs(value: int) -> int:
    """``value`` if it is an integer >= 1 (ValueError naming the flag otherwise)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--max_compiled_programs must be an integer >= 1, got {value!r}")
    return value


# The process's store, shared by the portable, compiled and batched engines.
PROGRAMS = ProgramStore()


def set_max_programs(max_programs: int) -> None:
    """Bounds the programs the process keeps (see the module docstring)."""
    PROGRAMS.resize(max_programs)


def enable_persistent_cache(directory: str | os.PathLike | None,
                            max_bytes: int = DEFAULT_COMPILATION_CACHE_BYTES) -> None:
    """Turns on JAX's persistent compilation cache in ``directory`` (None or "": no-op).

    Every program is cached (no minimum compile time or size), and the directory is bounded to
    ``max_bytes`` with JAX's own least-recently-used eviction (``jax_compilation_cache_max_size``)
    unless the environment sets ``JAX_COMPILATION_CACHE_MAX_SIZE``. JAX opens the cache at the
    first compilation after this call and keeps that directory for the rest of the process.
    """
    if not directory:
        return
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
