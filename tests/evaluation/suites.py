"""Small task/prediction suites shared by the evaluation tests (written to temporary files)."""

from __future__ import annotations

import json
import os
import re

IDENTITY_TESTS = "assert identity(3) == 3"

# What the evaluate command writes on stderr before an error: a line per phase it started (in a
# log as on a terminal) and the tasks' plain progress lines (alodlm_jax.cli.progress).
_PHASE = re.compile(r"(checking|loading|reading|tokenizing|compiling|resuming|still|--batch_size "
                    r"auto:|programs ready|\d+ XLA program|(evaluated|rescored) \d+/\d+) ")


def error_after_phases(err: str, prog: str = "alodlm-jax-evaluate") -> str:
    """The one-line error that ends a failed command's stderr; every line before it must be one
    of the command's phase or progress lines (no traceback, no second error)."""
    *before, last = err.strip("\n").splitlines() or [""]
    assert last.startswith(f"{prog}: error: "), err
    for line in before:
        assert line.startswith(f"{prog}: ") and _PHASE.match(line[len(prog) + 2:]), err
    assert "Traceback" not in err
    return last


def python_task(task_id, tests=IDENTITY_TESTS, benchmark="mbpp", timeout=None, **extra):
    task = {"benchmark": benchmark, "id": task_id, "metric": "python_tests",
            "prompt": "Write identity.", "tests": tests}
    if timeout is not None:
        task["timeout_seconds"] = timeout
    task.update(extra)
    return task


def evalplus_task(task_id, entry="identity", inputs=((3,),), expected=(3,), benchmark="humaneval",
                  atol=0.0):
    return {"benchmark": benchmark, "id": task_id, "metric": "evalplus", "prompt": "def f",
            "code_tests": {"dataset": "humaneval", "entry_point": entry, "atol": atol,
                           "suites": [{"inputs": [list(i) for i in inputs],
                                       "expected": list(expected),
                                       "reference_seconds": [0.001] * len(inputs)}]}}


def mc_task(task_id, answer="B", benchmark="mmlu", metric="mmlu"):
    return {"benchmark": benchmark, "id": task_id, "metric": metric, "prompt": "Q?",
            "answer": answer}


def math_task(task_id, answer="42", benchmark="gsm8k"):
    return {"benchmark": benchmark, "id": task_id, "metric": "math", "prompt": "Q?",
            "answer": answer}


def exact_task(task_id, answer="one .", benchmark="synthetic"):
    return {"benchmark": benchmark, "id": task_id, "metric": "exact",
            "prompt": "user Return value one </s> assistant ", "answer": answer}


def prediction(task, text, tokens=5, seconds=0.25, **extra):
    row = {"benchmark": task["benchmark"], "id": task["id"], "text": text,
           "generated_tokens": tokens, "wall_seconds": seconds}
    row.update(extra)
    return row


def identity_code(value="x"):
    return f"```python\ndef identity(x):\n    return {value}\n```"


def mixed_suite():
    """Tasks of every kind with right and wrong answers (python_tests, evalplus, mc, math)."""
    pairs = []
    for i in range(4):
        task = python_task(f"p{i}")
        pairs.append((task, identity_code("x" if i % 2 == 0 else "0")))
    for i in range(3):
        task = evalplus_task(f"e{i}")
        pairs.append((task, identity_code("x" if i != 1 else "x + 1")))
    for i in range(3):
        task = mc_task(i)
        pairs.append((task, "The answer is (B)." if i else "The answer is (C)."))
    pairs.append((math_task("m0"), "\\boxed{42}"))
    pairs.append((math_task("m1"), "\\boxed{41}"))
    pairs.append((python_task("p9", tests="assert identity(1) == 1", timeout=5),
                  "def identity(x):\n    return x"))
    return pairs


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return os.fspath(path)


def write_suite(directory, pairs, *, seconds=None):
    tasks = [task for task, _ in pairs]
    predictions = [prediction(task, text, tokens=i + 1,
                              seconds=(0.1 * (i + 1)) if seconds is None else seconds)
                   for i, (task, text) in enumerate(pairs)]
    tasks_path = write_jsonl(os.path.join(directory, "tasks.jsonl"), tasks)
    predictions_path = write_jsonl(os.path.join(directory, "predictions.jsonl"), predictions)
    return tasks_path, predictions_path


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()
