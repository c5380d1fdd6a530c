"""``alodlm-jax-prepare`` on the command line: options, determinism, the manifest and bad input."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil

import pytest

import alodlm_jax.data
from alodlm_prepare.choices import gpqa_option_order
from alodlm_prepare.fixtures import GSM8K_TRAIN, ROWS

from .helpers import read_rows, run_prepare, source_flags

TINY = pathlib.Path(alodlm_jax.data.__file__).parent / "tiny_checkpoint"


def _one_line_error(status, out, err, *needles):
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alodlm-jax-prepare: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _manifest(path) -> dict:
    return json.loads(pathlib.Path(str(path) + ".manifest.json").read_text())


def test_names_are_case_insensitive_and_rows_use_the_guides_spelling(tmp_path, sources, capsys):
    out = tmp_path / "suite.jsonl"
    status, stdout, err = run_prepare(["--benchmark", "arc-c,humaneval+,mbpp+", "--output", str(out)]
                                      + source_flags(sources, ("ARC-C", "HumanEval+", "MBPP+")),
                                      capsys)
    assert status == 0, err
    assert stdout.strip() == str(out)
    assert [row["benchmark"] for row in read_rows(out)] == ["ARC-C"] * 3 + ["HumanEval+"] * 3 + [
        "MBPP+"] * 3


def test_unknown_benchmark(tmp_path, capsys):
    _one_line_error(*run_prepare(["--benchmark", "ARC-C,HellaSwag", "--output",
                                  str(tmp_path / "s.jsonl")], capsys),
                    "unknown benchmark 'HellaSwag'", "GPQA-Diamond", "HumanEval+")
    assert not any(tmp_path.iterdir())


def test_source_with_the_wrong_columns_names_the_expected_ones(tmp_path, capsys):
    import pyarrow
    import pyarrow.parquet

    bad = tmp_path / "arc.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(
        [{"id": "q1", "question": "Why?", "options": ["a", "b"], "answer": "A"}]), bad)
    out = tmp_path / "out" / "suite.jsonl"
    _one_line_error(*run_prepare(["--benchmark", "ARC-E", "--source", str(bad), "--output",
                                  str(out)], capsys),
                    str(bad), "expects the columns (id, question, choices, answerKey)",
                    "(answer, id, options, question)")
    assert not (tmp_path / "out").exists()


def test_missing_local_source_and_hub_ids_for_evalplus(tmp_path, capsys):
    out = str(tmp_path / "s.jsonl")
    _one_line_error(*run_prepare(["--benchmark", "GSM8K", "--source", "./missing.parquet",
                                  "--output", out], capsys), "./missing.parquet", "no such file")
    _one_line_error(*run_prepare(["--benchmark", "HumanEval", "--source", "evalplus/humanevalplus",
                                  "--output", out], capsys), "release files")


def test_the_default_hub_source_is_not_downloaded_offline(tmp_path, capsys):
    _one_line_error(*run_prepare(["--benchmark", "ARC-C", "--output", str(tmp_path / "s.jsonl")],
                                 capsys), "could not load the Hugging Face dataset 'allenai/ai2_arc'")


def test_a_gold_label_outside_the_options_names_the_row(tmp_path, capsys):
    import pyarrow
    import pyarrow.parquet

    rows = [dict(row) for row in ROWS["ARC-E"]]
    rows[1]["answerKey"] = "E"
    bad = tmp_path / "arc.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), bad)
    _one_line_error(*run_prepare(["--benchmark", "ARC-E", "--source", str(bad), "--output",
                                  str(tmp_path / "s.jsonl")], capsys),
                    "Fixture_ARC_E_2", "'E' is not one of the option labels A, B, C, D")


def test_a_failed_run_leaves_the_output_as_it_was(tmp_path, sources, capsys):
    out = tmp_path / "suite.jsonl"
    out.write_text("previous suite\n")
    _one_line_error(*run_prepare(["--benchmark", "MMLU", "--source", str(sources["MMLU"]),
                                  "--template", str(tmp_path / "missing.jinja"), "--output",
                                  str(out)], capsys), "missing.jinja")
    assert out.read_text() == "previous suite\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite.jsonl"]


def test_a_row_the_loader_rejects_is_reported_as_a_bug(tmp_path, sources, capsys, monkeypatch):
    from alodlm_prepare import suite
    from alodlm_scoring.errors import TaskFileError

    def reject(path):
        raise TaskFileError("Each task needs a fully formatted prompt", file=path, line=1,
                            field="prompt")

    monkeypatch.setattr(suite, "load_tasks", reject)
    status, out, err = run_prepare(["--benchmark", "MMLU", "--source", str(sources["MMLU"]),
                                    "--output", str(tmp_path / "s.jsonl")], capsys)
    assert status == 1 and out == ""
    assert "a bug in alodlm-jax-prepare" in err and "fully formatted prompt" in err
    assert len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_output_and_manifest_are_stable_across_runs(tmp_path, sources, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # a cold cache for this test
    names = ("GPQA-Diamond", "HumanEval+", "MBPP+")
    runs = []
    for run in range(3):
        out = tmp_path / f"run{run}" / "suite.jsonl"
        status, _, err = run_prepare(["--benchmark", ",".join(names), "--output", str(out)]
                                     + source_flags(sources, names), capsys)
        assert status == 0, err
        runs.append((out.read_bytes(), _manifest(out)))
    (first, cold), (second, warm), (third, warm_again) = runs
    assert first == second == third  # timings are measured once, then read from the cache
    assert warm == warm_again
    for name in ("HumanEval+", "MBPP+"):
        assert cold["benchmarks"][name]["groundtruth"]["from_cache"] == []
        measured = cold["benchmarks"][name]["groundtruth"]["measured"]
        assert warm["benchmarks"][name]["groundtruth"] == {"measured": [], "from_cache": measured}
        cold["benchmarks"][name].pop("groundtruth"), warm["benchmarks"][name].pop("groundtruth")
    assert cold == warm  # nothing else differs
    manifest = warm_again
    assert manifest["suite_sha256"] == hashlib.sha256(third).hexdigest()
    assert manifest["rows"] == 9 and manifest["seed"] == 0 and manifest["thinking"] is False
    assert {"evalplus", "datasets", "transformers"} <= set(manifest["versions"])
    gpqa = manifest["benchmarks"]["GPQA-Diamond"]
    assert gpqa["source"]["files"][0]["sha256"] == hashlib.sha256(
        sources["GPQA-Diamond"].read_bytes()).hexdigest()
    assert gpqa["template"]["template"] == "default:multiple_choice.jinja"
    assert set(gpqa["option_orders"]) == {row["Record ID"] for row in ROWS["GPQA-Diamond"]}


def test_without_the_cache_nothing_is_stored(tmp_path, sources, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", "HumanEval", "--nogroundtruth_cache", "--output",
                                  str(out)] + source_flags(sources, ("HumanEval",)), capsys)
    assert status == 0, err
    assert not (tmp_path / "xdg").exists()
    manifest = _manifest(out)
    assert manifest["groundtruth_cache"] is False
    assert len(manifest["benchmarks"]["HumanEval"]["groundtruth"]["measured"]) == 3


def test_gpqa_permutation_is_seeded_per_question_and_stable_across_subsets(tmp_path, sources,
                                                                           capsys):
    def orders(*extra):
        out = tmp_path / f"gpqa{len(list(tmp_path.iterdir()))}.jsonl"
        status, _, err = run_prepare(["--benchmark", "GPQA-Diamond", "--output", str(out)]
                                     + source_flags(sources, ("GPQA-Diamond",)) + list(extra),
                                     capsys)
        assert status == 0, err
        return {row["id"]: row["option_order"] for row in read_rows(out)}

    full, first_only, reseeded = orders(), orders("--limit", "1"), orders("--seed", "7")
    assert first_only == {"recFixture001": full["recFixture001"]}
    assert reseeded != full
    columns = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    for record_id, order in reseeded.items():
        assert order == [columns[i] for i in gpqa_option_order(7, record_id)]


def test_template_override_per_benchmark(tmp_path, sources, capsys):
    template = tmp_path / "mmlu.jinja"
    template.write_text("Q: {{ question }}\n{% for o in options %}{{ o.label }}={{ o.text }};"
                        "{% endfor %} [{{ subject }}]")
    out = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", "MMLU,ARC-E", "--template", f"MMLU={template}",
                                  "--output", str(out)] + source_flags(sources, ("MMLU", "ARC-E")),
                                 capsys)
    assert status == 0, err
    rows = read_rows(out)
    assert rows[0]["prompt"] == "Q: What is 7 * 6?\nA=36;B=42;C=48;D=54; [elementary_mathematics]"
    assert rows[3]["prompt"].startswith("What do bees collect")  # ARC-E keeps the default
    manifest = _manifest(out)["benchmarks"]
    assert manifest["MMLU"]["template"] == {
        "template": str(template), "sha256": hashlib.sha256(template.read_bytes()).hexdigest()}


def test_a_template_with_an_unknown_variable_is_a_one_line_error(tmp_path, sources, capsys):
    template = tmp_path / "bad.jinja"
    template.write_text("{{ question }} {{ choices_text }}")
    _one_line_error(*run_prepare(["--benchmark", "MMLU", "--template", str(template), "--output",
                                  str(tmp_path / "s.jsonl")] + source_flags(sources, ("MMLU",)),
                                 capsys), str(template), "'choices_text' is undefined")


def test_model_chat_template_wraps_the_prompt(tmp_path, sources, capsys):
    out = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", "MATH-500", "--model", "builtin:tiny", "--output",
                                  str(out)] + source_flags(sources, ("MATH-500",)), capsys)
    assert status == 0, err
    prompt = read_rows(out)[0]["prompt"]
    assert prompt.startswith("user Solve the following math problem")
    assert prompt.endswith("Solution: </s> assistant ")  # the tiny checkpoint's template
    chat = _manifest(out)["chat_template"]
    assert chat["enable_thinking"] is None and len(chat["chat_template_sha256"]) == 64
    _one_line_error(*run_prepare(["--benchmark", "MATH-500", "--model", "builtin:tiny",
                                  "--thinking", "--output", str(tmp_path / "t.jsonl")]
                                 + source_flags(sources, ("MATH-500",)), capsys),
                    "--thinking", "no enable_thinking switch")


def test_thinking_switch_of_a_qwen3_style_template(tmp_path, sources, capsys):
    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}assistant {% if enable_thinking is defined and "
        "enable_thinking is false %}<think></think> {% endif %}{% endif %}")
    prompts = {}
    for flag in ("--nothinking", "--thinking"):
        out = tmp_path / f"{flag}.jsonl"
        status, _, err = run_prepare(["--benchmark", "MATH-500", "--model", str(model), flag,
                                      "--limit", "1", "--output", str(out)]
                                     + source_flags(sources, ("MATH-500",)), capsys)
        assert status == 0, err
        prompts[flag] = read_rows(out)[0]["prompt"]
        assert _manifest(out)["chat_template"]["enable_thinking"] is (flag == "--thinking")
    assert prompts["--nothinking"].endswith("assistant <think></think> ")
    assert prompts["--thinking"].endswith("assistant ")


def test_gsm8k_fewshot_examples_come_from_the_train_split(tmp_path, sources, capsys):
    out = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", "GSM8K", "--fewshot", "2", "--output", str(out)]
                                 + source_flags(sources, ("GSM8K",)), capsys)
    assert status == 0, err
    prompt = read_rows(out)[0]["prompt"]
    for shot in GSM8K_TRAIN[:2]:
        assert shot["question"] in prompt
    assert GSM8K_TRAIN[2]["question"] not in prompt
    assert "\\boxed{12}" in prompt and "\\boxed{10}" in prompt and "<<" not in prompt
    assert prompt.rstrip().endswith(f"Problem: {ROWS['GSM8K'][0]['question']}\nSolution:")
    assert _manifest(out)["benchmarks"]["GSM8K"]["fewshot"] == 2
    _one_line_error(*run_prepare(["--benchmark", "GSM8K", "--fewshot", "2", "--split", "train",
                                  "--output", str(tmp_path / "t.jsonl")]
                                 + source_flags(sources, ("GSM8K",)), capsys), "train split")
    _one_line_error(*run_prepare(["--benchmark", "MMLU", "--fewshot", "2", "--output",
                                  str(tmp_path / "t.jsonl")] + source_flags(sources, ("MMLU",)),
                                 capsys), "GSM8K only")


def test_mbpp_sanitized_layout_and_limit(tmp_path, capsys):
    import pyarrow
    import pyarrow.parquet

    rows = [{"source_file": "x", "task_id": 7, "prompt": "Write a function to double a number.",
             "code": "def double(x):\n    return 2 * x", "test_imports": ["import math"],
             "test_list": ["assert double(2) == 4", "assert math.isclose(double(0.5), 1)"]},
            {"source_file": "x", "task_id": 8, "prompt": "Unused.", "code": "", "test_imports": [],
             "test_list": ["assert True"]}]
    source = tmp_path / "sanitized" / "test-00000-of-00001.parquet"
    source.parent.mkdir()
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), source)
    out = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", "MBPP", "--source", str(source.parent), "--limit",
                                  "1", "--output", str(out)], capsys)
    assert status == 0, err
    [row] = read_rows(out)
    assert row["id"] == 7 and row["timeout_seconds"] == 10
    assert row["tests"] == "import math\nassert double(2) == 4\nassert math.isclose(double(0.5), 1)"
    assert _manifest(out)["benchmarks"]["MBPP"]["source"]["split"] == "test"


@pytest.mark.parametrize("argv,needle", [
    (["--limit", "0"], "--limit must be at least 1"),
    (["--thinking"], "--thinking needs --model"),
    (["--split", "HumanEval=test"], "is not among --benchmark"),
])
def test_flag_errors(tmp_path, sources, capsys, argv, needle):
    _one_line_error(*run_prepare(["--benchmark", "MMLU", "--output", str(tmp_path / "s.jsonl")]
                                 + source_flags(sources, ("MMLU",)) + argv, capsys), needle)


def test_a_plain_split_skips_the_evalplus_sets(tmp_path, sources, capsys):
    out = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", "MMLU,HumanEval", "--split", "test", "--output",
                                  str(out)] + source_flags(sources, ("MMLU", "HumanEval")), capsys)
    assert status == 0, err
    assert _manifest(out)["benchmarks"]["MMLU"]["source"]["split"] == "test"
    _one_line_error(*run_prepare(["--benchmark", "MMLU,HumanEval", "--split", "HumanEval=test",
                                  "--output", str(out)] + source_flags(sources, ("MMLU", "HumanEval")),
                                 capsys), "HumanEval", "no splits")


def test_the_suite_and_its_manifest_honour_the_umask(tmp_path, sources, capsys):
    import os
    import stat

    out = tmp_path / "suite.jsonl"
    previous = os.umask(0o027)
    try:
        status, _, err = run_prepare(["--benchmark", "ARC-C", "--output", str(out)]
                                     + source_flags(sources, ("ARC-C",)), capsys)
    finally:
        os.umask(previous)
    assert status == 0, err
    for path in (out, pathlib.Path(str(out) + ".manifest.json")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
