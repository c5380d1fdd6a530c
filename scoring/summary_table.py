"""The short table an evaluation ends with: per-benchmark scores, the macro score, tokens per
second, the times (generation wall, compile, the command's elapsed time) and where the files are
(the whole record stays in ``summary.json``).

Printed by ``alodlm-jax-evaluate`` on stdout (on stderr when ``--print_summary_json`` puts the
summary's JSON on stdout, as the reference prints it). Markdown pipes, as lm-eval prints its
results. No JAX here.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

COLUMNS = ("benchmark", "examples", "correct", "score %", "tokens/s")


def summary_table(summary: Mapping[str, Any], files: Sequence[str] = (),
                  elapsed_seconds: float | None = None) -> str:
    """The table of a ``summary.json`` object, then the macro line, the suite line (examples,
    tokens per second and the generation wall time they are measured over: the sum of the tasks'
    ``wall_seconds``, compile time excluded), a time line when ``elapsed_seconds`` (the command's
    own run time) is given (with the protocol's ``compile_seconds`` when it has them), a scoring
    failures line when there are any, and one line per file in ``files`` (paths as given)."""
    rows = [COLUMNS]
    for name, values in summary["benchmarks"].items():
        rows.append((str(name), str(values["examples"]), str(values["correct"]),
                     f"{values['score_percent']:.2f}", f"{values['tokens_per_second']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        padded = [cell.ljust(w) if i == 0 else cell.rjust(w)
                  for i, (cell, w) in enumerate(zip(cells, widths))]
        return "|" + "|".join(padded) + "|"

    rule = "|" + "|".join("-" * w if i == 0 else "-" * (w - 1) + ":"
                          for i, w in enumerate(widths)) + "|"
    lines = [line(rows[0]), rule, *(line(row) for row in rows[1:]), ""]
    lines.append(f"macro score: {summary['macro_score_percent']:.2f} % "
                 f"(unweighted mean of {summary['benchmark_count']} benchmark(s))")
    examples = sum(values["examples"] for values in summary["benchmarks"].values())
    protocol = summary.get("protocol") or {}
    supplied = protocol.get("decoder") == "supplied-predictions"
    whose = "the predictions'" if supplied else "the tasks'"
    lines.append(f"suite: {examples} example(s), {summary['suite_tokens_per_second']:.1f} tokens/s "
                 f"over a generation wall time of {summary['suite_wall_seconds']:.3f} s "
                 f"({whose} wall_seconds summed)")
    subset = protocol.get("subset")
    if subset:
        lines.append(f"subset: the first {subset['limit_per_benchmark']} task(s) of each benchmark,"
                     f" {subset['tasks']} of the file's {subset['tasks_in_file']} (--limit); "
                     "not a full evaluation")
    if elapsed_seconds is not None:
        compile_seconds = protocol.get("compile_seconds")
        compiled = ("" if compile_seconds is None
                    else f", {float(compile_seconds):.1f} s of it compiling")
        lines.append(f"time: {elapsed_seconds:.1f} s elapsed (the whole command){compiled}")
    failures = protocol.get("scoring_failures") or []
    if failures:
        lines.append(f"{len(failures)} task(s) scored incorrect by a scoring failure "
                     "(protocol.scoring_failures)")
    width = max((len(os.path.basename(path)) for path in files), default=0)
    lines.extend(f"{os.path.basename(path).ljust(width)}  {path}" for path in files)
    return "\n".join(lines) + "\n"
