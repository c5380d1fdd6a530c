"""Malformed inputs, as a new user would make them, in both modes of ``alodlm-jax-evaluate``
(SCORING.md D8, D9; README "Bad input").

Every case must end with exit status 2 and exactly one stderr line that names the file, line and
field (or the flag), without a traceback, and leave ``--output`` as it found it: absent (parents
included) when it did not exist, byte for byte the same when it did. Task-file and flag cases run
in both modes; generate mode uses the bundled tiny model, and every case fails before anything is
decoded (the prompt checks run right after the model is loaded). The suite the cases edit is
valid in both modes (checked first), so each case fails for its own edit only.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any, Callable

import pytest

from alodlm_jax.cli import evaluate

from . import suites

PROG = "alodlm-jax-evaluate"
GENERATE_FLAGS = ["--model", "builtin:tiny", "--device", "cpu", "--precision", "fp32",
                  "--max_new_tokens", "8", "--window_size", "4"]

SUITE = [
    {"benchmark": "mmlu", "id": 1, "metric": "mmlu", "prompt": "Return value one", "answer": "B"},
    {"benchmark": "arc", "id": "a1", "metric": "arc", "prompt": "Return value two",
     "answer": "C", "available_options": ["A", "B", "C"]},
    {"benchmark": "mbpp", "id": "p1", "metric": "python_tests", "prompt": "Write identity.",
     "tests": "assert identity(3) == 3", "timeout_seconds": 5},
    {"benchmark": "humaneval", "id": "e1", "metric": "evalplus", "prompt": "def identity",
     "code_tests": {"dataset": "humaneval", "entry_point": "identity", "atol": 0,
                    "suites": [{"inputs": [[3]], "expected": [3], "reference_seconds": [0.001]},
                               {"inputs_literal": "[(1,), (2,)]", "expected": [1, 2],
                                "reference_seconds": [0.001, 0.002]}]}},
    {"benchmark": "gsm8k", "id": "m1", "metric": "math", "prompt": "Return value one",
     "answer": "42"},
    {"benchmark": "synthetic", "id": 6, "metric": "exact", "prompt": "Return value two",
     "answer": "one ."},
]
TEXTS = ["The answer is (B).", "C", "```python\ndef identity(x):\n    return x\n```",
         "```python\ndef identity(x):\n    return x\n```", "\\boxed{42}", "one ."]


def _prediction(task: dict, text: str, index: int) -> dict:
    return {"benchmark": task["benchmark"], "id": task["id"], "text": text,
            "generated_tokens": index + 1, "wall_seconds": 0.25}


def _dump(rows) -> list[str]:
    return [json.dumps(row) + "\n" for row in rows]


# --------------------------------------------------------------------------------------------
# Edits
# --------------------------------------------------------------------------------------------

Lines = list  # the file's lines, each ending in "\n"


def replace(index: int, edit: Callable[[dict], Any]) -> Callable[[Lines], Lines]:
    """Edit the JSON object on line ``index + 1`` (``edit`` mutates it, or returns a raw line)."""

    def apply(lines: Lines) -> Lines:
        record = json.loads(lines[index])
        result = edit(record)
        lines[index] = result if isinstance(result, str) else json.dumps(record) + "\n"
        return lines

    return apply


def setting(*path, value=None, delete=False):
    """An edit that sets (or deletes) ``record[path[0]][path[1]]...``."""

    def edit(record):
        target = record
        for key in path[:-1]:
            target = target[key]
        if delete:
            del target[path[-1]]
        else:
            target[path[-1]] = copy.deepcopy(value)

    return edit


def raw(text: str) -> Callable[[dict], str]:
    return lambda record: text


def line_bytes(index: int, data: bytes) -> Callable[[Lines], bytes]:
    def apply(lines: Lines) -> bytes:
        encoded = [line.encode() for line in lines]
        encoded[index] = data
        return b"".join(encoded)

    return apply


MC, ARC, PY, EP, MATH, EXACT = range(6)
SUITE0 = ("code_tests", "suites", 0)
SUITE1 = ("code_tests", "suites", 1)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    where: str  # "tasks" / "predictions": the file whose line and field the error names
    line: int | None  # 1-based; None: the file as a whole
    field: str | None
    message: str
    tasks: Callable | None = None
    predictions: Callable | None = None


def task_case(name, index, edit, field, message) -> Case:
    return Case(name, "tasks", index + 1, field, message, tasks=replace(index, edit))


TASK_CASES = [
    # Shape, JSON and §2.2.
    task_case("invalid_json", ARC, raw('{"benchmark": "arc",\n'), None, "invalid JSON"),
    task_case("not_an_object", MC, raw("[1, 2]\n"), None,
              "each task line must be a JSON object, got array"),
    task_case("missing_benchmark", MC, setting("benchmark", delete=True), "benchmark",
              "missing required field"),
    task_case("missing_id", ARC, setting("id", delete=True), "id", "missing required field"),
    task_case("missing_metric", MATH, setting("metric", delete=True), "metric",
              "missing required field"),
    task_case("benchmark_number", MC, setting("benchmark", value=500), "benchmark",
              "must be a string, got number"),
    task_case("benchmark_array", EXACT, setting("benchmark", value=["x"]), "benchmark",
              "must be a string, got array"),
    task_case("id_null", MATH, setting("id", value=None), "id",
              "must be a string or a number, got null"),
    task_case("id_object", ARC, setting("id", value={"n": 1}), "id",
              "must be a string or a number, got object"),
    task_case("duplicate_id", EXACT, lambda r: r.update(benchmark="mmlu", id="1"), "id",
              "Duplicate benchmark and task ID"),
    task_case("unsupported_metric", MATH, setting("metric", value="bleu"), "metric",
              "Unsupported metric 'bleu'"),
    task_case("metric_number", MC, setting("metric", value=3), "metric", "Unsupported metric 3"),
    task_case("prompt_missing", ARC, setting("prompt", delete=True), "prompt",
              "Each task needs a fully formatted prompt"),
    task_case("prompt_empty", MATH, setting("prompt", value=""), "prompt",
              "Each task needs a fully formatted prompt"),
    task_case("prompt_number", PY, setting("prompt", value=7), "prompt",
              "Each task needs a fully formatted prompt"),
    task_case("answer_missing", MC, setting("answer", delete=True), "answer",
              "Each scored task needs a reference answer"),
    task_case("answer_blank", EXACT, setting("answer", value="  "), "answer",
              "Each scored task needs a reference answer"),
    task_case("answer_array", MATH, setting("answer", value=[42]), "answer",
              "must be a string, number, boolean or null, got array"),
    # Multiple choice: the gold letter and its labels (§2.3).
    task_case("answer_null_is_not_a_label", MC, setting("answer", value=None), "answer",
              "Gold answer is outside the displayed option labels: 'None'"),
    task_case("gold_outside_default_labels", MC, setting("answer", value="E"), "answer",
              "Gold answer is outside the displayed option labels"),
    task_case("gold_outside_available_options", ARC, setting("answer", value="D"), "answer",
              "Gold answer is outside the displayed option labels"),
    task_case("lowercase_labels", ARC,
              lambda r: r.update(answer="b", available_options=["a", "b", "c"]), "answer",
              "Gold answer is outside the displayed option labels"),
    task_case("available_options_number", ARC, setting("available_options", value=4),
              "available_options", "must be an array of strings or null, got number"),
    task_case("available_options_string", MC, setting("available_options", value="ABCD"),
              "available_options", "must be an array of strings or null, got string"),
    task_case("available_options_numbers", ARC, setting("available_options", value=[1, 2, 3]),
              "available_options", "must be an array of strings or null, got array"),
    # python_tests.
    task_case("tests_missing", PY, setting("tests", delete=True), "tests",
              "missing required field (KeyError)"),
    task_case("tests_blank", PY, setting("tests", value="  \n"), "tests",
              "python_tests requires a nonempty local test program"),
    task_case("tests_number", PY, setting("tests", value=5), "tests",
              "python_tests requires a nonempty local test program"),
    task_case("timeout_zero", PY, setting("timeout_seconds", value=0), "timeout_seconds",
              "Code timeout must be finite and positive"),
    task_case("timeout_negative_string", PY, setting("timeout_seconds", value="-1"),
              "timeout_seconds", "Code timeout must be finite and positive"),
    task_case("timeout_infinite_string", PY, setting("timeout_seconds", value="inf"),
              "timeout_seconds", "Code timeout must be finite and positive"),
    task_case("timeout_not_numeric", PY, setting("timeout_seconds", value="soon"),
              "timeout_seconds", "could not convert string to float: 'soon'"),
    task_case("timeout_boolean", PY, setting("timeout_seconds", value=True), "timeout_seconds",
              "must be a number or a numeric string, got boolean"),
    task_case("timeout_null", PY, setting("timeout_seconds", value=None), "timeout_seconds",
              "must be a number or a numeric string, got null"),
    task_case("function_prefix_number", PY, setting("function_prefix", value=5),
              "function_prefix", "must be a string or null, got number"),
    task_case("function_prefix_array", EP, setting("function_prefix", value=["def f():"]),
              "function_prefix", "must be a string or null, got array"),
    # evalplus: code_tests and every suite, the later one included (D9).
    task_case("code_tests_missing", EP, setting("code_tests", delete=True), "code_tests",
              "missing required field (KeyError)"),
    task_case("code_tests_array", EP, setting("code_tests", value=[1]), "code_tests",
              "must be an object, got array"),
    task_case("dataset_unknown", EP, setting("code_tests", "dataset", value="apps"),
              "code_tests.dataset", "EvalPlus dataset must be humaneval or mbpp, got 'apps'"),
    task_case("dataset_missing", EP, setting("code_tests", "dataset", delete=True),
              "code_tests.dataset", "missing required field (KeyError)"),
    task_case("suites_missing", EP, setting("code_tests", "suites", delete=True),
              "code_tests.suites", "missing required field (KeyError)"),
    task_case("suites_empty", EP, setting("code_tests", "suites", value=[]), "code_tests.suites",
              "An empty test suite cannot establish correctness"),
    task_case("suites_object", EP, setting("code_tests", "suites", value={"inputs": [[1]]}),
              "code_tests.suites", "must be an array of objects, got object"),
    task_case("entry_point_missing", EP, setting("code_tests", "entry_point", delete=True),
              "code_tests.entry_point", "missing required field (KeyError)"),
    task_case("entry_point_number", EP, setting("code_tests", "entry_point", value=3),
              "code_tests.entry_point", "must be a string, got number"),
    task_case("atol_not_numeric", EP, setting("code_tests", "atol", value="tight"),
              "code_tests.atol", "could not convert string to float: 'tight'"),
    task_case("min_time_limit_null", EP, setting("code_tests", "min_time_limit", value=None),
              "code_tests.min_time_limit", "must be a number or a numeric string, got null"),
    task_case("time_limit_factor_not_numeric", EP,
              setting("code_tests", "time_limit_factor", value="x4"),
              "code_tests.time_limit_factor", "could not convert string to float: 'x4'"),
    task_case("suite_not_an_object", EP, setting(*SUITE1, value=5), "code_tests.suites[1]",
              "must be an object, got number"),
    task_case("later_suite_inputs_missing", EP, setting(*SUITE1, "inputs_literal", delete=True),
              "code_tests.suites[1].inputs", "missing required field (KeyError)"),
    task_case("expected_missing", EP, setting(*SUITE0, "expected", delete=True),
              "code_tests.suites[0].expected", "missing required field (KeyError)"),
    task_case("reference_seconds_missing", EP, setting(*SUITE0, "reference_seconds", delete=True),
              "code_tests.suites[0].reference_seconds", "missing required field (KeyError)"),
    task_case("later_suite_misaligned", EP, setting(*SUITE1, "expected", value=[1]),
              "code_tests.suites[1]",
              "Test inputs, expected outputs, and reference times must align"),
    task_case("suite_without_inputs", EP,
              setting(*SUITE0, value={"inputs": [], "expected": [], "reference_seconds": []}),
              "code_tests.suites[0]",
              "Test inputs, expected outputs, and reference times must align"),
    task_case("reference_time_negative", EP, setting(*SUITE0, "reference_seconds", value=[-1]),
              "code_tests.suites[0].reference_seconds",
              "Reference execution times must be finite and nonnegative"),
    task_case("later_reference_time_infinite", EP,
              setting(*SUITE1, "reference_seconds", value=[0.1, "inf"]),
              "code_tests.suites[1].reference_seconds",
              "Reference execution times must be finite and nonnegative"),
    task_case("reference_time_not_numeric", EP,
              setting(*SUITE0, "reference_seconds", value=["fast"]),
              "code_tests.suites[0].reference_seconds[0]",
              "could not convert string to float: 'fast'"),
    task_case("reference_time_boolean", EP, setting(*SUITE0, "reference_seconds", value=[True]),
              "code_tests.suites[0].reference_seconds[0]",
              "must be a number or a numeric string, got boolean"),
    task_case("reference_seconds_string", EP, setting(*SUITE0, "reference_seconds", value="0.1"),
              "code_tests.suites[0].reference_seconds", "must be an array, got string"),
    task_case("inputs_literal_unparsable", EP, setting(*SUITE1, "inputs_literal", value="[(1,"),
              "code_tests.suites[1].inputs_literal", "SyntaxError"),
    task_case("inputs_literal_not_a_string", EP, setting(*SUITE1, "inputs_literal", value=5),
              "code_tests.suites[1].inputs_literal", "must be a string, got number"),
    task_case("inputs_literal_not_a_list", EP, setting(*SUITE1, "inputs_literal", value="{1: 2}"),
              "code_tests.suites[1].inputs", "must be an array of argument arrays, got object"),
    task_case("expected_literal_unparsable", EP,
              setting(*SUITE0, "expected_literal", value="[3"),
              "code_tests.suites[0].expected_literal", "SyntaxError"),
    task_case("inputs_not_argument_arrays", EP, setting(*SUITE0, "inputs", value=[3]),
              "code_tests.suites[0].inputs", "must be an array of argument arrays, got array"),
    task_case("expected_object", EP, setting(*SUITE0, "expected", value={"a": 3}),
              "code_tests.suites[0].expected", "must be an array, got object"),
    Case("invalid_utf8", "tasks", 3, None, "not valid UTF-8",
         tasks=line_bytes(PY, b'{"benchmark": "\xff"}\n')),
    Case("empty_file", "tasks", None, None, "Evaluation input is empty",
         tasks=lambda lines: ["\n", "   \n"]),
]


def prediction_case(name, index, edit, field, message) -> Case:
    return Case(name, "predictions", index + 1, field, message, predictions=replace(index, edit))


PREDICTION_CASES = [
    prediction_case("text_missing", ARC, setting("text", delete=True), "text",
                    "missing required field (KeyError)"),
    prediction_case("text_number", EXACT, setting("text", value=1), "text",
                    "prediction text must be a string"),
    prediction_case("wall_seconds_zero", MATH, setting("wall_seconds", value=0), "wall_seconds",
                    "Invalid timing or token count in prediction"),
    prediction_case("wall_seconds_string", MC, setting("wall_seconds", value="0.25"),
                    "wall_seconds", "Invalid timing or token count in prediction"),
    prediction_case("generated_tokens_negative", PY, setting("generated_tokens", value=-1),
                    "generated_tokens", "Invalid timing or token count in prediction"),
    prediction_case("generated_tokens_fraction", EP, setting("generated_tokens", value=1.5),
                    "generated_tokens", "Invalid timing or token count in prediction"),
    prediction_case("benchmark_number", MC, setting("benchmark", value=7), "benchmark",
                    "must be a string"),
    prediction_case("id_null", EXACT, setting("id", value=None), "id",
                    "must be a string or a number"),
    prediction_case("id_not_in_the_task_set", MATH, setting("id", value="m9"), "id",
                    "Prediction IDs must match the complete task set: no task has the key"),
    prediction_case("duplicate_row", EXACT, lambda r: r.update(benchmark="mmlu", id=1), "id",
                    "Duplicate prediction ('mmlu', '1') (first on line 1)"),
    prediction_case("not_an_object", ARC, raw('"C"\n'), None,
                    "each prediction line must be a JSON object, got string"),
    prediction_case("invalid_json", PY, raw("{'text': 1}\n"), None, "invalid JSON"),
    Case("blank_line", "predictions", 3, None, "invalid JSON",
         predictions=lambda lines: lines[:2] + ["\n"] + lines[2:]),
    Case("missing_row", "predictions", None, None,
         "Prediction IDs must match the complete task set: no prediction for task "
         "('synthetic', '6') of {tasks}:6",
         predictions=lambda lines: lines[:-1]),
    Case("invalid_utf8", "predictions", 2, None, "not valid UTF-8",
         predictions=line_bytes(ARC, b'{"text": "\xfe"}\n')),
]


@dataclasses.dataclass(frozen=True)
class FlagCase:
    name: str
    argv: tuple[str, ...]
    flag: str | None  # named in the message (None: the message names a file instead)
    message: str
    modes: tuple[str, ...] = ("generate", "rescore")


FLAG_CASES = [
    FlagCase("max_new_tokens_zero", ("--max_new_tokens=0",), "--max_new_tokens",
             "Window size and generation budget must be positive"),
    FlagCase("window_size_zero", ("--window-size", "0"), "--window_size",
             "Window size and generation budget must be positive"),
    FlagCase("q_above_one", ("--q", "1.5"), "--q",
             "q must be in [0,1] and tau must be finite and nonnegative"),
    FlagCase("tau_negative", ("--tau=-1",), "--tau",
             "q must be in [0,1] and tau must be finite and nonnegative"),
    FlagCase("tau_nan", ("--tau", "nan"), "--tau",
             "q must be in [0,1] and tau must be finite and nonnegative"),
    FlagCase("position_penalty_negative", ("--position-penalty", "-0.5"), "--position_penalty",
             "position_penalty must be finite and nonnegative"),
    FlagCase("mode_unknown", ("--mode", "sideways"), "--mode", "sideways"),
    FlagCase("q_not_a_number", ("--q", "half"), "--q", "half"),
    FlagCase("workers_zero", ("--workers", "0"), "--workers", "must be at least 1"),
    FlagCase("batch_size_zero", ("--batch_size", "0"), "--batch_size", "must be at least 1"),
    FlagCase("unknown_flag", ("--max_tokens", "8"), "--max_tokens", "Unknown command line flag"),
    FlagCase("model_missing", ("--model", ""), "--model", "--model is required for generation",
             modes=("generate",)),
]

# Prompts the decoder refuses (generate mode: checked once the tokenizer is loaded).
PROMPT_CASES = [
    task_case("prompt_without_tokens", ARC, setting("prompt", value="   "), "prompt",
              "The prompt must contain at least one token"),
    task_case("prompt_too_long", EXACT, setting("prompt", value=" ".join(["one"] * 125)),
              "prompt", "Prompt length 125 plus max_new_tokens 8 exceeds max_position_embeddings "
                        "128"),
]


# --------------------------------------------------------------------------------------------
# Running a case
# --------------------------------------------------------------------------------------------


def _write(path, content) -> str:
    data = content if isinstance(content, bytes) else "".join(content).encode()
    path.write_bytes(data)
    return os.fspath(path)


def _listing(root) -> dict[str, bytes | None]:
    found = {}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories:
            found[os.path.relpath(os.path.join(directory, name), root)] = None
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, root)] = handle.read()
    return found


def _outputs(tmp_path, kind):
    """``(argv for --output, check)``: a path that does not exist (nor its parent), or an existing
    directory with a user's file in it (or, for --resume, a partial run)."""
    if kind == "absent":
        output = tmp_path / "runs" / "out"

        def check():
            assert not (tmp_path / "runs").exists()

        return ["--output", str(output)], check
    output = tmp_path / "existing"
    output.mkdir()
    (output / "notes.txt").write_text("mine\n")
    extra = []
    if kind == "partial":
        row = {**_prediction(SUITE[0], TEXTS[0], 0), "correct": True, "extracted": "B"}
        (output / "predictions.jsonl").write_text(json.dumps(row) + "\n" + '{"torn')
        extra = ["--resume"]
    before = _listing(output)

    def check():
        assert _listing(output) == before

    return ["--output", str(output), *extra], check


def _run(argv, capsys):
    status = evaluate.main([PROG, *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _inputs(tmp_path, case: Case | None):
    tasks = _dump(SUITE)
    predictions = _dump(_prediction(t, text, i) for i, (t, text) in enumerate(zip(SUITE, TEXTS)))
    if case is not None and case.tasks is not None:
        tasks = case.tasks(tasks)
    if case is not None and case.predictions is not None:
        predictions = case.predictions(predictions)
    return (_write(tmp_path / "tasks.jsonl", tasks),
            _write(tmp_path / "predictions.jsonl", predictions))


def _mode_argv(mode, predictions_path):
    return GENERATE_FLAGS if mode == "generate" else ["--predictions", predictions_path]


def _assert_one_line(status, out, err, *fragments):
    assert status == 2, err
    assert out == ""
    line = suites.error_after_phases(err, PROG)  # after the phase lines, as in a log
    for fragment in fragments:
        assert fragment in line, (fragment, line)


def _location(case: Case, paths: dict) -> str:
    where = paths[case.where]
    if case.line is not None:
        where += f":{case.line}"
    return where + (f": field {case.field!r}: " if case.field else ": ")


def _output_kind(index: int) -> str:
    return ("absent", "existing", "partial")[index % 3]


def _file_cases():
    for mode in ("rescore", "generate"):
        for index, case in enumerate(TASK_CASES):
            yield pytest.param(mode, case, _output_kind(index), id=f"{mode}-tasks-{case.name}")
    for index, case in enumerate(PREDICTION_CASES):
        yield pytest.param("rescore", case, _output_kind(index), id=f"rescore-predictions-{case.name}")
    for index, case in enumerate(PROMPT_CASES):  # these load the model: JAX starts
        yield pytest.param("generate", case, _output_kind(index), id=f"generate-prompt-{case.name}",
                           marks=pytest.mark.jax_backend)


@pytest.mark.parametrize("mode, case, output_kind", list(_file_cases()))
def test_malformed_file(tmp_path, capsys, mode, case, output_kind):
    tasks_path, predictions_path = _inputs(tmp_path, case)
    output_argv, output_unchanged = _outputs(tmp_path, output_kind)
    status, out, err = _run(["--input", tasks_path, *output_argv,
                             *_mode_argv(mode, predictions_path)], capsys)
    paths = {"tasks": tasks_path, "predictions": predictions_path}
    _assert_one_line(status, out, err, _location(case, paths) + case.message.format(
        tasks=tasks_path))
    output_unchanged()


def _flag_cases():
    for index, case in enumerate(FLAG_CASES):
        for mode in case.modes:
            yield pytest.param(mode, case, _output_kind(index), id=f"{mode}-flag-{case.name}")


@pytest.mark.parametrize("mode, case, output_kind", list(_flag_cases()))
def test_malformed_flag(tmp_path, capsys, mode, case, output_kind):
    tasks_path, predictions_path = _inputs(tmp_path, None)
    output_argv, output_unchanged = _outputs(tmp_path, output_kind)
    argv = ["--input", tasks_path, *output_argv, *_mode_argv(mode, predictions_path), *case.argv]
    status, out, err = _run(argv, capsys)
    _assert_one_line(status, out, err, case.flag, case.message)
    output_unchanged()


def test_the_table_has_sixty_cases_or_more():
    files = list(_file_cases())
    flag_runs = list(_flag_cases())
    assert len(TASK_CASES) + len(PREDICTION_CASES) + len(PROMPT_CASES) + len(FLAG_CASES) >= 60
    assert {p.values[0] for p in files + flag_runs} == {"rescore", "generate"}
    assert len(files) + len(flag_runs) >= 120


@pytest.mark.parametrize("mode", ["rescore", "generate"])
def test_output_that_is_a_file_or_not_fresh(tmp_path, capsys, mode):
    tasks_path, predictions_path = _inputs(tmp_path, None)
    mode_argv = _mode_argv(mode, predictions_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file\n")
    status, out, err = _run(["--input", tasks_path, "--output", str(blocker / "out"),
                             *mode_argv], capsys)
    _assert_one_line(status, out, err, str(blocker), "is not a directory")
    assert blocker.read_text() == "a file\n"
    used = tmp_path / "used"
    used.mkdir()
    (used / "summary.json").write_text("{}\n")
    status, out, err = _run(["--input", tasks_path, "--output", str(used), *mode_argv], capsys)
    _assert_one_line(status, out, err, str(used / "summary.json"),
                     "Use a fresh evaluation output directory")
    assert _listing(used) == {"summary.json": b"{}\n"}
    status, out, err = _run(["--input", str(tmp_path / "absent.jsonl"), "--output",
                             str(tmp_path / "new"), *mode_argv], capsys)
    _assert_one_line(status, out, err, str(tmp_path / "absent.jsonl"))
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------------------------
# The unedited suite is valid in both modes, and the corrected command runs into the same path
# --------------------------------------------------------------------------------------------


@pytest.mark.jax_backend
def test_the_unedited_suite_passes_every_check_of_both_modes(tmp_path):
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.data import resolve_builtin
    from alodlm_jax.generate import build_generator, check_task_prompts
    from alodlm_scoring.evaluation import load_predictions
    from alodlm_scoring.tasks import load_tasks

    tasks_path, predictions_path = _inputs(tmp_path, None)
    tasks = load_tasks(tasks_path)
    assert tasks == SUITE and tasks.lines == [1, 2, 3, 4, 5, 6]
    assert len(load_predictions(predictions_path, tasks)) == len(SUITE)
    generator = build_generator(model=resolve_builtin("builtin:tiny"), device="cpu",
                                engine="portable",
                                decode_config=DecodeConfig(max_new_tokens=8, window_size=4))
    check_task_prompts(generator, tasks)  # raises for a prompt the decoder would refuse


def test_corrected_command_runs_into_the_same_output(tmp_path, capsys):
    """A failed run leaves nothing behind, so the corrected command needs no new --output."""
    bad = TASK_CASES[[c.name for c in TASK_CASES].index("later_suite_misaligned")]
    tasks_path, predictions_path = _inputs(tmp_path, bad)
    output = tmp_path / "runs" / "out"
    argv = ["--output", str(output), "--predictions", predictions_path, "--workers", "1"]
    status, _, err = _run(["--input", tasks_path, *argv], capsys)
    assert status == 2 and "suites[1]" in err and not output.parent.exists()
    tasks_path, _ = _inputs(tmp_path, None)
    status, out, err = _run(["--input", tasks_path, *argv, "--print_summary_json"], capsys)
    assert status == 0, err
    summary = json.loads(out)
    assert summary["benchmark_count"] == len(SUITE)
    rows = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert [row["correct"] for row in rows] == [True, True, True, True, True, True]
