"""docs/tasks.md's example lines are what it says they are: a task of each metric that the task
reader accepts, judged correct on the reply it names here; a generate-mode prediction row with
the decoder's keys in their order; a minimal rescoring row that rescores."""

from __future__ import annotations

import json
import pathlib
import re

from alodlm_jax.decode.result import RESULT_KEYS
from alodlm_scoring.metrics import score
from alodlm_scoring.predictions import load_predictions
from alodlm_scoring.tasks import SUPPORTED_METRICS, load_tasks

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "tasks.md"
REPLIES = {  # a right reply to each example task
    "arc": "The answer is (B).", "mmlu": "7 x 8 = 56. Answer: B",
    "mmlu_pro": "The largest is Jupiter. ANSWER: E", "gpqa": "Photons carry it. Answer: C",
    "math": "4 * 3 = 12, so \\boxed{12}.", "exact": "blue",
    "python_tests": "```python\ndef remove_occ(s, ch):\n    i = s.find(ch)\n    s = s[:i] + s[i+1:]\n"
                    "    j = s.rfind(ch)\n    return s[:j] + s[j+1:]\n```",
    "evalplus": "```python\n    return number % 1.0\n```",  # a body under function_prefix
}


def _examples() -> list[dict]:
    return [json.loads(block) for block in
            re.findall(r"^```json\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.M | re.S)]


def test_one_task_of_each_metric_loads_and_scores(tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(example) + "\n" for example in _examples()
                                  if "metric" in example))
    tasks = load_tasks(tasks_file)
    assert sorted(task["metric"] for task in tasks) == sorted(SUPPORTED_METRICS)
    for task in tasks:
        correct, _ = score(task, REPLIES[task["metric"]])
        assert correct, task["metric"]


def test_the_prediction_rows(tmp_path):
    rows = [example for example in _examples() if "metric" not in example]
    full, minimal = rows
    assert tuple(full)[:len(RESULT_KEYS)] == RESULT_KEYS
    assert tuple(full)[len(RESULT_KEYS):] == ("benchmark", "id", "correct", "extracted")
    assert full["generated_tokens"] == len(full["token_ids"]) == len(full["exit_depths"])
    tasks_file, predictions = tmp_path / "tasks.jsonl", tmp_path / "predictions.jsonl"
    math_task = next(example for example in _examples() if example.get("metric") == "math")
    tasks_file.write_text(json.dumps(math_task) + "\n")
    predictions.write_text(json.dumps(minimal) + "\n")
    [row] = load_predictions(predictions, load_tasks(tasks_file))
    assert score(math_task, row["text"]) == (full["correct"], full["extracted"])
