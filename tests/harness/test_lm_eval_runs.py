"""lm-eval runs on the bundled tiny model, offline: a task of our own over a local JSON file,
through the Python route and the command line, compared with the generator and with
``alodlm-jax-generate``; refused tasks and arguments (one line, exit status 2)."""

from __future__ import annotations

import collections
import json
import pathlib

import pytest

pytest.importorskip("lm_eval")

from alodlm_jax.cli import generate as generate_cli  # noqa: E402
from alodlm_jax.cli import lm_eval as lm_eval_cli  # noqa: E402
from alodlm_jax.data import BUILTINS  # noqa: E402

TINY = str(BUILTINS["builtin:tiny"])
PROMPTS = ["t20 t31 t42", "t33 t21", "t40 t41 t25 t26 t27"]
DECODE = {"q": 0.5, "tau": 0.4, "window_size": 4}
MAX_GEN_TOKS = 8
TASK = "alodlm_tiny_gen"


def _offline(monkeypatch):
    """Nothing may download: Hugging Face's offline switches, also where already read."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)


def _task_yaml(name: str, data: pathlib.Path, until: list[str], output_type="generate_until"):
    lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
             f"    test: {data}", "test_split: test", f"output_type: {output_type}",
             "doc_to_text: '{{question}}'", "doc_to_target: '{{answer}}'"]
    if output_type == "generate_until":
        lines += ["generation_kwargs:", f"  until: {json.dumps(until)}",
                  f"  max_gen_toks: {MAX_GEN_TOKS}", "  do_sample: false",
                  "metric_list:", "  - metric: exact_match"]
    else:
        lines += ["doc_to_choice: ['t20', 't21']", "metric_list:", "  - metric: acc"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The task directory, with an until word the tiny model writes in the middle of an answer
    (found from its full generations), and those full generations."""
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.generate import build_generator

    root = tmp_path_factory.mktemp("lm_eval")
    generator = build_generator(model=TINY, device="cpu", engine="compiled",
                                decode_config=DecodeConfig(**DECODE, max_new_tokens=MAX_GEN_TOKS))
    full = {prompt: generator.generate(prompt) for prompt in PROMPTS}
    counts = collections.Counter(
        token for result in full.values() for token in set(result["token_ids"][1:])
        if token not in result["token_ids"][:1])
    until_id = counts.most_common(1)[0][0]
    until = generator.tokenizer.decode([until_id])
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"question": p, "answer": f"t{i}"}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    (root / "tasks").mkdir()
    (root / "tasks" / f"{TASK}.yaml").write_text(_task_yaml(TASK, data, [until]))
    (root / "tasks" / "alodlm_tiny_mc.yaml").write_text(
        _task_yaml("alodlm_tiny_mc", data, [], output_type="multiple_choice"))
    return {"root": root, "until": until, "until_id": until_id, "full": full,
            "tokenizer": generator.tokenizer}


def _expected(setup, token_ids: list[int], text: str) -> tuple[str, int]:
    """The answer to a full generation, computed here from its ids with the checkpoint's
    tokenizer: the ids before the first until token, decoded; and that count."""
    ids = list(token_ids)
    if setup["until_id"] not in ids:
        return text, len(ids)
    kept = ids.index(setup["until_id"])
    return setup["tokenizer"].decode(ids[:kept], skip_special_tokens=True), kept


def _samples(output: pathlib.Path, task: str) -> list[dict]:
    (path,) = output.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.jax_backend
def test_python_route_matches_the_generator_and_stops_early(setup, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from alodlm_jax.harness.model import AlodlmJaxLM

    _offline(monkeypatch)
    lm = AlodlmJaxLM(pretrained="builtin:tiny", device="cpu", **DECODE)
    results = lm_eval.simple_evaluate(
        model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(setup["root"] / "tasks")),
        log_samples=True)
    assert "exact_match,none" in results["results"][TASK]
    stopped = 0
    for sample in results["samples"][TASK]:
        prompt = sample["arguments"][0][0]
        full = setup["full"][prompt]
        answer, kept = _expected(setup, full["token_ids"], full["text"])
        assert sample["resps"] == [[answer]]
        record = sample["arguments"][0][2]["alodlm_jax"]
        # Early stop: the engine emitted exactly the ids before the until token and stopped.
        assert record["token_ids"] == full["token_ids"][:kept]
        assert record["stop_reason"] == ("eos" if kept < len(full["token_ids"]) else full["stop_reason"])
        assert record["exit_depths"] == full["exit_depths"][:kept]
        assert record["engine_stop_ids"] == sorted({*lm.generator.stop_ids, setup["until_id"]})
        assert record["cut_at"] is None  # the engine stopped on the until token itself
        assert record["tokens_per_window"] == record["generated_tokens"] / record["outer_steps"]
        stopped += kept < len(full["token_ids"])
    assert stopped >= 1


@pytest.mark.jax_backend
def test_command_line_with_chat_template_and_batching_equals_alodlm_jax_generate(
        setup, tmp_path, monkeypatch, capsys):
    _offline(monkeypatch)
    output = tmp_path / "out"
    status = lm_eval_cli.main([
        "alodlm-jax-lm-eval", "--model", "alodlm-jax", "--model_args",
        "pretrained=builtin:tiny,device=cpu,q=0.5,tau=0.4,window_size=4",
        "--tasks", TASK, "--include_path", str(setup["root"] / "tasks"), "--batch_size", "2",
        "--apply_chat_template", "--log_samples", "--output_path", str(output)])
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    assert f"|{TASK}" in out and "exact_match" in out  # lm-eval's results table
    samples = _samples(output, TASK)
    assert len(samples) == len(PROMPTS)
    for sample in samples:
        question = sample["doc"]["question"]
        assert generate_cli.main(["alodlm-jax-generate", "--model", "builtin:tiny", "--prompt",
                                  question, "--device", "cpu", "--q", "0.5", "--tau", "0.4",
                                  "--window_size", "4", "--max_new_tokens", str(MAX_GEN_TOKS)]) == 0
        reference = json.loads(capsys.readouterr().out)
        answer, kept = _expected(setup, reference["token_ids"], reference["text"])
        assert sample["resps"] == [[answer]]
        record = sample["arguments"]["gen_args_0"]["arg_2"]["alodlm_jax"]
        assert record["token_ids"] == reference["token_ids"][:kept]
        assert record["exit_depths"] == reference["exit_depths"][:kept]


@pytest.mark.jax_backend
def test_loglikelihood_task_is_one_line_and_status_2(setup, monkeypatch, capsys):
    _offline(monkeypatch)
    status = lm_eval_cli.main([
        "alodlm-jax-lm-eval", "--model_args", "pretrained=builtin:tiny,device=cpu",
        "--tasks", "alodlm_tiny_mc", "--include_path", str(setup["root"] / "tasks")])
    err = capsys.readouterr().err
    assert status == 2
    lines = [line for line in err.splitlines() if line.startswith("alodlm-jax-lm-eval: error:")]
    assert lines == ["alodlm-jax-lm-eval: error: task 'alodlm_tiny_mc' (output_type "
                     "multiple_choice) needs loglikelihood requests; alodlm-jax runs only "
                     "generate_until tasks (a diffusion decoder has no left-to-right likelihood)"]
    assert "Traceback" not in err


def test_bad_model_args_key_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    _offline(monkeypatch)
    (tmp_path / "data.jsonl").write_text(json.dumps({"question": "t20", "answer": "t1"}) + "\n")
    (tmp_path / f"{TASK}.yaml").write_text(_task_yaml(TASK, tmp_path / "data.jsonl", ["t3"]))
    status = lm_eval_cli.main([
        "alodlm-jax-lm-eval", "--model_args", "pretrained=builtin:tiny,windowsize=4",
        "--tasks", TASK, "--include_path", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "alodlm-jax-lm-eval: error: model_args: unknown key 'windowsize'")
