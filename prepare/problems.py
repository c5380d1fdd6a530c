"""Math tasks: GSM8K and MATH-500 rows (metric ``math``).

The gold answer is the source's own answer field, verbatim: GSM8K's full solution ending in
``#### <number>`` and MATH-500's final answer in LaTeX. Which part of it is the gold is the
scorer's rule (SCORING.md §4.6.2), not restated here.

GSM8K few-shot examples (``--fewshot K``) are the first ``K`` rows of the source's ``train`` split;
the template gets each as ``question``, ``reasoning`` (the solution before its ``####`` line,
without the dataset's ``<<48/2=24>>`` calculator annotations) and ``answer`` (the number after
``####``).
"""

from __future__ import annotations

import re
from typing import Any

from .items import BuildContext, Item, ItemError

__all__ = ["gsm8k_items", "math500_items", "gsm8k_shot"]

_CALCULATOR_ANNOTATION = re.compile(r"<<[^<>]*>>")


def gsm8k_shot(row: dict[str, Any]) -> dict[str, str]:
    """One few-shot example for the template, from a GSM8K training row."""
    solution = str(row["answer"])
    if "####" not in solution:
        raise ItemError(f"few-shot row {row['question'][:40]!r}: the answer has no '####' line")
    reasoning, _, final = solution.rpartition("####")
    return {"question": str(row["question"]).strip(),
            "reasoning": _CALCULATOR_ANNOTATION.sub("", reasoning).strip(),
            "answer": final.strip()}


def gsm8k_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """GSM8K: ``question`` and ``answer``; no id column, so the id is the row's index in the split."""
    shots = [dict(shot) for shot in context.shots]
    return [Item(id=index, context={"question": str(row["question"]).strip(), "shots": shots},
                 fields={"answer": row["answer"]})
            for index, row in enumerate(rows)]


def math500_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """MATH-500: ``problem``, ``answer``, ``unique_id`` (the id); ``subject`` and ``level`` are
    passed to the template."""
    return [Item(id=row["unique_id"],
                 context={"question": str(row["problem"]).strip(), "shots": [],
                          "subject": row.get("subject"), "level": row.get("level")},
                 fields={"answer": row["answer"]})
            for row in rows]
