"""The scripts run end to end on the CPU (slow: they compile the engines)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_tiny_runs_on_cpu():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--tiny",
                           "--max_new_tokens", "16", "--batches", "1,3", "--graphs"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GPU_CHECK_DONE ok" in done.stdout
    assert done.stdout.count("same tokens portable/compiled: True") == 4
    # The heads' norms kernel against XLA's form (interpreted here), and a window layer's
    # products (XLA's form on both sides here), two row counts each per shape; and the attention
    # kernel applying the heads' norms itself against the two kernels, one request's rows.
    assert done.stdout.count("% equal, max |difference|") == 10
    assert done.stdout.count("normed attention rows   32: one kernel vs two") == 2
    # And the attention kernel's last part combining a prefix's parts, at two prefixes.
    assert done.stdout.count("in the kernel vs a second kernel 100.000% equal, 0 of 2 calls") == 4
    assert done.stdout.count("  layer products rows   32: XLA's form") == 2
    assert done.stdout.count("  layer products rows   64: XLA's form") == 2
    # The batch sweep: both sizes on both shapes, each with XLA's step analysis and equal tokens.
    assert done.stdout.count("same tokens: True") == 4
    assert done.stdout.count("\n  batch   3:") == 2 and "GB moved (floor" in done.stdout
    # Each batch engine's first run (its programs compiled, its prompts admitted and decoded),
    # timed: XLA's defaults and graphs, both sizes, both shapes.
    assert done.stdout.count("s (compiles included)") == 8
    # The plan of each program measured beside it (the single-request program and both batch
    # sizes, both shapes): the predicted step against the measured one, planned memory, the
    # measured peak, the allocator's limit.
    # --graphs: each compiled program again with loops and branches in command buffers (on a CPU
    # the same options), its tokens against XLA's defaults' and its plan beside it.
    assert done.stdout.count("same tokens as XLA's defaults: True") == 8
    assert done.stdout.count("\n  plan single   1: predicted") == 4
    assert done.stdout.count("\n  plan  batch   3: predicted") == 4
    assert done.stdout.count("measured/predicted") == 12
    assert done.stdout.count("GB planned, peak in use") == 12
    assert done.stdout.count("of an allocator limit of") == 12


def gpu_goals(tmp_path, *flags):
    report = tmp_path / "goals.json"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--goals", "--tiny",
                           "--max_new_tokens", "8", "--batches", "3", "--single_prompts", "2",
                           "--json", str(report), *flags],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(report.read_text())


@pytest.mark.slow
def test_gpu_check_goals_tiny_runs_on_cpu(tmp_path):
    """--goals runs its items in order on both shapes and gives each goal a verdict; on a CPU the
    thresholds are not the point (its times are not a GPU's), what is measured and recorded is."""
    out, report = gpu_goals(tmp_path)
    assert "GPU_CHECK_DONE ok" in out and report["not_measured"] == report["failed"] == []
    items = [line.split(" (")[0] for line in out.splitlines() if line.startswith("-- ")]
    assert items == ["-- 1.7b combined attention", "-- 1.7b single", "-- 1.7b one at a time",
                     "-- 1.7b batch 3", "-- 8b combined attention", "-- 8b single",
                     "-- 8b batch 3", "-- 1.7b single graphs", "-- 1.7b batch 3 graphs",
                     "-- 8b one at a time"]
    goals = {(v["model"], v["goal"]): v for v in report["verdicts"]}
    for model in ("1.7b", "8b"):
        assert goals[model, "combined attention: calls that differ"]["measured"] == 0
        for goal in ("single (XLA's defaults): ms per pass / all weights at the bandwidth",
                     "single (XLA's defaults): measured / predicted ms per step",
                     "batch 3 (XLA's defaults): first run s",
                     "batch 3 (XLA's defaults): measured / predicted ms per step",
                     "batch 3 (XLA's defaults): ms per step / max(floor bytes, FLOPs)"):
            assert goals[model, goal]["measured"] > 0
    # Tokens/s against one at a time where all the batch's prompts ran one at a time (the 1.7B),
    # and graphs against XLA's defaults: the same tokens (on a CPU the same options).
    assert goals["1.7b", "batch 3: suite tok/s / one at a time"]["limit"] == 20
    assert ("8b", "batch 3: suite tok/s / one at a time") not in goals
    assert "3 of 3 requests the same tokens as one at a time" in out
    assert out.count("same tokens as XLA's defaults: True") == 2


@pytest.mark.slow
def test_gpu_check_goals_stops_at_its_budget(tmp_path):
    """Past --budget_s no item starts: each is listed as not measured, in the output and the
    report."""
    out, report = gpu_goals(tmp_path, "--budget_s", "0")
    assert report["verdicts"] == report["failed"] == [] and len(report["not_measured"]) == 10
    assert out.count("not measured (the budget of 0 s was spent)") == 10
    assert "-- " not in out


@pytest.mark.slow
def test_gpu_check_refuses_bad_flags_before_it_builds_anything():
    for flags, message in ((["--models", "1.7b,9b"], "--models: unknown 9b"),
                           (["--goals", "--window_size", "0"], "--window_size / --max_new_tokens"),
                           (["--goals", "--batches", ""], "--goals needs at least one batch")):
        done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--tiny", *flags],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.splitlines()[-1].startswith(f"scripts/gpu_check.sh: error: {message}")


@pytest.mark.slow
def test_bench_decode_quick_run(tmp_path):
    """The decode benchmark runs end to end (small model, short budget) and writes its report."""
    report = tmp_path / "bench.json"
    done = subprocess.run(
        ["python", str(ROOT / "scripts" / "bench_decode.py"), "--quick", "--models", "small",
         "--modes", "entropy", "--batch", "2", "--batch_prompts", "3", "--repeats", "1",
         "--scaling", "", "--step_costs", "1,2", "--workdir", str(tmp_path / "work"), "--json", str(report)],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(report.read_text())
    model = data["models"][0]
    assert model["modes"]["entropy"]["same_tokens"] is True
    assert model["batch_same_tokens"] == {"entropy": True}
    engines = {row["engine"] for row in model["modes"]["entropy"]["rows"]}
    assert engines == {"portable", "compiled", "torch-eager", "compiled-seq2", "compiled-batch2"}
    for goal in model["goals"].values():
        assert goal["measured"] > 0 and goal["ceiling"] > 0
    assert "goal compiled/torch >= 10.0" in done.stdout
    # The batch goal's second bound: the prompts' own passes (the longest request sets the steps).
    passes = model["batch_passes"]["entropy"]
    batch_goal = model["goals"]["batch/compiled"]
    assert batch_goal["passes"]["least_steps"] == max(max(passes), -(-sum(passes) // 2))
    assert 1.0 <= batch_goal["workload_ceiling"] <= 2.0
    assert "even if a step cost one pass" in done.stdout
    # XLA's cost and memory analysis of one batch step at each size, beside the floor.
    costs = data["step_costs"]["small"]
    assert [c["batch"] for c in costs] == [1, 2]
    assert all(c["flops"] > 0 and 0 < c["floor_bytes"] <= c["bytes_moved"] for c in costs)
    assert costs[1]["flops"] > costs[0]["flops"]
    assert "one batch step, XLA cost/memory analysis" in done.stdout


def test_source_tree_makes_mapped_packages_importable(tmp_path):
    """scripts/source_tree.py: a package that lives in a folder of another name (pyproject's
    package map) imports from a checkout that is not installed."""
    (tmp_path / "pkg_folder").mkdir()
    (tmp_path / "pkg_folder" / "__init__.py").write_text("ANSWER = 42\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import source_tree; "
            "source_tree.use(__import__('pathlib').Path(sys.argv[2]), "
            "{'alodlm_unmapped_probe': 'pkg_folder'}); "
            "import alodlm_unmapped_probe; print(alodlm_unmapped_probe.ANSWER)")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "42"


@pytest.mark.slow
def test_gpu_parity_script_on_cpu(tmp_path):
    """scripts/gpu_parity.py with the CPU on both sides (the accelerators' fixed shapes on the
    device side): identical counts and exit 0; a difference (here: a negative tolerance, which
    every request exceeds) is reported per request and exits 1."""
    script = [sys.executable, str(ROOT / "scripts" / "gpu_parity.py"), "--device", "cpu",
              "--shapes", "fixed"]
    done = subprocess.run(script + ["--quick", "--prompts", "4", "--batches", "1,8"],
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "parity PASSED: batch 1: 8/8 identical, batch 8: 8/8 identical" in done.stdout
    assert "window 7" in done.stdout and "window 10" in done.stdout
    done = subprocess.run(script + ["--settings", "0", "--prompts", "2", "--batches", "8",
                                    "--halt_tolerance", "-1", "--graphs"],
                          capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "loops and branches in command buffers" in done.stdout  # --graphs (nothing on a CPU)
    assert "parity FAILED: batch 8: " in done.stdout
    assert "first-pass halting probabilities differ by up to" in done.stdout


@pytest.mark.slow
def test_bench_first_run_runs():
    """scripts/bench_first_run.py: a fresh process's first batch, compiles included, reported."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_first_run.py"),
                           "--batch", "2", "--max_new_tokens", "8", "--repeats", "1"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "run 1: first generate_batch" in done.stdout and "compile seconds" in done.stdout
