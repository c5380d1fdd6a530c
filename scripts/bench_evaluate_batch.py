"""The evaluate command with continuous batching against one task at a time, on the same suite.

    python scripts/bench_evaluate_batch.py                       # builtin:tiny, 32 tasks, batch 8
    python scripts/bench_evaluate_batch.py --model DIR --tasks 64 --batch 16 --max_new_tokens 64

The suite is the bundled sample suite's non-code tasks (multiple choice and math), repeated with
fresh ids up to ``--tasks`` rows. Each run is ``alodlm-jax-evaluate`` in a fresh process (batch 1
and batch N alternating, ``--repeats`` times); the script prints the suite's tokens/s from each
``summary.json`` (total tokens over the tasks' summed ``wall_seconds``), the command's own wall
time, and whether the prediction rows agree apart from timing (text, tokens, exit depths, counters
and verdicts; first-pass hazards within 1e-6).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

TIMING = ("wall_seconds", "prefill_seconds", "tokens_per_second", "first_pass_halt_probabilities")


def build_suite(path: pathlib.Path, tasks: int) -> None:
    from alodlm_jax.data import resolve_builtin

    rows = [json.loads(line) for line in pathlib.Path(resolve_builtin("builtin:sample")).read_text()
            .splitlines() if line.strip()]
    rows = [r for r in rows if r["metric"] not in ("python_tests", "evalplus")]
    out = []
    for i in range(tasks):
        row = dict(rows[i % len(rows)])
        row["id"] = f"{row['id']}-{i}"
        out.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in out))


def run(args, suite: pathlib.Path, out: pathlib.Path, batch: int) -> dict:
    command = [sys.executable, "-m", "alodlm_jax.cli.evaluate", "--model", args.model,
               "--input", str(suite), "--output", str(out), "--device", "cpu", "--precision",
               "fp32", "--q", "0.5", "--tau", "0.4", "--window_size", str(args.window_size),
               "--max_new_tokens", str(args.max_new_tokens), "--batch_size", str(batch)]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"evaluate --batch_size {batch} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return {"batch": batch, "tokens_per_second": summary["suite_tokens_per_second"],
            "tokens": sum(r["generated_tokens"] for r in rows), "command_seconds": wall,
            "generation_seconds": sum(r["wall_seconds"] for r in rows), "rows": rows}


def same_rows(a: list[dict], b: list[dict]) -> bool:
    for x, y in zip(a, b, strict=True):
        if {k: v for k, v in x.items() if k not in TIMING} != \
                {k: v for k, v in y.items() if k not in TIMING}:
            return False
        hx, hy = x.get("first_pass_halt_probabilities"), y.get("first_pass_halt_probabilities")
        if (hx is None) != (hy is None) or (hx and any(abs(p - q) > 1e-6 for p, q in zip(hx, hy))):
            return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--window_size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        suite = tmp / "suite.jsonl"
        build_suite(suite, args.tasks)
        best: dict[int, dict] = {}
        for r in range(args.repeats):
            for batch in (1, args.batch):
                result = run(args, suite, tmp / f"out-{batch}-{r}", batch)
                if batch not in best or result["tokens_per_second"] > best[batch]["tokens_per_second"]:
                    best[batch] = result
        one, many = best[1], best[args.batch]
        for res in (one, many):
            print(f"batch {res['batch']:>3}: suite {res['tokens_per_second']:9.1f} tok/s "
                  f"({res['tokens']} tokens, generation {res['generation_seconds']:.2f} s), "
                  f"command {res['command_seconds']:.1f} s")
        print(f"batch {args.batch} / batch 1: {many['tokens_per_second'] / one['tokens_per_second']:.2f}x "
              f"suite tokens/s; rows identical apart from timing: {same_rows(one['rows'], many['rows'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
