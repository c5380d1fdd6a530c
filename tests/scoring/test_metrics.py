"""Non-code scoring through the dispatcher: SCORING.md §10.1 rows 1-11, §11.1, §11.2, §2.3, §3.

The tables were computed with the pinned libraries (math-verify 0.8.0, latex2sympy2_extended
1.10.2, sympy 1.14.0); every row asserts the verdict and the extracted string (decision D1).
"""

from __future__ import annotations

import threading

import pytest

from alodlm_scoring import extract
from alodlm_scoring.metrics import (
    CODE_METRICS,
    METRICS,
    math_correct,
    math_verify_equal,
    normalized_equal,
    score,
)


def test_metric_names():
    assert METRICS == ("arc", "mmlu", "mmlu_pro", "gpqa", "math", "exact", "python_tests", "evalplus")
    assert CODE_METRICS == ("python_tests", "evalplus")


# §10.1 rows 1-11: (metric, answer, generation, correct, extracted)
REFERENCE_TESTS = [
    ("arc", "C", "Based on the calculation, the answer is (C).", True, "C"),
    ("arc", "B", "Based on the calculation, the answer is (C).", False, "C"),
    ("mmlu", "D", "<think>The answer is A</think>The answer is (D).", True, "D"),
    ("gpqa", "C", "<think>B</think>#### C", True, "C"),
    ("gpqa", "D", "No option selected.", False, ""),
    ("mmlu_pro", "J", "The answer is **(J)**.", True, "J"),
    ("mmlu_pro", "F", "ANSWER: F", True, "F"),
    ("math", "0.5", "<think>3</think>\\boxed{\\frac{1}{2}}", True, "\\frac{1}{2}"),
    ("math", "#### 1024", "\\boxed{1,024}", True, "1,024"),
    ("math", "42", "\\boxed{41}", False, "41"),
    ("math", "0", "No result.", False, ""),
]


@pytest.mark.parametrize("metric, answer, generation, correct, extracted", REFERENCE_TESTS)
def test_reference_scoring_tests(metric, answer, generation, correct, extracted):
    assert score({"metric": metric, "answer": answer}, generation) == (correct, extracted)


# §11.1: (generation, reference, prediction, math-verify, normalizer, correct); None = not recorded.
MATH_CASES = [
    ("The answer is 42.", "42", "42.", True, False, True),
    ("\\boxed{1,024}", "1024", "1,024", True, True, True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", "\\dfrac{1}{2}", True, False, True),
    ("\\boxed{}", "0", "", None, None, False),
    ("\\boxed{} so 7", "7", "7", True, True, True),
    ("\\boxed{5}", "The result is \\boxed{5}", "5", True, True, True),
    ("\\boxed{1000}", "#### 1,000", "1000", True, True, True),
    ("\\boxed{50\\%}", "50", "50\\%", False, True, True),
    ("\\boxed{(1,2)}", "(1, 2)", "(1,2)", True, True, True),
    ("\\fbox{5}", "5", "5", True, True, True),
    ("\\boxed{3.14159}", "3.1416", "3.14159", False, False, False),
    ("\\boxed{3.1415926}", "3.1415927", "3.1415926", True, False, True),
    ("\\boxed{\\text{(B)}}", "B", "\\text{(B)}", True, False, True),
    ("\\boxed 5", "5", "5", True, True, True),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", "x^2+2x+1", True, False, True),
    ("\\boxed{10^\\circ}", "10", "10^\\circ", True, True, True),
    ("\\boxed{x=5}", "5", "x=5", True, False, True),
    ("\\boxed{5}", "x=5", "5", True, False, True),
    ("1.5e3", "1500", "3", False, False, False),
    ("<think>\\boxed{9}</think>no box here 4", "4", "4", True, True, True),
    ("\\boxed{0.333333}", "\\frac{1}{3}", "0.333333", True, False, True),
    ("\\boxed{\\pi}", "3.14159265", "\\pi", True, False, True),
    ("\\boxed{2}", "\\boxed{2} \\boxed{3}", "2", False, False, False),
    ("\\boxed{-3}", "\u22123", "-3", True, False, True),
    ("Total 1,234,567 apples", "1234567", "1234567", True, True, True),
    ("\\boxed{\\frac{1}{2}", "0.5", "2", False, False, False),
    ("\\boxed{{5}}", "5", "{5}", True, True, True),
    ("\\boxed{5 \\text{ cm}}", "5", "5 \\text{ cm}", True, False, True),
    ("\\boxed{12}", "012", "12", True, False, True),
    ("so #### 72", "72", "72", None, None, True),
    ("<think> 5 ... 7", "5", "7", None, None, False),
    ("None", None, "", None, None, False),  # answer null -> the text "None"
]


@pytest.mark.parametrize("generation, answer, prediction, mv, norm, correct", MATH_CASES)
def test_math_regression_cases(generation, answer, prediction, mv, norm, correct):
    assert score({"metric": "math", "answer": answer}, generation) == (correct, prediction)
    gold = extract.extract_math_gold(str(answer).strip())
    if mv is not None:
        assert math_verify_equal(gold, prediction) is mv
    if norm is not None:
        assert normalized_equal(gold, prediction) is norm


def test_math_golds_in_the_table():
    assert extract.extract_math_gold("The result is \\boxed{5}") == "5"
    assert extract.extract_math_gold("#### 1,000") == "1000"
    assert extract.extract_math_gold("\\boxed{2} \\boxed{3}") == "3"


def test_math_empty_side_is_incorrect_without_comparison():
    assert math_correct("0", "") is False
    assert math_correct("", "0") is False
    assert math_correct("0", "0") is True


def test_math_scoring_refuses_to_run_off_the_main_thread():
    errors = []

    def work():
        try:
            score({"metric": "math", "answer": "0.5"}, "\\boxed{\\frac{1}{2}}")
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors and "main thread" in errors[0]


def test_math_verify_is_asymmetric_gold_first():
    # Gold "x=5" against prediction "5" is accepted, as in §11.1; the call order is part of D1.
    assert math_verify_equal("x=5", "5") is True


# §11.2: (metric, answer, options, generation, extracted)
MULTIPLE_CHOICE_CASES = [
    ("arc", "A", None, "B", "B"),
    ("arc", "A", None, "(b)", "B"),
    ("arc", "A", None, "  c.  ", "C"),
    ("arc", "A", None, "E", ""),
    ("arc", "A", ["A", "B", "C", "D", "E"], "E", "E"),
    ("arc", "A", None, "The answer is Because of x", "B"),
    ("arc", "A", None, "The analysis Below shows D", "B"),
    ("arc", "A", None, "I think it's B, not C", "C"),
    ("arc", "A", None, "Answer: A. Actually the answer is D", "D"),
    ("arc", "A", None, "answer is e", ""),
    ("arc", "A", None, "A) is correct since B fails", "A"),
    ("arc", "A", None, "<think>the answer is A</think> so B", "A"),
    ("mmlu", "A", None, "Answer: **B**", "B"),
    ("mmlu", "A", None, "The answer is: C", "C"),
    ("mmlu", "A", None, "The answer is a", ""),
    ("mmlu", "A", None, "\\boxed{C} ok", "C"),
    ("mmlu", "A", None, "<think>Answer: C</think> I pick (B) over D", "C"),
    ("mmlu", "A", None, "<think>(C)</think> none", "C"),
    ("mmlu", "A", None, "The answer is E", ""),
    ("mmlu", "A", None, "Answerable: D", "D"),
    ("gpqa", "A", None, "#### (B) and \\boxed{C}", "B"),
    ("gpqa", "A", None, "ANSWER is D", "D"),
    ("mmlu_pro", "A", None, "Answer: because it is (C)", "b"),
    ("mmlu_pro", "A", None, "Answer: The answer is (C)", "C"),
    ("mmlu_pro", "A", None, "The answer is: **H**", "H"),
    ("mmlu_pro", "A", None, "answer is (k)", "k"),
    ("mmlu_pro", "A", None, "we think about it and then I choose G", "G"),
    ("mmlu_pro", "A", None, "I choose G and then we think about it for a while", ""),
    ("mmlu_pro", "A", None, "<think>Answer: A</think> ANSWER: B", "A"),
]


@pytest.mark.parametrize("metric, answer, options, generation, extracted", MULTIPLE_CHOICE_CASES)
def test_multiple_choice_regression_cases(metric, answer, options, generation, extracted):
    record = {"metric": metric, "answer": answer}
    if options is not None:
        record["available_options"] = options
    assert score(record, generation) == (extracted.upper() == answer, extracted)


def test_mmlu_pro_last_30_characters_boundary():
    # "G" is the 30th character from the end in the first case and the 31st in the second.
    inside = "I choose G " + "y" * 28
    outside = "I choose G " + "y" * 29
    assert len(inside) - inside.index("G") == 30
    assert score({"metric": "mmlu_pro", "answer": "G"}, inside + "  ") == (True, "G")
    assert score({"metric": "mmlu_pro", "answer": "G"}, outside) == (False, "")


def test_lowercase_gold_is_compared_uppercased():
    assert score({"metric": "mmlu", "answer": "c"}, "The answer is C") == (True, "C")
    assert score({"metric": "mmlu_pro", "answer": "B"}, "Answer: because") == (True, "b")


@pytest.mark.parametrize(
    "record",
    [
        {"metric": "arc", "answer": "a", "available_options": ["a", "b"]},
        {"metric": "mmlu_pro", "answer": "K"},
        {"metric": "mmlu", "answer": "E"},
        {"metric": "gpqa", "answer": "AB"},
    ],
)
def test_gold_outside_the_displayed_labels(record):
    with pytest.raises(ValueError, match="Gold answer is outside the displayed option labels"):
        score(record, "any")


def test_exact_metric():
    assert score({"metric": "exact", "answer": "  x "}, " x\n") == (True, "x")
    assert score({"metric": "exact", "answer": "x"}, "X") == (False, "X")
    assert score({"metric": "exact", "answer": 5}, "5") == (True, "5")


def test_unsupported_metric_at_scoring_time():
    with pytest.raises(ValueError, match="Unsupported evaluation metric"):
        score({"metric": "foo", "answer": "x"}, "x")


def test_metric_is_required():
    with pytest.raises(KeyError):
        score({"answer": "x"}, "x")


@pytest.mark.parametrize("answer", ["", "   ", "MISSING"])
@pytest.mark.parametrize("metric", ["arc", "mmlu", "mmlu_pro", "gpqa", "math", "exact"])
def test_reference_is_required_for_non_code_metrics(metric, answer):
    record = {"metric": metric} if answer == "MISSING" else {"metric": metric, "answer": answer}
    with pytest.raises(ValueError, match="An evaluation reference is required"):
        score(record, "A")


def test_numeric_and_null_answers_are_stringified():
    assert score({"metric": "math", "answer": 0}, "\\boxed{0}") == (True, "0")
    assert score({"metric": "exact", "answer": None}, "None") == (True, "None")
