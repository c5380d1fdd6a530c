"""What one step of an XLA:GPU program launches from the host, and the step time the plan predicts.

XLA:GPU runs a compiled program as a sequence of *thunks* (a kernel, a copy, a library call, a
``while`` or ``conditional`` whose control the host drives, ...). A pass of its own
(``command-buffer-conversion``) gathers runs of thunks into *command buffers*: CUDA graphs,
launched from the host as one operation. With the ``WHILE`` and ``CONDITIONAL`` command types a
loop or branch whose predicate lives on the device becomes a graph node of its own (CUDA graph
conditional nodes), so the host no longer reads that predicate back. None of this is in the
optimized HLO text; XLA writes the thunk sequence after its thunk passes when asked to dump
(``xla_dump_to``): ``*.thunk_sequence_after_thunk_passes.txt``, with each thunk's HLO instruction
in ``*.thunk_metadata.txt``.

:func:`step_launches` reads those two files and counts one step (the step loop of
:func:`alodlm_jax.plan.hlo.step_cost`, found by its HLO name), each loop as often as it runs (the
HLO's trip count; a loop whose count depends on the data once, as the byte count does) and the
branch with the most kernels of each conditional:

* ``kernels_outside_command_buffers``: kernels (and copies, library calls) the host launches one
  by one;
* ``command_buffer_launches``: graphs the host launches;
* ``kernels_in_command_buffers``: kernels run inside those graphs;
* ``host_syncs``: times the host waits for the device to decide what runs next: one per iteration
  of a loop outside a command buffer (its predicate is read back), one per conditional outside
  one (its branch index), one per dynamic-slice thunk outside one (its offsets).

:func:`predicted_step_seconds` turns a step's bytes, FLOPs and those counts into a time
(:data:`TIME_MODEL`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

__all__ = ["Launches", "Thunk", "parse_thunks", "read_dump", "step_launches",
           "predicted_step_seconds", "few_programs_seconds", "TIME_MODEL"]

# The step-time model, in seconds (docs/plan.md). ``kernel``: what each kernel of a step adds to
# the time its bytes or FLOPs take (its ramp, tail and the gap to the next one, inside a graph or
# not): fitted to the first H200 measurement, the 1.7B at batch 1 (2.15 ms per pass, 1.00 ms of
# it the plan's bytes at 4.8 TB/s, 639 kernels in one graph per pass). ``launch``: a kernel the
# host launches one by one, ``graph``: a graph launch, ``sync``: a device-to-host read the next
# launch waits for. ``program``: the bytes per second one program (thread block) of a Pallas GPU
# kernel reads from device memory: what it keeps in flight (a 64-slot tile of K and of V, two
# stages: 64 KB) over a load's latency (about 0.6 us), so that a grid of 8 programs reads at 0.8
# TB/s, not the device's 4.8. The last four are assumed, not yet measured (scripts/gpu_check.sh
# prints the prediction beside the measured step, and the attention kernel's rate at 8 programs).
TIME_MODEL = {"kernel": 1.75e-6, "launch": 3e-6, "graph": 10e-6, "sync": 20e-6, "program": 100e9}

_THUNK = re.compile(r"^(\s*)(\d+):\s+(k\w+)\s*(?:\[[^\]]*\])?\s*(.*)$")
_MARKER = re.compile(r"^(\s*)(condition|body|branch_\d+|true_branch|false_branch):\s*$")
_CONTAINERS = {"kCommandBuffer", "kWhile", "kConditional", "kSequential", "kDynamicSliceFusion"}
_NOT_LAUNCHES = {"kWaitForStreams", "kHostSendDone", "kHostRecvDone"}


@dataclasses.dataclass
class Thunk:
    kind: str
    thunk_id: int
    name: str = ""
    regions: dict = dataclasses.field(default_factory=dict)  # region name -> [Thunk]
    region: str = ""  # the region children go to now (while parsing)

    def children(self, region: str | None = None) -> list["Thunk"]:
        if region is not None:
            return self.regions.get(region, [])
        return [t for r in self.regions.values() for t in r]


@dataclasses.dataclass(frozen=True)
class Launches:
    """What one execution of a thunk sequence launches (module docstring); ``unknown``: loops of
    unknown trip count, counted once."""
    kernels_outside_command_buffers: int = 0
    command_buffer_launches: int = 0
    kernels_in_command_buffers: int = 0
    host_syncs: int = 0
    unknown: int = 0

    def __add__(self, other: "Launches") -> "Launches":
        return Launches(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def times(self, n: int) -> "Launches":
        return Launches(*(a * n for a in dataclasses.astuple(self)))

    @property
    def kernels(self) -> int:
        return self.kernels_outside_command_buffers + self.kernels_in_command_buffers


def _annotations(metadata: str) -> dict[int, str]:
    """thunk id -> its profile annotation (the HLO instruction's name)."""
    names = {}
    for block in re.findall(r"thunk_info \{(.*?)\}", metadata, re.S):
        name = re.search(r'profile_annotation: "([^"]*)"', block)
        tid = re.search(r"thunk_id: (\d+)", block)
        if name and tid:
            names[int(tid.group(1))] = name.group(1)
    return names


def parse_thunks(sequence: str, metadata: str = "") -> Thunk:
    """The thunk tree of XLA's ``thunk_sequence_after_thunk_passes`` text (a root ``kSequential``);
    names from the ``thunk_metadata`` text where given."""
    names = _annotations(metadata)
    root = Thunk("kSequential", -1)
    stack: list[tuple[int, Thunk]] = [(-1, root)]
    for line in sequence.splitlines():
        marker = _MARKER.match(line)
        if marker:
            indent = len(marker.group(1))
            if marker.group(2) != "condition":  # XLA prints "condition:" unindented
                while len(stack) > 1 and stack[-1][0] >= indent:
                    stack.pop()
            stack[-1][1].region = marker.group(2)
            continue
        match = _THUNK.match(line)
        if not match:
            continue
        indent, tid, kind, rest = len(match.group(1)), int(match.group(2)), match.group(3), match.group(4)
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        node = Thunk(kind, tid, names.get(tid) or rest.split(" ")[0] if rest else names.get(tid, ""))
        parent.regions.setdefault(parent.region, []).append(node)
        stack.append((indent, node))
    return root


def count(thunks: list[Thunk], trips, in_graph: bool = False) -> Launches:
    """One execution of ``thunks``; ``trips(name)``: a loop's trip count (None: unknown)."""
    total = Launches()
    for thunk in thunks:
        if thunk.kind == "kCommandBuffer":
            total = total + count(thunk.children(), trips, True) + Launches(
                command_buffer_launches=0 if in_graph else 1)
        elif thunk.kind == "kWhile":
            n = trips(thunk.name)
            once = count(thunk.children(), trips, in_graph)
            if n is None:
                total = total + once + Launches(host_syncs=0 if in_graph else 1, unknown=1)
            else:
                total = total + once.times(n) + Launches(host_syncs=0 if in_graph else n)
        elif thunk.kind == "kConditional":
            branches = [count(b, trips, in_graph) for b in thunk.regions.values()]
            total = total + max(branches, key=lambda c: (c.kernels, c.host_syncs),
                                default=Launches()) + Launches(host_syncs=0 if in_graph else 1)
        elif thunk.kind == "kDynamicSliceFusion":
            total = total + count(thunk.children(), trips, in_graph) + Launches(
                host_syncs=0 if in_graph else 1)
        elif thunk.kind in _CONTAINERS:
            total = total + count(thunk.children(), trips, in_graph)
        elif thunk.kind not in _NOT_LAUNCHES:
            total = total + (Launches(kernels_in_command_buffers=1) if in_graph
                             else Launches(kernels_outside_command_buffers=1))
    return total


def _find(thunks: list[Thunk], name: str, in_graph: bool = False):
    for thunk in thunks:
        if thunk.kind == "kWhile" and thunk.name == name:
            return thunk, in_graph
        found = _find(thunk.children(), name, in_graph or thunk.kind == "kCommandBuffer")
        if found:
            return found
    return None


def read_dump(directory) -> tuple[str, str] | None:
    """``(thunk sequence text, thunk metadata text)`` of the one module XLA dumped into
    ``directory`` (None when it wrote none)."""
    directory = pathlib.Path(directory)
    sequences = sorted(directory.glob("*.thunk_sequence_after_thunk_passes.txt")) \
        or sorted(directory.glob("*.thunk_sequence.txt"))
    if not sequences:
        return None
    sequence = sequences[-1]
    stem = sequence.name.split(".thunk_sequence")[0]
    metadata = directory / f"{stem}.thunk_metadata.txt"
    return sequence.read_text(), metadata.read_text() if metadata.is_file() else ""


def step_launches(module, step_loop_name: str | None, sequence: str, metadata: str) -> dict | None:
    """One step's :class:`Launches` (as a dict) and whether the step loop itself runs inside a
    command buffer (``step_in_command_buffer``), or None when the step loop is not among the
    thunks. ``module``: the :class:`alodlm_jax.plan.hlo.Module` the thunks were compiled from
    (trip counts)."""
    if step_loop_name is None:
        return None
    loops = {i.name: (c, i) for c in module.computations.values() for i in c.instructions
             if i.opcode == "while"}

    def trips(name):
        found = loops.get(name)
        return None if found is None else module.trip_count(*found)

    root = parse_thunks(sequence, metadata)
    found = _find(root.children(), step_loop_name)
    if found is None:
        return None
    loop, in_graph = found
    step = count(loop.children(), trips, in_graph)
    if not in_graph:
        step = step + Launches(host_syncs=1)  # the step loop's own predicate
    record = dataclasses.asdict(step)
    record["step_in_command_buffer"] = in_graph
    return record


def predicted_step_seconds(bytes_per_step, flops_per_step, launches: dict | None, kernels: int,
                           bandwidth, matrix_flops, few_programs: float = 0.0) -> float | None:
    """The step time the plan predicts: the longer of its bytes at ``bandwidth`` and its FLOPs at
    ``matrix_flops`` (bytes alone where the rate is unknown), plus ``few_programs``, the seconds
    its kernels of few programs take beyond their bytes at the bandwidth
    (:func:`few_programs_seconds`), plus
    :data:`TIME_MODEL`'s cost of each kernel, launch, graph launch and host sync (``launches``
    from :func:`step_launches`; without it, ``kernels`` each launched by the host). None without
    a bandwidth."""
    if not bandwidth or bytes_per_step is None:
        return None
    floor = bytes_per_step / bandwidth
    if matrix_flops and flops_per_step:
        floor = max(floor, flops_per_step / matrix_flops)
    floor += few_programs
    m = TIME_MODEL
    if launches is None:
        return floor + kernels * (m["kernel"] + m["launch"])
    return (floor + (launches["kernels_outside_command_buffers"]
                     + launches["kernels_in_command_buffers"]) * m["kernel"]
            + launches["kernels_outside_command_buffers"] * m["launch"]
            + launches["command_buffer_launches"] * m["graph"] + launches["host_syncs"] * m["sync"])


def few_programs_seconds(few_programs, bandwidth) -> float:
    """What kernels of few programs add to a step: each ``(bytes, programs)`` (a Pallas GPU
    kernel's runs, :class:`alodlm_jax.plan.hlo.Cost`) read at ``programs`` times
    :data:`TIME_MODEL`'s ``program`` rate where that is below ``bandwidth``, less the time its
    bytes take at the bandwidth (counted in the step's bytes already)."""
    rate = TIME_MODEL["program"]
    return sum(max(0.0, moved / min(bandwidth, programs * rate) - moved / bandwidth)
               for moved, programs in few_programs)
