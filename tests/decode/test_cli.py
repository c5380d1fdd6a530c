"""The generate command and the evaluate command's generate mode on a tiny checkpoint (in-process,
so compiled shapes are shared with the other decoding tests)."""

from __future__ import annotations

import json

import pytest

from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.result import RESULT_KEYS

TASK = {"id": "1", "benchmark": "synthetic", "metric": "exact",
        "prompt": "user Return value one </s> assistant ", "answer": "one ."}
TASK2 = {"id": 2, "benchmark": "other", "metric": "exact",
         "prompt": "user Return value two </s> assistant ", "answer": "two ."}


def _generate(argv, capsys):
    from alodlm_jax.cli import generate

    status = generate.main(["alodlm-jax-generate"] + argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_generate_with_prompt_applies_the_chat_template(sandwich, capsys):
    status, out, err = _generate(["--model", str(sandwich.path), "--prompt", "Return value one",
                                  "--max-new-tokens", "6", "--window-size", "4", "--device", "cpu",
                                  "--stats"], capsys)
    assert status == 0, err
    result = json.loads(out)
    assert list(result) == list(RESULT_KEYS)
    assert result["generated_tokens"] <= 6
    assert result["prompt_tokens"] == len("user Return value one </s> assistant".split())
    prompt = sandwich.ref.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Return value one"}], tokenize=False,
        add_generation_prompt=True)
    ids = sandwich.ref.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ref = sandwich.ref.generate(ids, DecodeConfig(max_new_tokens=6, window_size=4))
    assert result["token_ids"] == ref["token_ids"] and result["exit_depths"] == ref["exit_depths"]
    assert result["text"] == ref["text"]
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["decoder"] == "jax-xla-compiled" and stats["token_layer_calls"] > 0  # the default


def test_generate_with_raw_prompt_ids(sandwich, capsys):
    status, out, err = _generate(["--model", str(sandwich.path), "--prompt_ids", "4,7,9",
                                  "--q", "0.3", "--tau", "2", "--mode", "entropy",
                                  "--max_new_tokens", "12", "--window_size", "4",
                                  "--precision", "fp32", "--engine", "portable"], capsys)
    assert status == 0, err
    result = json.loads(out)
    ref = sandwich.ref.generate([4, 7, 9], DecodeConfig(q=0.3, tau=2.0, max_new_tokens=12,
                                                         window_size=4))
    for key in ("token_ids", "exit_depths", "outer_steps", "recurrent_passes", "stop_reason"):
        assert result[key] == ref[key], key


@pytest.mark.parametrize("argv,needle", [
    (["--prompt_ids", "4,x"], "--prompt_ids"),
    (["--prompt_ids", "4,99"], "Prompt token ids"),
    (["--prompt", "hi", "--prompt_ids", "4"], "exactly one"),
    (["--prompt_ids", "4", "--q", "1.5"], "q must be in [0,1]"),
    (["--prompt_ids", "4", "--window-size", "0"], "Window size"),
    (["--prompt_ids", "4", "--mode", "sideways"], "mode"),
    (["--prompt_ids", "4", "--device", "tpu"], "no tpu device"),
])
def test_generate_bad_input_is_one_line_and_status_2(sandwich, capsys, argv, needle):
    status, out, err = _generate(["--model", str(sandwich.path), "--max-new-tokens", "4"] + argv,
                                 capsys)
    assert status == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alodlm-jax-generate: ") and needle in lines[0]


def test_generate_missing_model_directory(capsys, tmp_path):
    status, _, err = _generate(["--model", str(tmp_path / "nope"), "--prompt_ids", "4"], capsys)
    assert status == 2 and "local model directory does not exist" in err


def _evaluate(argv, capsys):
    from alodlm_jax.cli import evaluate

    status = evaluate.main(["alodlm-jax-evaluate"] + argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_evaluate_generate_mode_then_rescore(sandwich, tmp_path, capsys):
    """SCORING.md §10.2 workflows 1d/1e with the seed's command shape."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASK) + "\n" + json.dumps(TASK2) + "\n")
    out_dir = tmp_path / "evaluated"
    status, out, err = _evaluate(["--model", str(sandwich.path), "--input", str(tasks),
                                  "--output", str(out_dir), "--device", "cpu", "--precision",
                                  "fp32", "--q", "0.5", "--tau", "0.4", "--max-new-tokens", "64",
                                  "--print_summary_json"], capsys)
    assert status == 0, err
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary == json.loads(out)
    assert summary["benchmark_count"] == 2
    assert summary["benchmarks"]["synthetic"]["examples"] == 1
    protocol = summary["protocol"]
    assert protocol["decoder"] == "jax-xla-compiled"  # the default engine
    assert protocol["device"] == "cpu" and protocol["precision"] == "fp32"
    assert protocol["decode"] == DecodeConfig(max_new_tokens=64).as_dict()
    assert protocol["device_kind"] and protocol["compile_seconds"] >= 0
    assert "gpu" not in protocol
    rows = [json.loads(line) for line in (out_dir / "predictions.jsonl").read_text().splitlines()]
    assert [list(r)[:15] for r in rows] == [list(RESULT_KEYS)] * 2
    assert [r["id"] for r in rows] == ["1", 2]
    # The predictions are those of the generator on the verbatim prompt.
    ids = sandwich.ref.tokenizer(TASK["prompt"], add_special_tokens=False)["input_ids"]
    ref = sandwich.ref.generate(ids, DecodeConfig(max_new_tokens=64))
    assert rows[0]["token_ids"] == ref["token_ids"]
    assert rows[0]["exit_depths"] == ref["exit_depths"]

    rescored_dir = tmp_path / "rescored"
    status, out, err = _evaluate(["--input", str(tasks), "--predictions",
                                  str(out_dir / "predictions.jsonl"), "--output", str(rescored_dir)],
                                 capsys)
    assert status == 0, err
    rescored = json.loads((rescored_dir / "summary.json").read_text())
    assert rescored["macro_score_percent"] == summary["macro_score_percent"]
    assert rescored["suite_wall_seconds"] == summary["suite_wall_seconds"]
    for key in ("decode", "device", "precision"):
        assert rescored["protocol"][key] is None


def test_evaluate_resume_keeps_generated_rows(sandwich, tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASK) + "\n" + json.dumps(TASK2) + "\n")
    out_dir = tmp_path / "run"
    argv = ["--model", str(sandwich.path), "--input", str(tasks), "--output", str(out_dir),
            "--device", "cpu", "--max-new-tokens", "8", "--window-size", "4"]
    status, _, err = _evaluate(argv, capsys)
    assert status == 0, err
    lines = (out_dir / "predictions.jsonl").read_text().splitlines(keepends=True)
    # Simulate an interruption after the first row (with a torn second line).
    (out_dir / "summary.json").unlink()
    (out_dir / "predictions.jsonl").write_text(lines[0] + lines[1][:20])
    status, _, err = _evaluate(argv + ["--resume"], capsys)
    assert status == 0, err
    resumed = (out_dir / "predictions.jsonl").read_text().splitlines(keepends=True)
    assert resumed[0] == lines[0]  # kept verbatim, timing included
    first, second = json.loads(lines[1]), json.loads(resumed[1])
    assert second["token_ids"] == first["token_ids"]
    assert json.loads((out_dir / "summary.json").read_text())["benchmark_count"] == 2


def test_packaged_demo_checkpoint_is_small_and_generates(tmp_path, capsys):
    """alodlm_jax/data/tiny_checkpoint is DEMO_SPEC (the sandwich fixture, seed 42, LM head x128,
    gate weight x-0.5), and the generate command reproduces the PyTorch reference on it."""
    import hashlib
    import pathlib

    import alodlm_jax.data
    from alodlm_jax.testing.tiny_checkpoint import DEMO_SPEC, build_tiny_checkpoint
    from alodlm_jax.compare.torch_reference import TorchALoDLM

    demo = pathlib.Path(alodlm_jax.data.__file__).parent / "tiny_checkpoint"
    files = {p.name for p in demo.iterdir()}
    assert {"config.json", "model.safetensors", "exit_gate.pt", "alodlm_config.json",
            "tokenizer.json"} <= files
    assert sum(p.stat().st_size for p in demo.iterdir()) < 400_000
    rebuilt = build_tiny_checkpoint(tmp_path / "demo", DEMO_SPEC)
    for name in ("model.safetensors", "exit_gate.pt", "config.json", "alodlm_config.json"):
        assert (hashlib.sha256((rebuilt / name).read_bytes()).digest()
                == hashlib.sha256((demo / name).read_bytes()).digest()), name
    status, out, err = _generate(["--model", str(demo), "--prompt_ids", "4,7,9", "--tau", "2",
                                  "--max-new-tokens", "12", "--window-size", "4"], capsys)
    assert status == 0, err
    ref = TorchALoDLM.from_checkpoint(demo).generate(
        [4, 7, 9], DecodeConfig(tau=2.0, max_new_tokens=12, window_size=4))
    assert json.loads(out)["token_ids"] == ref["token_ids"]
    assert json.loads(out)["exit_depths"] == ref["exit_depths"]


def test_packaged_demo_commits_at_several_depths_and_tokens_per_window():
    """The README demo's decoding settings on the bundled sample prompts: the bundled checkpoint
    exits at every depth and commits several tokens per window (its unscaled gate halted every
    window at depth 1, one token each)."""
    import collections

    from alodlm_jax.data import BUILTINS
    from alodlm_jax.compare.torch_reference import TorchALoDLM

    model = TorchALoDLM.from_checkpoint(BUILTINS["builtin:tiny"])
    config = DecodeConfig(q=0.5, tau=0.4, window_size=4, max_new_tokens=16)  # the README's
    tasks = [json.loads(line) for line in open(BUILTINS["builtin:sample"])]
    depths, tokens, windows = collections.Counter(), 0, 0
    for task in tasks[::10]:
        ids = model.tokenizer(task["prompt"], add_special_tokens=False)["input_ids"]
        result = model.generate(ids, config)
        depths.update(result["exit_depths"])
        tokens += result["generated_tokens"]
        windows += result["outer_steps"]
    assert set(depths) == {1, 2, 3, 4}, depths
    assert tokens / windows > 2, (tokens, windows)