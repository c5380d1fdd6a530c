"""Each of the eleven benchmarks prepared from hand-made files in its source's real layout:
the rows validate, the gold answer is the one displayed, the guide's names and metrics are used,
and for code the canonical solution passes while a mutated one fails, under every rule set."""

from __future__ import annotations

import ast
import re

import pytest

from alodlm_prepare.fixtures import ROWS, mutated_program
from alodlm_scoring.tasks import load_tasks

from .helpers import ALL_BENCHMARKS, RULE_SETS, read_rows, score_under

# The evaluation guide's table: benchmark -> metric.
GUIDE_METRICS = {"ARC-C": "arc", "ARC-E": "arc", "MMLU": "mmlu", "MMLU-Pro": "mmlu_pro",
                 "GPQA-Diamond": "gpqa", "GSM8K": "math", "MATH-500": "math",
                 "MBPP": "python_tests", "MBPP+": "evalplus", "HumanEval": "evalplus",
                 "HumanEval+": "evalplus"}
MULTIPLE_CHOICE = ("ARC-C", "ARC-E", "MMLU", "MMLU-Pro", "GPQA-Diamond")
CODE = ("MBPP", "MBPP+", "HumanEval", "HumanEval+")
_OPTION_LINE = re.compile(r"^\((\w)\) (.*)$", re.MULTILINE)


def _rows_of(prepared_suite, benchmark):
    return [row for row in read_rows(prepared_suite) if row["benchmark"] == benchmark]


def _displayed(prompt: str) -> list[tuple[str, str]]:
    return _OPTION_LINE.findall(prompt)


def _correct_text(benchmark: str, source: dict) -> str:
    """The correct option's text, read from the fixture row in the source's own terms."""
    if benchmark in ("ARC-C", "ARC-E"):
        choices = source["choices"]
        return choices["text"][choices["label"].index(source["answerKey"])]
    if benchmark == "MMLU":
        return source["choices"][source["answer"]]
    if benchmark == "MMLU-Pro":
        return source["options"][source["answer_index"]]
    return source["Correct Answer"].strip()


def test_every_row_validates_and_uses_the_guides_names(prepared_suite):
    tasks = load_tasks(prepared_suite)  # what the evaluate command calls
    assert [task["benchmark"] for task in tasks] == [
        name for name in ALL_BENCHMARKS for _ in ROWS[name]]
    for task in tasks:
        assert task["metric"] == GUIDE_METRICS[task["benchmark"]]


@pytest.mark.parametrize("name", MULTIPLE_CHOICE)
def test_multiple_choice_gold_is_the_displayed_correct_option(prepared_suite, name):
    rows = _rows_of(prepared_suite, name)
    assert len(rows) == len(ROWS[name])
    for row, source in zip(rows, ROWS[name]):
        displayed = _displayed(row["prompt"])
        labels = [label for label, _ in displayed]
        assert labels == row["available_options"]
        assert dict(displayed)[row["answer"]] == _correct_text(name, source).strip()
        if name in ("ARC-C", "ARC-E"):  # the data's own labels, numeric ones included
            assert labels == source["choices"]["label"]
        if name == "GPQA-Diamond":  # the recorded permutation is the displayed order
            assert [source[column].strip() for column in row["option_order"]] == [
                text for _, text in displayed]
            assert row["id"] == source["Record ID"]


def test_arc_numeric_labels_are_kept(prepared_suite):
    row = _rows_of(prepared_suite, "ARC-C")[1]
    assert row["available_options"] == ["1", "2", "3", "4"] and row["answer"] == "3"


@pytest.mark.parametrize("name", ("GSM8K", "MATH-500"))
def test_math_rows_carry_the_sources_answer(prepared_suite, name):
    rows = _rows_of(prepared_suite, name)
    for row, source in zip(rows, ROWS[name]):
        question = source.get("question") or source["problem"]
        assert question in row["prompt"]
        assert row["answer"] == source["answer"]
        assert "\\boxed{}" in row["prompt"]
    if name == "MATH-500":
        assert [row["id"] for row in rows] == [source["unique_id"] for source in ROWS[name]]


def _entry_point(program: str) -> str:
    return next(node.name for node in ast.parse(program).body
                if isinstance(node, ast.FunctionDef))


def _canonical_program(benchmark: str, source: dict) -> str:
    if benchmark == "MBPP":
        return source["code"]
    return source["prompt"] + source["canonical_solution"]


def _fenced(program: str) -> str:
    return f"```python\n{program}\n```"


@pytest.mark.parametrize("rule_set", RULE_SETS)
@pytest.mark.parametrize("name", CODE)
def test_canonical_solution_passes_and_a_mutated_one_fails(prepared_suite, name, rule_set):
    rows = _rows_of(prepared_suite, name)
    assert len(rows) == len(ROWS[name])
    for row, source in zip(rows, ROWS[name]):
        program = _canonical_program(name, source)
        entry = source.get("entry_point") or _entry_point(program)
        assert score_under(rule_set, row, _fenced(program)) == (True, None), row["id"]
        wrong = mutated_program(program, entry)
        assert score_under(rule_set, row, _fenced(wrong)) == (False, None), row["id"]


@pytest.mark.parametrize("rule_set", RULE_SETS)
def test_humaneval_body_only_answer_runs_under_its_signature(prepared_suite, rule_set):
    for row, source in zip(_rows_of(prepared_suite, "HumanEval"), ROWS["HumanEval"]):
        assert row["function_prefix"] == source["prompt"].rstrip()
        assert score_under(rule_set, row, source["canonical_solution"]) == (True, None)


def test_evalplus_suites_base_and_extended(prepared_suite):
    for benchmark, suites in (("HumanEval", 1), ("HumanEval+", 2)):
        for row in _rows_of(prepared_suite, benchmark):
            assert len(row["code_tests"]["suites"]) == suites
            assert row["code_tests"]["dataset"] == "humaneval"
    plus = {row["id"]: row for row in _rows_of(prepared_suite, "MBPP+")}
    assert [len(plus[s["task_id"]]["code_tests"]["suites"]) for s in ROWS["MBPP+"]] == [2, 2, 1]
    for row, source in zip(_rows_of(prepared_suite, "HumanEval+"), ROWS["HumanEval+"]):
        assert row["code_tests"]["atol"] == source["atol"]
        base, extended = row["code_tests"]["suites"]
        for suite, column in ((base, "base_input"), (extended, "plus_input")):
            assert len(suite["reference_seconds"]) == len(source[column])
            assert all(seconds >= 0 for seconds in suite["reference_seconds"])


def test_literals_keep_tuples_and_the_not_none_oracle(prepared_suite):
    rows = {(row["benchmark"], row["id"]): row for row in read_rows(prepared_suite)}
    sum_product = rows[("HumanEval", "HumanEval/8")]["code_tests"]["suites"][0]
    assert "inputs" in sum_product  # JSON carries lists of ints exactly
    assert ast.literal_eval(sum_product["expected_literal"]) == [(0, 1), (6, 6)]
    similar = rows[("MBPP+", "Mbpp/2")]["code_tests"]["suites"][0]
    # evalplus's mbpp_deserialize_inputs turns task 2's argument lists into tuples
    assert ast.literal_eval(similar["inputs_literal"])[0] == [(3, 4, 5, 6), (5, 7, 4, 10)]
    assert ast.literal_eval(similar["expected_literal"]) == [(4, 5), (3, 4)]
    check_str = rows[("MBPP+", "Mbpp/737")]["code_tests"]["suites"]
    # canonical returns a match object or None; evalplus records only "is not None"
    assert [suite["expected"] for suite in check_str] == [[True, False], [True, False]]
    root = rows[("HumanEval+", "HumanEval/32")]["code_tests"]["suites"][0]
    assert abs(root["expected"][0] - (-5.0)) < 1e-6  # the canonical root, measured
