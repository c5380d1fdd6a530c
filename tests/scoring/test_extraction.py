"""Extractor behaviour (SCORING.md §4, §5.1), including the reference quirks kept under D1."""

from __future__ import annotations

import pytest

from alodlm_scoring import extract

ABCD = ["A", "B", "C", "D"]


@pytest.mark.parametrize(
    "text, tail",
    [
        ("no tags", "no tags"),
        ("<think>a</think>b", "b"),
        ("<think>a</think>b</think>c", "c"),
        ("<think> only opening", "<think> only opening"),
        ("</think>", ""),
    ],
)
def test_answer_tail_uses_last_closing_tag(text, tail):
    assert extract.answer_tail(text) == tail


@pytest.mark.parametrize(
    "text, options, expected",
    [
        ("", ABCD, ""),
        ("   ", ABCD, ""),
        ("(b)", ABCD, "B"),
        ("  c.  ", ABCD, "C"),
        ("d!", ABCD, "D"),
        ("( a )", ABCD, "A"),
        ("E", ABCD, ""),
        ("E", ["A", "B", "C", "D", "E"], "E"),
        ("e", ["a", "b", "e"], "E"),  # labels are uppercased for the valid set
        # "answer is: C" is not a step-3 cue ("is" and ":" are alternatives) but fallback 3 gets it.
        ("the answer is: C", ABCD, "C"),
        ("Answer: Because", ABCD, "B"),
        ("B. because", ABCD, "B"),
        ("A and B and C", ABCD, "A"),  # fallback 1: a label at the very start
        ("so A and B and C", ABCD, "C"),
        ("x ANSWER (D) y answer A", ABCD, "A"),
    ],
)
def test_arc_extractor_steps(text, options, expected):
    assert extract.extract_arc(text, options) == expected


def test_arc_ignores_thinking_markers():
    assert extract.extract_arc("<think>the answer is A</think> so B", ABCD) == "A"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", ""),
        ("The answer is (D).", "D"),
        ("<think>The answer is A</think>The answer is (D).", "D"),
        ("<think>The answer is A</think> I pick (D)", "A"),
        ("\\boxed{(B)} and (C)", "B"),
        ("(A) then B", "A"),  # parenthesized letters beat standalone ones in the same scope
        ("<think>(A)</think> B", "B"),  # tail scope comes first
        ("nothing here", ""),
    ],
)
def test_mmlu_extractor(text, expected):
    assert extract.extract_mmlu(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### (B) and \\boxed{C}", "B"),
        ("\\boxed{C} and (B)", "C"),
        ("#### A then #### D", "D"),
        ("<think>B</think>#### C", "C"),
    ],
)
def test_gpqa_extractor(text, expected):
    assert extract.extract_gpqa(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ANSWER: a ... answer: J", "a"),
        ("answer is **(J)** or answer is (B)", "B"),
        ("x" * 40 + " J", "J"),
        ("P", ""),  # the tail fallback only knows A-J
        ("answer is P", "P"),  # cue extraction reaches P
        ("", ""),
    ],
)
def test_mmlu_pro_extractor(text, expected):
    assert extract.extract_mmlu_pro(text) == expected


@pytest.mark.parametrize(
    "generation, expected",
    [
        ("\\boxed{a} then \\boxed{b}", "b"),
        ("\\boxed  {x}", "x"),  # the brace need not be adjacent
        ("\\boxed{ {a}{b} }", "{a}{b}"),
        ("\\boxed{}", ""),
        ("answer -1,5.", "-15."),
        ("no digits", ""),
        ("<think>\\boxed{9}</think>", ""),
    ],
)
def test_math_prediction(generation, expected):
    assert extract.extract_math_prediction(generation) == expected


@pytest.mark.parametrize(
    "reference, expected",
    [
        ("#### 1,000", "1000"),
        ("a #### 1 #### 2,5 ", "25"),
        ("The result is \\boxed{5}", "5"),
        ("\\boxed{2} \\boxed{3}", "3"),
        ("  7  ", "7"),
    ],
)
def test_math_gold(reference, expected):
    assert extract.extract_math_gold(reference) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{{5}}", "5"),
        ("\\fbox{6}", "6"),
        ("x \\boxed{1}\nProblem: \\boxed{2}", "1"),  # truncated at the next problem
        ("\\boxed 5 so the answer is $12$.", "12"),  # no brace wrapper: fallback 1
        ("\\boxed 5 then $x+1$", "x+1"),  # fallback 2
        ("\\boxed 5 nothing", "5"),  # fallback 3
        ("\\boxed", ""),  # fallback 4
        ("\\boxed{a}{b}", "a"),
        ("The answer is: {x}.", "x"),  # fallback answer stripped of its outer braces
    ],
)
def test_legacy_math_answer(text, expected):
    assert extract.legacy_math_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac12"),
        ("\\left( 1 \\right)", "(1)"),
        ("10^{\\circ}", "10"),
        ("10^\\circ", "10"),
        ("\\$5", "5"),
        ("50\\%", "50"),
        ("a\nb\\!c", "abc"),
        ("\\\\frac", "\\frac"),
        ("1,2,3", "12,3"),  # pairwise digit-comma fusion (quirk 12)
        ("1,000,000", "1000000"),
        ("{{5}}", "5"),
        ("{a}{b}", "{a}{b}"),
    ],
)
def test_legacy_normalize(text, expected):
    assert extract.legacy_normalize(text) == expected


FENCE = "```"


@pytest.mark.parametrize(
    "generation, prefix, program",
    [
        (f"{FENCE}python3\ndef f(x):\n    return x\n{FENCE}", "", "3\ndef f(x):\n    return x"),
        (f"{FENCE}Python\ndef f(x):\n    return x\n{FENCE}", "", "Python\ndef f(x):\n    return x"),
        (f"{FENCE}py def f(x): return x{FENCE}", "", "def f(x): return x"),
        (
            f"<think>{FENCE}python\ndef wrong(): pass\n{FENCE}</think>"
            f"{FENCE}python\ndef right(): pass\n{FENCE}\n{FENCE}python\nprint(right())\n{FENCE}",
            "",
            "def right(): pass",
        ),
        (f"{FENCE}python\ndef f(x):\n    return x\n", "", f"{FENCE}python\ndef f(x):\n    return x"),
        ("  x = 1  ", "", "\nx = 1"),
        (f"{FENCE}\nprint(1)\n{FENCE} then {FENCE}\nprint(2)\n{FENCE}", "", "\nprint(2)"),
        # D2: the first line's indentation is restored under a non-empty prefix.
        ("    return x", "def f(x):", "def f(x):\n    return x"),
        (
            f"{FENCE}python\n    y = x\n    return y\n{FENCE}",
            "def f(x):",
            "def f(x):\n    y = x\n    return y",
        ),
        ("\t\treturn x", "def f(x):", "def f(x):\n\t\treturn x"),
        ("return x", "def f(x):", "def f(x):\nreturn x"),  # unindented body: as the reference
        ("text   return x", "def f(x):", "def f(x):\ntext   return x"),
        (f"{FENCE}   return x{FENCE}", "def f(x):", "def f(x):\nreturn x"),  # not at a line start
        # A full function is never given another signature.
        ("def g():\n    return 1", "def f(x):", "def g():\n    return 1"),
    ],
)
def test_extract_program(generation, prefix, program):
    assert extract.extract_program(generation, prefix) == program
