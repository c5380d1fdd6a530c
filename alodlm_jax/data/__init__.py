"""Bundled offline defaults: a tiny random checkpoint and a sample suite covering every metric.

Command-line tools accept these names wherever they take a path:

* ``builtin:tiny`` — ``tiny_checkpoint/``, a random 3-layer ALoDLM in the reference's file format
  (:data:`alodlm_jax.testing.tiny_checkpoint.DEMO_SPEC`; its outputs are random words, committed
  at several depths and several tokens per window);
* ``builtin:sample`` — ``sample_suite/tasks.jsonl``, a small suite: hand-written rows with the
  edge cases of all eight metrics (benchmarks ``edge-cases/<metric>``), then a slice of the eleven
  benchmarks prepared by ``alodlm-jax-prepare`` (:mod:`alodlm_prepare.sample_slice`);
* ``builtin:sample-predictions`` — ``sample_suite/predictions.jsonl``, predictions for it.

``builtin:fixtures`` is not a path: ``alodlm-jax-prepare --source builtin:fixtures`` reads the
benchmarks from the bundled fixture files (:mod:`alodlm_prepare.fixtures`); it passes through
:func:`resolve_builtin` unchanged.
"""

from __future__ import annotations

import pathlib

DATA_DIR = pathlib.Path(__file__).resolve().parent
BUILTINS = {
    "builtin:tiny": DATA_DIR / "tiny_checkpoint",
    "builtin:sample": DATA_DIR / "sample_suite" / "tasks.jsonl",
    "builtin:sample-predictions": DATA_DIR / "sample_suite" / "predictions.jsonl",
}

# Bundled names that a command reads itself rather than as a path.
COMMAND_NAMES = frozenset({"builtin:fixtures"})


def resolve_builtin(value: str | None) -> str | None:
    """Maps a ``builtin:`` name to its bundled path; any other value is returned unchanged."""
    if value is None or not value.startswith("builtin:") or value in COMMAND_NAMES:
        return value
    try:
        return str(BUILTINS[value])
    except KeyError:
        names = ", ".join(sorted([*BUILTINS, *COMMAND_NAMES]))
        raise ValueError(f"unknown bundled name {value!r}; choose one of: {names}") from None
