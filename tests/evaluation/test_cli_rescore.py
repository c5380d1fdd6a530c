"""``alodlm-jax-evaluate`` in rescore mode (SCORING.md §6, D8; the user guide's command)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from alodlm_jax.cli import evaluate
from alodlm_scoring.summary_table import COLUMNS, summary_table

from . import suites

PROG = "alodlm-jax-evaluate"


def _small_suite(directory):
    pairs = [
        (suites.mc_task(1), "The answer is (B)."),
        (suites.mc_task(2, answer="C", benchmark="arc", metric="arc"), "A"),
        (suites.exact_task("1"), "one ."),
        (suites.math_task("m"), "\\boxed{42}"),
    ]
    return suites.write_suite(directory, pairs)


def _run(argv, capsys):
    """Runs the command in-process; stdout is summary.json's JSON (``--print_summary_json``)."""
    status = evaluate.main([PROG, *argv, "--print_summary_json"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _elapsed(table: str) -> float:
    """The elapsed seconds of a closing table's time line (exactly one)."""
    lines = [line for line in table.splitlines() if line.startswith("time: ")]
    assert len(lines) == 1, table
    match = re.fullmatch(r"time: (\d+\.\d) s elapsed \(the whole command\)", lines[0])
    assert match, lines[0]  # rescoring compiles nothing: no compile time
    return float(match.group(1))


def test_user_guide_command_verbatim_console_script(tmp_path):
    """The guide's rescoring command, with the project's program name, as a real process."""
    tasks_path, predictions_path = _small_suite(tmp_path)
    executable = shutil.which(PROG) or pytest.skip(f"{PROG} is not installed")
    completed = subprocess.run(
        [executable, "--input", tasks_path, "--predictions", predictions_path,
         "--output", "outputs/rescored"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    out = tmp_path / "outputs" / "rescored"
    summary_text = (out / "summary.json").read_text()
    summary = json.loads(summary_text)
    # It ends with the short table, naming the files as the command was given them, with the
    # command's own elapsed time.
    elapsed = _elapsed(completed.stdout)
    assert completed.stdout == summary_table(summary, ["outputs/rescored/predictions.jsonl",
                                                       "outputs/rescored/summary.json"],
                                             elapsed_seconds=elapsed)
    assert summary["benchmark_count"] == 4
    protocol = summary["protocol"]
    assert protocol["decode"] is None and protocol["device"] is None
    assert protocol["precision"] is None
    assert protocol["decoder"] == "supplied-predictions"
    digest = hashlib.sha256(open(predictions_path, "rb").read()).hexdigest()
    assert protocol["predictions_sha256"] == digest
    assert protocol["input_sha256"] == hashlib.sha256(open(tasks_path, "rb").read()).hexdigest()
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 4


def test_the_closing_table_and_the_summary_json_flag(tmp_path, capsys):
    tasks_path, predictions_path = _small_suite(tmp_path)
    output = tmp_path / "out"
    argv = [PROG, "--input", tasks_path, "--predictions", predictions_path, "--output"]
    assert evaluate.main([*argv, str(output)]) == 0
    table = capsys.readouterr().out
    summary = json.loads((output / "summary.json").read_text())
    lines = table.splitlines()
    assert [cell.strip() for cell in lines[0].split("|")[1:-1]] == list(COLUMNS)
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in lines[2:]
            if line.startswith("|")}
    assert list(rows) == list(summary["benchmarks"])
    for name, cells in rows.items():
        values = summary["benchmarks"][name]
        assert [cell.strip() for cell in cells] == [
            str(values["examples"]), str(values["correct"]), f"{values['score_percent']:.2f}",
            f"{values['tokens_per_second']:.1f}"]
    assert f"macro score: {summary['macro_score_percent']:.2f} %" in table
    assert f"{summary['suite_tokens_per_second']:.1f} tokens/s" in table
    assert (f"over a generation wall time of {summary['suite_wall_seconds']:.3f} s "
            "(the predictions' wall_seconds summed)") in table
    _elapsed(table)
    assert lines[-2:] == [f"predictions.jsonl  {output / 'predictions.jsonl'}",
                          f"summary.json       {output / 'summary.json'}"]
    # --print_summary_json: stdout is the file's JSON (the reference's output), the table stderr.
    # (--quiet: no phase or progress lines above the table.)
    assert evaluate.main([*argv, str(tmp_path / "again"), "--print_summary_json", "--quiet"]) == 0
    captured = capsys.readouterr()
    again = (tmp_path / "again" / "summary.json").read_text()
    assert captured.out == again and captured.err == summary_table(
        json.loads(again), [str(tmp_path / "again" / name)
                            for name in ("predictions.jsonl", "summary.json")],
        elapsed_seconds=_elapsed(captured.err))


@pytest.mark.parametrize("spelling", ["dash", "underscore"])
def test_decoding_flags_in_both_spellings(tmp_path, capsys, spelling):
    tasks_path, predictions_path = _small_suite(tmp_path)
    flags = {"dash": ["--max-new-tokens", "64", "--window-size=8", "--position-penalty", "0.1",
                      "--model-config", "x.yaml"],
             "underscore": ["--max_new_tokens", "64", "--window_size=8", "--position_penalty",
                            "0.1", "--model_config", "x.yaml"]}[spelling]
    status, out, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                             "--output", str(tmp_path / "out"), "--q", "0.4", *flags], capsys)
    assert status == 0, err
    assert evaluate.FLAGS.max_new_tokens == 64 and evaluate.FLAGS.window_size == 8
    assert evaluate.FLAGS.position_penalty == 0.1 and evaluate.FLAGS.model_config == "x.yaml"
    assert json.loads(out)["protocol"]["decode"] is None


def test_dash_spellings_are_normalized_only_for_known_flags():
    from alodlm_jax.cli.flags import normalize_argv

    argv = [PROG, "--max-new-tokens=5", "--window-size", "4", "--no-resume", "--model-config",
            "a-b", "--unknown-flag", "--", "--max-new-tokens"]
    assert normalize_argv(argv, evaluate.FLAGS) == [
        PROG, "--max_new_tokens=5", "--window_size", "4", "--noresume", "--model_config", "a-b",
        "--unknown-flag", "--", "--max-new-tokens"]


def test_bad_pool_size_is_a_usage_error(tmp_path, capsys):
    tasks_path, predictions_path = _small_suite(tmp_path)
    output = tmp_path / "out"
    status, _, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                           "--output", str(output), "--workers", "0"], capsys)
    _assert_one_line_error(status, err, output, "--workers must be at least 1")


def test_flags_reset_between_in_process_runs(tmp_path, capsys):
    tasks_path, predictions_path = _small_suite(tmp_path)
    _run(["--input", tasks_path, "--predictions", predictions_path, "--output",
          str(tmp_path / "a"), "--window-size", "3"], capsys)
    _run(["--input", tasks_path, "--predictions", predictions_path, "--output",
          str(tmp_path / "b")], capsys)
    assert evaluate.FLAGS.window_size == 16


def _assert_one_line_error(status, err, output_dir, *fragments):
    assert status == 2
    line = suites.error_after_phases(err, PROG)  # after the phase lines, as in a log
    for fragment in fragments:
        assert fragment in line, line
    assert not os.path.exists(os.path.join(output_dir, "summary.json"))
    assert not os.path.exists(os.path.join(output_dir, "predictions.jsonl"))  # D8: still fresh


def _rewrite_predictions(path, edit):
    lines = open(path).read().splitlines(keepends=True)
    open(path, "w").write("".join(edit(lines)))


BAD_PREDICTIONS = {
    "missing_field": (lambda lines: [lines[0].replace('"text": ', '"txt": ')] + lines[1:],
                      ["predictions.jsonl:1:", "'text'"]),
    "bad_json_line": (lambda lines: lines[:2] + ["{not json\n"] + lines[2:], [":3:", "invalid JSON"]),
    "blank_line": (lambda lines: lines[:1] + ["\n"] + lines[1:], [":2:", "invalid JSON"]),
    "duplicate": (lambda lines: lines + [lines[1]], [":5:", "Duplicate prediction"]),
    "mismatched_ids": (lambda lines: lines[:3] + [lines[3].replace('"id": "m"', '"id": "zz"')],
                       ["Prediction IDs must match the complete task set"]),
    "missing_row": (lambda lines: lines[:3], ["Prediction IDs must match the complete task set"]),
    # The last row is invalid: D8 checks every row before anything is written.
    "invalid_timing": (lambda lines: lines[:3] + [lines[3].replace('"wall_seconds": 0.4',
                                                                   '"wall_seconds": 0')],
                       [":4:", "Invalid timing or token count in prediction", "wall_seconds"]),
    "negative_tokens": (lambda lines: lines[:3] + [lines[3].replace('"generated_tokens": 4',
                                                                    '"generated_tokens": -1')],
                        ["Invalid timing or token count in prediction", "generated_tokens"]),
}


@pytest.mark.parametrize("case", sorted(BAD_PREDICTIONS))
def test_bad_predictions_fail_cleanly(tmp_path, capsys, case):
    tasks_path, predictions_path = _small_suite(tmp_path)
    edit, fragments = BAD_PREDICTIONS[case]
    _rewrite_predictions(predictions_path, edit)
    output = tmp_path / "out"
    status, out, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                             "--output", str(output)], capsys)
    _assert_one_line_error(status, err, output, *fragments)
    assert out == ""


@pytest.mark.parametrize(
    "flag, message",
    [(["--q", "1.5"], "q must be in [0,1] and tau must be finite and nonnegative"),
     (["--tau", "-1"], "q must be in [0,1] and tau must be finite and nonnegative"),
     (["--window-size", "0"], "Window size and generation budget must be positive"),
     (["--position-penalty", "-0.5"], "position_penalty must be finite and nonnegative")],
)
def test_decoding_flags_are_validated_in_rescore_mode(tmp_path, capsys, flag, message):
    tasks_path, predictions_path = _small_suite(tmp_path)
    output = tmp_path / "out"
    status, _, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                           "--output", str(output), *flag], capsys)
    _assert_one_line_error(status, err, output, message)


def test_bad_task_file_and_missing_files(tmp_path, capsys):
    tasks_path, predictions_path = _small_suite(tmp_path)
    _rewrite_predictions(tasks_path, lambda lines: lines + ['{"benchmark": "x", "id": 1}\n'])
    output = tmp_path / "out"
    status, _, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                           "--output", str(output)], capsys)
    _assert_one_line_error(status, err, output, "tasks.jsonl:5", "metric")
    status, _, err = _run(["--input", str(tmp_path / "nope.jsonl"), "--predictions",
                           predictions_path, "--output", str(output)], capsys)
    _assert_one_line_error(status, err, output, "nope.jsonl")
    status, _, err = _run(["--predictions", predictions_path, "--output", str(output)], capsys)
    _assert_one_line_error(status, err, output, "--input")


def test_fresh_directory_is_required(tmp_path, capsys):
    tasks_path, predictions_path = _small_suite(tmp_path)
    output = tmp_path / "out"
    argv = ["--input", tasks_path, "--predictions", predictions_path, "--output", str(output)]
    assert _run(argv, capsys)[0] == 0
    before = (output / "predictions.jsonl").read_bytes(), (output / "summary.json").read_bytes()
    status, _, err = _run(argv, capsys)
    assert status == 2
    suites.error_after_phases(err, PROG)
    assert "Use a fresh evaluation output directory" in err
    assert ((output / "predictions.jsonl").read_bytes(), (output / "summary.json").read_bytes()) == before


def test_other_files_in_the_output_directory_are_tolerated(tmp_path, capsys):
    tasks_path, predictions_path = _small_suite(tmp_path)
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("hello")
    status, _, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                           "--output", str(output)], capsys)
    assert status == 0, err


def test_code_task_checks_run_when_the_task_file_is_loaded(tmp_path, capsys):
    """D9: the check a scoring worker would fail on is made up front, naming file, line, field."""
    pairs = [(suites.mc_task(1), "(B)"), (suites.python_task("bad", tests="  "),
                                          suites.identity_code())]
    tasks_path, predictions_path = suites.write_suite(tmp_path, pairs)
    status, _, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                           "--output", str(tmp_path / "out"), "--workers", "1"], capsys)
    assert status == 2
    assert suites.error_after_phases(err, PROG) == (
        f"{PROG}: error: {tasks_path}:2: field 'tests': "
        "python_tests requires a nonempty local test program")
    assert not (tmp_path / "out").exists()


def test_supplied_verdicts_are_recomputed_and_timing_copied(tmp_path, capsys):
    task = suites.mc_task(1)
    row = suites.prediction(task, "The answer is (C).", tokens=7, seconds=2, correct=True,
                            extracted="B", extra="kept")
    tasks_path = suites.write_jsonl(tmp_path / "tasks.jsonl", [task])
    predictions_path = suites.write_jsonl(tmp_path / "predictions.jsonl", [row])
    status, out, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                             "--output", str(tmp_path / "out")], capsys)
    assert status == 0, err
    line = (tmp_path / "out" / "predictions.jsonl").read_text()
    assert line == ('{"benchmark": "mmlu", "id": 1, "text": "The answer is (C).", '
                    '"generated_tokens": 7, "wall_seconds": 2, "correct": false, '
                    '"extracted": "C", "extra": "kept"}\n')
    summary = json.loads(out)
    assert summary["suite_wall_seconds"] == 2 and summary["benchmarks"]["mmlu"]["correct"] == 0


def test_rescore_mode_never_imports_jax(tmp_path):
    tasks_path, predictions_path = _small_suite(tmp_path)
    code = (
        "import sys\n"
        "from alodlm_jax.cli import evaluate\n"
        f"status = evaluate.main(['x', '--input', {tasks_path!r}, '--predictions',"
        f" {predictions_path!r}, '--output', {str(tmp_path / 'out')!r}])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('jax', 'jaxlib', 'flax', 'torch', 'transformers'))\n"
        "sys.stderr.write(f'STATUS {status} LOADED {loaded}\\n')\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120)
    assert "STATUS 0 LOADED []" in completed.stderr, completed.stderr


def test_help_explains_every_flag(capsys):
    status, out, _ = _run(["--help"], capsys)
    assert status == 0
    for name in ("model", "model_config", "device", "precision", "q", "tau", "mode",
                 "window_size", "max_new_tokens", "position_penalty", "input", "output",
                 "predictions", "engine", "workers", "resume", "compilation_cache_dir",
                 "batch_size"):
        assert f"--{name}" in out
    assert "--max-new-tokens" in out


def test_generate_mode_requires_a_model(tmp_path, capsys):
    tasks_path, _ = _small_suite(tmp_path)
    output = tmp_path / "out"
    status, _, err = _run(["--input", tasks_path, "--output", str(output)], capsys)
    _assert_one_line_error(status, err, output, "--model is required for generation")


@pytest.mark.slow
def test_workflow_generate_then_rescore(tmp_path, capsys):
    """§10.2 rows 1d/1e: generate mode on the tiny checkpoint, then rescore its predictions."""
    from alodlm_jax.testing.tiny_checkpoint import build_tiny_checkpoint

    model = build_tiny_checkpoint(tmp_path / "model")
    task = {"id": "1", "benchmark": "synthetic", "metric": "exact",
            "prompt": "user Return value one </s> assistant ", "answer": "one ."}
    tasks_path = suites.write_jsonl(tmp_path / "tasks.jsonl", [task])
    generated = tmp_path / "evaluated"
    status, out, err = _run(["--model", str(model), "--input", tasks_path, "--output",
                             str(generated), "--max-new-tokens", "6", "--window-size", "4",
                             "--device", "cpu"], capsys)
    assert status == 0, err
    first = json.loads(out)
    assert first["benchmark_count"] == 1 and first["benchmarks"]["synthetic"]["examples"] == 1
    assert first["protocol"]["decoder"] == "jax-xla-compiled"  # the default engine
    assert first["protocol"]["decode"]["max_new_tokens"] == 6
    status, out, err = _run(["--input", tasks_path, "--predictions",
                             str(generated / "predictions.jsonl"), "--output",
                             str(tmp_path / "rescored")], capsys)
    assert status == 0, err
    second = json.loads(out)
    assert second["macro_score_percent"] == first["macro_score_percent"]
    assert second["suite_wall_seconds"] == first["suite_wall_seconds"]
    assert [second["protocol"][k] for k in ("decode", "device", "precision")] == [None] * 3


def test_sample_suite_demo(tmp_path, capsys):
    """The README demo: the shipped sample suite rescored, every metric, right and wrong."""
    import importlib.resources

    suite = importlib.resources.files("alodlm_jax.data") / "sample_suite"
    tasks_path, predictions_path = str(suite / "tasks.jsonl"), str(suite / "predictions.jsonl")
    status, out, err = _run(["--input", tasks_path, "--predictions", predictions_path,
                             "--output", str(tmp_path / "x")], capsys)
    assert status == 0, err
    rows = [json.loads(line) for line in (tmp_path / "x" / "predictions.jsonl").read_text().splitlines()]
    tasks = [json.loads(line) for line in open(tasks_path)]
    assert {task["metric"] for task in tasks} == {"arc", "mmlu", "mmlu_pro", "gpqa", "math",
                                                  "exact", "python_tests", "evalplus"}
    verdicts = {}
    for task, row in zip(tasks, rows):
        verdicts.setdefault(task["metric"], set()).add(row["correct"])
    assert all(seen == {True, False} for seen in verdicts.values()), verdicts
    summary = json.loads(out)
    # The prepared slice's eleven guide benchmarks, then the hand-written rows grouped by metric
    # under names that say what they are (never a guide name, nor one that reads as a duplicate).
    from alodlm_prepare.sample_slice import GUIDE_NAMES

    names = list(summary["benchmarks"])
    assert names[:11] == sorted(GUIDE_NAMES)
    assert names[11:] == [f"edge-cases/{metric}" for metric in sorted(verdicts)]
    assert summary["protocol"]["scoring_failures"] == []
