#!/usr/bin/env python
"""Benchmark rescoring throughput per metric family, serially and with the worker pool.

Generates a synthetic suite (at ``--scale 1``: 10,000 multiple-choice, 2,000 math and 200 code
tasks; the code tasks mix python_tests and evalplus programs that pass, fail and time out), rescores
each family through the real evaluation flow (``alodlm_scoring.evaluation.rescore``: load, validate,
score, write rows, summary) with ``--workers 1`` and with the pool, checks that both runs write
byte-identical files, and times the naive scheme for code — one fresh interpreter per code task, as
the reference does, without a sandbox — as the baseline. Code is also rescored with the pool and
the code sandbox off (``--code_sandbox=off``) and under the strict rules, alternating with the
sandboxed runs (``--repeats`` times, best of each) so that a drift of a shared machine affects
both alike: the sandbox's cost is the ratio of the two pool rates. The python_tests tasks alone are
then rescored under the reference's and the strict rules, alternating, best of each: strict
python_tests run the program and its tests in two processes (``alodlm_scoring.sandbox.calls``),
and their cost is the ratio of the two times (goal: at most 1.5x). ``--families`` picks the parts
to run (``python_tests`` alone takes seconds).

    python scripts/bench_scoring.py --scale 0.1
    python scripts/bench_scoring.py --families python_tests --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from alodlm_scoring import evaluation

MC_METRICS = ("arc", "mmlu", "mmlu_pro", "gpqa")
LETTERS = "ABCD"
FILLER = ("Let us reason about each option carefully, comparing the definitions and checking "
          "the units before choosing. ")


def _mc_pairs(count: int, rng: random.Random):
    pairs = []
    for i in range(count):
        metric = MC_METRICS[i % len(MC_METRICS)]
        gold = rng.choice(LETTERS)
        guess = gold if rng.random() < 0.6 else rng.choice(LETTERS)
        style = i % 5
        text = {
            0: f"The answer is ({guess}).",
            1: f"<think>{FILLER * 3}Maybe {rng.choice(LETTERS)}.</think>{FILLER}Answer: {guess}",
            2: f"{FILLER * 2}So the correct choice is {guess}.",
            3: f"ANSWER: {guess}",
            4: f"{FILLER}\\boxed{{{guess}}}",
        }[style]
        task = {"benchmark": f"mc_{metric}", "id": i, "metric": metric, "prompt": "Q?",
                "answer": gold}
        pairs.append((task, text))
    return pairs


def _math_pairs(count: int, rng: random.Random):
    pairs = []
    for i in range(count):
        a, b = rng.randint(1, 999), rng.randint(2, 99)
        kind = i % 4
        if kind == 0:
            gold, text = f"#### {a * b:,}", f"{FILLER}so the total is \\boxed{{{a * b}}}."
        elif kind == 1:
            gold, text = f"\\frac{{{a}}}{{{b}}}", f"\\boxed{{\\dfrac{{{a}}}{{{b + (i % 3 == 0)}}}}}"
        elif kind == 2:
            gold, text = str(a), f"{FILLER}The answer is {a + (i % 5 == 0)}."
        else:
            gold, text = f"{a}x+{b}", f"<think>{FILLER}</think>\\boxed{{{b}+{a}x}}"
        task = {"benchmark": "math", "id": i, "metric": "math", "prompt": "Q?", "answer": gold}
        pairs.append((task, text))
    return pairs


def _code_pairs(count: int, rng: random.Random):
    """Half python_tests, half evalplus; ~45 % pass, ~50 % fail, ~5 % time out."""
    pairs = []
    for i in range(count):
        roll = rng.random()
        outcome = "pass" if roll < 0.45 else ("fail" if roll < 0.95 else "timeout")
        body = {"pass": "return x * 2", "fail": "return x * 3",
                "timeout": "while True:\n        pass"}[outcome]
        program = f"```python\ndef double(x):\n    {body}\n```"
        if i % 2 == 0:
            task = {"benchmark": "mbpp", "id": i, "metric": "python_tests", "prompt": "double",
                    "tests": "assert double(2) == 4\nassert double(5) == 10",
                    "timeout_seconds": 1}
        else:
            inputs = [[n] for n in range(3)]  # a timing-out program costs ~1 s per input
            task = {"benchmark": "humaneval", "id": i, "metric": "evalplus", "prompt": "double",
                    "code_tests": {"dataset": "humaneval", "entry_point": "double", "atol": 0,
                                   "suites": [{"inputs": inputs,
                                               "expected": [2 * n for n in range(3)],
                                               "reference_seconds": [0.0001] * 3}]}}
        pairs.append((task, program))
    return pairs


def _write_suite(directory: str, name: str, pairs):
    tasks_path = os.path.join(directory, f"{name}_tasks.jsonl")
    predictions_path = os.path.join(directory, f"{name}_predictions.jsonl")
    with open(tasks_path, "w") as tasks, open(predictions_path, "w") as predictions:
        for i, (task, text) in enumerate(pairs):
            tasks.write(json.dumps(task) + "\n")
            predictions.write(json.dumps({"benchmark": task["benchmark"], "id": task["id"],
                                          "text": text, "generated_tokens": 10 + i % 7,
                                          "wall_seconds": 0.25}) + "\n")
    return tasks_path, predictions_path


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _rescore(directory: str, name: str, paths, workers: int, *, code_sandbox: str = "on",
             code_verdicts: str = "reference", tag: str = "") -> tuple[float, bytes, bytes, float]:
    """Wall seconds, the two output files, and an idle-machine estimate in seconds.

    The estimate, for a shared (loaded) machine: the CPU time this run used, spread over the
    cores it could use — max(main-process CPU, total CPU / min(workers + 1, cores)).
    """
    output = os.path.join(directory, f"{name}_out_{workers}{tag}")
    own_before, children_before = _cpu_seconds()
    started = time.perf_counter()
    evaluation.rescore(paths[0], paths[1], output, workers=workers, code_sandbox=code_sandbox,
                       code_verdicts=code_verdicts)
    elapsed = time.perf_counter() - started
    own_after, children_after = _cpu_seconds()
    own, children = own_after - own_before, children_after - children_before
    lanes = min(workers + 1, os.cpu_count() or 1)
    estimate = max(own, (own + children) / lanes)
    with open(os.path.join(output, "predictions.jsonl"), "rb") as rows, \
            open(os.path.join(output, "summary.json"), "rb") as summary:
        return elapsed, rows.read(), summary.read(), estimate


def _naive_code(pairs) -> tuple[float, list]:
    """The reference's scheme: one fresh interpreter per code task, run one after another."""
    verdicts = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for task, text in pairs:
            request = json.dumps({"nonce": "n", "record": task, "generation": text}) + "\n"
            completed = subprocess.run(
                [sys.executable, "-m", "alodlm_scoring.worker", "--sandbox", "off"],
                input=request.encode(), capture_output=True, cwd=scratch, timeout=600,
            )
            lines = completed.stdout.decode().splitlines()
            verdicts.append(json.loads(lines[-1])["verdict"][0] if len(lines) > 1 else None)
    return time.perf_counter() - started, verdicts


def _python_tests_rules(directory: str, code_pairs, args) -> dict:
    """The python_tests tasks under the reference's and the strict rules, alternating."""
    pairs = [pair for pair in code_pairs if pair[0]["metric"] == "python_tests"]
    paths = _write_suite(directory, "python_tests", pairs)
    best, files = {}, {}
    for repeat in range(args.repeats):
        for rules in ("reference", "strict"):
            run = _rescore(directory, "python_tests", paths, args.workers, code_verdicts=rules,
                           tag=f"_{rules}_{repeat}")
            best[rules] = min(best.get(rules, run[0]), run[0])
            files[rules] = run[1]
    ratio = best["strict"] / best["reference"]
    same = files["reference"] == files["strict"]
    for rules, seconds in best.items():
        print(f"{'python_tests ' + rules:24s} {len(pairs):6d} tasks  pool({args.workers}) "
              f"{len(pairs) / seconds:8.2f}/s (best of {args.repeats})", flush=True)
    print(f"strict python_tests take {ratio:.2f}x the reference rules' time "
          f"(goal <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'}); "
          f"same predictions.jsonl: {same}", flush=True)
    return {"tasks": len(pairs), "reference_seconds": best["reference"],
            "strict_seconds": best["strict"], "strict_over_reference": ratio,
            "same_files": same}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the suite sizes (10,000 / 2,000 / 200) by this")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="pool size for the pooled runs (default: CPU count)")
    parser.add_argument("--baseline-tasks", type=int, default=None,
                        help="time the naive baseline on only the first N code tasks")
    parser.add_argument("--repeats", type=int, default=2,
                        help="pooled code runs per sandbox setting (alternating; best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", default="multiple_choice,math,code,python_tests",
                        help="comma list of the parts to run (default: all)")
    args = parser.parse_args()
    wanted = set(args.families.split(","))
    unknown = wanted - {"multiple_choice", "math", "code", "python_tests"}
    if unknown:
        parser.error(f"--families: unknown part(s) {', '.join(sorted(unknown))}")
    if args.repeats < 1 or args.workers < 1:
        parser.error("--repeats and --workers must be at least 1")
    rng = random.Random(args.seed)
    sizes = {"multiple_choice": max(1, round(10000 * args.scale)),
             "math": max(1, round(2000 * args.scale)),
             "code": max(2, round(200 * args.scale))}
    families = {"multiple_choice": _mc_pairs(sizes["multiple_choice"], rng),
                "math": _math_pairs(sizes["math"], rng),
                "code": _code_pairs(sizes["code"], rng)}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, pool workers {args.workers}, "
          f"load average {os.getloadavg()[0]:.1f}")
    from alodlm_scoring.metrics import score

    for name in ("multiple_choice", "math"):  # warm up: imports (math-verify, sympy) untimed
        task, text = families[name][0]
        score(task, text)
    results = {}
    with tempfile.TemporaryDirectory(prefix="alodlm-bench-") as directory:
        if "python_tests" in wanted:
            results["python_tests_rules"] = _python_tests_rules(directory, families["code"], args)
        for name, pairs in families.items():
            if name not in wanted:
                continue
            paths = _write_suite(directory, name, pairs)
            serial = _rescore(directory, name, paths, 1)
            pooled = _rescore(directory, name, paths, args.workers)
            identical = serial[1:3] == pooled[1:3]
            results[name] = {"tasks": len(pairs),
                             "serial_tasks_per_s": len(pairs) / serial[0],
                             "pool_tasks_per_s": len(pairs) / pooled[0],
                             "identical_files": identical,
                             "cpu_estimate_serial_tasks_per_s": len(pairs) / serial[3],
                             "cpu_estimate_pool_tasks_per_s": len(pairs) / pooled[3]}
            # CPU-time estimates mean nothing for code (time limits are wall-clock waits).
            estimate = "" if name == "code" else (
                f"  [idle-machine estimate from CPU time: serial {len(pairs) / serial[3]:.1f}/s, "
                f"pool {len(pairs) / pooled[3]:.1f}/s]")
            print(f"{name:16s} {len(pairs):6d} tasks  serial {len(pairs) / serial[0]:10.1f}/s  "
                  f"pool({args.workers}) {len(pairs) / pooled[0]:10.1f}/s  "
                  f"byte-identical: {identical}{estimate}", flush=True)
            if name == "code":
                rows = [json.loads(line) for line in pooled[1].decode().splitlines()]
                pooled_verdicts = [row["correct"] for row in rows]
        if "code" not in wanted:
            print(json.dumps(results))
            return 0
        paths = _write_suite(directory, "code", families["code"])
        settings = {"sandbox on": ("on", "reference"), "sandbox off": ("off", "reference"),
                    "sandbox on, strict": ("on", "strict")}
        best = {label: None for label in settings}
        files = {}
        for repeat in range(args.repeats):
            for label, (mode, rules) in settings.items():
                run = _rescore(directory, "code", paths, args.workers, code_sandbox=mode,
                               code_verdicts=rules, tag=f"_{mode}_{rules}_{repeat}")
                best[label] = run[0] if best[label] is None else min(best[label], run[0])
                files[label] = run[1]
        tasks = len(families["code"])
        for label, seconds in best.items():
            results[f"code {label}"] = {"tasks": tasks, "pool_tasks_per_s": tasks / seconds}
            print(f"{'code ' + label:24s} {tasks:6d} tasks  pool({args.workers}) "
                  f"{tasks / seconds:8.2f}/s (best of {args.repeats})", flush=True)
        cost = 1 - best["sandbox off"] / best["sandbox on"]
        same = len({files[label] for label in settings}) == 1
        results["code_sandbox_cost"] = {"fraction_of_pool_rate": cost, "same_files": same}
        print(f"code sandbox cost: {100 * cost:.1f} % of the pool's rate; "
              f"on / off / strict files byte-identical: {same}")
        code = families["code"][: args.baseline_tasks]
        naive_seconds, naive_verdicts = _naive_code(code)
        naive_rate = len(code) / naive_seconds
        same = naive_verdicts == pooled_verdicts[: len(code)]
        results["code_naive"] = {"tasks": len(code), "tasks_per_s": naive_rate,
                                 "same_verdicts": same}
        print(f"{'code (naive)':16s} {len(code):6d} tasks  one interpreter per task "
              f"{naive_rate:8.1f}/s  same verdicts: {same}")
        speedup = results["code"]["pool_tasks_per_s"] / naive_rate
        print(f"code pool / naive speed-up: {speedup:.2f}x")
    if not {"multiple_choice", "math"} <= wanted:
        print(json.dumps(results))
        return 0
    mc, math_ = results["multiple_choice"], results["math"]
    goals = {
        "multiple_choice >= 20000/s (wall)": mc["pool_tasks_per_s"] >= 20000,
        "multiple_choice >= 20000/s (idle estimate)": mc["cpu_estimate_pool_tasks_per_s"] >= 20000,
        "math >= 250/s with the pool (wall)": math_["pool_tasks_per_s"] >= 250,
        "math >= 250/s with the pool (idle estimate)": math_["cpu_estimate_pool_tasks_per_s"] >= 250,
        "code >= 2x naive": speedup >= 2,
        "code sandbox costs <= 15 % of the pool's rate": cost <= 0.15,
        "pool == serial files": all(r["identical_files"] for r in results.values()
                                    if "identical_files" in r),
    }
    for goal, met in goals.items():
        print(f"goal {goal}: {'met' if met else 'NOT met'}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
