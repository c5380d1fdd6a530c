"""The evaluate command copies a prepared suite's manifest into ``summary.json``'s protocol."""

from __future__ import annotations

import json
import pathlib

import pytest

from alodlm_jax.cli import evaluate
from alodlm_scoring.outputs import protocol_block
from evaluation import suites

from .helpers import read_rows, run_prepare, source_flags

NAMES = ("MMLU", "HumanEval")


@pytest.fixture()
def suite(tmp_path, sources, capsys) -> pathlib.Path:
    out = tmp_path / "suite.jsonl"
    status, _, err = run_prepare(["--benchmark", ",".join(NAMES), "--limit", "2", "--output",
                                  str(out)] + source_flags(sources, NAMES), capsys)
    assert status == 0, err
    return out


def _predictions(suite: pathlib.Path) -> pathlib.Path:
    path = suite.parent / "predictions.jsonl"
    lines = [json.dumps({"benchmark": row["benchmark"], "id": row["id"],
                         "text": f"The answer is ({row.get('answer', 'A')}).",
                         "generated_tokens": 5, "wall_seconds": 0.5})
             for row in read_rows(suite)]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _rescore(suite, output, capsys):
    status = evaluate.main(["alodlm-jax-evaluate", "--input", str(suite), "--predictions",
                            str(_predictions(suite)), "--output", str(output), "--workers", "1"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_rescore_summary_carries_the_manifest_last(suite, tmp_path, capsys):
    status, out, err = _rescore(suite, tmp_path / "rescored", capsys)
    assert status == 0, err
    protocol = json.loads((tmp_path / "rescored" / "summary.json").read_text())["protocol"]
    manifest = json.loads(pathlib.Path(str(suite) + ".manifest.json").read_text())
    assert protocol["suite_manifest"] == manifest
    assert list(protocol)[-1] == "suite_manifest"
    reference_and_project_keys = list(protocol_block(
        decoder="d", input_sha256="x", decode=None, precision=None, device=None, timing="t",
        predictions_sha256="p"))
    assert list(protocol)[:-1] == reference_and_project_keys + ["code_verdicts", "code_sandbox"]


def test_no_manifest_no_key(suite, tmp_path, capsys):
    pathlib.Path(str(suite) + ".manifest.json").unlink()
    status, _, err = _rescore(suite, tmp_path / "rescored", capsys)
    assert status == 0, err
    protocol = json.loads((tmp_path / "rescored" / "summary.json").read_text())["protocol"]
    assert "suite_manifest" not in protocol


@pytest.mark.parametrize("damage,needle", [
    (lambda suite, manifest: manifest.write_text("{not json"), "not a valid suite manifest"),
    (lambda suite, manifest: manifest.write_text("[1, 2]"), "expected a JSON object"),
    (lambda suite, manifest: suite.write_text(suite.read_text().splitlines(True)[0]),
     "describes another suite"),
])
def test_a_broken_or_foreign_manifest_is_a_one_line_error(suite, tmp_path, capsys, damage,
                                                          needle):
    manifest = pathlib.Path(str(suite) + ".manifest.json")
    damage(suite, manifest)
    predictions = _predictions(suite)
    status = evaluate.main(["alodlm-jax-evaluate", "--input", str(suite), "--predictions",
                            str(predictions), "--output", str(tmp_path / "rescored")])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    line = suites.error_after_phases(captured.err)
    assert str(manifest) in line and needle in line
    assert not (tmp_path / "rescored" / "summary.json").exists()
    assert not (tmp_path / "rescored" / "predictions.jsonl").exists()


class _FixedGenerator:
    """Stands in for the model: the same answer for every prompt (the protocol is under test)."""

    def warmup(self, prompt):
        pass

    def check_prompt(self, prompt):  # the generator contract's up-front prompt check
        return [1, 2, 3]

    def generate(self, prompt):
        from alodlm_jax.decode.result import RESULT_KEYS

        result = dict.fromkeys(RESULT_KEYS)
        result.update(text="The answer is (B).", token_ids=[1], prompt_tokens=3,
                      generated_tokens=1, wall_seconds=0.25, exit_depths=[2],
                      first_pass_halt_probabilities=[0.5], stop_reason="eos")
        return result

    def protocol_fields(self):
        return {"device_kind": "cpu", "compile_seconds": 0.0}


def test_generate_mode_summary_carries_the_manifest(suite, tmp_path, capsys, monkeypatch):
    from alodlm_jax import generate
    from alodlm_jax.data import BUILTINS

    monkeypatch.setattr(generate, "build_generator", lambda *args, **kwargs: _FixedGenerator())
    output = tmp_path / "generated"
    model = str(BUILTINS["builtin:tiny"])  # recorded in run.json; the generator is the fake one
    status = evaluate.main(["alodlm-jax-evaluate", "--model", model, "--input", str(suite),
                            "--output", str(output), "--device", "cpu", "--workers", "1"])
    assert status == 0, capsys.readouterr().err
    protocol = json.loads((output / "summary.json").read_text())["protocol"]
    assert list(protocol)[-1] == "suite_manifest"
    assert protocol["suite_manifest"] == json.loads(
        pathlib.Path(str(suite) + ".manifest.json").read_text())


@pytest.mark.slow
def test_generate_summary_carries_the_manifest(tmp_path, sources, capsys):
    """The same with the bundled checkpoint (slow: compiles the decoder)."""
    from alodlm_jax.data import BUILTINS

    suite = tmp_path / "one.jsonl"
    status, _, err = run_prepare(["--benchmark", "MMLU", "--limit", "1", "--output", str(suite)]
                                 + source_flags(sources, ("MMLU",)), capsys)
    assert status == 0, err
    output = tmp_path / "generated"
    status = evaluate.main(["alodlm-jax-evaluate", "--model", str(BUILTINS["builtin:tiny"]),
                            "--input", str(suite), "--output", str(output), "--device", "cpu",
                            "--engine", "portable", "--max-new-tokens", "2", "--window-size", "2",
                            "--workers", "1"])
    assert status == 0, capsys.readouterr().err
    protocol = json.loads((output / "summary.json").read_text())["protocol"]
    assert protocol["decoder"] == "jax-xla-portable"
    assert list(protocol)[-1] == "suite_manifest"
    assert protocol["suite_manifest"] == json.loads(
        pathlib.Path(str(suite) + ".manifest.json").read_text())
