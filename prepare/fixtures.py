"""Hand-made source files in each benchmark's real layout, for tests and the bundled sample suite.

:func:`write_sources` writes a few rows per benchmark in the format and columns its real source
has (ARC, MMLU, MMLU-Pro, GSM8K and MBPP as parquet, GPQA as CSV, MATH-500 as JSONL, the EvalPlus
release files as gzipped JSONL), so that preparing them exercises the same reading code as the
real data, offline. The rows are ours, written for these files: short questions, and code tasks
that cover what EvalPlus suites must preserve (tuple outputs, sets, floats under a tolerance, the
polynomial root of HumanEval/32, an MBPP+ not-None oracle, MBPP+ inputs that evalplus decodes
into tuples).

:func:`mutated_program` turns a correct program into one that fails its tests, for showing that a
suite rejects wrong code.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import textwrap

__all__ = ["write_sources", "mutated_program", "SOURCE_FILES", "ROWS", "GSM8K_TRAIN"]

_ARC_C = [
    {"id": "Fixture_ARC_C_1", "question": "Which gas do plants take in to make food?",
     "choices": {"text": ["oxygen", "carbon dioxide", "nitrogen", "helium"],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
    {"id": "Fixture_ARC_C_2", "question": "Which tool measures air temperature?",
     "choices": {"text": ["a ruler", "a scale", "a thermometer", "a compass"],
                 "label": ["1", "2", "3", "4"]}, "answerKey": "3"},
    {"id": "Fixture_ARC_C_3", "question": "What does a magnet attract?",
     "choices": {"text": ["wood", "glass", "iron", "plastic", "paper"],
                 "label": ["A", "B", "C", "D", "E"]}, "answerKey": "C"},
]
_ARC_E = [
    {"id": "Fixture_ARC_E_1", "question": "What do bees collect from flowers?",
     "choices": {"text": ["nectar", "sand", "salt", "oil"], "label": ["A", "B", "C", "D"]},
     "answerKey": "A"},
    {"id": "Fixture_ARC_E_2", "question": "Which season is usually the coldest?",
     "choices": {"text": ["summer", "spring", "autumn", "winter"], "label": ["A", "B", "C", "D"]},
     "answerKey": "D"},
]
_MMLU = [
    {"question": "What is 7 * 6?", "subject": "elementary_mathematics",
     "choices": ["36", "42", "48", "54"], "answer": 1},
    {"question": "What is 9 - 4?", "subject": "elementary_mathematics",
     "choices": ["3", "4", "5", "6"], "answer": 2},
    {"question": "Which planet is the largest?", "subject": "astronomy",
     "choices": ["Mars", "Venus", "Earth", "Jupiter"], "answer": 3},
]
_MMLU_PRO = [
    {"question_id": 70001, "question": "Which number is prime?",
     "options": ["4", "6", "8", "9", "10", "11", "12", "14", "15", "16"], "answer": "F",
     "answer_index": 5, "cot_content": "", "category": "math", "src": "fixture"},
    {"question_id": 70002, "question": "Which metal is liquid at room temperature?",
     "options": ["iron", "copper", "mercury", "zinc", "tin", "lead", "gold", "silver"],
     "answer": "C", "answer_index": 2, "cot_content": "", "category": "chemistry",
     "src": "fixture"},
]
_EV = ("Feedback", "Validator Revision Suggestion", "Is First Validation", "Post hoc agreement",
       "Sufficient Expertise?", "Understand the question?", "Question Difficulty",
       "Validator Answered Correctly", "Self-reported time (minutes)", "Probability Correct",
       "Manual Correctness Adjustment", "Expert Validator")
_NEV = ("Feedback", "Validator Answered Correctly", "Explanation", "Self-reported time (minutes)",
        "Websites visited", "Probability Correct", "Manual Correctness Adjustment",
        "Non-Expert Validator")
_GPQA_COLUMNS = (
    ["Pre-Revision Question", "Pre-Revision Correct Answer", "Pre-Revision Incorrect Answer 1",
     "Pre-Revision Incorrect Answer 2", "Pre-Revision Incorrect Answer 3",
     "Pre-Revision Explanation", "Self-reported question-writing time (minutes)", "Question",
     "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3",
     "Explanation", "Revision Comments (from Question Writer)", "Subdomain",
     "Writer's Difficulty Estimate", "Extra Revised Question", "Extra Revised Explanation",
     "Extra Revised Correct Answer", "Extra Revised Incorrect Answer 1",
     "Extra Revised Incorrect Answer 2", "Extra Revised Incorrect Answer 3",
     "Non-Expert Validator Accuracy", "Majority Non-Expert Vals Incorrect",
     "Expert Validator Accuracy", "Record ID", "High-level domain", "Question Writer"]
    + [f"{name}_EV_{n}" for n in (1, 2) for name in _EV]
    + [f"{name}_NEV_{n}" for n in (1, 2, 3) for name in _NEV]
    + ["Expert Validator Disagreement Category", "Canary String"])
_GPQA = [
    {"Record ID": "recFixture001", "Question": "Which particle carries a negative charge?",
     "Correct Answer": "electron", "Incorrect Answer 1": "proton",
     "Incorrect Answer 2": "neutron", "Incorrect Answer 3": "photon",
     "High-level domain": "Physics", "Subdomain": "Particle physics"},
    {"Record ID": "recFixture002", "Question": "What is the speed of light in vacuum?",
     "Correct Answer": " about 3e8 m/s\n", "Incorrect Answer 1": "about 3e6 m/s",
     "Incorrect Answer 2": "about 3e5 m/s", "Incorrect Answer 3": "about 3e3 m/s",
     "High-level domain": "Physics", "Subdomain": "Relativity"},
    {"Record ID": "recFixture003", "Question": "Which molecule stores genetic information?",
     "Correct Answer": "DNA", "Incorrect Answer 1": "ATP", "Incorrect Answer 2": "glucose",
     "Incorrect Answer 3": "cholesterol", "High-level domain": "Biology",
     "Subdomain": "Molecular Biology"},
]
_GSM8K_TRAIN = [
    {"question": "Ann has 3 bags of 4 apples. How many apples does she have?",
     "answer": "Ann has 3 * 4 = <<3*4=12>>12 apples.\n#### 12"},
    {"question": "A pen costs $2. How much do 5 pens cost?",
     "answer": "5 pens cost 5 * 2 = <<5*2=10>>10 dollars.\n#### 10"},
    {"question": "Tim read 7 pages and then 8 more. How many pages did he read?",
     "answer": "He read 7 + 8 = <<7+8=15>>15 pages.\n#### 15"},
]
_GSM8K_TEST = [
    {"question": "Tom has 3 boxes of 8 apples. How many apples does he have?",
     "answer": "Tom has 3 * 8 = <<3*8=24>>24 apples.\n#### 24"},
    {"question": "A farm sells 1,000 eggs a day for 2 days. How many eggs is that?",
     "answer": "It sells 1000 * 2 = <<1000*2=2000>>2000 eggs.\n#### 2,000"},
]
_MATH500 = [
    {"problem": "Write $0.5$ as a fraction in lowest terms.", "solution":
     "$0.5 = \\frac{5}{10} = \\boxed{\\frac{1}{2}}$.", "answer": "\\frac{1}{2}",
     "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/fixture1.json"},
    {"problem": "Expand $(x+1)^2$.", "solution": "$(x+1)^2 = \\boxed{x^2+2x+1}$.",
     "answer": "x^2+2x+1", "subject": "Algebra", "level": 2,
     "unique_id": "test/algebra/fixture2.json"},
]
_MBPP = [
    {"task_id": 901, "text": "Write a function to add two numbers.",
     "code": "def add(a, b):\r\n    return a + b", "test_list": [
         "assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 902, "text": "Write a function to find the largest value in a list.",
     "code": "def largest(items):\r\n    return max(items)", "test_list": [
         "assert largest(numbers) == 9", "assert largest([1, 2]) == 2",
         "assert largest([-3, -1]) == -1"],
     "test_setup_code": "numbers = [4, 9, 2]", "challenge_test_list": []},
]


def _python(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _body(text: str) -> str:
    """A function body: dedented, then indented by four spaces."""
    return textwrap.indent(_python(text), "    ")


_HUMANEVAL = [
    {"task_id": "HumanEval/2", "entry_point": "truncate_number",
     "prompt": _python('''
        def truncate_number(number: float) -> float:
            """Return the decimal part of a positive number."""
        '''),
     "canonical_solution": "    return number % 1.0\n",
     "base_input": [[3.5], [1.25], [123.456]], "plus_input": [[0.5], [7.0]], "atol": 1e-06},
    {"task_id": "HumanEval/8", "entry_point": "sum_product",
     "prompt": _python('''
        from typing import List, Tuple


        def sum_product(numbers: List[int]) -> Tuple[int, int]:
            """Return (sum, product) of the numbers; (0, 1) for none."""
        '''),
     "canonical_solution": _body('''
            total, product = 0, 1
            for n in numbers:
                total += n
                product *= n
            return total, product
        '''),
     "base_input": [[[]], [[1, 2, 3]]], "plus_input": [[[5]], [[-1, 4, 0]]], "atol": 0},
    {"task_id": "HumanEval/32", "entry_point": "find_zero",
     "prompt": _python('''
        import math


        def poly(xs: list, x: float):
            return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])


        def find_zero(xs: list):
            """Return a root of the polynomial with coefficients xs (odd degree)."""
        '''),
     "canonical_solution": _body('''
            begin, end = -1.0, 1.0
            while poly(xs, begin) * poly(xs, end) > 0:
                begin *= 2.0
                end *= 2.0
            while end - begin > 1e-10:
                center = (begin + end) / 2.0
                if poly(xs, center) * poly(xs, begin) > 0:
                    begin = center
                else:
                    end = center
            return begin
        '''),
     "base_input": [[[-10, -2]], [[1, 2]]], "plus_input": [[[-6, 11, -6, 1]]], "atol": 1e-04},
]
for _row in _HUMANEVAL:
    _row["contract"] = ""
    _row["test"] = "def check(candidate):\n    pass\n"

_MBPP_PLUS = [
    {"task_id": "Mbpp/2", "entry_point": "similar_elements",
     "prompt": '"""\nWrite a function to find the shared elements from the given two lists.\n'
               'assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"""\n',
     "canonical_solution": "\ndef similar_elements(test_tup1, test_tup2):\n"
                           "  return tuple(set(test_tup1) & set(test_tup2))\n",
     "base_input": [[[3, 4, 5, 6], [5, 7, 4, 10]], [[1, 2, 3, 4], [5, 4, 3, 7]]],
     "plus_input": [[[11, 12], [12, 13]]], "atol": 0,
     "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"]},
    {"task_id": "Mbpp/737", "entry_point": "check_str",
     "prompt": '"""\nWrite a function to check whether the given string is starting with a vowel '
               "or not using regex.\nassert check_str(\"annie\")\n\"\"\"\n",
     "canonical_solution": "\nimport re\ndef check_str(string):\n"
                           "  regex = '^[aeiouAEIOU][A-Za-z0-9_]*'\n"
                           "  return re.search(regex, string)\n",
     "base_input": [["annie"], ["dawood"]], "plus_input": [["Else"], ["xyz"]], "atol": 0,
     "test_list": ['assert check_str("annie")']},
    {"task_id": "Mbpp/3", "entry_point": "is_not_prime",
     "prompt": '"""\nWrite a python function to identify non-prime numbers.\n'
               'assert is_not_prime(2) == False\n"""\n',
     "canonical_solution": "\nimport math\ndef is_not_prime(n):\n  if n == 1:\n    return True\n"
                           "  for i in range(2, int(math.sqrt(n)) + 1):\n"
                           "    if n % i == 0:\n      return True\n  return False\n",
     "base_input": [[2], [10], [35]], "plus_input": [], "atol": 0,
     "test_list": ["assert is_not_prime(2) == False"]},
]
for _row in _MBPP_PLUS:
    _row.update(code=_row["canonical_solution"].strip(), source_file="fixture",
                test_imports=[], test="", contract="", assertion="\n".join(_row["test_list"]))

# The hand-made rows of each benchmark's source (GSM8K: its test split; the train split is
# GSM8K_TRAIN), in the source's own columns.
GSM8K_TRAIN = _GSM8K_TRAIN
ROWS = {"ARC-C": _ARC_C, "ARC-E": _ARC_E, "MMLU": _MMLU, "MMLU-Pro": _MMLU_PRO,
        "GPQA-Diamond": _GPQA, "GSM8K": _GSM8K_TEST, "MATH-500": _MATH500, "MBPP": _MBPP,
        "MBPP+": _MBPP_PLUS, "HumanEval": _HUMANEVAL, "HumanEval+": _HUMANEVAL}

# Which file each benchmark reads (relative to the directory given to write_sources).
SOURCE_FILES = {
    "ARC-C": "ai2_arc/ARC-Challenge",
    "ARC-E": "ai2_arc/ARC-Easy/test-00000-of-00001.parquet",
    "MMLU": "mmlu/all",
    "MMLU-Pro": "mmlu_pro/test-00000-of-00001.parquet",
    "GPQA-Diamond": "gpqa/gpqa_diamond.csv",
    "GSM8K": "gsm8k/main",
    "MATH-500": "math500/test.jsonl",
    "MBPP": "mbpp/full/test-00000-of-00001.parquet",
    "MBPP+": "MbppPlus.jsonl.gz",
    "HumanEval": "HumanEvalPlus.jsonl.gz",
    "HumanEval+": "HumanEvalPlus.jsonl.gz",
}


def _parquet(path: pathlib.Path, rows: list[dict]) -> None:
    import pyarrow
    import pyarrow.parquet

    path.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)


def _csv(path: pathlib.Path, rows: list[dict], columns: list[str]) -> None:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({column: row.get(column, "") for column in columns})


def _jsonl(path: pathlib.Path, rows: list[dict], gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
    if gz:
        with gzip.GzipFile(path, "wb", mtime=0) as handle:
            handle.write(data)
    else:
        path.write_bytes(data)


def write_sources(directory: str | pathlib.Path) -> dict[str, pathlib.Path]:
    """Write every fixture source below ``directory``; returns each benchmark's source path."""
    root = pathlib.Path(directory)
    _parquet(root / "ai2_arc/ARC-Challenge/test-00000-of-00001.parquet", _ARC_C)
    _parquet(root / SOURCE_FILES["ARC-E"], _ARC_E)
    _parquet(root / "mmlu/all/test-00000-of-00001.parquet", _MMLU)
    _parquet(root / SOURCE_FILES["MMLU-Pro"], _MMLU_PRO)
    _csv(root / SOURCE_FILES["GPQA-Diamond"], _GPQA, _GPQA_COLUMNS)
    _parquet(root / "gsm8k/main/train-00000-of-00001.parquet", _GSM8K_TRAIN)
    _parquet(root / "gsm8k/main/test-00000-of-00001.parquet", _GSM8K_TEST)
    _jsonl(root / SOURCE_FILES["MATH-500"], _MATH500)
    _parquet(root / SOURCE_FILES["MBPP"], _MBPP)
    _jsonl(root / SOURCE_FILES["MBPP+"], _MBPP_PLUS, gz=True)
    _jsonl(root / SOURCE_FILES["HumanEval"], _HUMANEVAL, gz=True)
    return {name: root / relative for name, relative in SOURCE_FILES.items()}


def mutated_program(program: str, entry_point: str) -> str:
    """``program`` with ``entry_point`` wrapped so that every result is wrong.

    Numbers move by one, booleans flip, strings, lists and tuples grow, sets gain an element and
    ``None`` becomes a string (a not-None oracle sees the opposite answer); the function keeps its
    name and signature, so only the values are wrong.
    """
    return program.rstrip() + "\n\n\n" + _python(f'''
        _alodlm_correct_{entry_point} = {entry_point}


        def {entry_point}(*args, **kwargs):
            out = _alodlm_correct_{entry_point}(*args, **kwargs)
            if isinstance(out, bool):
                return not out
            if isinstance(out, (int, float)):
                return out + 1
            if isinstance(out, str):
                return out + "x"
            if isinstance(out, (list, tuple)):
                return type(out)(list(out) + ["x"])
            if isinstance(out, set):
                return out | {{"x"}}
            return "x" if out is None else None
        ''')
