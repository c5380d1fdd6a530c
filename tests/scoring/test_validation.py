"""The shared task checks (alodlm_scoring.validation): what the reference scores still loads and
scores; the JSON-type rules apply at load time only; load time checks what scoring checks lazily.
(The malformed inputs themselves are tabulated in tests/evaluation/test_malformed_inputs.py.)"""

from __future__ import annotations

import json

import pytest

from alodlm_scoring import validation
from alodlm_scoring.errors import TaskFileError
from alodlm_scoring.metrics import score
from alodlm_scoring.tasks import load_tasks

SUITE = {"inputs": [[1]], "expected": [1], "reference_seconds": [0.001]}


def _evalplus(**code_tests):
    base = {"dataset": "humaneval", "entry_point": "f", "suites": [SUITE]}
    base.update(code_tests)
    return {"metric": "evalplus", "prompt": "p", "code_tests": base}


# Records the reference scores (values as it reads them), each of which must load unchanged.
ACCEPTED = {
    "timeout_numeric_string": {"metric": "python_tests", "prompt": "p", "tests": "assert 1",
                               "timeout_seconds": "5"},
    "timeout_float": {"metric": "python_tests", "prompt": "p", "tests": "assert 1",
                      "timeout_seconds": 2.5},
    "timeout_default": {"metric": "python_tests", "prompt": "p", "tests": "assert 1"},
    "function_prefix_null": {"metric": "python_tests", "prompt": "p", "tests": "assert 1",
                             "function_prefix": None},
    "answer_null_exact": {"metric": "exact", "prompt": "p", "answer": None},
    "answer_number": {"metric": "math", "prompt": "p", "answer": 0},
    "answer_boolean": {"metric": "exact", "prompt": "p", "answer": True},
    "lowercase_gold": {"metric": "mmlu", "prompt": "p", "answer": "b"},
    "options_null": {"metric": "arc", "prompt": "p", "answer": "D", "available_options": None},
    "options_empty": {"metric": "mmlu_pro", "prompt": "p", "answer": "J", "available_options": []},
    "prompt_whitespace": {"metric": "exact", "prompt": "  ", "answer": "x"},
    "atol_null": _evalplus(atol=None),
    "atol_numeric_string": _evalplus(atol="1e-6"),
    "time_settings_numeric_strings": _evalplus(min_time_limit="2", time_limit_factor="3"),
    "reference_seconds_numeric_strings": _evalplus(
        suites=[{"inputs": [[1]], "expected": [1], "reference_seconds": ["0.001"]}]),
    "literals_with_tuples_and_sets": _evalplus(
        suites=[{"inputs_literal": "[((1, 2),), ({3},)]", "expected_literal": "[(1, 2), {3}]",
                 "inputs": "ignored: the literal takes precedence", "reference_seconds": [0, 0]}]),
    "find_zero_without_expected": _evalplus(entry_point="find_zero", suites=[
        {"inputs": [[[1, 2]]], "reference_seconds": [0.001]}]),
    "mbpp_dataset": _evalplus(dataset="mbpp"),
    "extra_fields_of_other_metrics": {"metric": "exact", "prompt": "p", "answer": "x",
                                      "tests": 5, "code_tests": [], "available_options": 4},
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_what_the_reference_scores_loads(tmp_path, name):
    record = {"benchmark": "b", "id": name, **ACCEPTED[name]}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert load_tasks(path) == [record]


def test_values_are_read_as_the_reference_reads_them():
    record = ACCEPTED["timeout_numeric_string"]
    assert validation.python_tests_arguments(record) == ("assert 1", 5.0)
    assert validation.python_tests_arguments(ACCEPTED["timeout_default"])[1] == 10.0
    assert validation.reference_answer(ACCEPTED["answer_null_exact"]) == "None"
    assert validation.option_labels(ACCEPTED["options_empty"], "mmlu_pro") == list("ABCDEFGHIJ")
    assert validation.option_labels(ACCEPTED["options_null"], "arc") == ["A", "B", "C", "D"]
    settings = validation.evalplus_settings(ACCEPTED["atol_numeric_string"])
    assert (settings.atol, settings.min_time_limit, settings.time_limit_factor) == (1e-6, 1.0, 4.0)
    literal = ACCEPTED["literals_with_tuples_and_sets"]["code_tests"]["suites"][0]
    assert validation.suite_arguments(literal, False) == ([((1, 2),), ({3},)], [(1, 2), {3}],
                                                          [0.0, 0.0])
    root = validation.evalplus_settings(ACCEPTED["find_zero_without_expected"])
    assert validation.is_root_check(root)
    suite = ACCEPTED["find_zero_without_expected"]["code_tests"]["suites"][0]
    assert validation.suite_arguments(suite, True)[1] == [True]


def test_json_type_rules_apply_at_load_time_only(tmp_path):
    """A string of labels is read by the reference as its characters; ``score`` keeps doing so,
    the task file refuses it (the type §2.1 documents is an array)."""
    record = {"benchmark": "b", "id": 1, "metric": "arc", "prompt": "p", "answer": "B",
              "available_options": "ABC"}
    assert score(record, "B") == (True, "B")
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(TaskFileError, match="field 'available_options': must be an array"):
        load_tasks(path)
    # A wrong type the reference cannot score raises its own error at scoring time.
    with pytest.raises(TypeError):
        score({**record, "available_options": 4}, "B")


def test_load_time_checks_every_suite_scoring_time_stops_at_the_first_failure(tmp_path):
    malformed = {"inputs": [[0]], "expected": [], "reference_seconds": [0.001]}
    record = {"benchmark": "b", "id": 1, **_evalplus(
        entry_point="g", suites=[{"inputs": [[0]], "expected": [1], "reference_seconds": [0.001]},
                                 malformed])}
    assert score(record, "def g(x):\n    return 0") == (False, None)  # the reference's verdict
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    assert (caught.value.line, caught.value.field) == (1, "code_tests.suites[1]")
    assert caught.value.message == "Test inputs, expected outputs, and reference times must align"


@pytest.mark.parametrize("error, text", [
    (KeyError("tests"), "missing required field (KeyError)"),
    (ValueError("Code timeout must be finite and positive"),
     "Code timeout must be finite and positive"),
    (validation.JSONTypeError("must be a string, got number"), "must be a string, got number"),
    (SyntaxError("invalid syntax"), "SyntaxError: invalid syntax"),
])
def test_error_text(error, text):
    assert validation.error_text(error) == text


def test_json_type_names():
    names = [validation.json_type(v) for v in (None, True, 1, 1.5, "s", [], (), {})]
    assert names == ["null", "boolean", "number", "number", "string", "array", "array", "object"]
