"""The prepared slice of the bundled sample suite (``builtin:sample``) and its sample predictions.

The bundled suite (``alodlm_jax/data/sample_suite``) holds hand-written rows that show each
metric's edge cases (benchmarks ``edge-cases/<metric>``), followed by this slice: the first :data:`SLICE_ROWS` rows of every benchmark
of :mod:`alodlm_prepare.fixtures`, prepared by ``alodlm-jax-prepare`` with the bundled checkpoint's
chat template. The slice's rows are the ones whose ``benchmark`` is a guide name (ARC-C, ...).

Its sample predictions are written, not generated: per benchmark the first row is answered right
and the second wrong (the canonical solution, then :func:`~alodlm_prepare.fixtures.mutated_program`
of it, for code), so rescoring shows both verdicts of every benchmark. Token counts are the
answer's whitespace-separated words and the times are made up (0.05 s plus 0.03 s per token), like
the hand-written predictions'.

``scripts/make_sample_suite.py`` rewrites the slice of the bundled files with these functions.
"""

from __future__ import annotations

import pathlib
from typing import Any

from . import fixtures
from .benchmarks import BENCHMARKS
from .suite import Options, Prepared, prepare_suite

__all__ = ["SLICE_ROWS", "GUIDE_NAMES", "prepare_slice", "sample_prediction"]

SLICE_ROWS = 2
GUIDE_NAMES = tuple(benchmark.name for benchmark in BENCHMARKS)


def prepare_slice(directory: str | pathlib.Path, model: str) -> Prepared:
    """Write the fixture sources below ``directory`` and prepare the slice from them."""
    directory = pathlib.Path(directory)
    sources = fixtures.write_sources(directory / "sources")
    return prepare_suite(Options(
        benchmarks=list(BENCHMARKS), output=str(directory / "slice.jsonl"),
        sources={name: str(path) for name, path in sources.items()}, limit=SLICE_ROWS,
        model=model))


def _answer(row: dict[str, Any], source: dict[str, Any], right: bool) -> str:
    metric = row["metric"]
    if metric in ("arc", "mmlu", "mmlu_pro", "gpqa"):
        wrong = next(label for label in row["available_options"] if label != row["answer"])
        return f"The answer is ({row['answer'] if right else wrong})."
    if metric == "math":
        gold = str(row["answer"]).rpartition("####")[2].strip().replace(",", "")
        wrong = "1" if gold == "0" else "0"
        return f"So the answer is \\boxed{{{gold if right else wrong}}}."
    if metric == "python_tests":
        program, entry = source["code"], None
    else:
        program, entry = source["prompt"] + source["canonical_solution"], source["entry_point"]
    if not right:
        if entry is None:
            import ast

            entry = next(node.name for node in ast.parse(program).body
                         if isinstance(node, ast.FunctionDef))
        program = fixtures.mutated_program(program, entry)
    return f"```python\n{program.strip()}\n```"


def sample_prediction(row: dict[str, Any], index: int) -> dict[str, Any]:
    """The sample prediction of a slice row that is its benchmark's ``index``-th (0: right)."""
    source = {}
    if row["metric"] in ("python_tests", "evalplus"):  # the fixture row with its solution
        source = next(s for s in fixtures.ROWS[row["benchmark"]] if s["task_id"] == row["id"])
    text = _answer(row, source, right=index == 0)
    tokens = len(text.split())
    return {"benchmark": row["benchmark"], "id": row["id"], "text": text,
            "generated_tokens": tokens, "wall_seconds": round(0.05 + 0.03 * tokens, 2)}
