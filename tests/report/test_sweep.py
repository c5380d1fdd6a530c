"""The sweep: grid and directory names, resume point by point, outputs, and the evaluation-backed
point runner driven by a fake generator (no model). One real end-to-end point is marked slow."""

from __future__ import annotations

import io
import json
import os
import re

import pytest

from alodlm_jax.cli import sweep as sweep_cli
from alodlm_jax.config import DecodeConfig
from alodlm_jax.report import sweep
from alodlm_jax.report.sweep_runner import EvaluationPointRunner, fixed_protocol_fields
from alodlm_scoring.tasks import load_tasks, sha256_file

from .test_run_report import PNG_SIGNATURE, assert_png, referenced_images, write_generate_run

BASE = DecodeConfig(window_size=8, max_new_tokens=32)
TASKS = [
    {"benchmark": "synthetic", "id": "1", "metric": "exact",
     "prompt": "user Return value one </s> assistant ", "answer": "one ."},
    {"benchmark": "synthetic", "id": "2", "metric": "exact",
     "prompt": "user Return value two </s> assistant ", "answer": "two ."},
    {"benchmark": "other", "id": 3, "metric": "exact",
     "prompt": "user Return value three </s> assistant ", "answer": "three ."},
]


def test_grid_order_names_and_validation():
    points = sweep.make_grid(sweep.parse_float_list("0.3, 0.5", "q"),
                             sweep.parse_float_list("0.2,0.4", "tau"),
                             sweep.parse_mode_list("entropy,left1"), BASE)
    names = [p.name for p in points]
    assert names[:3] == ["q0.3_tau0.2_entropy", "q0.5_tau0.2_entropy", "q0.3_tau0.4_entropy"]
    assert len(names) == len(set(names)) == 8 and names[-1] == "q0.5_tau0.4_left1"
    assert sweep.SweepPoint(1, 0, "left1").name == "q1.0_tau0.0_left1"
    config = points[-1].decode_config(BASE)
    assert (config.q, config.tau, config.mode, config.window_size) == (0.5, 0.4, "left1", 8)
    with pytest.raises(ValueError, match=r"grid point q1.5_tau0.4_entropy: q must be in \[0,1\]"):
        sweep.make_grid((1.5,), (0.4,), ("entropy",), BASE)
    for text, message in [("0.3,x", "'x' is not a number"), ("0.3,,0.5", "empty value"),
                          ("0.5,0.50", "listed twice"), ("nan", "not finite")]:
        with pytest.raises(ValueError, match=message):
            sweep.parse_float_list(text, "q")
    with pytest.raises(ValueError, match="'greedy' is not one of entropy, left1"):
        sweep.parse_mode_list("entropy,greedy")


def test_pareto_front():
    points = [(10, 50), (20, 40), (5, 60), (20, 30), (15, 55), (30, 10)]
    assert sweep.pareto_front(points, larger_x_better=True) == [
        (5, 60), (15, 55), (20, 40), (30, 10)]
    assert sweep.pareto_front(points, larger_x_better=False) == [(5, 60)]


class FakeRunner:
    """Writes a generate-mode fixture for the point; records its calls."""

    def __init__(self, input_sha256="0" * 64):
        self.calls = []
        self.input_sha256 = input_sha256

    def __call__(self, point, directory, resume):
        self.calls.append((point.name, resume))
        decode = point.decode_config(BASE).as_dict()
        summary = write_generate_run(directory, seed=len(self.calls), decode=decode,
                                     per_benchmark=2, benchmarks=("gsm8k", "mmlu"))
        return summary


def _grid():
    return sweep.make_grid((0.3, 0.7), (0.4,), ("entropy", "left1"), BASE)


def test_sweep_outputs_and_resume(tmp_path):
    points = _grid()
    root = tmp_path / "sweep"
    # A partial point (rows only) is resumed; a foreign directory name is ignored.
    (root / points[1].name).mkdir(parents=True)
    (root / points[1].name / "predictions.jsonl").write_text("")
    runner = FakeRunner()
    log = io.StringIO()
    result = sweep.run_sweep(points, root, runner, base=BASE, metadata={"model": "fake"},
                             log=log)
    assert runner.calls == [(points[0].name, False), (points[1].name, True),
                            (points[2].name, False), (points[3].name, False)]
    document = json.loads((root / "sweep.json").read_text())
    assert document["format"] == "alodlm-jax-sweep"
    assert document["grid"] == {"q": [0.3, 0.7], "tau": [0.4], "mode": ["entropy", "left1"]}
    assert document["fixed_decode"] == {"window_size": 8, "max_new_tokens": 32,
                                        "position_penalty": None}
    records = document["points"]
    assert [r["status"] for r in records] == ["ran", "resumed", "ran", "ran"]
    for record, point in zip(records, points):
        summary = json.loads((root / point.name / "summary.json").read_text())
        assert record["macro_score_percent"] == summary["macro_score_percent"]
        assert record["suite_tokens_per_second"] == summary["suite_tokens_per_second"]
        assert record["loop_token_passes_per_output_token"] > 0
        assert record["report"] == f"{point.name}/report.html"
        assert (root / point.name / "report_exit_depths.png").read_bytes()[:8] == PNG_SIGNATURE
    page = (root / "report.html").read_text()
    links = set(re.findall(r'<a href="([^"]+)"', page))
    assert links == {f"{p.name}/report.html" for p in points}
    assert referenced_images(page) == {p.name for p in root.glob("*.png")} == {
        "sweep_score_vs_tokens_per_second.png", "sweep_score_vs_loop_passes.png"}
    for path in result.figure_paths:
        assert_png(path)

    # Second run: everything complete, nothing evaluated, reports kept.
    rerun = FakeRunner()
    sweep.run_sweep(points, root, rerun, base=BASE, log=io.StringIO())
    assert rerun.calls == []
    assert [r["status"] for r in json.loads((root / "sweep.json").read_text())["points"]] == [
        "skipped"] * 4

    # A complete point made with another decoding configuration is refused, not reused.
    other = sweep.make_grid((0.3,), (0.4,), ("entropy",), DecodeConfig(window_size=16))
    with pytest.raises(ValueError, match="was produced with decode"):
        sweep.run_sweep(other, root, FakeRunner(), base=DecodeConfig(window_size=16),
                        log=io.StringIO())
    with pytest.raises(ValueError, match="another task file"):
        sweep.run_sweep(points, root, FakeRunner(), base=BASE, input_sha256="f" * 64,
                        log=io.StringIO())


def test_sweep_of_rescored_points_skips_the_loop_frontier(tmp_path):
    from .test_run_report import write_rescore_run

    def runner(point, directory, resume):
        return write_rescore_run(directory)

    points = sweep.make_grid((0.5,), (0.4,), ("entropy",), BASE)
    result = sweep.run_sweep(points, tmp_path, runner, base=BASE, check_decode=False,
                             log=io.StringIO())
    assert [os.path.basename(p) for p in result.figure_paths] == [
        "sweep_score_vs_tokens_per_second.png"]
    page = (tmp_path / "report.html").read_text()
    assert "no point has loop-token pass counts" in page
    assert referenced_images(page) == {p.name for p in tmp_path.glob("*.png")}


# --------------------------------------------------------------------------------------------
# The evaluation-backed runner with a fake generator
# --------------------------------------------------------------------------------------------


class FakeGenerator:
    """Deterministic §6.6 results; answers correctly when q >= 0.5; can fail after n tasks."""

    def __init__(self, decode, fail_after=None):
        self.decode = decode
        self.fail_after = fail_after
        self.generated = 0
        self.warmups = 0

    def warmup(self, prompt):
        self.warmups += 1

    def check_prompt(self, prompt):  # the decoder's request checks: every fixture prompt passes
        self.checked = getattr(self, "checked", 0) + 1

    def generate(self, prompt):
        if self.fail_after is not None and self.generated >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.generated += 1
        word = prompt.split()[3]
        text = f"{word} ." if self.decode.q >= 0.5 else "t13"
        tokens = len(text.split())
        passes = 2 if self.decode.mode == "entropy" else 3
        return {"text": text, "token_ids": [9] * tokens, "prompt_tokens": 6,
                "generated_tokens": tokens, "wall_seconds": 0.25, "prefill_seconds": 0.05,
                "tokens_per_second": tokens / 0.25, "mean_exit_depth": 1.5,
                "loop_token_passes": passes * self.decode.window_size,
                "loop_token_passes_per_output_token": passes * self.decode.window_size / tokens,
                "outer_steps": 1, "recurrent_passes": passes, "exit_depths": [1, 2][:tokens],
                "first_pass_halt_probabilities": [0.25, 0.75][:tokens], "stop_reason": "eos"}

    def protocol_fields(self):
        return {"device_kind": "fake", "compile_seconds": 0.0}


class Factory:
    def __init__(self, fail_after=None):
        self.configs = []
        self.fail_after = fail_after

    def __call__(self, decode):
        self.configs.append(decode)
        return FakeGenerator(decode, self.fail_after)


def _settings_for(task_file, model=None, device=None):
    """The run record settings the sweep command gives a point (with no --model and no --device:
    when nothing is left to generate)."""
    from alodlm_jax.cli.flags import generate_run_settings

    def settings_for(point):
        return generate_run_settings(
            input_path=task_file, model=model, model_config=None, precision="fp32", device=device,
            decode=point.decode_config(BASE), code_sandbox="on", code_verdicts="reference",
            free={"decoder": "jax-xla-portable"})

    return settings_for


def _runner(tmp_path, factory, **settings):
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return EvaluationPointRunner(
        tasks=load_tasks(str(task_file)), input_sha256=sha256_file(str(task_file)),
        generators=factory, base=BASE, workers=1,
        fixed_protocol=fixed_protocol_fields("portable", "fp32", "cpu"),
        settings_for=_settings_for(str(task_file), **settings)), str(task_file)


def test_evaluation_runner_writes_evaluate_outputs_and_resumes(tmp_path):
    factory = Factory()
    runner, task_file = _runner(tmp_path, factory)
    points = sweep.make_grid((0.3, 0.7), (0.4,), ("entropy",), BASE)
    with runner:
        result = sweep.run_sweep(points, tmp_path / "sw", runner, base=BASE,
                                 input_sha256=sha256_file(task_file), reports=False,
                                 log=io.StringIO())
    assert [c.q for c in factory.configs] == [0.3, 0.7]
    low, high = (json.loads((tmp_path / "sw" / p.name / "summary.json").read_text())
                 for p in points)
    assert low["macro_score_percent"] == 0.0 and high["macro_score_percent"] == 100.0
    assert high["protocol"]["decoder"] == "jax-xla-portable"
    assert high["protocol"]["decode"] == points[1].decode_config(BASE).as_dict()
    assert high["protocol"]["device_kind"] == "fake"
    rows = [json.loads(line) for line in
            (tmp_path / "sw" / points[1].name / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["1", "2", 3] and all(r["correct"] for r in rows)
    assert list(rows[0])[-4:] == ["benchmark", "id", "correct", "extracted"]
    assert not (tmp_path / "sw" / points[0].name / "report.html").exists()  # reports=False
    assert result.points[1].stats.loop_token_passes_per_output_token == pytest.approx(16 / 2)

    # Killed before its first row: nothing is left, not even the sweep directory.
    runner, _ = _runner(tmp_path, Factory(fail_after=0))
    with pytest.raises(KeyboardInterrupt):
        with runner:
            sweep.run_sweep(points[1:], tmp_path / "runs" / "never", runner, base=BASE,
                            log=io.StringIO())
    assert not (tmp_path / "runs").exists()

    # Kill a point after one row, then resume: the files equal the uninterrupted run's.
    killed = Factory(fail_after=1)
    runner, _ = _runner(tmp_path, killed)
    fresh_root = tmp_path / "again"
    with pytest.raises(KeyboardInterrupt):
        with runner:
            sweep.run_sweep(points[1:], fresh_root, runner, base=BASE, log=io.StringIO())
    directory = fresh_root / points[1].name
    assert sweep.point_state(str(directory)) == "partial"
    assert len((directory / "predictions.jsonl").read_text().splitlines()) == 1
    resumed = Factory()
    runner, _ = _runner(tmp_path, resumed)
    with runner:
        result = sweep.run_sweep(points[1:], fresh_root, runner, base=BASE, log=io.StringIO())
    assert result.points[0].status == "resumed"
    for name in ("predictions.jsonl", "summary.json"):
        assert (directory / name).read_bytes() == (tmp_path / "sw" / points[1].name / name
                                                   ).read_bytes()


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


def _task_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return str(path)


@pytest.mark.parametrize("extra, message", [
    (["--q", "0.3,2"], "grid point q2.0_tau0.4_entropy: q must be in [0,1]"),
    (["--mode", "entropy,fast"], "--mode: 'fast' is not one of entropy, left1"),
    (["--window-size", "0"], "Window size and generation budget must be positive"),
    ([], "--model is required: 1 point(s) still need generating"),
])
def test_cli_bad_input_is_one_line_and_status_2(tmp_path, capsys, extra, message):
    argv = ["alodlm-jax-sweep", "--input", _task_file(tmp_path), "--output",
            str(tmp_path / "out")] + extra
    assert sweep_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("alodlm-jax-sweep: error: ")
    assert message in err


def test_cli_dry_run_and_complete_sweep_needs_no_model(tmp_path, capsys):
    task_file = _task_file(tmp_path)
    out = tmp_path / "out"
    argv = ["alodlm-jax-sweep", "--input", task_file, "--output", str(out), "--q", "0.3,0.7",
            "--max-new-tokens", "32", "--window-size", "8"]
    assert sweep_cli.main(argv + ["--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == ["q0.3_tau0.4_entropy\tfresh",
                                                    "q0.7_tau0.4_entropy\tfresh"]
    runner, _ = _runner(tmp_path, Factory())
    with runner:
        sweep.run_sweep(sweep.make_grid((0.3, 0.7), (0.4,), ("entropy",), BASE), out, runner,
                        base=BASE, reports=False, log=io.StringIO())
    assert sweep_cli.main(argv + ["--no-reports"]) == 0  # no --model: nothing left to generate
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / "report.html")
    assert "model loaded 0 time(s)" in captured.err


@pytest.mark.parametrize("extra, flag, recorded, new", [
    (["--precision", "bf16"], "--precision", "fp32", "bf16"),
    (["--max-new-tokens", "16"], "--max_new_tokens", "32", "16"),
    (["--code_verdicts", "strict"], "--code_verdicts", "reference", "strict"),
    (["--device", "tpu"], "--device", "cpu", "tpu"),
])
def test_cli_rerun_with_other_settings_is_refused_before_any_work(tmp_path, capsys, extra, flag,
                                                                 recorded, new):
    """A rerun continues only the same run: a complete point (and a partial one) whose run
    record binds another value is refused, one line, exit 2, every file as it was."""
    from alodlm_jax.data import BUILTINS

    model = str(BUILTINS["builtin:tiny"])
    task_file = _task_file(tmp_path)
    out = tmp_path / "out"
    points = sweep.make_grid((0.3, 0.7), (0.4,), ("entropy",), BASE)
    runner, _ = _runner(tmp_path, Factory(), model=model, device="cpu")
    with runner:  # q0.3 complete
        sweep.run_sweep(points[:1], out, runner, base=BASE, reports=False, log=io.StringIO())
    with pytest.raises(KeyboardInterrupt):  # q0.7 partial: killed after one row
        runner, _ = _runner(tmp_path, Factory(fail_after=1), model=model, device="cpu")
        with runner:
            sweep.run_sweep(points[1:], out, runner, base=BASE, reports=False, log=io.StringIO())
    before = {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}
    argv = ["alodlm-jax-sweep", "--input", task_file, "--output", str(out), "--q", "0.3,0.7",
            "--max-new-tokens", "32", "--window-size", "8", "--model", model, "--device", "cpu",
            "--engine", "portable"]
    assert sweep_cli.main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("alodlm-jax-sweep: error: cannot resume "), err
    assert f"{flag} was {recorded} when the run started, now {new}" in err, err
    assert {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()} == before


@pytest.mark.slow
def test_tiny_checkpoint_end_to_end(tmp_path, capsys):
    import alodlm_jax

    model = os.path.join(os.path.dirname(alodlm_jax.__file__), "data", "tiny_checkpoint")
    if not os.path.exists(os.path.join(model, "alodlm_config.json")):  # no prebuilt copy: build
        pytest.importorskip("torch")
        from alodlm_jax.testing.tiny_checkpoint import build_tiny_checkpoint

        model = build_tiny_checkpoint(tmp_path / "tiny")
    out = tmp_path / "sweep"
    argv = ["alodlm-jax-sweep", "--model", str(model), "--input", _task_file(tmp_path),
            "--output", str(out), "--q", "0.3,0.7", "--mode", "entropy,left1",
            "--max-new-tokens", "8", "--device", "cpu", "--workers", "1"]
    assert sweep_cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "model loaded 1 time(s)" in err
    document = json.loads((out / "sweep.json").read_text())
    assert [p["status"] for p in document["points"]] == ["ran"] * 4
    for record in document["points"]:
        summary = json.loads((out / record["name"] / "summary.json").read_text())
        assert summary["protocol"]["decode"]["q"] == record["q"]
        assert summary["protocol"]["decode"]["mode"] == record["mode"]
        assert record["loop_token_passes_per_output_token"] is not None
    page = (out / "report.html").read_text()
    assert referenced_images(page) == {p.name for p in out.glob("*.png")}
    assert sweep_cli.main(argv) == 0  # resume: all complete, the model is not even loaded
    assert "model loaded 0 time(s)" in capsys.readouterr().err


def test_shared_model_generators_load_once_and_share_params(monkeypatch):
    from alodlm_jax import generate as generation
    from alodlm_jax.report.sweep_runner import SharedModelGenerators

    loads = []

    class FakeLoaded:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)
            self.engine_name = kwargs.get("engine", "portable")

        def with_decode_config(self, decode_config):  # as Generator.with_decode_config: no reload
            return FakeLoaded(**{**self.__dict__, "decode_config": decode_config,
                                 "jax_device": generation.jax_device(self.device)})

    def fake_build(**kwargs):
        loads.append(kwargs)
        return FakeLoaded(cfg="cfg", params={"w": object()}, tokenizer="tok", model_dir="dir",
                          precision=kwargs["precision"], device=kwargs["device"],
                          engine=kwargs["engine"], decode_config=kwargs["decode_config"])

    monkeypatch.setattr(generation, "build_generator", fake_build)
    monkeypatch.setattr(generation, "Generator", FakeLoaded)
    monkeypatch.setattr(generation, "jax_device", lambda device: f"jax:{device}")
    factory = SharedModelGenerators("some/model", precision="bf16", device="cpu",
                                    engine="compiled")
    first_config, second_config = (DecodeConfig(q=0.3), DecodeConfig(q=0.7, mode="left1"))
    first = factory(first_config)
    second = factory(second_config)
    assert factory(first_config) is first  # the loaded generator serves its own configuration
    assert len(loads) == 1 == factory.loads and loads[0]["model"] == "some/model"
    assert second.params is first.params and second.tokenizer == "tok"
    assert second.decode_config == second_config and second.engine == "compiled"
    assert second.jax_device == "jax:cpu" and second.precision == "bf16"
