"""The task checks of SCORING.md §2.3 and the JSON types of §2.1, each defined once.

Two callers use the same functions:

* :func:`alodlm_scoring.metrics.score` (scoring time, for direct library callers) calls them with
  the defaults: each check raises the reference's exception type and message text, lazily as the
  reference does (a later evalplus suite is validated only when the earlier ones passed), and no
  JSON-type rule is applied — a record the reference scores is scored.
* :func:`alodlm_scoring.tasks.load_tasks` (load time, decision D9) calls :func:`check_task` on
  every record: every check of every task (every evalplus suite included) runs before a model is
  loaded or a row is written, with ``strict=True`` (the JSON-type rules below), and ``report``
  turns each failure into a :class:`~alodlm_scoring.errors.TaskFileError` naming file, line and
  field (``code_tests.suites[1].reference_seconds``, say) with the reference's message text.

``report(field, error)`` receives the dotted field path and the exception the reference would
raise (``KeyError('tests')``, ``ValueError("Code timeout must be finite and positive")``,
``float()``'s ``ValueError``, ``ast.literal_eval``'s ``SyntaxError``, ...); it must not return.

Values, as the reference reads them (kept at both times):

* ``answer``: ``str(answer)`` stripped, ``""`` when absent; ``null`` becomes ``"None"``, which
  passes the non-empty check (and, for multiple choice, must then be a label: ``NONE`` is not);
* ``available_options``: a falsy value (absent, ``null``, ``[]``) means the default labels (A-D,
  A-J for mmlu_pro); membership is of the *uppercased* gold, case-sensitive;
* ``timeout_seconds``, ``min_time_limit``, ``time_limit_factor``, each ``reference_seconds`` item:
  ``float()`` of the value, so numeric strings (``"5"``, ``"inf"``, which then fails the finite
  check) are accepted; ``atol`` is ``float(atol or 0.0)``;
* ``inputs_literal`` / ``expected_literal`` take precedence over ``inputs`` / ``expected`` and are
  parsed with ``ast.literal_eval``; for HumanEval ``find_zero`` the expected outputs are not read.

JSON-type rules (load time only; each names the field and the type expected). They reject some
records the reference would still score, because the value is not of the type §2.1 documents:

* ``benchmark``: a string (the reference sorts benchmark names: a number crashes it when mixed
  with strings, and becomes a string key in ``summary.json`` otherwise);
* ``id``: a string or a number (not a boolean, ``null``, array or object);
* ``answer`` (non-code metrics): a string, number, boolean or ``null`` (not an array or object);
* ``available_options``: an array of strings, or ``null`` (a string such as ``"ABCD"``, which the
  reference would read as its characters, and other falsy values such as ``0`` are refused);
* ``function_prefix``: a string or ``null``;
* ``timeout_seconds``, ``min_time_limit``, ``time_limit_factor``, ``reference_seconds`` items: a
  number or a numeric string; ``atol`` also ``null`` (booleans, which ``float()`` accepts, are
  refused);
* ``code_tests``: an object; ``suites``: an array of objects; ``entry_point``: a string;
  ``inputs``: an array of argument arrays (after parsing, for ``inputs_literal``: a list or tuple
  of lists or tuples); ``expected``: an array (a list or tuple); ``reference_seconds``: an array;
  ``inputs_literal`` / ``expected_literal``: strings.

Fields a metric does not use are not checked (extra fields are ignored, §2.1).
"""

from __future__ import annotations

import ast
import math
from typing import Any, Callable, Mapping, NamedTuple, NoReturn

__all__ = [
    "DEFAULT_OPTIONS",
    "MMLU_PRO_OPTIONS",
    "MULTIPLE_CHOICE_METRICS",
    "CODE_METRICS",
    "DEFAULT_CODE_TIMEOUT_SECONDS",
    "DEFAULT_MIN_TIME_LIMIT",
    "DEFAULT_TIME_LIMIT_FACTOR",
    "EVALPLUS_DATASETS",
    "ROOT_CHECK_DATASET",
    "ROOT_CHECK_ENTRY_POINT",
    "JSONTypeError",
    "EvalplusSettings",
    "Report",
    "raise_as_is",
    "json_type",
    "is_number",
    "error_text",
    "reference_answer",
    "option_labels",
    "check_gold_label",
    "function_prefix",
    "python_tests_arguments",
    "evalplus_settings",
    "is_root_check",
    "resolve",
    "suite_arguments",
    "check_identity_types",
    "check_task",
]

DEFAULT_OPTIONS = ("A", "B", "C", "D")
MMLU_PRO_OPTIONS = tuple("ABCDEFGHIJ")
MULTIPLE_CHOICE_METRICS = ("arc", "mmlu", "mmlu_pro", "gpqa")
CODE_METRICS = ("python_tests", "evalplus")
DEFAULT_CODE_TIMEOUT_SECONDS = 10
DEFAULT_MIN_TIME_LIMIT = 1.0
DEFAULT_TIME_LIMIT_FACTOR = 4.0
EVALPLUS_DATASETS = ("humaneval", "mbpp")
# HumanEval's polynomial-root task is scored by a residual wrapper (§5.3 step 3).
ROOT_CHECK_DATASET = "humaneval"
ROOT_CHECK_ENTRY_POINT = "find_zero"

Report = Callable[[str, BaseException], NoReturn]


class JSONTypeError(TypeError):
    """A value of the wrong JSON type (load time only); the message says which type is expected."""


def raise_as_is(field: str, error: BaseException) -> NoReturn:
    """The scoring-time ``report``: raise the reference's exception unchanged."""
    raise error


_JSON_TYPES = ((bool, "boolean"), (int, "number"), (float, "number"), (str, "string"),
               (list, "array"), (tuple, "array"), (dict, "object"))


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (``null``, ``boolean``, ``number``, ...)."""
    if value is None:
        return "null"
    for kind, name in _JSON_TYPES:  # bool before int: True is an int in Python
        if isinstance(value, kind):
            return name
    return type(value).__name__


def error_text(error: BaseException) -> str:
    """One line for a reported exception: the reference's message text (a missing key says so)."""
    if isinstance(error, KeyError):
        return "missing required field (KeyError)"
    if type(error) is ValueError or isinstance(error, JSONTypeError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _type_error(report: Report, field: str, expected: str, value: Any) -> NoReturn:
    report(field, JSONTypeError(f"must be {expected}, got {json_type(value)}"))
    raise AssertionError("report must raise")  # pragma: no cover


def is_number(value: Any) -> bool:
    """A JSON number (not a boolean, which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _required(mapping: Mapping[str, Any], key: str, field: str, report: Report) -> Any:
    """``mapping[key]`` as the reference reads it (a non-mapping raises its own ``TypeError``)."""
    try:
        return mapping[key]
    except KeyError as error:
        report(field, error)
    raise AssertionError("report must raise")  # pragma: no cover


def _check_numeric(value: Any, field: str, report: Report, *, null_ok: bool = False) -> None:
    """Strict: a number or a string (``float()`` then decides whether the string is numeric)."""
    if not (is_number(value) or isinstance(value, str) or (null_ok and value is None)):
        _type_error(report, field, "a number or a numeric string" + (" or null" if null_ok else ""),
                    value)


def _to_float(value: Any, field: str, report: Report, strict: bool) -> float:
    """``float(value)`` as the reference converts it; strict: a number or a numeric string."""
    if strict:
        _check_numeric(value, field, report)
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError) as error:
        report(field, error)
    raise AssertionError("report must raise")  # pragma: no cover


# --------------------------------------------------------------------------------------------
# Every metric
# --------------------------------------------------------------------------------------------


def reference_answer(record: Mapping[str, Any]) -> str:
    """The gold answer as the reference reads it: ``str(answer)`` stripped (``""`` if absent)."""
    return str(record.get("answer", "")).strip()


def check_identity_types(record: Mapping[str, Any], report: Report) -> None:
    """Load time: ``benchmark`` is a string and ``id`` a string or a number (JSON types, §2.1)."""
    if not isinstance(record["benchmark"], str):
        _type_error(report, "benchmark", "a string", record["benchmark"])
    if not (isinstance(record["id"], str) or is_number(record["id"])):
        _type_error(report, "id", "a string or a number", record["id"])


# --------------------------------------------------------------------------------------------
# Multiple choice (arc, mmlu, mmlu_pro, gpqa)
# --------------------------------------------------------------------------------------------


def option_labels(record: Mapping[str, Any], metric: str, *, report: Report = raise_as_is,
                  strict: bool = False) -> Any:
    """The displayed option labels: ``available_options``, or the metric's default when falsy."""
    value = record.get("available_options")
    if strict and value is not None and not (
        isinstance(value, list) and all(isinstance(label, str) for label in value)
    ):
        _type_error(report, "available_options", "an array of strings or null", value)
    default = MMLU_PRO_OPTIONS if metric == "mmlu_pro" else DEFAULT_OPTIONS
    return value or list(default)


def check_gold_label(reference: str, options: Any, *, report: Report = raise_as_is) -> None:
    """The uppercased gold must be one of the labels (case-sensitive membership)."""
    if reference.upper() not in options:
        report("answer", ValueError(
            f"Gold answer is outside the displayed option labels: {reference!r} not in {options!r}"))


# --------------------------------------------------------------------------------------------
# Code metrics
# --------------------------------------------------------------------------------------------


def function_prefix(record: Mapping[str, Any], *, report: Report = raise_as_is,
                    strict: bool = False) -> str:
    """The signature a body-only response is joined under (``""`` when absent or falsy)."""
    value = record.get("function_prefix")
    if strict and value is not None and not isinstance(value, str):
        _type_error(report, "function_prefix", "a string or null", value)
    return value or ""


def python_tests_arguments(record: Mapping[str, Any], *, report: Report = raise_as_is,
                           strict: bool = False) -> tuple[str, float]:
    """``(tests, timeout)`` of a python_tests record, validated (§5.2 step 1)."""
    tests = _required(record, "tests", "tests", report)
    if not isinstance(tests, str) or not tests.strip():
        report("tests", ValueError("python_tests requires a nonempty local test program"))
    timeout = _to_float(record.get("timeout_seconds", DEFAULT_CODE_TIMEOUT_SECONDS),
                        "timeout_seconds", report, strict)
    if not math.isfinite(timeout) or timeout <= 0:
        report("timeout_seconds", ValueError("Code timeout must be finite and positive"))
    return tests, timeout


class EvalplusSettings(NamedTuple):
    """The ``code_tests`` settings of an evalplus record, in the order the reference reads them."""

    dataset: str
    suites: list
    atol: float
    entry_point: str
    min_time_limit: float
    time_limit_factor: float


def evalplus_settings(record: Mapping[str, Any], *, report: Report = raise_as_is,
                      strict: bool = False) -> EvalplusSettings:
    """``code_tests`` of an evalplus record, validated up to (not including) its suites (§5.3
    step 2). The grader's self-check, which the reference runs first, is not a task check."""
    code_tests = _required(record, "code_tests", "code_tests", report)
    if strict and not isinstance(code_tests, dict):
        _type_error(report, "code_tests", "an object", code_tests)
    dataset = _required(code_tests, "dataset", "code_tests.dataset", report)
    if dataset not in EVALPLUS_DATASETS:
        report("code_tests.dataset",
               ValueError(f"EvalPlus dataset must be humaneval or mbpp, got {dataset!r}"))
    suites = _required(code_tests, "suites", "code_tests.suites", report)
    if not suites:
        report("code_tests.suites", ValueError("An empty test suite cannot establish correctness"))
    if strict and not isinstance(suites, list):
        _type_error(report, "code_tests.suites", "an array of objects", suites)
    raw_atol = code_tests.get("atol")
    if strict:
        _check_numeric(raw_atol, "code_tests.atol", report, null_ok=True)
    atol = _to_float(raw_atol or 0.0, "code_tests.atol", report, False)
    entry_point = _required(code_tests, "entry_point", "code_tests.entry_point", report)
    if strict and not isinstance(entry_point, str):
        _type_error(report, "code_tests.entry_point", "a string", entry_point)
    min_time_limit = _to_float(code_tests.get("min_time_limit", DEFAULT_MIN_TIME_LIMIT),
                               "code_tests.min_time_limit", report, strict)
    time_limit_factor = _to_float(code_tests.get("time_limit_factor", DEFAULT_TIME_LIMIT_FACTOR),
                                  "code_tests.time_limit_factor", report, strict)
    return EvalplusSettings(dataset, suites, atol, entry_point, min_time_limit, time_limit_factor)


def is_root_check(settings: EvalplusSettings) -> bool:
    """Whether the record is HumanEval ``find_zero``, scored by the residual wrapper."""
    return settings.dataset == ROOT_CHECK_DATASET and settings.entry_point == ROOT_CHECK_ENTRY_POINT


def resolve(suite: Mapping[str, Any], key: str, *, field: str = "code_tests.suites",
            report: Report = raise_as_is, strict: bool = False) -> Any:
    """``suite[key + "_literal"]`` parsed with ``ast.literal_eval`` if present, else
    ``suite[key]`` (the ``inputs`` / ``expected`` of a suite, as the reference reads them)."""
    literal = key + "_literal"
    if literal in suite:
        text = suite[literal]
        if strict and not isinstance(text, str):
            _type_error(report, f"{field}.{literal}", "a string", text)
        try:
            return ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
            report(f"{field}.{literal}", error)
    return _required(suite, key, f"{field}.{key}", report)


def _check_sequence(value: Any, field: str, report: Report, expected: str,
                    item_ok: Callable[[Any], bool] = lambda item: True) -> None:
    if not isinstance(value, (list, tuple)) or not all(item_ok(item) for item in value):
        _type_error(report, field, expected, value)


def suite_arguments(suite: Mapping[str, Any], root_check: bool, *,
                    field: str = "code_tests.suites", report: Report = raise_as_is,
                    strict: bool = False) -> tuple[list, list, list[float]]:
    """Inputs, expected outputs and reference times of one suite, validated (§5.3 step 4)."""
    if strict and not isinstance(suite, dict):
        _type_error(report, field, "an object", suite)
    inputs = resolve(suite, "inputs", field=field, report=report, strict=strict)
    if strict:
        _check_sequence(inputs, f"{field}.inputs", report, "an array of argument arrays",
                        lambda item: isinstance(item, (list, tuple)))
    if root_check:
        expected = [True] * len(inputs)
    else:
        expected = resolve(suite, "expected", field=field, report=report, strict=strict)
        if strict:
            _check_sequence(expected, f"{field}.expected", report, "an array")
    times = _required(suite, "reference_seconds", f"{field}.reference_seconds", report)
    if strict:
        _check_sequence(times, f"{field}.reference_seconds", report, "an array")
    if not (len(inputs) == len(expected) == len(times)) or len(inputs) == 0:
        report(field, ValueError("Test inputs, expected outputs, and reference times must align"))
    times = [_to_float(seconds, f"{field}.reference_seconds[{index}]", report, strict)
             for index, seconds in enumerate(times)]
    if not all(math.isfinite(seconds) and seconds >= 0 for seconds in times):
        report(f"{field}.reference_seconds",
               ValueError("Reference execution times must be finite and nonnegative"))
    return list(inputs), list(expected), times


# --------------------------------------------------------------------------------------------
# Load time: everything at once
# --------------------------------------------------------------------------------------------


def check_task(record: Mapping[str, Any], report: Report) -> None:
    """Every check scoring would make on ``record`` (every evalplus suite included), with the
    JSON-type rules. ``record`` has passed §2.2 (its metric is supported)."""
    metric = record["metric"]
    if metric not in CODE_METRICS:
        answer = record.get("answer")
        if isinstance(answer, (list, dict)):
            _type_error(report, "answer", "a string, number, boolean or null", answer)
    if metric in MULTIPLE_CHOICE_METRICS:
        options = option_labels(record, metric, report=report, strict=True)
        check_gold_label(reference_answer(record), options, report=report)
    elif metric == "python_tests":
        function_prefix(record, report=report, strict=True)
        python_tests_arguments(record, report=report, strict=True)
    elif metric == "evalplus":
        function_prefix(record, report=report, strict=True)
        settings = evalplus_settings(record, report=report, strict=True)
        root_check = is_root_check(settings)
        for index, suite in enumerate(settings.suites):
            suite_arguments(suite, root_check, field=f"code_tests.suites[{index}]", report=report,
                            strict=True)
