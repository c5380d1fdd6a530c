"""``alodlm-jax-evaluate --resume`` continues only the same run.

One generating run on the bundled tiny checkpoint, then resumes of it (interrupted after its first
row, or complete): every setting that can change a row is refused when it differs from the run's
record (``run.json``), before any work, in one line naming the flag with its recorded and its new
value, exit 2, every file as it was; the free settings (engine, batch size, workers) may differ,
and the protocol then says which part of the run used which.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import pytest

from alodlm_jax.cli import evaluate
from alodlm_jax.data import BUILTINS
from evaluation import suites

TASKS = [
    {"id": "1", "benchmark": "synthetic", "metric": "exact",
     "prompt": "user Return value one </s> assistant ", "answer": "one ."},
    {"id": 2, "benchmark": "other", "metric": "exact",
     "prompt": "user Return value two </s> assistant ", "answer": "two ."},
    {"id": "3", "benchmark": "synthetic", "metric": "exact",
     "prompt": "user Return value three </s> assistant ", "answer": "three ."},
]
SETTINGS = ["--device", "cpu", "--max-new-tokens", "6", "--window-size", "4", "--workers", "1"]


@dataclasses.dataclass(frozen=True)
class Finished:
    model: pathlib.Path
    tasks: pathlib.Path
    output: pathlib.Path

    def argv(self, output, *extra) -> list[str]:
        return ["alodlm-jax-evaluate", "--model", str(self.model), "--input", str(self.tasks),
                "--output", str(output), *SETTINGS, *extra]


def _write_tasks(path, tasks) -> pathlib.Path:
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Finished:
    base = tmp_path_factory.mktemp("same_run")
    model = base / "model"
    shutil.copytree(BUILTINS["builtin:tiny"], model)
    run = Finished(model, _write_tasks(base / "tasks.jsonl", TASKS), base / "run")
    assert evaluate.main(run.argv(run.output)) == 0
    return run


def _interrupted(finished: Finished, output: pathlib.Path, rows: int = 1) -> pathlib.Path:
    """A copy of the finished run as a kill after ``rows`` rows leaves it."""
    shutil.copytree(finished.output, output)
    (output / "summary.json").unlink()
    lines = (output / "predictions.jsonl").read_text().splitlines(keepends=True)
    (output / "predictions.jsonl").write_text("".join(lines[:rows]))
    return output


def _files(directory: pathlib.Path) -> dict:
    return {path.relative_to(directory): (path.stat().st_mode, path.read_bytes())
            for path in sorted(directory.rglob("*"))}


def _refused(argv, directory, capsys) -> str:
    before = _files(directory)
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err
    assert suites.error_after_phases(err).startswith("alodlm-jax-evaluate: error: cannot resume ")
    assert _files(directory) == before  # untouched
    return err


@pytest.mark.parametrize("extra, flag, recorded, new", [
    (["--q", "0.3"], "--q", "0.5", "0.3"),
    (["--tau", "0.2"], "--tau", "0.4", "0.2"),
    (["--mode", "left1"], "--mode", "entropy", "left1"),
    (["--window-size", "8"], "--window_size", "4", "8"),
    (["--max-new-tokens", "8"], "--max_new_tokens", "6", "8"),
    (["--position-penalty", "0.1"], "--position_penalty", "(not given)", "0.1"),
    (["--precision", "bf16"], "--precision", "fp32", "bf16"),
    (["--device", "tpu"], "--device", "cpu", "tpu"),
    (["--code_verdicts", "strict"], "--code_verdicts", "reference", "strict"),
    (["--code_sandbox", "off"], "--code_sandbox", "on", "off"),
])
@pytest.mark.parametrize("state", ["interrupted", "complete"])
def test_a_setting_that_changes_rows_is_refused(finished, tmp_path, capsys, extra, flag, recorded,
                                                new, state):
    output = (_interrupted(finished, tmp_path / "run") if state == "interrupted"
              else shutil.copytree(finished.output, tmp_path / "run"))
    err = _refused(finished.argv(output, "--resume", *extra), output, capsys)
    assert f"{flag} was {recorded} when the run started, now {new}" in err, err


def test_another_task_file_content_is_refused(finished, tmp_path, capsys):
    output = _interrupted(finished, tmp_path / "run")
    changed = [dict(task) for task in TASKS]
    changed[2]["answer"] = "four ."  # same ids, same order: only the content says it is another
    argv = finished.argv(output, "--resume")
    argv[argv.index("--input") + 1] = str(_write_tasks(tmp_path / "tasks.jsonl", changed))
    err = _refused(argv, output, capsys)
    assert "--input was sha256:" in err and "now sha256:" in err, err


def test_another_model_directory_is_refused(finished, tmp_path, capsys):
    output = _interrupted(finished, tmp_path / "run")
    copy = shutil.copytree(finished.model, tmp_path / "same_weights_elsewhere")
    argv = finished.argv(output, "--resume")
    argv[argv.index("--model") + 1] = str(copy)
    err = _refused(argv, output, capsys)
    assert f"--model was {finished.model} when the run started, now {copy}" in err, err


def test_changed_model_files_are_refused(finished, tmp_path, capsys):
    output = _interrupted(finished, tmp_path / "run")
    config = finished.model / "generation_config.json"
    original = config.read_bytes()
    try:
        config.write_bytes(original + b"\n")  # the same directory, another file
        err = _refused(finished.argv(output, "--resume"), output, capsys)
    finally:
        config.write_bytes(original)
    assert "--model files: generation_config.json was sha256:" in err, err


def test_a_recurrence_yaml_is_refused(finished, tmp_path, capsys):
    output = _interrupted(finished, tmp_path / "run")
    yaml = tmp_path / "model.yaml"
    yaml.write_text("model:\n  num_loops: 4\n")
    err = _refused(finished.argv(output, "--resume", "--model_config", str(yaml)), output, capsys)
    assert "--model_config was (not given) when the run started, now sha256:" in err, err


def test_rescoring_a_generating_run_is_refused(finished, tmp_path, capsys):
    output = _interrupted(finished, tmp_path / "run")
    argv = ["alodlm-jax-evaluate", "--input", str(finished.tasks), "--predictions",
            str(finished.output / "predictions.jsonl"), "--output", str(output), "--resume",
            "--workers", "1"]
    err = _refused(argv, output, capsys)
    assert "--predictions was (not given) when the run started, now sha256:" in err, err


def test_rows_without_a_run_record_are_refused(finished, tmp_path, capsys):
    output = _interrupted(finished, tmp_path / "run")
    (output / "run.json").unlink()
    err = _refused(finished.argv(output, "--resume"), output, capsys)
    assert "holds rows but no run.json" in err, err


def _tokens(directory):
    return [(row["id"], row["token_ids"], row["exit_depths"], row["correct"]) for row in
            map(json.loads, (directory / "predictions.jsonl").read_text().splitlines())]


def test_the_same_command_resumes_with_the_protocol_of_one_run(finished, tmp_path, capsys):
    output = _interrupted(finished, tmp_path / "run")
    assert evaluate.main(finished.argv(output, "--resume")) == 0, capsys.readouterr().err
    assert _tokens(output) == _tokens(finished.output)
    protocol = json.loads((output / "summary.json").read_text())["protocol"]
    finished_protocol = json.loads((finished.output / "summary.json").read_text())["protocol"]
    assert "parts" not in protocol
    assert protocol["decoder"] == finished_protocol["decoder"]
    record = json.loads((output / "run.json").read_text())
    assert [part["first_row"] for part in record["parts"]] == [0, 1]


@pytest.mark.parametrize("extra, free", [
    (["--engine", "portable"], {"decoder": "jax-xla-portable", "batch_size": 1}),
    pytest.param(["--batch_size", "2", "--workers", "2"],
                 {"decoder": "jax-xla-compiled", "batch_size": 2},
                 marks=pytest.mark.slow),  # compiles the batch programs
])
def test_free_settings_may_differ_and_the_protocol_says_which_part_used_which(
        finished, tmp_path, capsys, extra, free):
    output = _interrupted(finished, tmp_path / "run")
    assert evaluate.main(finished.argv(output, "--resume", *extra)) == 0, capsys.readouterr().err
    assert _tokens(output) == _tokens(finished.output)  # no token or verdict moved
    protocol = json.loads((output / "summary.json").read_text())["protocol"]
    first = {"decoder": "jax-xla-compiled", "batch_size": 1, "mesh": None}
    assert protocol["parts"] == [{"rows": [0, 1], **first},
                                 {"rows": [1, 3], **first, **free}]
    assert protocol["decoder"] == free["decoder"]
