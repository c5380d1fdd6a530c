"""Comparing alodlm-jax against PyTorch: the metrics, the checks and the report dict.

Two comparisons share one report shape (``kind``, the measured numbers, ``checks``, ``passed``):

* **model level** — the same checkpoint run by JAX and by a PyTorch side. Per depth (1-based, as
  exit depths are): max |Δ logits|, mean KL(torch ‖ jax) in fp64, top-1 agreement and max |Δ hazard|
  over every row of every prompt of an all-``K``-passes forward; then a greedy decode both ways with
  the same ``DecodeConfig``: token agreement, exit-depth agreement and the first divergence per
  prompt (MODEL_AND_DECODING.md §8 "parity expectations");
* **predictions level** — two ``predictions.jsonl`` files (SCORING.md §7.1), e.g. a JAX run and a
  reference run of the same tasks: per-benchmark score deltas, exact-text agreement, first
  divergence, tokens/s ratio and the examples that flip between correct and incorrect.

Everything here is a pure function of arrays, rows or result dicts, except the small loaders at
the end (``load_*``, ``run_model_comparison``) which read files and import JAX / torch lazily. The
predictions path never imports JAX or torch, so rescoring code tasks through
``alodlm_scoring.metrics.score`` keeps running generated code from a JAX-free process (SCORING.md D6).

Sign convention: every delta and ratio is **B relative to A** (``b - a``, ``b / a``); at model level
A is PyTorch and B is JAX.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
from typing import Any, Callable, Iterable, Sequence

import numpy as np

__all__ = [
    "CompareInputError",
    "Tolerances",
    "default_tolerances",
    # predictions level
    "load_prediction_rows",
    "first_divergence",
    "compare_predictions",
    # model level
    "depth_metrics",
    "merge_depth_metrics",
    "decode_pair_metrics",
    "model_report",
    "load_prompts",
    "PromptSpec",
    "perturb_core_q",
    "run_model_comparison",
    # both
    "format_report",
    "exit_status",
]

TORCH_SIDE_OFFICIAL = "alodlm-official"
TORCH_SIDE_REFERENCE = "alodlm-jax-torch-reference"


class CompareInputError(ValueError):
    """Bad user input (a file, a line, a field): the CLI prints ``str(error)`` and exits 2."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        where = ""
        if file is not None:
            where = file if line is None else f"{file}:{line}"
        if field is not None:
            where = f"{where}: field {field!r}" if where else f"field {field!r}"
        super().__init__(f"{where}: {message}" if where else message)


# ------------------------------------------------------------------------------------------------
# Tolerances


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """Pass/fail thresholds.

    ``atol`` bounds max |Δ hazard| at every depth, and |Δ logits| together with ``rtol``:
    ``|Δ| ≤ atol + rtol · s`` for every logit, where ``s`` is the row's largest |torch logit| (the
    row's scale; ``rtol`` is 0 in fp32). BF16 needs the relative part: a bf16 hidden state carries
    relative errors of about 2^-8 into the head, so logit differences scale with the logits
    themselves (measured on the tiny models: max |Δ| / s ≈ 0.008-0.009, about one bf16 ulp of the
    row's scale, for rows with s from 3 to 44); real logits reach 20-40, where that is 0.2-0.4, over
    any useful absolute bound. ``min_token_agreement`` is
    the fraction of prompts (model level) or examples (predictions level: exact text) whose outputs
    must be identical. ``min_exit_depth_agreement`` is the fraction of positions, over the common
    token prefix of every prompt, whose exit depths must be equal: FP32 must reproduce exit depths
    exactly, BF16 only statistically because exit depths sit on the ``tau``/``q`` thresholds.
    """

    atol: float
    min_token_agreement: float
    min_exit_depth_agreement: float
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise CompareInputError(f"--{name} must be finite and nonnegative")
        for name in ("min_token_agreement", "min_exit_depth_agreement"):
            value = getattr(self, name)
            if not (0.0 <= value <= 1.0):
                raise CompareInputError(f"--{name} must be in [0, 1]")


_DEFAULTS = {
    "fp32": dict(atol=1e-4, min_token_agreement=1.0, min_exit_depth_agreement=1.0, rtol=0.0),
    # rtol 2^-5 of the row's scale: about four bf16 ulps (measured differences are about one).
    "bf16": dict(atol=0.1, min_token_agreement=0.95, min_exit_depth_agreement=0.9, rtol=2.0 ** -5),
}


def default_tolerances(precision: str, *, atol: float | None = None,
                       min_token_agreement: float | None = None,
                       min_exit_depth_agreement: float | None = None,
                       rtol: float | None = None) -> Tolerances:
    """The precision's defaults, with any explicitly given value taking precedence."""
    if precision not in _DEFAULTS:
        raise CompareInputError(f"--precision must be fp32 or bf16, got {precision!r}")
    values = dict(_DEFAULTS[precision])
    for name, value in (("atol", atol), ("min_token_agreement", min_token_agreement),
                        ("min_exit_depth_agreement", min_exit_depth_agreement), ("rtol", rtol)):
        if value is not None:
            values[name] = float(value)
    return Tolerances(**values)


def _check(name: str, value: float | None, threshold: float, *, at_most: bool, **where) -> dict:
    """One named check. A missing value (``None``) or NaN fails: nothing measured, nothing proven."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        passed = False
    else:
        passed = value <= threshold if at_most else value >= threshold
    return {"name": name, **where, "value": value, "threshold": threshold,
            "comparison": "<=" if at_most else ">=", "passed": bool(passed)}


def exit_status(report: dict) -> int:
    """0 when every check passed, 1 otherwise (2, bad input, is decided before a report exists)."""
    return 0 if report.get("passed") else 1


# ------------------------------------------------------------------------------------------------
# Predictions level


def sha256_file(path: str) -> str:
    """Lowercase hex SHA-256 of a file (recorded in the report so inputs can be identified)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_lines(path: str) -> list[str]:
    try:
        data = open(path, "rb").read()
    except OSError as error:
        raise CompareInputError(f"cannot read: {error.strerror or error}", file=path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CompareInputError(f"not valid UTF-8: {error.reason}", file=path, line=line) from None
    return list(io.StringIO(text, newline=None))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_prediction_rows(path: str, *, require_correct: bool) -> list[dict]:
    """Reads a ``predictions.jsonl`` file; returns its rows in file order, each with ``_line``.

    Needs ``benchmark``, ``id`` and ``text`` (a string) in every row, and ``correct`` (a boolean)
    unless the rows will be rescored. ``token_ids`` (a list of integers), ``generated_tokens`` (an
    integer) and ``wall_seconds`` (a positive number) are optional but checked when present.
    Blank lines are skipped. Keys are ``(benchmark, str(id))`` as in the evaluate command; a repeated
    key is an error.
    """
    rows: list[dict] = []
    seen: dict[tuple, int] = {}
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        where = {"file": path, "line": number}
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise CompareInputError(f"invalid JSON: {error.msg} (column {error.colno})", **where) from None
        if not isinstance(row, dict):
            raise CompareInputError(f"each line must be a JSON object, got {type(row).__name__}", **where)
        for field in ("benchmark", "id", "text"):
            if field not in row:
                raise CompareInputError("missing required field", field=field, **where)
        if not isinstance(row["text"], str):
            raise CompareInputError("must be a string", field="text", **where)
        if require_correct and not isinstance(row.get("correct"), bool):
            problem = "missing" if "correct" not in row else "must be true or false"
            raise CompareInputError(f"{problem} (or pass --input to rescore)", field="correct", **where)
        if "token_ids" in row and row["token_ids"] is not None and not (
            isinstance(row["token_ids"], list) and all(_is_int(t) for t in row["token_ids"])
        ):
            raise CompareInputError("must be a list of integers", field="token_ids", **where)
        if "generated_tokens" in row and not (_is_int(row["generated_tokens"]) and row["generated_tokens"] >= 0):
            raise CompareInputError("must be an integer >= 0", field="generated_tokens", **where)
        if "wall_seconds" in row and not (
            _is_number(row["wall_seconds"]) and math.isfinite(row["wall_seconds"]) and row["wall_seconds"] > 0
        ):
            raise CompareInputError("must be a finite number > 0", field="wall_seconds", **where)
        key = _row_key(row)
        if key in seen:
            raise CompareInputError(f"duplicate prediction {key!r} (first on line {seen[key]})",
                                    field="id", **where)
        seen[key] = number
        rows.append({**row, "_line": number})
    if not rows:
        raise CompareInputError("no predictions", file=path)
    return rows


def _row_key(row: dict) -> tuple[Any, str]:
    return (row["benchmark"], str(row["id"]))


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
        if "generated_tokens" not in row or "wall_seconds" not in row:
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
    return [bool(score(tasks_by_key[_row_key(row)], row["text"])[0]) for row in rows]


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
    keys_a = [_row_key(r) for r in rows_a]
    by_key_b = {_row_key(r): r for r in rows_b}
    only_a = [k for k in keys_a if k not in by_key_b]
    only_b = [k for k in by_key_b if k not in set(keys_a)]
    if only_a or only_b:
        raise CompareInputError(
            "prediction files must cover the same examples: "
            f"{len(only_a)} only in A{_first(only_a)}, {len(only_b)} only in B{_first(only_b)}")
    ordered_b = [by_key_b[k] for k in keys_a]

    if tasks is not None:
        tasks_by_key = {(t["benchmark"], str(t["id"])): t for t in tasks}
        if set(tasks_by_key) != set(keys_a):
            missing = [k for k in keys_a if k not in tasks_by_key]
            extra = [k for k in tasks_by_key if k not in by_key_b]
            raise CompareInputError(
                "prediction IDs must match the complete task set: "
                f"{len(missing)} predictions without a task{_first(missing)}, "
                f"{len(extra)} tasks without a prediction{_first(extra)}")
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
        _check("exact_text_agreement", overall["exact_text_agreement"], tolerances.min_token_agreement,
               at_most=False),
        # Identical texts must score identically; a difference means the scorers disagree.
        _check("identical_text_correctness_mismatches", float(len(scoring_mismatches)), 0.0, at_most=True),
    ]
    return {
        "kind": "predictions",
        "sources": sources or {},
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


def _first(keys: list) -> str:
    return f" (first: {keys[0]!r})" if keys else ""


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


# ------------------------------------------------------------------------------------------------
# Model level: forward metrics


_KL_ROW_CHUNK = 64


def _log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def depth_metrics(torch_logits: np.ndarray, jax_logits: np.ndarray, torch_hazards: np.ndarray,
                  jax_hazards: np.ndarray, *, rtol: float = 0.0) -> list[dict]:
    """Per-depth accumulators for one prompt: ``[K, T, V]`` logits and ``[K, T]`` hazards per side.

    KL(torch ‖ jax) = Σ_v p_torch (log p_torch − log p_jax), in float64 from the fp32 logits.
    ``logits_excess`` is max over logits of |Δ| − rtol · (the row's max |torch logit|), the quantity
    bounded by ``atol`` (it equals max |Δ logits| when ``rtol`` is 0).
    Returns, per depth, maxima and sums with the row count so prompts of different lengths merge
    exactly (:func:`merge_depth_metrics`).
    """
    tl, jl = np.asarray(torch_logits, np.float32), np.asarray(jax_logits, np.float32)
    th, jh = np.asarray(torch_hazards, np.float32), np.asarray(jax_hazards, np.float32)
    if tl.shape != jl.shape or th.shape != jh.shape or tl.shape[:2] != th.shape:
        raise ValueError(f"shape mismatch: logits {tl.shape} vs {jl.shape}, hazards {th.shape} vs {jh.shape}")
    out = []
    for depth in range(tl.shape[0]):
        kl_sums = []
        for lo in range(0, tl.shape[1], _KL_ROW_CHUNK):  # bounded float64 temporaries at V = 151936
            lt = _log_softmax64(tl[depth, lo:lo + _KL_ROW_CHUNK])
            lj = _log_softmax64(jl[depth, lo:lo + _KL_ROW_CHUNK])
            kl_sums.extend((np.exp(lt) * (lt - lj)).sum(axis=-1).tolist())
        out.append({
            "rows": int(tl.shape[1]),
            "max_abs_logits": float(np.abs(tl[depth].astype(np.float64) - jl[depth]).max(initial=0.0)),
            "logits_excess": float((np.abs(tl[depth].astype(np.float64) - jl[depth])
                                    - rtol * np.abs(tl[depth].astype(np.float64)).max(axis=-1, keepdims=True)
                                    ).max(initial=-np.inf)),
            "kl_sum": float(math.fsum(kl_sums)),
            "top1_agree": int((tl[depth].argmax(-1) == jl[depth].argmax(-1)).sum()),
            "max_abs_hazard": float(np.abs(th[depth].astype(np.float64) - jh[depth]).max(initial=0.0)),
        })
    return out


def merge_depth_metrics(per_prompt: list[list[dict]]) -> list[dict]:
    """Merges per-prompt accumulators into the report's per-depth rows (depths 1-based)."""
    if not per_prompt:
        return []
    merged = []
    for depth in range(len(per_prompt[0])):
        items = [p[depth] for p in per_prompt]
        rows = sum(i["rows"] for i in items)
        merged.append({
            "depth": depth + 1,
            "rows": rows,
            "max_abs_logits": max(i["max_abs_logits"] for i in items),
            "max_logits_excess": max(i.get("logits_excess", i["max_abs_logits"]) for i in items),
            "mean_kl": math.fsum(i["kl_sum"] for i in items) / rows if rows else None,
            "top1_agreement": sum(i["top1_agree"] for i in items) / rows if rows else None,
            "max_abs_hazard": max(i["max_abs_hazard"] for i in items),
        })
    return merged


# ------------------------------------------------------------------------------------------------
# Model level: decode metrics


def decode_pair_metrics(torch_result: dict | None, jax_result: dict | None, *,
                        errors: dict | None = None) -> dict:
    """Compares one prompt's two generation results (``token_ids``, ``exit_depths``, ...).

    A side that raised instead of returning a result is passed as ``None`` with its message in
    ``errors`` (``{"torch": ..., "jax": ...}``): the prompt then counts as a disagreement.
    """
    if torch_result is None or jax_result is None:
        results = {"torch": torch_result, "jax": jax_result}
        return {
            "tokens_equal": False, "exit_depths_equal": False, "first_divergence": None,
            "first_exit_depth_divergence": None, "common_prefix": 0, "exit_depth_positions_equal": 0,
            "generated_tokens": {k: (len(r["token_ids"]) if r else None) for k, r in results.items()},
            "stop_reason": {k: (r.get("stop_reason") if r else None) for k, r in results.items()},
            "mean_exit_depth": {k: (r.get("mean_exit_depth") if r else None) for k, r in results.items()},
            "token_ids": {k: (list(r["token_ids"]) if r else None) for k, r in results.items()},
            "exit_depths": {k: (list(r["exit_depths"]) if r else None) for k, r in results.items()},
            "errors": dict(errors or {}),
        }
    t_tok, j_tok = list(torch_result["token_ids"]), list(jax_result["token_ids"])
    t_exit, j_exit = list(torch_result["exit_depths"]), list(jax_result["exit_depths"])
    common = first_divergence(t_tok, j_tok)
    common = min(len(t_tok), len(j_tok)) if common is None else common
    equal_exits = sum(a == b for a, b in zip(t_exit[:common], j_exit[:common]))
    return {
        "tokens_equal": t_tok == j_tok,
        "exit_depths_equal": t_tok == j_tok and t_exit == j_exit,
        "first_divergence": first_divergence(t_tok, j_tok),
        "first_exit_depth_divergence": first_divergence(t_exit[:common], j_exit[:common]),
        "common_prefix": common,
        "exit_depth_positions_equal": equal_exits,
        "generated_tokens": {"torch": len(t_tok), "jax": len(j_tok)},
        "stop_reason": {"torch": torch_result.get("stop_reason"), "jax": jax_result.get("stop_reason")},
        "mean_exit_depth": {"torch": torch_result.get("mean_exit_depth"), "jax": jax_result.get("mean_exit_depth")},
        "token_ids": {"torch": t_tok, "jax": j_tok},
        "exit_depths": {"torch": t_exit, "jax": j_exit},
    }


def _generate_or_error(generate_fn: Callable[[list[int]], dict], ids: list[int]) -> tuple[dict | None, str | None]:
    """Runs one side's generation; an exception becomes a recorded error (the prompt then fails the
    comparison) instead of aborting the other prompts. Inputs are validated before this point."""
    try:
        return generate_fn(ids), None
    except Exception as error:  # noqa: BLE001 - any failure of one side is a finding to report
        return None, f"{type(error).__name__}: {error}"


def model_report(*, depth_rows: list[dict], decode_rows: list[dict] | None, tolerances: Tolerances,
                 info: dict) -> dict:
    """Assembles the model-level report and its checks.

    Checks: per depth, max |Δ logits| ≤ atol (with ``rtol`` > 0: max(|Δ| − rtol · row scale) ≤ atol,
    named ``max_logits_excess``) and max |Δ hazard| ≤ atol; over prompts, the fraction
    with identical token sequences ≥ ``min_token_agreement``; over the common token prefixes, the
    fraction of positions with equal exit depths ≥ ``min_exit_depth_agreement``. KL and top-1 are
    reported, not checked: they follow from the logits bound.
    """
    checks = []
    for row in depth_rows:
        if tolerances.rtol:
            checks.append(_check("max_logits_excess", row["max_logits_excess"], tolerances.atol,
                                 at_most=True, depth=row["depth"]))
        else:
            checks.append(_check("max_abs_logits", row["max_abs_logits"], tolerances.atol, at_most=True,
                                 depth=row["depth"]))
        checks.append(_check("max_abs_hazard", row["max_abs_hazard"], tolerances.atol, at_most=True,
                             depth=row["depth"]))
    decode = None
    if decode_rows is not None:
        n = len(decode_rows)
        positions = sum(r["common_prefix"] for r in decode_rows)
        equal_positions = sum(r["exit_depth_positions_equal"] for r in decode_rows)
        decode = {
            "prompts": n,
            "token_agreement": sum(r["tokens_equal"] for r in decode_rows) / n if n else None,
            "exit_depth_sequence_agreement": sum(r["exit_depths_equal"] for r in decode_rows) / n if n else None,
            # No common positions (both empty) means nothing disagrees.
            "exit_depth_position_agreement": equal_positions / positions if positions else 1.0,
            "per_prompt": [{"prompt": i, **r} for i, r in enumerate(decode_rows)],
        }
        checks.append(_check("token_agreement", decode["token_agreement"], tolerances.min_token_agreement,
                             at_most=False))
        checks.append(_check("exit_depth_position_agreement", decode["exit_depth_position_agreement"],
                             tolerances.min_exit_depth_agreement, at_most=False))
    return {
        "kind": "model",
        **info,
        "tolerances": dataclasses.asdict(tolerances),
        "forward": {"depths": depth_rows},
        "decode": decode,
        "checks": checks,
        "failed": [_check_label(c) for c in checks if not c["passed"]],
        "passed": all(c["passed"] for c in checks),
    }


def _check_label(check: dict) -> str:
    where = f" at depth {check['depth']}" if "depth" in check else ""
    return f"{check['name']}{where}: {check['value']} (must be {check['comparison']} {check['threshold']})"


# ------------------------------------------------------------------------------------------------
# Model level: prompts


@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """One prompt: text (chat template applied unless ``raw``) or explicit token ids."""

    where: str
    text: str | None = None
    ids: tuple[int, ...] | None = None
    raw: bool = False


def load_prompts(path: str) -> list[PromptSpec]:
    """Reads a prompts file: JSONL or plain text, one prompt per line (blank lines skipped).

    The file is JSONL when its first non-blank line is a JSON object. Each JSONL object holds either
    ``prompt`` (a non-empty string; ``"raw": true`` encodes it verbatim instead of through the chat
    template) or ``prompt_ids`` (a non-empty list of integers). A plain-text line is a chat prompt.
    """
    lines = _read_lines(path)
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise CompareInputError("no prompts", file=path)
    try:
        is_jsonl = isinstance(json.loads(numbered[0][1]), dict)
    except json.JSONDecodeError:
        is_jsonl = False
    specs = []
    for number, line in numbered:
        where = {"file": path, "line": number}
        label = f"{path}:{number}"
        if not is_jsonl:
            specs.append(PromptSpec(where=label, text=line.rstrip("\r\n")))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CompareInputError(f"invalid JSON: {error.msg} (column {error.colno})", **where) from None
        if not isinstance(record, dict):
            raise CompareInputError("each line must be a JSON object", **where)
        has_text, has_ids = "prompt" in record, "prompt_ids" in record
        if has_text == has_ids:
            raise CompareInputError("give exactly one of 'prompt' and 'prompt_ids'", **where)
        raw = record.get("raw", False)
        if not isinstance(raw, bool):
            raise CompareInputError("must be true or false", field="raw", **where)
        if has_text:
            if not isinstance(record["prompt"], str) or not record["prompt"]:
                raise CompareInputError("must be a non-empty string", field="prompt", **where)
            specs.append(PromptSpec(where=label, text=record["prompt"], raw=raw))
        else:
            ids = record["prompt_ids"]
            if not (isinstance(ids, list) and ids and all(_is_int(t) for t in ids)):
                raise CompareInputError("must be a non-empty list of integers", field="prompt_ids", **where)
            specs.append(PromptSpec(where=label, ids=tuple(ids)))
    return specs


def encode_prompts(specs: Sequence[PromptSpec], tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Token ids per prompt: the chat template rendered over one user turn with the generation
    prompt (``enable_thinking=False``, MODEL_AND_DECODING.md §4.7) and encoded without added special
    tokens, exactly as ``Generator.chat_prompt_ids`` does; or the text itself encoded verbatim for
    ``raw`` prompts; or the given ids. Every id must lie in ``[0, vocab_size)``."""
    out = []
    for spec in specs:
        if spec.ids is not None:
            ids = list(spec.ids)
        elif spec.raw:
            ids = list(tokenizer.encode(spec.text, add_special_tokens=False))
        else:
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": spec.text}], tokenize=False, add_generation_prompt=True,
                enable_thinking=False)
            ids = list(tokenizer.encode(rendered, add_special_tokens=False))
        if not ids:
            raise CompareInputError("the prompt encodes to no tokens", file=spec.where)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise CompareInputError(f"token id {bad[0]} outside [0, {vocab_size})", file=spec.where)
        out.append(ids)
    return out


# ------------------------------------------------------------------------------------------------
# Model level: running both sides


def perturb_core_q(params: dict, *, layer: int = 0, delta: float = 1e-2) -> dict:
    """A copy of ``params`` with ``delta`` added to one core layer's q kernel (a test hook: a
    conversion error of this size must fail the comparison)."""
    import jax.numpy as jnp  # noqa: PLC0415

    core = dict(params["core"])
    core["q"] = core["q"].at[layer].add(jnp.asarray(delta, core["q"].dtype))
    return {**params, "core": core}


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def official_alodlm_available() -> bool:
    """Whether the reference package ``alodlm`` (with its portable decoder) can be imported."""
    try:
        import alodlm.inference  # noqa: F401, PLC0415
        import alodlm.model  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return False
    return True


class _OfficialDecoder:
    """The reference's portable decoder (``alodlm.model.ALoDLM`` + ``alodlm.inference.Decoder``).

    Only decoding goes through it: the reference package has no public all-passes forward, so the
    per-depth forward comparison always uses our torch reference (the report says so).
    """

    def __init__(self, model_dir: str, precision: str):
        import torch  # noqa: PLC0415
        from alodlm.data import load_tokenizer  # noqa: PLC0415
        from alodlm.inference import Decoder  # noqa: PLC0415
        from alodlm.model import ALoDLM  # noqa: PLC0415

        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        model = ALoDLM.from_pretrained(model_dir, config=None, dtype=dtype).to("cpu")
        self._decoder = Decoder(model, load_tokenizer(model_dir))

    def generate(self, prompt_ids: list[int], config: Any) -> dict:
        from alodlm.inference import DecodeConfig as OfficialDecodeConfig  # noqa: PLC0415

        return self._decoder.generate(prompt_ids, OfficialDecodeConfig(**config.as_dict()))


def run_model_comparison(model: str, prompts: Sequence[PromptSpec], *, precision: str, decode_config: Any,
                         tolerances: Tolerances, engine: str = "compiled", device: str = "cpu",
                         torch_side: str = "auto", decode: bool = True,
                         jax_params_hook: Callable[[dict], dict] | None = None) -> dict:
    """Runs the checkpoint in JAX and PyTorch and returns the model-level report.

    ``torch_side``: ``"auto"`` (the official package if importable, else our reference),
    ``"official"`` or ``"reference"``. ``jax_params_hook`` transforms the JAX params before they are
    used (tests perturb them with :func:`perturb_core_q`); it applies to the forward comparison and,
    when the generator exposes its params, to the JAX decode too.
    """
    import jax  # noqa: PLC0415

    from alodlm_jax import generate  # noqa: PLC0415
    from alodlm_jax.model import looped_forward  # noqa: PLC0415
    from alodlm_jax.params import load_model  # noqa: PLC0415
    from alodlm_jax.torch_reference import TorchALoDLM  # noqa: PLC0415

    if torch_side not in ("auto", "official", "reference"):
        raise CompareInputError(f"--torch_side must be auto, official or reference, got {torch_side!r}")
    use_official = official_alodlm_available() if torch_side == "auto" else torch_side == "official"
    if use_official and not official_alodlm_available():
        raise CompareInputError("--torch_side official: the alodlm package is not importable")

    target = generate.jax_device(device)
    model_dir = _resolve_model_dir(model)
    reference = TorchALoDLM.from_checkpoint(model_dir, precision)
    prompt_ids = encode_prompts(prompts, reference.tokenizer, reference.vocab_size)
    budget = decode_config.max_new_tokens if decode else 0
    for spec, ids in zip(prompts, prompt_ids):
        if len(ids) + budget > reference.max_position_embeddings:
            raise CompareInputError(
                f"prompt of {len(ids)} tokens plus max_new_tokens {budget} exceeds "
                f"max_position_embeddings {reference.max_position_embeddings}", file=spec.where)

    placement = jax.sharding.SingleDeviceSharding(target)
    cfg, params = load_model(model_dir, precision, sharding=lambda path, array: placement)
    if jax_params_hook is not None:
        params = jax_params_hook(params)
    forward = jax.jit(looped_forward, static_argnums=1)
    per_prompt = []
    with jax.default_device(target):
        for ids in prompt_ids:
            t_logits, t_hazards = reference.looped_forward(ids)
            j_logits, j_hazards = forward(params, cfg, jax.numpy.asarray(ids, dtype=jax.numpy.int32))
            per_prompt.append(depth_metrics(_to_numpy(t_logits), _to_numpy(j_logits),
                                            _to_numpy(t_hazards), _to_numpy(j_hazards), rtol=tolerances.rtol))
    depth_rows = merge_depth_metrics(per_prompt)

    decode_rows = None
    if decode:
        # Built from the params above (hook included), so both comparisons test the same weights.
        generator = generate.Generator(
            cfg=cfg, params=params, tokenizer=generate.load_tokenizer(model_dir), model_dir=model_dir,
            precision=precision, device=device, engine=engine, decode_config=decode_config,
            jax_device=target)
        stop_ids = list(generator.stop_ids)
        official = _OfficialDecoder(model_dir, precision) if use_official else None
        if official is not None:
            torch_generate = lambda ids: official.generate(ids, decode_config)  # noqa: E731
        else:
            torch_generate = lambda ids: reference.generate(ids, decode_config, stop_ids=stop_ids)  # noqa: E731
        decode_rows = []
        for ids in prompt_ids:
            torch_result, torch_error = _generate_or_error(torch_generate, ids)
            jax_result, jax_error = _generate_or_error(generator.generate_ids, ids)
            errors = {k: v for k, v in (("torch", torch_error), ("jax", jax_error)) if v is not None}
            decode_rows.append(decode_pair_metrics(torch_result, jax_result, errors=errors))

    info = {
        "model": model,
        "precision": precision,
        "jax_side": "alodlm-jax",
        "torch_side": TORCH_SIDE_OFFICIAL if (use_official and decode) else TORCH_SIDE_REFERENCE,
        "torch_forward_side": TORCH_SIDE_REFERENCE,
        "engine": engine,
        "device": device,
        "decode_config": decode_config.as_dict() if decode else None,
        "prompts": [{"where": s.where, "tokens": len(ids)} for s, ids in zip(prompts, prompt_ids)],
        "jax_params_hook": getattr(jax_params_hook, "__name__", "hook") if jax_params_hook else None,
        "versions": _versions(),
    }
    return model_report(depth_rows=depth_rows, decode_rows=decode_rows, tolerances=tolerances, info=info)


def _resolve_model_dir(model: str) -> str:
    from alodlm_convert.resolve import resolve_model  # noqa: PLC0415

    return os.fspath(resolve_model(model))


def _versions() -> dict:
    from importlib import metadata  # noqa: PLC0415

    out = {}
    for name in ("jax", "jaxlib", "flax", "torch", "transformers", "alodlm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


# ------------------------------------------------------------------------------------------------
# Readable table


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def format_report(report: dict) -> str:
    """A short human-readable rendering of a report (the JSON file has everything)."""
    lines: list[str] = []
    if report["kind"] == "model":
        lines.append(f"model {report.get('model')}  precision {report.get('precision')}  "
                     f"torch side {report.get('torch_side')}  jax engine {report.get('engine')}")
        lines.append("")
        lines += _table(
            ["depth", "rows", "max|dlogits|", "mean KL(t||j)", "top-1 agree", "max|dhazard|"],
            [[str(r["depth"]), str(r["rows"]), _fmt(r["max_abs_logits"]), _fmt(r["mean_kl"]),
              _fmt(r["top1_agreement"], ".4f"), _fmt(r["max_abs_hazard"])] for r in report["forward"]["depths"]])
        decode = report.get("decode")
        if decode is not None:
            lines.append("")
            lines += _table(
                ["prompt", "tokens t/j", "tokens equal", "exits equal", "first divergence", "first exit divergence"],
                [[str(r["prompt"]), f"{_fmt(r['generated_tokens']['torch'])}/{_fmt(r['generated_tokens']['jax'])}",
                  _fmt(r["tokens_equal"]), _fmt(r["exit_depths_equal"]), _fmt(r["first_divergence"]),
                  _fmt(r["first_exit_depth_divergence"])] for r in decode["per_prompt"]])
            for r in decode["per_prompt"]:
                for side, message in r.get("errors", {}).items():
                    lines.append(f"prompt {r['prompt']}: {side} side raised {message}")
            lines.append(f"token agreement {_fmt(decode['token_agreement'], '.4f')}  "
                         f"exit-depth sequences {_fmt(decode['exit_depth_sequence_agreement'], '.4f')}  "
                         f"exit-depth positions {_fmt(decode['exit_depth_position_agreement'], '.4f')}")
    else:
        src = report.get("sources", {})
        lines.append(f"A {src.get('predictions_a')}  vs  B {src.get('predictions_b')}  "
                     f"(correctness: {report['correctness_source']}; divergence in {report['divergence_unit']})")
        lines.append("")
        rows = []
        for name, b in list(report["benchmarks"].items()) + [("(pooled)", report["overall"])]:
            rows.append([name, str(b["examples"]), _fmt(b["score_percent_a"], ".2f"), _fmt(b["score_percent_b"], ".2f"),
                         _fmt(b["score_delta_points"], "+.2f"), _fmt(b["exact_text_agreement"], ".4f"),
                         _fmt(b["mean_first_divergence"], ".2f"), _fmt(b["tokens_per_second_ratio"], ".3f")])
        lines += _table(["benchmark", "n", "score A", "score B", "delta", "same text", "mean 1st div",
                         "tok/s B/A"], rows)
        overall = report["overall"]
        lines.append(f"macro score A {overall['macro_score_percent_a']:.2f}  B {overall['macro_score_percent_b']:.2f}  "
                     f"delta {overall['macro_score_delta_points']:+.2f}")
        if report["flips"]:
            lines.append("flips (A -> B):")
            for f in report["flips"]:
                arrow = "correct -> incorrect" if f["correct_a"] else "incorrect -> correct"
                lines.append(f"  {f['benchmark']} {f['id']!r}: {arrow} (first divergence {_fmt(f['first_divergence'])})")
    lines.append("")
    for check in report["checks"]:
        if not check["passed"]:
            lines.append(f"FAIL {_check_label(check)}")
    lines.append("PASS" if report["passed"] else "FAIL")
    return "\n".join(lines)
