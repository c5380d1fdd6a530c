"""Predictions level: two ``predictions.jsonl`` files (SCORING.md §7.1) of the same tasks, e.g. a
JAX run and a reference run: per-benchmark score deltas, exact-text agreement, first divergence,
tokens/s ratio and the examples that flip between correct and incorrect (B relative to A).

The files are read by ``alodlm_scoring.predictions`` (the evaluate command's reader; blank lines
skipped here). This module never imports JAX or torch, so rescoring code tasks through
``alodlm_scoring.metrics.score`` keeps running generated code from a JAX-free process (D6).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Sequence

from alodlm_scoring.errors import PredictionFileError
from alodlm_scoring.predictions import (COMPARE_FIELDS, FieldSet, check_task_set, index_rows,
                                        read_prediction_rows)
from alodlm_scoring.tasks import sha256_file, task_key

from .errors import CompareInputError
from .tolerances import Tolerances, check

__all__ = ["load_prediction_rows", "first_divergence", "compare_predictions", "sha256_file"]

_WITH_VERDICTS = FieldSet(required=COMPARE_FIELDS.required + ("correct",),
                          optional=COMPARE_FIELDS.optional)


def load_prediction_rows(path: str, *, require_correct: bool) -> list[dict]:
    """Reads a ``predictions.jsonl`` file; returns its rows in file order, each with ``_line``.

    Needs ``benchmark``, ``id`` and ``text`` in every row, and ``correct`` (a boolean) unless the
    rows will be rescored; ``token_ids``, ``generated_tokens`` and ``wall_seconds`` are optional
    but checked when present (:data:`alodlm_scoring.predictions.COMPARE_FIELDS`). Blank lines are
    skipped. Keys are ``(benchmark, str(id))`` as in the evaluate command; a repeated key is an
    error.
    """
    try:
        rows = index_rows(read_prediction_rows(path, skip_blank_lines=True), file=path,
                          fields=_WITH_VERDICTS if require_correct else COMPARE_FIELDS)
    except PredictionFileError as error:
        if error.field != "correct":
            raise
        raise PredictionFileError(f"{error.message} (or pass --input to rescore)",
                                  file=path, line=error.line, field=error.field) from None
    if not rows:
        raise PredictionFileError("no predictions", file=path)
    return [{**row, "_line": number} for number, row in rows.values()]


def first_divergence(a: Sequence, b: Sequence) -> int | None:
    """The first index where ``a`` and ``b`` differ; ``None`` when they are identical.

    When one is a proper prefix of the other, the divergence is at the shorter length (the first
    position that exists in only one of them).
    """
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _tokens_per_second(rows: Iterable[dict]) -> float | None:
    """Total generated tokens over total wall seconds (the summary's definition); None if unknown."""
    tokens, seconds = 0, []
    for row in rows:
        if row.get("generated_tokens") is None or row.get("wall_seconds") is None:
            return None
        tokens += row["generated_tokens"]
        seconds.append(float(row["wall_seconds"]))
    total = math.fsum(seconds)
    return tokens / total if total > 0 else None


def _ratio(b: float | None, a: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _rescore(rows: list[dict], tasks_by_key: dict, score: Callable) -> list[bool]:
    return [bool(score(tasks_by_key[task_key(row)], row["text"])[0]) for row in rows]


def compare_predictions(rows_a: list[dict], rows_b: list[dict], *, tolerances: Tolerances,
                        tasks: list[dict] | None = None, score: Callable | None = None,
                        sources: dict | None = None) -> dict:
    """The predictions-level report for two row lists (B compared with A).

    Both files must hold the same examples (order may differ; A's order is kept). Correctness comes
    from the rows' ``correct`` unless ``tasks`` is given, in which case both sides are rescored with
    ``score(record, text) -> (correct, extracted)`` (``alodlm_scoring.metrics.score``) and the task
    keys must equal the prediction keys. First divergence is measured in tokens when every example
    has ``token_ids`` on both sides, otherwise in characters of ``text`` for all examples (one unit
    for the whole report, so the means are comparable).
    """
    sources = sources or {}
    by_key_a = {task_key(r): r for r in rows_a}
    by_key_b = {task_key(r): r for r in rows_b}
    only_a = [r for r in rows_a if task_key(r) not in by_key_b]
    only_b = [r for r in rows_b if task_key(r) not in by_key_a]
    if only_a or only_b:
        raise CompareInputError(
            "prediction files must cover the same examples: "
            f"{len(only_a)} only in A{_first(only_a, 'A')}, {len(only_b)} only in B"
            f"{_first(only_b, 'B')}")
    ordered_b = [by_key_b[task_key(r)] for r in rows_a]

    if tasks is not None:
        check_task_set({key: (row["_line"], row) for key, row in by_key_a.items()}, tasks,
                       file=sources.get("predictions_a") or "A")
        tasks_by_key = {task_key(t): t for t in tasks}
        if score is None:
            from alodlm_scoring.metrics import score  # noqa: PLC0415 - lazy: math-verify is heavy
        correct_a = _rescore(rows_a, tasks_by_key, score)
        correct_b = _rescore(ordered_b, tasks_by_key, score)
        correctness_source = "rescored"
    else:
        correct_a = [r["correct"] for r in rows_a]
        correct_b = [r["correct"] for r in ordered_b]
        correctness_source = "rows"

    use_tokens = all(isinstance(r.get("token_ids"), list) for r in rows_a + ordered_b)
    unit = "tokens" if use_tokens else "characters"
    field = "token_ids" if use_tokens else "text"

    examples = []
    for row_a, row_b, ok_a, ok_b in zip(rows_a, ordered_b, correct_a, correct_b):
        examples.append({
            "benchmark": row_a["benchmark"],
            "id": row_a["id"],
            "identical_text": row_a["text"] == row_b["text"],
            "first_divergence": first_divergence(row_a[field], row_b[field]),
            "correct_a": ok_a,
            "correct_b": ok_b,
            "line_a": row_a["_line"],
            "line_b": row_b["_line"],
        })

    groups: dict[str, list[int]] = {}
    for index, example in enumerate(examples):
        groups.setdefault(example["benchmark"], []).append(index)
    benchmarks = {}
    for name in sorted(groups, key=str):
        idx = groups[name]
        benchmarks[str(name)] = _group_stats([examples[i] for i in idx], [rows_a[i] for i in idx],
                                             [ordered_b[i] for i in idx])

    overall = _group_stats(examples, rows_a, ordered_b)
    overall.pop("flips")
    percents_a = [b["score_percent_a"] for b in benchmarks.values()]
    percents_b = [b["score_percent_b"] for b in benchmarks.values()]
    macro_a, macro_b = math.fsum(percents_a) / len(percents_a), math.fsum(percents_b) / len(percents_b)
    overall.update(macro_score_percent_a=macro_a, macro_score_percent_b=macro_b,
                   macro_score_delta_points=macro_b - macro_a)

    flips = [{k: e[k] for k in ("benchmark", "id", "correct_a", "correct_b", "first_divergence")}
             for e in examples if e["correct_a"] != e["correct_b"]]
    scoring_mismatches = [e for e in examples if e["identical_text"] and e["correct_a"] != e["correct_b"]]
    checks = [
        check("exact_text_agreement", overall["exact_text_agreement"], tolerances.min_token_agreement,
               at_most=False),
        # Identical texts must score identically; a difference means the scorers disagree.
        check("identical_text_correctness_mismatches", float(len(scoring_mismatches)), 0.0, at_most=True),
    ]
    return {
        "kind": "predictions",
        "sources": sources,
        "correctness_source": correctness_source,
        "divergence_unit": unit,
        "delta_convention": "b - a (ratios b / a)",
        "tolerances": dataclasses.asdict(tolerances),
        "overall": overall,
        "benchmarks": benchmarks,
        "flips": flips,
        "examples": examples,
        "checks": checks,
        "passed": all(c["passed"] for c in checks),
    }


def _first(rows: list[dict], side: str) -> str:
    return f" (first: {task_key(rows[0])!r}, {side} line {rows[0]['_line']})" if rows else ""


def _group_stats(examples: list[dict], rows_a: list[dict], rows_b: list[dict]) -> dict:
    n = len(examples)
    correct_a = sum(e["correct_a"] for e in examples)
    correct_b = sum(e["correct_b"] for e in examples)
    score_a, score_b = (100 * correct_a) / n, (100 * correct_b) / n
    identical = sum(e["identical_text"] for e in examples)
    divergences = [e["first_divergence"] for e in examples if e["first_divergence"] is not None]
    tps_a, tps_b = _tokens_per_second(rows_a), _tokens_per_second(rows_b)
    return {
        "examples": n,
        "correct_a": correct_a,
        "correct_b": correct_b,
        "score_percent_a": score_a,
        "score_percent_b": score_b,
        "score_delta_points": score_b - score_a,
        "identical_texts": identical,
        "exact_text_agreement": identical / n,
        "diverging": len(divergences),
        "mean_first_divergence": _mean([float(d) for d in divergences]),
        "tokens_per_second_a": tps_a,
        "tokens_per_second_b": tps_b,
        "tokens_per_second_ratio": _ratio(tps_b, tps_a),
        "flips": {
            "correct_to_incorrect": [e["id"] for e in examples if e["correct_a"] and not e["correct_b"]],
            "incorrect_to_correct": [e["id"] for e in examples if not e["correct_a"] and e["correct_b"]],
        },
    }
