"""The decode modules import each other in one direction: the engine (compiled) uses the batch
program (batched), and both use the shared window pieces (window); nothing imports back."""

from __future__ import annotations

import ast
import pathlib

import alodlm_jax.decode as decode

HERE = pathlib.Path(decode.__file__).parent


def _decode_imports(module: str) -> set[str]:
    tree = ast.parse((HERE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):  # nested (lazy) imports count too
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "alodlm_jax.decode":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("alodlm_jax.decode."):
                found.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.rsplit(".", 1)[1] for a in node.names
                         if a.name.startswith("alodlm_jax.decode."))
    return found


def test_no_import_circle_between_the_engine_and_the_batch_program():
    assert "compiled" not in _decode_imports("batched")
    assert "batched" in _decode_imports("compiled")
    assert not {"compiled", "batched"} & _decode_imports("window")
