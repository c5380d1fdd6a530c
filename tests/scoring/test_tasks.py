"""Load-time validation of the task file (SCORING.md §2.1, §2.2, decision D8)."""

from __future__ import annotations

import hashlib
import json

import pytest

from alodlm_scoring.errors import TaskFileError
from alodlm_scoring.tasks import load_tasks, sha256_file, task_key

_MISSING = object()
GOOD = {"benchmark": "b", "id": 1, "metric": "exact", "prompt": "p", "answer": "x"}
TESTS = "assert f(1) == 1"
CODE_TESTS = {"dataset": "humaneval", "entry_point": "f",
              "suites": [{"inputs": [[1]], "expected": [1], "reference_seconds": [0.001]}]}


def write_lines(tmp_path, lines, name="tasks.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def dumps(**overrides):
    record = dict(GOOD)
    for key, value in overrides.items():
        if value is _MISSING:
            record.pop(key)
        else:
            record[key] = value
    return json.dumps(record)



def test_loads_records_in_order_and_skips_blank_lines(tmp_path):
    path = write_lines(
        tmp_path,
        [dumps(id=2), "", "   \t", dumps(id="x", metric="python_tests", answer=_MISSING,
                                         tests=TESTS)],
    )
    tasks = load_tasks(path)
    assert [task["id"] for task in tasks] == [2, "x"]
    assert tasks[0] == dict(GOOD, id=2)


def test_task_key_stringifies_the_id():
    assert task_key({"benchmark": "b", "id": 1}) == ("b", "1")
    assert task_key({"benchmark": "b", "id": "1"}) == ("b", "1")


def test_extra_fields_and_null_answer_are_accepted(tmp_path):
    # `null` becomes the text "None", which passes the reference check (quirk 11).
    path = write_lines(tmp_path, [dumps(answer=None, extra=[1, 2])])
    assert load_tasks(path)[0]["answer"] is None


def test_whitespace_only_prompt_is_accepted(tmp_path):
    assert load_tasks(write_lines(tmp_path, [dumps(prompt="  ")]))[0]["prompt"] == "  "


def test_code_metrics_need_no_answer(tmp_path):
    lines = [dumps(id=1, metric="python_tests", answer=_MISSING, tests=TESTS),
             dumps(id=2, metric="evalplus", answer="", code_tests=CODE_TESTS)]
    assert len(load_tasks(write_lines(tmp_path, lines))) == 2


@pytest.mark.parametrize(
    "line, field, message",
    [
        (dumps(benchmark=_MISSING), "benchmark", "missing required field"),
        (dumps(id=_MISSING), "id", "missing required field"),
        (dumps(metric=_MISSING), "metric", "missing required field"),
        (dumps(metric="foo"), "metric", "Unsupported metric 'foo'"),
        (dumps(prompt=_MISSING), "prompt", "Each task needs a fully formatted prompt"),
        (dumps(prompt=""), "prompt", "Each task needs a fully formatted prompt"),
        (dumps(prompt=5), "prompt", "Each task needs a fully formatted prompt"),
        (dumps(answer=_MISSING), "answer", "Each scored task needs a reference answer"),
        (dumps(answer="  "), "answer", "Each scored task needs a reference answer"),
        (dumps(answer=""), "answer", "Each scored task needs a reference answer"),
    ],
)
def test_each_validation_error_names_file_line_and_field(tmp_path, line, field, message):
    path = write_lines(tmp_path, [dumps(id=0), "", line])
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    error = caught.value
    assert (error.file, error.line, error.field) == (str(path), 3, field)
    assert message in error.message
    assert str(error) == f"{path}:3: field {field!r}: {error.message}"
    assert "\n" not in str(error)
    assert isinstance(error, ValueError)


def test_message_format_matches_the_documented_example(tmp_path):
    (tmp_path / "tasks.jsonl").write_text(dumps(id=0) + "\n\n" + dumps(metric="foo") + "\n")
    with pytest.raises(TaskFileError) as caught:
        load_tasks(tmp_path / "tasks.jsonl")
    assert str(caught.value).endswith("tasks.jsonl:3: field 'metric': Unsupported metric 'foo'")


def test_integer_and_string_ids_collide(tmp_path):
    path = write_lines(tmp_path, [dumps(id=1), dumps(id="1")])
    with pytest.raises(TaskFileError, match="Duplicate benchmark and task ID") as caught:
        load_tasks(path)
    assert (caught.value.line, caught.value.field) == (2, "id")


def test_same_id_in_different_benchmarks_is_fine(tmp_path):
    path = write_lines(tmp_path, [dumps(id=1), dumps(id=1, benchmark="other")])
    assert len(load_tasks(path)) == 2


@pytest.mark.parametrize(
    "line, expected_message",
    [
        # Order of §2.2: identity fields, then duplicate, then metric, prompt, answer.
        (dumps(id=0, metric="foo"), "Duplicate benchmark and task ID"),
        (dumps(id=1, metric="foo", prompt=""), "Unsupported metric"),
        (dumps(id=1, prompt="", answer=""), "Each task needs a fully formatted prompt"),
        (dumps(id=0, metric=_MISSING), "missing required field"),
    ],
)
def test_validation_order(tmp_path, line, expected_message):
    with pytest.raises(TaskFileError, match=expected_message):
        load_tasks(write_lines(tmp_path, [dumps(id=0), line]))


def test_json_parse_error_reports_file_and_line(tmp_path):
    path = write_lines(tmp_path, [dumps(id=0), "", '{"benchmark": "b",'])
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    assert caught.value.line == 3 and caught.value.field is None
    assert str(caught.value).startswith(f"{path}:3: invalid JSON: ")


def test_non_object_line_is_reported(tmp_path):
    with pytest.raises(TaskFileError, match=r":1: each task line must be a JSON object"):
        load_tasks(write_lines(tmp_path, ["[1, 2]"]))


def test_unhashable_benchmark_is_reported(tmp_path):
    with pytest.raises(TaskFileError,
                       match=r":1: field 'benchmark': must be a string, got array"):
        load_tasks(write_lines(tmp_path, [dumps(benchmark=["b"])]))


def test_invalid_utf8_is_reported_with_its_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(dumps(id=0).encode() + b"\n" + b'{"benchmark": "\xff"}\n')
    with pytest.raises(TaskFileError, match=r":2: not valid UTF-8"):
        load_tasks(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_input(tmp_path, content):
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    assert str(caught.value) == f"{path}: Evaluation input is empty"
    assert caught.value.line is None


def test_crlf_lines_are_accepted(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes((dumps(id=0) + "\r\n\r\n" + dumps(id=1) + "\r\n").encode())
    assert [task["id"] for task in load_tasks(path)] == [0, 1]


def test_missing_file_raises_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "absent.jsonl")


def test_sha256_file_matches_hashlib_across_block_boundaries(tmp_path):
    data = bytes(range(256)) * 9000  # > 2 MiB, not a multiple of the block size
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
