"""``alodlm-jax-lm-eval --help``: our part first (the model, its model_args keys, an example),
then lm-eval's; and the command's flags in dash or underscore spelling."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval")

from alodlm_jax.cli import lm_eval as lm_eval_cli  # noqa: E402
from alodlm_jax.harness import MODEL_NAME  # noqa: E402
from alodlm_jax.harness.model_args import MODEL_ARG_KEYS  # noqa: E402


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["run", "--help"]])
def test_help_names_the_model_and_its_keys_before_lm_evals_help(argv, capsys):
    status = lm_eval_cli.main(["alodlm-jax-lm-eval", *argv])
    out = capsys.readouterr().out
    assert status == 0
    ours, sep, theirs = out.partition("lm-eval's own help follows.")
    assert sep and "usage:" in theirs and "usage:" not in ours  # ours first, then lm-eval's
    assert f"model '{MODEL_NAME}'" in ours
    listed = {line.split()[0] for line in ours.splitlines()
              if line.startswith("  ") and not line.startswith("   ")}
    assert {"pretrained", *MODEL_ARG_KEYS} - {"model"} <= listed
    assert "(default: '0.4')" in next(line for line in ours.splitlines()
                                      if line.split()[:1] == ["tau"])  # the evaluate default
    assert f"--model {MODEL_NAME}" in ours and "--model_args pretrained=" in ours


def test_dash_spellings_are_lm_evals_underscore_flags():
    assert lm_eval_cli._underscored(
        ["--model-args", "pretrained=x,window-size=4", "--output-path=o-dir", "-M", "my-model",
         "--tasks", "my-task", "--apply-chat-template"]) == [
        "--model_args", "pretrained=x,window-size=4", "--output_path=o-dir", "-M", "my-model",
        "--tasks", "my-task", "--apply_chat_template"]


def test_a_dash_spelled_flag_reaches_our_model(tmp_path, monkeypatch, capsys):
    """test_lm_eval_runs's bad-key refusal, with --model-args and --include-path."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "data.jsonl").write_text(json.dumps({"question": "t20", "answer": "t1"}) + "\n")
    (tmp_path / "dash_task.yaml").write_text("\n".join([
        "task: dash_task", "dataset_path: json", "dataset_kwargs:", "  data_files:",
        f"    test: {tmp_path / 'data.jsonl'}", "test_split: test", "output_type: generate_until",
        "doc_to_text: '{{question}}'", "doc_to_target: '{{answer}}'"]) + "\n")
    status = lm_eval_cli.main(["alodlm-jax-lm-eval", "--model-args", "pretrained=builtin:tiny,windowsize=4",
                               "--tasks", "dash_task", "--include-path", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2  # our model read the args and refused the key, in one line
    assert [line for line in err.splitlines() if "error:" in line][0].startswith(
        "alodlm-jax-lm-eval: error: model_args: unknown key 'windowsize'")
