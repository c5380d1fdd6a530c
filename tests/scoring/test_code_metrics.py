"""Code metrics: SCORING.md §10.1 rows 12-18 (and 20/21 in-process), §11.3, the §2.3 validation
errors, and the hygiene of unsandboxed python_tests (process group, address space).

The verdict tables run three ways (the ``code_score`` fixture): in this process without the
sandbox (the reference's way), and in a scoring worker with the code sandbox under the reference's
and under the strict rules (SCORING.md D10). Every verdict must be the same.

evalplus cases fork a child each (about 0.1 s, 1 s for the time-limit case), so they stay limited
to the table rows; python_tests timeouts are kept small.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from alodlm_scoring import metrics
from alodlm_scoring.extract import extract_program
from alodlm_scoring.pool import ScoringPool
from alodlm_scoring.metrics import run_python_tests, score

FENCE = "```"
IDENTITY_TESTS = "assert identity(3) == 3"


@pytest.fixture(autouse=True)
def _evalplus_default_task_cap(monkeypatch):
    """evalplus 0.3.1 crashes when EVALPLUS_TIMEOUT_PER_TASK is set (SCORING.md §5.4); the
    evaluator removes it from its workers (D3). Keep these in-process tests independent of it."""
    monkeypatch.delenv("EVALPLUS_TIMEOUT_PER_TASK", raising=False)


SCORERS = ("in-process", "sandboxed", "sandboxed-strict")


@pytest.fixture(scope="module")
def _sandboxed_pools():
    pools = {"sandboxed": ScoringPool(1, rules="reference"),
             "sandboxed-strict": ScoringPool(1, rules="strict")}
    yield pools
    for pool in pools.values():
        pool.close()


@pytest.fixture(params=SCORERS)
def code_score(request, _sandboxed_pools):
    """``score`` for one of the three ways of running code; ``.rules`` names the rule set."""
    if request.param == "in-process":
        function = score
    else:
        pool = _sandboxed_pools[request.param]

        def function(record, generation):
            outcome = pool.score(record, generation)
            assert outcome.failure is None
            return outcome.correct, outcome.extracted

    function.rules = "strict" if request.param.endswith("strict") else "reference"
    return function


def python_tests_record(tests=IDENTITY_TESTS, **extra):
    return {"metric": "python_tests", "tests": tests, **extra}


def evalplus_record(entry_point, suites, dataset="humaneval", atol=0, **extra):
    code_tests = {"dataset": dataset, "entry_point": entry_point, "atol": atol, "suites": suites}
    code_tests.update(extra)
    return {"metric": "evalplus", "code_tests": code_tests}


def suite(inputs, expected, seconds=0.001, **extra):
    return {"inputs": inputs, "expected": expected, "reference_seconds": [seconds] * len(inputs), **extra}


# --------------------------------------------------------------------------------------------
# §10.1 rows 12-18 (20/21 are the isolated variants; their in-process equivalent is rows 12/13)
# --------------------------------------------------------------------------------------------

FIND_ZERO = evalplus_record("find_zero", [suite([[[-10, -2]]], [-5.0])], atol=1e-4)
IDENTITY = evalplus_record("identity", [suite([[3]], [3])])


@pytest.mark.parametrize(
    "record, generation, correct",
    [
        (python_tests_record(), f"{FENCE}python\ndef identity(x):\n    return x\n{FENCE}", True),
        (python_tests_record(), "def identity(x):\n    return 0", False),
        (
            python_tests_record(timeout_seconds=0.2),
            "def identity(x):\n    while True:\n        pass",
            False,
        ),
        (FIND_ZERO, "def find_zero(xs):\n    return -xs[0] / xs[1]", True),
        (FIND_ZERO, "def find_zero(xs):\n    return 0", False),
        (IDENTITY, "def identity(x):\n    return x", True),
        (IDENTITY, "def identity(x):\n    return 1", False),
    ],
    ids=["12-fenced", "13-wrong", "14-timeout", "15-root", "16-no-root", "17-identity", "18-wrong"],
)
def test_reference_code_tests(record, generation, correct, code_score):
    assert code_score(record, generation) == (correct, None)


# What strict python_tests carry between the program's process and the test process
# (alodlm_scoring.sandbox.calls): every verdict is the reference's.
SPLIT_CASES = [
    ("generator", "def evens(n):\n    for i in range(0, n, 2):\n        yield i\n",
     "assert list(evens(7)) == [0, 2, 4, 6]\nassert evens(3) != [0, 2]\nassert next(iter(evens(3))) == 0",
     True),
    ("program_class", "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
     "    def span(self):\n        return self.b - self.a\n"
     "def longest(pairs):\n    return max(p.span() for p in pairs)\n",
     "assert longest([Pair(1, 5), Pair(2, 3)]) == 4\np = Pair(2, 9)\nassert p.a == 2 and p.span() == 7",
     True),
    ("module_of_the_program", "import math\ndef root(x):\n    return math.sqrt(x)\n",
     "assert math.isclose(root(2), 1.4142135623730951)", True),
    ("constant_and_helper", "R = 3\ndef scale(x):\n    return R * x\ndef helper(x):\n    return x + 1\n",
     "assert scale(helper(1)) == 6 and R == 3", True),
    ("keywords_and_containers", "def f(a, *, b=1):\n    return {'a': (a, {b}), 'n': [a] * b}\n",
     "assert f(2, b=3) == {'a': (2, {3}), 'n': [2, 2, 2]}", True),
    ("exception_caught_by_the_test", "def f(x):\n    raise ValueError('no')\n",
     "try:\n    f(1)\nexcept ValueError as error:\n    assert str(error) == 'no'\nelse:\n    assert False",
     True),
    ("exception_fails_the_test", "def f(x):\n    return 1 / x\n", "assert f(0) == 0", False),
    ("big_integer", "def f(n):\n    return 7 ** n\n", "assert f(9000) == 7 ** 9000", True),
    ("regex_match_truthiness", "import re\ndef f(s):\n    return re.search('^a', s)\n",
     "assert f('abc')\nassert not f('xbc')", True),
    ("thread_left_running", "import threading, time\n"
     "threading.Thread(target=time.sleep, args=(60,)).start()\ndef f():\n    return 1\n",
     "assert f() == 1", False),
    ("recursion_up_to_the_limit", "def depth(n):\n    return 1 if n == 0 else 1 + depth(n - 1)\n",
     "assert depth(998) == 999", True),
    ("recursion_past_the_limit", "def depth(n):\n    return 1 if n == 0 else 1 + depth(n - 1)\n",
     "assert depth(999) == 1000", False),
    ("future_import_of_the_program", "from __future__ import annotations\ndef f():\n    return 1\n",
     "def g(x: Undefined) -> int:\n    return f()\nassert g(0) == 1", True),
    ("setup_code_in_the_tests", "def largest(items):\n    return max(items)\n",
     "numbers = [4, 9, 2]\nassert largest(numbers) == 9", True),
]


@pytest.mark.parametrize("program, tests, correct", [case[1:] for case in SPLIT_CASES],
                         ids=[case[0] for case in SPLIT_CASES])
def test_what_crosses_between_program_and_tests(program, tests, correct, code_score):
    # Generous for passes (a loaded machine), short where a failure waits for the timeout.
    record = python_tests_record(tests, timeout_seconds=10 if correct else 2)
    assert code_score(record, f"{FENCE}python\n{program}{FENCE}") == (correct, None)


# Where the strict rules decide otherwise by design (docs/scoring.md, "Strict verdict rules").
STRICT_DIFFERENCES = [
    ("argument_changed_in_place", "def grow(items):\n    items.append(1)\n",
     "items = []\ngrow(items)\nassert items == [1]"),
    ("test_passes_a_lambda", "def apply(f, x):\n    return f(x)\n", "assert apply(lambda v: v + 1, 1) == 2"),
    ("program_redefines_a_builtin", "def identity(x):\n    return 0\ndef int(text):\n    return 0\n",
     "assert identity(3) == int('3')"),
]


@pytest.mark.parametrize("program, tests", [case[1:] for case in STRICT_DIFFERENCES],
                         ids=[case[0] for case in STRICT_DIFFERENCES])
def test_documented_strict_differences(program, tests, code_score):
    record = python_tests_record(tests, timeout_seconds=10)
    expected = code_score.rules != "strict"
    assert code_score(record, f"{FENCE}python\n{program}{FENCE}") == (expected, None)


def test_python_tests_timeout_is_enforced_quickly():
    start = time.monotonic()
    assert run_python_tests("while True:\n    pass", "", 0.3) is False
    assert time.monotonic() - start < 3


def test_isolated_style_call_in_a_fresh_interpreter():
    """Rows 20/21 in spirit: the scorer works in a fresh interpreter that only imports it."""
    code = (
        "import json, sys\n"
        "from alodlm_scoring.metrics import score\n"
        "r = {'metric': 'python_tests', 'tests': 'assert identity(3) == 3'}\n"
        "print(json.dumps([score(r, 'def identity(x):\\n    return x'),"
        " score(r, 'def identity(x):\\n    return 0')]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[true, null], [false, null]]"


# --------------------------------------------------------------------------------------------
# §11.3 code cases
# --------------------------------------------------------------------------------------------

F_TESTS = "assert f(2) == 2"


@pytest.mark.parametrize(
    "generation, prefix, program, correct",
    [
        (f"{FENCE}python3 def f(x): return x{FENCE}", "", "3 def f(x): return x", False),
        (f"{FENCE}Python\ndef f(x):\n    return x\n{FENCE}", "", "Python\ndef f(x):\n    return x", False),
        (f"{FENCE}py def f(x): return x{FENCE}", "", "def f(x): return x", True),
        (f"{FENCE}python\ndef f(x):\n    return x\n", "", f"{FENCE}python\ndef f(x):\n    return x", False),
        ("x = 1\n", "", "\nx = 1", False),
        # D2 (project rule): the indented body runs under the supplied signature.
        ("    return x", "def f(x):", "def f(x):\n    return x", True),
    ],
    ids=["python3-tag", "Python-tag", "py-same-line", "unclosed-fence", "no-def", "D2-prefix"],
)
def test_code_extraction_cases(generation, prefix, program, correct, code_score):
    assert extract_program(generation, prefix) == program
    record = python_tests_record(F_TESTS, function_prefix=prefix)
    assert code_score(record, generation) == (correct, None)


def test_python3_tag_on_its_own_line_leaves_a_harmless_3(code_score):
    """§11.3 says a ``python3`` fence "starts with 3 -> fails". The extraction part holds, but when
    the tag is on its own line the leftover ``3`` is a valid expression statement, so the program
    still runs (the same happens in the reference, whose fence regex is identical)."""
    generation = f"{FENCE}python3\ndef f(x):\n    return x\n{FENCE}"
    assert extract_program(generation) == "3\ndef f(x):\n    return x"
    assert code_score(python_tests_record(F_TESTS), generation) == (True, None)


def test_last_fence_with_def_is_chosen(code_score):
    generation = (
        f"<think>{FENCE}python\ndef wrong(): pass\n{FENCE}</think>"
        f"{FENCE}python\ndef right(): pass\n{FENCE}\n{FENCE}python\nprint(right())\n{FENCE}"
    )
    assert extract_program(generation) == "def right(): pass"
    record = python_tests_record("right()\nassert 'wrong' not in globals()")
    assert code_score(record, generation) == (True, None)


def test_d2_documents_the_reference_behaviour():
    """The reference joins the *stripped* body: ``def f(x):\\nreturn x`` fails to compile."""
    reference_program = "def f(x):" + "\n" + "    return x".strip()
    assert run_python_tests(reference_program, F_TESTS, 5) is False
    project_program = extract_program("    return x", "def f(x):")
    assert run_python_tests(project_program, F_TESTS, 5) is True


@pytest.mark.parametrize("status, correct", [(3, False), (0, True)])
def test_exit_status_decides(status, correct, code_score):
    record = python_tests_record(f"import sys\nsys.exit({status})")
    assert code_score(record, "def g():\n    pass") == (correct, None)


ROOT_SUITE = [suite([[[-10, -2]]], [-5.0])]


@pytest.mark.parametrize(
    "record, generation, correct",
    [
        (evalplus_record("find_zero", ROOT_SUITE, atol=0), "def find_zero(xs):\n    return -5.0", True),
        (evalplus_record("find_zero", ROOT_SUITE, atol=0), "def find_zero(xs):\n    return -5.001", False),
        (evalplus_record("find_zero", ROOT_SUITE, atol=1.0), "def find_zero(xs):\n    return 100", True),
        (evalplus_record("find_zero", ROOT_SUITE, atol=0.5), "def find_zero(xs):\n    return 100", False),
        (evalplus_record("g", [suite([[0]], [0.1])]), "def g(x):\n    return 0.1000000001", True),
        (evalplus_record("g", [suite([[0]], [0.1])]), "def g(x):\n    return 0.1001", False),
        (evalplus_record("g", [suite([[0]], [1.0])]), "def g(x):\n    return 1", True),
        (evalplus_record("g", [suite([[0]], [[1, 2]])]), "def g(x):\n    return (1, 2)", False),
        (
            evalplus_record(
                "g", [{"inputs": [[0]], "expected_literal": "[(1, 2)]", "reference_seconds": [0.001]}]
            ),
            "def g(x):\n    return (1, 2)",
            True,
        ),
        (
            evalplus_record("similar_elements", [suite([[[1, 2, 3], [3, 2, 5]]], [[2, 3]])], dataset="mbpp"),
            "def similar_elements(a, b):\n    return [3, 2]",
            True,
        ),
        (
            evalplus_record("are_equivalent", [suite([[36, 57]], [False])], dataset="mbpp"),
            "def are_equivalent(a, b):\n    return 'anything'",
            True,
        ),
        (
            evalplus_record("check_str", [suite([["annie"]], [True])], dataset="mbpp"),
            "import re\ndef check_str(s):\n    return re.search('^[aeiouAEIOU][A-Za-z0-9_]*', s)",
            True,
        ),
        (
            evalplus_record("g", [suite([[0]], [0])]),
            "raise SystemExit\ndef g(x):\n    return 0",
            False,
        ),
        (
            evalplus_record("g", [suite([[0]], [0])]),
            "def g(x):\n    print('noise')\n    return 0",
            True,
        ),
    ],
    ids=[
        "root-exact-atol0", "root-inexact-atol0", "root-atol1-any-number", "root-atol0.5",
        "float-forced-atol-close", "float-forced-atol-far", "int-equals-float", "tuple-vs-json-list",
        "expected-literal-tuple", "mbpp-set-equality", "mbpp-are-equivalent", "mbpp-not-none",
        "module-level-system-exit", "printing-swallowed",
    ],
)
def test_evalplus_cases(record, generation, correct, code_score):
    assert code_score(record, generation) == (correct, None)


def test_evalplus_infinite_loop_hits_the_minimum_time_limit(code_score):
    record = evalplus_record("g", [suite([[0]], [0])])
    start = time.monotonic()
    assert code_score(record, "def g(x):\n    while True:\n        pass") == (False, None)
    assert 0.9 < time.monotonic() - start < 10


def test_evalplus_stops_at_the_first_failing_suite(code_score):
    # The second suite is malformed; it must be neither validated nor run (lazy validation).
    malformed = {"inputs": [[0]], "expected": [], "reference_seconds": [0.001]}
    record = evalplus_record("g", [suite([[0]], [1]), malformed])
    assert code_score(record, "def g(x):\n    return 0") == (False, None)
    passing_first = evalplus_record("g", [suite([[0]], [0]), malformed])
    with pytest.raises(ValueError, match="must align"):
        score(passing_first, "def g(x):\n    return 0")


def test_inputs_literal_takes_precedence(code_score):
    literal_suite = {
        "inputs": [[[0]]],
        "inputs_literal": "[[(1, 2)]]",
        "expected": [True],
        "reference_seconds": [0.001],
    }
    record = evalplus_record("g", [literal_suite])
    assert code_score(record, "def g(x):\n    return isinstance(x, tuple)") == (True, None)


# --------------------------------------------------------------------------------------------
# §2.3 validation errors
# --------------------------------------------------------------------------------------------


def test_python_tests_requires_tests():
    with pytest.raises(KeyError):
        score({"metric": "python_tests"}, "def f(): pass")


@pytest.mark.parametrize("tests", ["", "  \n", 5, None])
def test_python_tests_requires_a_nonempty_program(tests):
    with pytest.raises(ValueError, match="python_tests requires a nonempty local test program"):
        score(python_tests_record(tests), "def f(): pass")


@pytest.mark.parametrize("timeout", [0, -1, "0", float("nan"), float("inf"), "inf"])
def test_python_tests_timeout_must_be_finite_and_positive(timeout):
    with pytest.raises(ValueError, match="Code timeout must be finite and positive"):
        score(python_tests_record(timeout_seconds=timeout), "def f(): pass")


def test_numeric_string_timeout_is_accepted():
    record = python_tests_record(F_TESTS, timeout_seconds="5")
    assert score(record, "def f(x):\n    return x") == (True, None)


@pytest.mark.parametrize(
    "record, error, message",
    [
        (evalplus_record("g", [suite([[0]], [0])], dataset="apps"), ValueError,
         "EvalPlus dataset must be humaneval or mbpp"),
        (evalplus_record("g", []), ValueError, "An empty test suite cannot establish correctness"),
        (evalplus_record("g", [suite([[0], [1]], [0])]), ValueError,
         "Test inputs, expected outputs, and reference times must align"),
        (evalplus_record("g", [suite([], [])]), ValueError,
         "Test inputs, expected outputs, and reference times must align"),
        (evalplus_record("g", [{"inputs": [[0]], "expected": [0], "reference_seconds": [-1]}]),
         ValueError, "Reference execution times must be finite and nonnegative"),
        (evalplus_record("g", [{"inputs": [[0]], "expected": [0], "reference_seconds": [math.inf]}]),
         ValueError, "Reference execution times must be finite and nonnegative"),
    ],
    ids=["dataset", "no-suites", "misaligned", "empty-suite", "negative-time", "infinite-time"],
)
def test_evalplus_validation_errors(record, error, message):
    with pytest.raises(error, match=message):
        score(record, "def g(x):\n    return 0")


def test_grader_self_check_failure(monkeypatch):
    monkeypatch.setattr(metrics, "_GRADERS_CHECKED", set())
    monkeypatch.setattr(metrics, "_untrusted_check", lambda *args, **kwargs: ("fail", []))
    # The self-check runs before dataset validation.
    record = evalplus_record("g", [suite([[0]], [0])], dataset="apps")
    with pytest.raises(RuntimeError, match="Code grader failed its positive/negative execution checks"):
        score(record, "def g(x):\n    return 0")


def test_grader_self_check_runs_once_per_process(monkeypatch):
    calls = []

    def fake(dataset, code, inputs, entry, expected, atol, times, **kwargs):
        calls.append(code)
        return ("pass" if "return x" in code or "return 0" not in code else "fail"), []

    monkeypatch.setattr(metrics, "_GRADERS_CHECKED", set())
    monkeypatch.setattr(metrics, "_untrusted_check", fake)
    record = evalplus_record("g", [suite([[0]], [0])])
    score(record, "def g(x):\n    return 1")
    score(record, "def g(x):\n    return 1")
    assert len(calls) == 2 + 2  # two self-check calls, then one suite per score


def test_time_limit_settings_are_passed_through(monkeypatch):
    seen = {}

    def fake(dataset, code, inputs, entry, expected, atol, times, **kwargs):
        seen.update(kwargs, atol=atol, times=times, entry=entry, expected=expected)
        return "pass", []

    monkeypatch.setattr(metrics, "_GRADERS_CHECKED", {(None, "reference")})
    monkeypatch.setattr(metrics, "_untrusted_check", fake)
    record = evalplus_record(
        "g", [suite([[0]], [0], seconds=2)], atol=None, min_time_limit=3, time_limit_factor=2
    )
    assert score(record, "def g(x):\n    return 0") == (True, None)
    assert seen == {
        "min_time_limit": 3.0, "gt_time_limit_factor": 2.0, "atol": 0.0, "times": [2.0],
        "entry": "g", "expected": [0],
    }
    score(evalplus_record("g", [suite([[0]], [0])]), "def g(x):\n    return 0")
    assert (seen["min_time_limit"], seen["gt_time_limit_factor"]) == (1.0, 4.0)


# --------------------------------------------------------------------------------------------
# python_tests sandbox hygiene (project additions that must not change ordinary verdicts)
# --------------------------------------------------------------------------------------------


def _is_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_timeout_kills_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    program = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "while True:\n    pass\n"
    )
    assert run_python_tests(program, "", 1.0) is False
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _is_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _is_gone(pid)


def test_child_runs_under_the_address_space_cap():
    limit = metrics._address_space_limit()
    assert 0 < limit <= 4 * 1024**3
    tests = f"import resource\nassert resource.getrlimit(resource.RLIMIT_AS)[0] == {limit}"
    assert run_python_tests("", tests, 10) is True
    assert run_python_tests("", f"x = bytearray({limit} + 1)", 10) is False


def test_ordinary_code_with_numpy_runs_under_the_cap():
    tests = "import numpy as np\nassert np.arange(10).sum() == 45"
    assert run_python_tests("", tests, 30) is True


def test_child_is_isolated_and_runs_in_a_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "shadow.py").write_text("VALUE = 1\n")
    tests = (
        "import os, sys\n"
        "assert os.path.exists('check.py')\n"
        "try:\n    import shadow\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit(1)\n"
    )
    assert run_python_tests("", tests, 10) is True
    assert os.getcwd() != str(tmp_path)
