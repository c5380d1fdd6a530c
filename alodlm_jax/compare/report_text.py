"""The short human-readable rendering of a comparison report (the JSON file has everything)."""

from __future__ import annotations

from typing import Any

from .tolerances import check_label

__all__ = ["format_report"]


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
            lines.append(f"FAIL {check_label(check)}")
    lines.append("PASS" if report["passed"] else "FAIL")
    return "\n".join(lines)
