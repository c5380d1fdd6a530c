"""What one execution of an optimized XLA program moves, read from its HLO text.

XLA's ``cost_analysis()`` counts every ``while`` body once, whatever its trip count, and XLA:GPU
reports none at all. This module walks the optimized module's text (``compiled.as_text()``) and
counts each loop body as often as it runs:

* a *kernel* is an instruction of a non-fused computation that does work on the device: a fusion,
  a library call (``custom-call``: cuBLAS, cuDNN, ...), a copy, a collective, any other op that is
  not bookkeeping (parameter, tuple, get-tuple-element, constant, bitcast, control flow). Its
  bytes are those of its operands and results, except where the program says it touches less
  (:meth:`Module.kernel_bytes`): an operand read only through slices is charged the slices, a
  buffer updated in place (a cache write) only the update, not the whole buffer, and a Pallas
  kernel what its cost estimate says (:mod:`alodlm_jax.kernels.window` reads one depth of each
  request's cache, not the buffers it is handed);
* a ``while`` runs its body and condition ``n`` times: ``n`` from XLA's ``known_trip_count``
  annotation, or from a condition ``i < N`` with ``i`` starting at a constant; otherwise 1 (the
  loop is then listed in ``unknown_trip_counts``);
* a ``conditional`` (``lax.switch``/``lax.cond``) costs its heaviest branch (most bytes): the
  heaviest path through the program;
* a ``call`` costs its callee.

:func:`step_cost` is the cost of one iteration of the program's step loop: the outermost loop of
unknown trip count (the batch program's loop of steps), or the one nested ``depth`` levels inside
it (the single-request program's loop of passes inside its loop of windows).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

__all__ = ["Cost", "Module", "parse", "step_cost", "step_loop", "program_cost", "count_fusions"]

_ITEMSIZE = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
             "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3": 1, "f8e3m4": 1, "f8e4m3b11fnuz": 1,
             "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8,
             "u64": 8, "f64": 8, "c64": 8, "c128": 16, "token": 0}
_NOT_KERNELS = {"parameter", "tuple", "get-tuple-element", "constant", "bitcast", "while",
                "conditional", "call", "after-all", "add-dependency", "opt-barrier",
                "partition-id", "replica-id", "domain", "get-dimension-size", "copy-done",
                "all-reduce-done", "all-gather-done", "collective-permute-done", "async-done",
                "async-update", "send-done", "recv-done"}
_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")
# What a Pallas kernel says it moves and computes: its ``cost_estimate`` in a Mosaic (TPU) call's
# config, its metadata in a Triton (GPU) call's (quotes escaped as \22 there).
_KERNEL_ESTIMATE = {field: re.compile(r'(?:"cost_estimate":\{[^}]*|serialized_metadata = "[^"]*)'
                                      + field + r'(?:"|\\22):\s*(?:"|\\22)(\d+)')
                    for field in ("bytes_accessed", "flops", "programs")}
_ON_CHIP = re.compile(r"S\(([1-9]\d*)\)")  # a layout's memory space other than device memory


def _type_bytes(text: str) -> int:
    """Bytes in device memory of an HLO type: an array ``bf16[8,1024]{...}`` or a tuple of them
    (an array placed in another memory space, such as XLA:TPU's on-chip ``S(1)``, counts 0)."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(text):
        if dtype not in _ITEMSIZE or _ON_CHIP.search(layout or ""):
            continue
        sizes = [int(d.replace("<=", "")) for d in dims.split(",") if d.strip()]
        total += _ITEMSIZE[dtype] * math.prod(sizes)
    return total


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    type_text: str
    opcode: str
    operands: tuple[str, ...]
    attrs: str
    literal: str = ""  # a constant's value text


@dataclasses.dataclass
class Computation:
    name: str
    entry: bool
    instructions: list[Instruction]

    @functools.cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}


@dataclasses.dataclass(frozen=True)
class Cost:
    """``kernels`` launched and ``bytes`` their operands and results move; ``unknown`` counts the
    loops whose trip count could not be read (counted once); ``flops``: the multiply-adds (times
    two) of the matrix products (``dot`` in a fused computation or a cuBLAS call), and a Pallas
    kernel's own estimate; ``few_programs``: ``(bytes, programs)`` of each kernel whose metadata
    states its grid's programs (a Pallas GPU kernel; its runs' bytes summed), for
    :func:`alodlm_jax.plan.launches.few_programs_seconds`: too few programs may not read at the
    bandwidth."""
    kernels: int = 0
    bytes: int = 0
    unknown: int = 0
    flops: int = 0
    few_programs: tuple = ()

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.kernels + other.kernels, self.bytes + other.bytes,
                    self.unknown + other.unknown, self.flops + other.flops,
                    self.few_programs + other.few_programs)

    def times(self, n: int) -> "Cost":
        return Cost(self.kernels * n, self.bytes * n, self.unknown * n, self.flops * n,
                    tuple((b * n, p) for b, p in self.few_programs))


def _split_operands(rest: str) -> tuple[tuple[str, ...], str]:
    """The operand names inside the opcode's parentheses and the attributes after them."""
    depth, end = 1, len(rest)
    for index, char in enumerate(rest):
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
            if depth == 0:
                end = index
                break
    inside, attrs = rest[:end], rest[end + 1:]
    names = tuple(re.findall(r"%([^\s,)]+)", inside))
    return names, attrs


class Module:
    """An optimized HLO module's computations (``parse(text)``)."""

    def __init__(self, computations: dict[str, Computation]):
        self.computations = computations
        self.entry = next(c for c in computations.values() if c.entry)
        self._memo: dict[str, Cost] = {}

    def callees(self, instruction: Instruction, key: str) -> list[str]:
        match = re.search(key + r"=\{?([^},]+(?:,\s*%[^},]+)*)\}?", instruction.attrs)
        if not match:
            return []
        return [name.strip().lstrip("%") for name in match.group(1).split(",")]

    def trip_count(self, computation: Computation, loop: Instruction) -> int | None:
        """The loop's trip count: XLA's annotation, or ``i < N`` from a constant start."""
        known = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attrs)
        if known:
            return int(known.group(1))
        condition = self.computations.get((self.callees(loop, "condition") or [""])[0])
        if condition is None:
            return None
        root = condition.instructions[-1] if condition.instructions else None
        if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
            return None
        index_op, bound_op = (condition.by_name.get(n) for n in root.operands[:2])
        if bound_op is None or bound_op.opcode != "constant" or index_op is None \
                or index_op.opcode != "get-tuple-element":
            return None
        bound = _constant_value(bound_op)
        index = re.search(r"index=(\d+)", index_op.attrs)
        init_tuple = computation.by_name.get(loop.operands[0]) if loop.operands else None
        if bound is None or index is None or init_tuple is None or init_tuple.opcode != "tuple":
            return None
        start = _trace_constant(computation, init_tuple.operands[int(index.group(1))])
        return None if start is None else max(0, bound - start)

    def cost(self, name: str) -> Cost:
        """Cost of one execution of computation ``name`` (module docstring)."""
        if name in self._memo:
            return self._memo[name]
        computation = self.computations[name]
        total = Cost()
        for instr in computation.instructions:
            total = total + self.instruction_cost(computation, instr)
        self._memo[name] = total
        return total

    def instruction_cost(self, computation: Computation, instr: Instruction) -> Cost:
        if instr.opcode == "while":
            body = sum((self.cost(c) for c in self.callees(instr, "body")
                        + self.callees(instr, "condition")), Cost())
            trips = self.trip_count(computation, instr)
            return body.times(trips) if trips is not None else body + Cost(unknown=1)
        if instr.opcode == "conditional":
            branches = (self.callees(instr, "branch_computations")
                        or self.callees(instr, "true_computation") + self.callees(instr, "false_computation"))
            costs = [self.cost(b) for b in branches if b in self.computations]
            return max(costs, key=lambda c: (c.bytes, c.kernels), default=Cost())
        if instr.opcode == "call":
            return sum((self.cost(c) for c in self.callees(instr, "to_apply")
                        if c in self.computations), Cost())
        if instr.opcode in _NOT_KERNELS:
            return Cost()
        moved = self.kernel_bytes(computation, instr)
        programs = _kernel_estimate(instr, "programs") if instr.opcode == "custom-call" else None
        return Cost(kernels=1, bytes=moved, flops=self.kernel_flops(computation, instr),
                    few_programs=((moved, programs),) if programs else ())

    def kernel_flops(self, computation: Computation, instr: Instruction, depth: int = 0) -> int:
        """Twice the multiply-adds of the matrix products a kernel runs: a ``dot`` (2 x its
        result's elements x its contracted size), those of a fusion's computation (nested
        fusions included), a cuBLAS ``custom-call`` from its dimension numbers, a Pallas kernel
        its own estimate (as for its bytes)."""
        if instr.opcode == "dot":
            return _dot_flops(computation, instr, r"lhs_contracting_dims=\{([^}]*)\}")
        if instr.opcode == "custom-call" and "cublas" in instr.attrs:
            return _dot_flops(computation, instr,
                              r'"lhs_contracting_dimensions":\[([^\]]*)\]')
        if instr.opcode == "custom-call":
            return _kernel_estimate(instr, "flops") or 0
        if instr.opcode == "fusion" and depth < 4:
            callee = self.computations.get((self.callees(instr, "calls") or [""])[0])
            if callee is not None:
                return sum(self.kernel_flops(callee, i, depth + 1) for i in callee.instructions
                           if i.opcode in ("dot", "fusion", "custom-call"))
        return 0

    def kernel_bytes(self, computation: Computation, instr: Instruction) -> int:
        """Bytes a kernel reads and writes: its operands and results, except that an operand
        read only through slices (``dynamic-slice``, ``gather``, ``slice``) is charged the
        slices, a buffer updated in place (operand 0 of ``dynamic-update-slice`` / ``scatter``)
        is charged nothing for its unchanged part, and such an update's result is charged the
        update (what the kernel writes)."""
        sizes = [_type_bytes(computation.by_name[o].type_text) if o in computation.by_name else 0
                 for o in instr.operands]
        callee = None
        if instr.opcode == "fusion":
            callee = self.computations.get((self.callees(instr, "calls") or [""])[0])
        if callee is None:
            estimate = (_kernel_estimate(instr, "bytes_accessed") if instr.opcode == "custom-call"
                        else None)
            if estimate is not None:  # a Pallas kernel's own figure (it reads parts of operands)
                return estimate
            if instr.opcode == "copy-start":  # (destination, source alias, context): read + write
                parts = _ARRAY.findall(instr.type_text)
                written = _type_bytes("{}[{}]{}".format(*parts[0])) if parts else 0
                return sum(sizes) + written
            if instr.opcode in _SLICES:
                return 2 * _type_bytes(instr.type_text) + sum(sizes[1:])
            if instr.opcode in _UPDATES:
                update = sizes[_UPDATES[instr.opcode]] if len(sizes) > _UPDATES[instr.opcode] else 0
                return sum(sizes[1:]) + update
            return _type_bytes(instr.type_text) + sum(sizes)
        params = {int(i.literal): i for i in callee.instructions
                  if i.opcode == "parameter" and i.literal.strip().isdigit()}
        users = _users(callee)
        read = 0
        for index, size in enumerate(sizes):
            param = params.get(index)
            charge = None if param is None else self.read_through_slices(callee, param, users)
            read += size if charge is None else charge
        return read + _written(callee)

    def read_through_slices(self, computation: Computation, param: Instruction, users=None,
                            depth: int = 0) -> int | None:
        """Bytes read of a fused parameter used only by slices (their results), as the buffer of
        in-place updates (nothing), or by nested fusions that do the same; None when some use
        reads it whole."""
        users = _users(computation) if users is None else users
        total, frontier, seen = 0, [param.name], set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            uses = users.get(name, [])
            if not uses:
                if name == param.name:
                    return 0
                return None  # the fusion's result is the parameter itself (read whole)
            for user, position in uses:
                if user.opcode in _VIEWS:
                    frontier.append(user.name)
                elif user.opcode in _SLICES and position == 0:
                    total += _type_bytes(user.type_text)
                elif user.opcode in _UPDATES and position == 0:
                    pass
                elif user.opcode == "fusion" and depth < 4:
                    nested = self.computations.get((self.callees(user, "calls") or [""])[0])
                    inner = None if nested is None else next(
                        (i for i in nested.instructions if i.opcode == "parameter"
                         and i.literal.strip() == str(position)), None)
                    charge = None if inner is None else self.read_through_slices(
                        nested, inner, None, depth + 1)
                    if charge is None:
                        return None
                    total += charge
                else:
                    return None
        return total

    def step_loops(self, computation: Computation) -> list[Instruction]:
        """The loops of unknown trip count in ``computation`` (and in what it calls), heaviest
        first."""
        found: list[tuple[Computation, Instruction]] = []

        def visit(comp: Computation, seen: set):
            for instr in comp.instructions:
                if instr.opcode == "while" and self.trip_count(comp, instr) is None:
                    found.append((comp, instr))
                elif instr.opcode in ("call", "conditional"):
                    for key in ("to_apply", "branch_computations", "true_computation",
                                "false_computation"):
                        for callee in self.callees(instr, key):
                            if callee in self.computations and callee not in seen:
                                visit(self.computations[callee], seen | {callee})

        visit(computation, {computation.name})
        return [i for _, i in sorted(found, key=lambda ci: -self._loop_body(ci[1]).bytes)]

    def _loop_body(self, loop: Instruction) -> Cost:
        return sum((self.cost(c) for c in self.callees(loop, "body") + self.callees(loop, "condition")),
                   Cost())


_SLICES = {"dynamic-slice", "gather", "slice"}
_UPDATES = {"dynamic-update-slice": 1, "scatter": 2}  # opcode -> index of the update operand
_VIEWS = {"bitcast", "reshape", "get-tuple-element"}


def _users(computation: Computation) -> dict[str, list[tuple[Instruction, int]]]:
    users: dict[str, list[tuple[Instruction, int]]] = {}
    for instr in computation.instructions:
        for position, name in enumerate(instr.operands):
            users.setdefault(name, []).append((instr, position))
    return users


def _written(computation: Computation) -> int:
    """Bytes a fused computation writes: its result, an in-place update (of a parameter) only
    its update."""
    if not computation.instructions:
        return 0
    root = computation.instructions[-1]
    parts = ([computation.by_name.get(o) for o in root.operands] if root.opcode == "tuple"
             else [root])
    total = 0
    for part in parts:
        if part is None:
            continue
        view = part
        while view.opcode in ("bitcast", "reshape") and view.operands \
                and view.operands[0] in computation.by_name:
            view = computation.by_name[view.operands[0]]
        if view.opcode in _UPDATES and len(view.operands) > _UPDATES[view.opcode]:
            buffer = computation.by_name.get(view.operands[0])
            while buffer is not None and buffer.opcode in ("bitcast", "reshape") and buffer.operands:
                buffer = computation.by_name.get(buffer.operands[0])
            update = computation.by_name.get(view.operands[_UPDATES[view.opcode]])
            if buffer is not None and buffer.opcode == "parameter" and update is not None:
                total += _type_bytes(update.type_text)
                continue
        total += _type_bytes(part.type_text)
    return total


def _kernel_estimate(instr: Instruction, field: str) -> int | None:
    """A Pallas kernel's own ``field`` (``bytes_accessed``, ``flops``; ``programs``, its grid's,
    in a GPU kernel's metadata) from its call's config or metadata; None where it states none."""
    found = _KERNEL_ESTIMATE[field].search(instr.attrs)
    return int(found.group(1)) if found else None


def _dot_flops(computation: Computation, instr: Instruction, contracting: str) -> int:
    """2 x result elements x the product of the lhs's contracted dimensions (0 if unreadable)."""
    match = re.search(contracting, instr.attrs)
    lhs = computation.by_name.get(instr.operands[0]) if instr.operands else None
    arrays = _ARRAY.findall(instr.type_text)
    if match is None or lhs is None or not arrays:
        return 0
    lhs_arrays = _ARRAY.findall(lhs.type_text)
    if not lhs_arrays:
        return 0
    lhs_dims = [int(d.replace("<=", "")) for d in lhs_arrays[0][1].split(",") if d.strip()]
    out_dims = [int(d.replace("<=", "")) for d in arrays[0][1].split(",") if d.strip()]
    dims = [int(d.strip().strip('"')) for d in match.group(1).split(",") if d.strip()]
    if any(d >= len(lhs_dims) for d in dims):
        return 0
    return 2 * math.prod(out_dims) * math.prod(lhs_dims[d] for d in dims)


def _constant_value(instr: Instruction) -> int | None:
    match = re.match(r"\s*(-?\d+)\s*$", instr.literal)
    return int(match.group(1)) if match else None


def _trace_constant(computation: Computation, name: str) -> int | None:
    for _ in range(8):
        instr = computation.by_name.get(name)
        if instr is None:
            return None
        if instr.opcode == "constant":
            return _constant_value(instr)
        if instr.opcode != "copy" or not instr.operands:
            return None
        name = instr.operands[0]
    return None


def parse(text: str) -> Module:
    """The computations of an HLO module's text."""
    computations: dict[str, Computation] = {}
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and not line.startswith(("HloModule", "//")):
                current = Computation(header.group(2), bool(header.group(1)), [])
            continue
        if line.strip() == "}":
            computations[current.name] = current
            current = None
            continue
        match = _INSTR.match(line)
        if not match:
            continue
        name, type_text, opcode, rest = match.groups()
        if opcode in ("constant", "parameter"):
            literal, _, attrs = rest.partition(")")
            instr = Instruction(name, type_text, opcode, (), attrs, literal)
        else:
            operands, attrs = _split_operands(rest)
            instr = Instruction(name, type_text, opcode, operands, attrs)
        current.instructions.append(instr)
    return Module(computations)


def program_cost(module: Module) -> Cost:
    """One execution of the whole program (loops of unknown trip count counted once)."""
    return module.cost(module.entry.name)


def step_cost(module: Module, depth: int = 1) -> Cost | None:
    """One iteration of the step loop: the heaviest loop of unknown trip count in the entry
    computation, ``depth - 1`` times descended into the heaviest such loop of its body. None if
    there is no such loop."""
    loop = step_loop(module, depth)
    return None if loop is None else module._loop_body(loop)


def step_loop(module: Module, depth: int = 1) -> Instruction | None:
    """The ``while`` instruction of :func:`step_cost`'s step loop (None if there is none)."""
    computation, loop = module.entry, None
    for _ in range(depth):
        loops = module.step_loops(computation)
        if not loops:
            return None
        loop = loops[0]
        computation = module.computations[module.callees(loop, "body")[0]]
    return loop


def count_fusions(text: str) -> int:
    """Fusion instructions in the whole program text (every branch and loop once)."""
    return len(re.findall(r"=\s*\S.*?\sfusion\(", text))
