"""Code tasks: MBPP as ``python_tests``, HumanEval, HumanEval+ and MBPP+ as ``evalplus``.

* MBPP: the test program is the setup code (``test_setup_code``, or the sanitized layout's
  ``test_imports``) followed by the ``test_list`` asserts; ``timeout_seconds`` is the guide's
  default, 10.
* HumanEval: one suite, the official base inputs. HumanEval+ and MBPP+: the base suite and the
  extended (``plus_input``) suite. The expected outputs and ``reference_seconds`` are measured
  later by running ``prompt + canonical_solution`` (exactly what evalplus's own ground truth runs)
  in the scorer's code sandbox (:mod:`alodlm_scoring.groundtruth`); here each suite becomes a job.
* MBPP+ inputs are decoded with evalplus's ``mbpp_deserialize_inputs`` (as evalplus's
  ``get_mbpp_plus`` does), and the tasks in evalplus's ``MBPP_OUTPUT_NOT_NONE_TASKS`` record
  ``out is not None`` as their expected output, evalplus's convention for those special oracles.
* HumanEval rows carry the dataset's prompt (signature and docstring) as ``function_prefix``, so a
  response that gives only the function body is scored under that signature.
"""

from __future__ import annotations

from typing import Any

from alodlm_scoring.groundtruth import Job

from .items import BuildContext, EvalPlusTask, Item, ItemError

__all__ = ["mbpp_items", "humaneval_items", "humaneval_plus_items", "mbpp_plus_items",
           "MBPP_TIMEOUT_SECONDS"]

MBPP_TIMEOUT_SECONDS = 10


def mbpp_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """MBPP, full layout (``text``, ``test_setup_code``) or sanitized (``prompt``, ``test_imports``)."""
    items = []
    for row in rows:
        if layout == 0:
            text, setup = row["text"], str(row["test_setup_code"] or "")
        else:
            text, setup = row["prompt"], "\n".join(row["test_imports"] or [])
        tests = [str(test) for test in row["test_list"]]
        if not tests:
            raise ItemError(f"id {row['task_id']!r}: test_list is empty")
        program = "\n".join([setup.strip()] + tests if setup.strip() else tests)
        items.append(Item(
            id=row["task_id"],
            context={"text": str(text).strip(), "tests": tests},
            fields={"tests": program, "timeout_seconds": MBPP_TIMEOUT_SECONDS}))
    return items


def _inputs(row: dict, column: str) -> list:
    value = row[column]
    if not isinstance(value, list) or not all(isinstance(args, (list, tuple)) for args in value):
        raise ItemError(f"id {row['task_id']!r}: {column} is not a list of argument lists")
    return [list(args) for args in value]


def _evalplus_item(row: dict, dataset: str, columns: tuple[str, ...], output_not_none: bool,
                   inputs_of, fields: dict[str, Any]) -> Item:
    task_id = row["task_id"]
    program = row["prompt"] + row["canonical_solution"]
    jobs = []
    for column in columns:
        inputs = inputs_of(row, column)
        if not inputs:
            if column == "base_input":
                raise ItemError(f"id {task_id!r}: base_input is empty")
            continue  # an empty extended suite adds no test
        jobs.append(Job(task_id=f"{task_id} ({column})", program=program,
                        entry_point=row["entry_point"], inputs=inputs,
                        output_not_none=output_not_none))
    try:
        atol = float(row["atol"] or 0.0)
    except (TypeError, ValueError):
        raise ItemError(f"id {task_id!r}: atol {row['atol']!r} is not a number") from None
    return Item(id=task_id, context={"prompt": row["prompt"], "entry_point": row["entry_point"]},
                fields=fields,
                evalplus=EvalPlusTask(dataset, row["entry_point"], atol, tuple(jobs)))


def _humaneval(rows: list[dict], columns: tuple[str, ...]) -> list[Item]:
    return [_evalplus_item(row, "humaneval", columns, False, _inputs,
                           {"function_prefix": row["prompt"].rstrip()}) for row in rows]


def humaneval_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """HumanEval: the HumanEvalPlus release rows, base inputs only."""
    return _humaneval(rows, ("base_input",))


def humaneval_plus_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """HumanEval+: base and extended inputs."""
    return _humaneval(rows, ("base_input", "plus_input"))


def mbpp_plus_items(rows: list[dict], layout: int, context: BuildContext) -> list[Item]:
    """MBPP+: base and extended inputs, decoded as evalplus decodes them."""
    from evalplus.data.mbpp import mbpp_deserialize_inputs
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS

    def inputs_of(row: dict, column: str) -> list:
        return _inputs({**row, column: mbpp_deserialize_inputs(row["task_id"], row[column])},
                       column)

    return [_evalplus_item(row, "mbpp", ("base_input", "plus_input"),
                           row["entry_point"] in MBPP_OUTPUT_NOT_NONE_TASKS, inputs_of, {})
            for row in rows]
