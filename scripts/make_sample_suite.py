#!/usr/bin/env python3
"""Rewrite the prepared slice of the bundled sample suite (alodlm_jax/data/sample_suite).

    python scripts/make_sample_suite.py

Keeps the hand-written rows of tasks.jsonl and predictions.jsonl (benchmarks that are not guide
names) and replaces the rest with alodlm_prepare.sample_slice: the first rows of every benchmark
of the hand-made fixture sources, prepared with the bundled checkpoint's chat template, and their
sample predictions. EvalPlus timings come from the ground-truth cache when it has them (a rerun on
the same machine writes the same bytes).
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from alodlm_jax.data import BUILTINS
from alodlm_prepare.sample_slice import GUIDE_NAMES, prepare_slice, sample_prediction

SUITE = pathlib.Path(BUILTINS["builtin:sample"])
PREDICTIONS = pathlib.Path(BUILTINS["builtin:sample-predictions"])


def _handwritten(path: pathlib.Path) -> list[str]:
    return [line for line in path.read_text().splitlines(keepends=True)
            if json.loads(line)["benchmark"] not in GUIDE_NAMES]


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        prepared = prepare_slice(work, str(BUILTINS["builtin:tiny"]))
        rows = prepared.rows
        seen: dict[str, int] = {}
        predictions = []
        for row in rows:
            predictions.append(sample_prediction(row, seen.get(row["benchmark"], 0)))
            seen[row["benchmark"]] = seen.get(row["benchmark"], 0) + 1
        slice_text = pathlib.Path(prepared.path).read_text()
    SUITE.write_text("".join(_handwritten(SUITE)) + slice_text)
    PREDICTIONS.write_text("".join(_handwritten(PREDICTIONS))
                           + "".join(json.dumps(p) + "\n" for p in predictions))
    print(f"{SUITE}: {len(rows)} prepared rows; {PREDICTIONS}: {len(predictions)} predictions")


if __name__ == "__main__":
    main()
