"""The Generator's batched entry point and build_generator's engine options (bundled tiny model)."""

from __future__ import annotations

import pathlib

import jax
import pytest

import alodlm_jax.data
from alodlm_jax.config import DecodeConfig
from alodlm_jax.decode.result import RESULT_KEYS
from alodlm_jax.generate import BATCH_NEEDS_COMPILED, Generator, build_generator
from evaluation import suites

DEMO = pathlib.Path(alodlm_jax.data.__file__).parent / "tiny_checkpoint"
DECODE = DecodeConfig(tau=2.0, max_new_tokens=12, window_size=4)
PROMPTS = ["user Return value one </s> assistant ", "user Return value two </s> assistant ",
           "user one </s> assistant "]


@pytest.mark.parametrize("engine", ["portable", "nonsense"])
def test_batch_size_above_one_needs_the_compiled_engine(engine, tmp_path):
    # Refused before anything is loaded: the model path does not even exist.
    with pytest.raises(ValueError, match="batch_size > 1 needs --engine compiled"):
        build_generator(model=str(tmp_path / "missing"), engine=engine, batch_size=2)
    with pytest.raises(ValueError, match="positive integer"):
        build_generator(model=str(tmp_path / "missing"), engine="compiled", batch_size=0)
    assert "--engine compiled" in BATCH_NEEDS_COMPILED


def test_build_generator_passes_batch_size_and_cache_dir(tmp_path):
    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs,
              jax.config.jax_persistent_cache_min_entry_size_bytes)
    try:
        gen = build_generator(model=str(DEMO), engine="compiled", batch_size=2,
                               decode_config=DECODE, compilation_cache_dir=str(tmp_path / "cache"))
        assert gen.engine.batch_size == 2 and gen.batch_size == 2
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", before[2])


def test_generate_batch_equals_one_by_one():
    gen = build_generator(model=str(DEMO), engine="compiled", batch_size=2, decode_config=DECODE)
    singles = [gen.generate(text) for text in PROMPTS]
    gen.warmup_batches([PROMPTS])
    compiled_before = gen.compile_seconds
    together = gen.generate_batch(PROMPTS)  # 2 slots: the third prompt waits for a free one
    assert gen.compile_seconds == compiled_before  # the warm-up compiled every group's program
    assert [list(r) for r in together] == [list(RESULT_KEYS)] * len(PROMPTS)
    for alone, batched in zip(singles, together):
        for key in ("text", "token_ids", "exit_depths", "stop_reason", "prompt_tokens",
                    "outer_steps", "recurrent_passes", "loop_token_passes"):
            assert batched[key] == alone[key], key
    assert gen.generate_batch([]) == []


def test_portable_generate_batch_is_one_by_one():
    gen = build_generator(model=str(DEMO), engine="portable", decode_config=DECODE)
    gen.warmup_batches([PROMPTS[:1]])
    assert [r["token_ids"] for r in gen.generate_batch(PROMPTS[:2])] == [
        gen.generate(text)["token_ids"] for text in PROMPTS[:2]]


# -- alodlm-jax-evaluate --batch_size ---------------------------------------------------------

TASKS = [{"id": str(i), "benchmark": "synthetic", "metric": "exact", "prompt": prompt,
          "answer": "one ."} for i, prompt in enumerate(PROMPTS)]


def _evaluate(argv, capsys):
    from alodlm_jax.cli import evaluate

    status = evaluate.main(["alodlm-jax-evaluate"] + argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _rows(directory: pathlib.Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (directory / "predictions.jsonl").read_text().splitlines()]


def _same_row(row: dict) -> dict:
    return {key: row[key] for key in ("benchmark", "id", "text", "token_ids", "exit_depths",
                                      "stop_reason", "correct")}


def test_evaluate_batch_2_equals_batch_1_and_resumes(tmp_path, capsys):
    import json

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    common = ["--model", str(DEMO), "--input", str(tasks), "--device", "cpu", "--engine",
              "compiled", "--tau", "2", "--max_new_tokens", "12", "--window_size", "4",
              "--workers", "1"]
    status, _, err = _evaluate(common + ["--output", str(tmp_path / "b1")], capsys)
    assert status == 0, err
    status, out, err = _evaluate(common + ["--output", str(tmp_path / "b2"), "--batch_size", "2"],
                                 capsys)
    assert status == 0, err
    one, two = _rows(tmp_path / "b1"), _rows(tmp_path / "b2")
    assert [_same_row(r) for r in two] == [_same_row(r) for r in one]
    assert all(r["wall_seconds"] > 0 for r in two)

    p1 = json.loads((tmp_path / "b1" / "summary.json").read_text())["protocol"]
    p2 = json.loads((tmp_path / "b2" / "summary.json").read_text())["protocol"]
    assert "batch_size" not in p1 and "batch_timing" not in p1
    assert list(p2)[-2:] == ["batch_size", "batch_timing"]
    assert list(p2)[:-2] == list(p1)  # the batch keys come after every other key
    assert p2["batch_size"] == 2 and "continuous batching" in p2["batch_timing"]
    assert p2["decoder"] == "jax-xla-compiled"

    # Resume in the middle: the remaining tasks are streamed from there.
    b2 = tmp_path / "b2"
    lines = (b2 / "predictions.jsonl").read_text().splitlines(keepends=True)
    (b2 / "summary.json").unlink()
    (b2 / "predictions.jsonl").write_text(lines[0] + lines[1][:15])
    status, _, err = _evaluate(common + ["--output", str(b2), "--batch_size", "2", "--resume"],
                               capsys)
    assert status == 0, err
    resumed = (b2 / "predictions.jsonl").read_text().splitlines(keepends=True)
    assert resumed[0] == lines[0]
    assert [_same_row(json.loads(r)) for r in resumed] == [_same_row(r) for r in one]
    # The README's resume guarantee: tokens, exit depths, counters and verdicts identical to an
    # uninterrupted run; hazards within 1e-6 (resumed rows may share buckets with other neighbours).
    uninterrupted = [json.loads(line) for line in lines]
    counters = ("generated_tokens", "outer_steps", "recurrent_passes", "loop_token_passes")
    for got, want in zip((json.loads(r) for r in resumed), uninterrupted, strict=True):
        assert {k: got[k] for k in counters} == {k: want[k] for k in counters}
        assert max(abs(a - b) for a, b in zip(got["first_pass_halt_probabilities"],
                                              want["first_pass_halt_probabilities"],
                                              strict=True)) <= 1e-6


def test_evaluate_batch_size_needs_the_compiled_engine(tmp_path, capsys):
    import json

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASKS[0]) + "\n")
    status, out, err = _evaluate(["--model", str(DEMO), "--input", str(tasks), "--output",
                                  str(tmp_path / "out"), "--device", "cpu", "--engine", "portable",
                                  "--batch_size", "2"], capsys)
    assert status == 2 and out == ""
    assert suites.error_after_phases(err).endswith(BATCH_NEEDS_COMPILED)


def test_with_decode_config_shares_the_loaded_model():
    gen = build_generator(model=str(DEMO), engine="compiled", decode_config=DECODE)
    other_config = DecodeConfig(q=1.0, tau=0.0, max_new_tokens=6, window_size=4, mode="left1")
    other = gen.with_decode_config(other_config)
    assert other.params is gen.params and other.tokenizer is gen.tokenizer
    assert other.decode_config == other_config and gen.decode_config == DECODE
    assert (other.engine_name, other.precision, other.device) == (gen.engine_name, gen.precision,
                                                                  gen.device)
    fresh = build_generator(model=str(DEMO), engine="compiled", decode_config=other_config)
    assert other.generate(PROMPTS[0])["token_ids"] == fresh.generate(PROMPTS[0])["token_ids"]
