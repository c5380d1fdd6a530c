"""The package's imports, read from its source: floors in one direction, no circle, public names.

Every import counts, at module level or inside a function (a lazy import that keeps JAX out of a
command's start is fine; one that only hides a circle is not, and shows up here as the circle).
"""

from __future__ import annotations

import ast
import pathlib

import alodlm_jax

ROOT = pathlib.Path(alodlm_jax.__file__).parent
PACKAGE = "alodlm_jax"

# The floors, lowest first: a module may import its own floor and the ones below, never above. A
# name covers the module and everything under it (the longest listed prefix decides).
FLOORS = (
    ("settings and data", ("alodlm_jax", "config", "data", "testing")),
    ("the network", ("network", "kernels")),
    ("decoding", ("decode",)),
    ("the generator", ("generate", "analysis", "plan")),
    ("front ends", ("cli", "harness", "report", "compare", "distributed", "torch_reference",
                    "serve")),
)


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = (PACKAGE,) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _floor(module: str) -> int:
    best, floor = -1, None
    for index, (_, names) in enumerate(FLOORS):
        for name in names:
            full = PACKAGE if name == PACKAGE else f"{PACKAGE}.{name}"
            if (module == full or module.startswith(full + ".")) and len(full) > best:
                best, floor = len(full), index
    assert floor is not None, f"{module} has no floor in FLOORS"
    return floor


def _target(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not MODULES[module].name == "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` for every import of our package."""
    tree = ast.parse(MODULES[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names
                      if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            target = _target(module, node)
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, None, node.lineno) if sub in MODULES
                             else (target, alias.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m) if t in MODULES and t != m} for m in MODULES}


def test_every_module_has_a_floor_and_imports_no_higher_floor():
    wrong = sorted({f"{m}:{line} imports {t} ({FLOORS[_floor(m)][0]} -> {FLOORS[_floor(t)][0]})"
                    for m in MODULES for t, _, line in _imports(m)
                    if t in MODULES and _floor(t) > _floor(m)})
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_even_through_function_level_imports():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    circles = []

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(circles)


def test_no_private_name_of_another_module_is_used():
    wrong = []
    for module in MODULES:
        tree = ast.parse(MODULES[module].read_text())
        aliases = {}  # local name -> our module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == PACKAGE and a.asname:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                target = _target(module, node)
                for a in node.names:
                    if f"{target}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
        for target, name, line in _imports(module):
            if name and name.startswith("_") and target != module:
                wrong.append(f"{module}:{line} imports {target}.{name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and aliases[node.value.id] != module
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                wrong.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_no_module_is_over_600_lines():
    long = sorted(f"{m}: {n} lines" for m, path in MODULES.items()
                  if (n := len(path.read_text().splitlines())) > 600)
    assert not long, "\n".join(long)


def test_the_decode_modules_have_one_direction():
    """window is under every engine; the batch program is under its scheduler, which is under the
    compiled engine; the portable engine and the batch program do not know each other."""
    graph = _graph()
    decode = {m.rsplit(".", 1)[1]: {t.rsplit(".", 1)[1] for t in ts if t.startswith("alodlm_jax.decode.")}
              for m, ts in graph.items() if m.startswith("alodlm_jax.decode.")}
    assert not {"portable", "compiled", "batched", "scheduler"} & decode["window"]
    assert "window" in decode["portable"] & decode["compiled"] & decode["batched"]
    assert not {"compiled", "scheduler", "portable"} & decode["batched"]
    assert "batched" in decode["scheduler"] and "compiled" not in decode["scheduler"]
    assert "scheduler" in decode["compiled"] and "portable" not in decode["compiled"]
    assert not {"compiled", "batched", "scheduler"} & decode["portable"]


def test_the_checks_see_what_they_look_for():
    """The reader finds function-level imports and private names (so the tests above can fail)."""
    targets = {t for t, _, _ in _imports("alodlm_jax.generate")}
    assert "alodlm_jax.decode.programs" in targets  # imported inside enable_compilation_cache
    assert _floor("alodlm_jax.decode.window") < _floor("alodlm_jax.generate")
    assert _floor("alodlm_jax.cli.evaluate") == len(FLOORS) - 1


def test_the_harness_imports_no_command():
    """lm-eval's model takes the evaluate command's flag definitions from the module that defines
    them for every command (``cli.flags``), not from a command's module."""
    wrong = sorted(f"{m} imports {t}" for m, targets in _graph().items()
                   if m.startswith("alodlm_jax.harness")
                   for t in targets if t.startswith("alodlm_jax.cli") and t != "alodlm_jax.cli.flags")
    assert not wrong, "\n".join(wrong)
