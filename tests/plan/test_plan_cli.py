"""alodlm-jax-plan: compile the tiny checkpoint's programs for a GPU and a TPU target without
either (the aot extra), the JSON it writes, the memory a JAX process gets, the missing extra; and the
batch program with the attention kernel (:mod:`alodlm_jax.kernels.window`) for each."""

import json
import pathlib
import subprocess
import sys

import pytest

from alodlm_jax.cli import plan as plan_cli
from alodlm_jax.plan import targets
from alodlm_jax.plan.compile import PROGRAM_KEYS
from alodlm_jax.plan import aot_gpu

pytestmark = pytest.mark.jax_backend

TINY = ["--model", "builtin:tiny", "--prompt_tokens", "20", "--max_new_tokens", "32",
        "--window_size", "4"]
HAVE_TPU = targets.missing_extra(targets.load_target("v5p")) is None
# .ci/run keeps the aot extra's GPU half out of the environment (module docstring of .ci/run):
# the GPU plan then runs in a child process with it on PYTHONPATH.
HAVE_GPU = aot_gpu.INSTALLED


def _run(tmp_path, *args):
    out = tmp_path / "plan.json"
    status = plan_cli.main(["alodlm-jax-plan", *TINY, *args, "--json", str(out)])
    return status, (json.loads(out.read_text()) if out.exists() else None)


def _run_gpu(tmp_path, capsys, *args):
    """``(status, record, stdout)`` of a GPU plan: in this process where the plugin is installed,
    else in a child with .ci/aot-gpu on its path."""
    if HAVE_GPU:
        status, record = _run(tmp_path, *args)
        return status, record, capsys.readouterr().out
    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "alodlm_jax.cli.plan", *TINY, *args, "--json",
                           str(out)], env=aot_gpu.child_env(), capture_output=True, text=True,
                          timeout=600)
    return done.returncode, (json.loads(out.read_text()) if out.exists() else None), done.stdout


@pytest.mark.skipif(not HAVE_TPU, reason="needs the aot extra (libtpu)")
def test_tpu_target_prefill_compiles_here_and_the_json_has_every_key(tmp_path, capsys):
    status, record = _run(tmp_path, "--target", "v5p", "--programs", "prefill")
    assert status == 0
    assert {"target", "programs", "max_batch_size"} <= set(record)
    assert record["target"]["name"] == "v5p" and record["device"].startswith("tpu")
    (program,) = record["programs"]
    assert set(PROGRAM_KEYS) <= set(program) and program["name"] == "prefill"
    assert program["fits"] is True and program["compile_seconds"] > 0
    assert program["program_bytes"] > 0 and program["weight_bytes"] > 0
    assert program["device_memory_bytes"] >= program["weight_bytes"] + program["cache_bytes"]
    assert program["capacity_bytes"] == 95_000_000_000
    assert record["max_batch_size"] >= 1
    assert "prefill: compile" in capsys.readouterr().out


@pytest.mark.skipif(not HAVE_TPU, reason="needs the aot extra (libtpu)")
def test_a_mesh_over_the_tpu_topology_splits_the_weights(tmp_path):
    status, one = _run(tmp_path, "--target", "v5p", "--programs", "prefill")
    assert status == 0
    status, split = _run(tmp_path, "--target", "v5p", "--programs", "prefill", "--mesh", "model=2")
    assert status == 0 and split["mesh"] == {"data": 1, "model": 2}
    # As evaluate loads them: stacked layer groups on a TPU, one device or a mesh; and the
    # accelerators' one fixed shape, with the attention kernel on one TPU.
    assert (one["layer_layout"], split["layer_layout"]) == ("stacked", "stacked")
    assert (one["shapes"], split["shapes"]) == ("fixed-kernel", "fixed")
    # Per device: each of the two holds half of every split weight (norms and the gate are whole).
    assert split["programs"][0]["weight_bytes"] < 0.6 * one["programs"][0]["weight_bytes"]


@pytest.mark.skipif(not aot_gpu.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_gpu_target_plans_against_what_a_jax_process_gets(tmp_path, capsys):
    status, record, out = _run_gpu(tmp_path, capsys, "--target", "h200", "--batch_size", "2",
                                   "--programs", "admit")
    assert status == 0
    assert record["device"].startswith("gpu")
    # As evaluate runs on one GPU: per-layer weights, the fixed shapes with the attention kernel.
    assert (record["layer_layout"], record["shapes"]) == ("per-layer", "fixed-kernel")
    (program,) = record["programs"]
    assert set(PROGRAM_KEYS) <= set(program) and program["name"] == "admit"
    # JAX's CUDA client gives its allocator 75% of the device (alodlm_jax.plan.fit).
    assert program["capacity_bytes"] == 141_000_000_000
    assert program["usable_bytes"] == record["usable_bytes"] == 105_750_000_000
    assert program["fits"] is True and record["fits"] is True
    assert 0 < program["beyond_arguments_bytes"] < program["device_memory_bytes"]
    assert record["max_batch_size"] > 2
    assert "105.75 GB usable: fits" in out


def test_without_the_aot_extra_one_line_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(targets, "_importable", lambda module: False)
    for target in ("h100", "v6e"):
        status, record = _run(tmp_path, "--target", target)
        assert status == 2 and record is None
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("alodlm-jax-plan: error:")
        assert "[aot]" in err[0] and "pip install" in err[0]


def test_unknown_target_and_missing_prompt_length_are_one_line_errors(tmp_path, capsys):
    status, _ = _run(tmp_path, "--target", "h999")
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--target" in err[0] and "h200" in err[0]
    status = plan_cli.main(["alodlm-jax-plan", "--model", "released:8b", "--target", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--prompt_tokens" in err[0]


def test_every_named_target_file_loads():
    names = targets.target_names()
    assert {"h100", "h200", "b200", "a100", "v5e", "v5p", "v6e", "cpu", "attached"} <= set(names)
    for name in names:
        if name != "attached":
            target = targets.load_target(name)
            assert target.capacity_bytes > 0
    assert targets.load_target("h200").bandwidth_bytes_per_second == 4.8e12


def test_a_window_makes_its_rope_tables_once_not_in_every_pass(tmp_path):
    """The single-request program's pass loop (its step) computes no cosine or sine: a window's
    RoPE tables are made when it opens (decode.window.open_window), as its prelude is."""
    import gzip

    from alodlm_jax.plan import hlo

    status, _ = _run(tmp_path, "--target", "cpu", "--programs", "single", "--save_hlo",
                     str(tmp_path))
    assert status == 0
    module = hlo.parse(gzip.open(tmp_path / "single.hlo.gz", "rt").read())
    passes = hlo.step_loop(module, depth=2)

    def reached(names, seen):  # the computations these call, transitively
        for name in names:
            if name in module.computations and name not in seen:
                seen.add(name)
                for instr in module.computations[name].instructions:
                    reached([c for key in ("calls", "to_apply", "body", "condition",
                                           "branch_computations")
                             for c in module.callees(instr, key)], seen)
        return seen

    def trig(names):
        return {i.opcode for n in names for i in module.computations[n].instructions
                if i.opcode in ("cosine", "sine")}

    assert trig(module.computations) == {"cosine", "sine"}  # the program has them
    assert trig(reached(module.callees(passes, "body") + module.callees(passes, "condition"),
                        set())) == set()


# The batch program evaluate runs on one TPU or GPU, at shapes the kernels support (heads of 128,
# a window of 16 rows): each layer's attention is a Mosaic or Triton call.
def _kernel_calls(target: str, out: str, program: str = "batch", window: int = 8) -> dict:
    import dataclasses
    import gzip

    import jax.numpy as jnp

    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.plan.compile import plan
    from alodlm_jax.testing.released_shapes import model_config, param_specs

    cfg = dataclasses.replace(model_config("8b", tiny=True), head_dim=128)
    record = plan(targets.load_target(target), cfg, param_specs(cfg, jnp.bfloat16),
                  DecodeConfig(window_size=window, max_new_tokens=32), prompt_tokens=20,
                  batch_size=2 if program == "batch" else 1, programs=[program], save_hlo=out)
    text = gzip.open(pathlib.Path(out) / f"{program}.hlo.gz", "rt").read()
    return {"shapes": record["shapes"], "layers": cfg.num_hidden_layers,
            "tpu": text.count('custom_call_target="tpu_custom_call"'),
            "triton": text.count("xla.gpu.triton"),
            "combine": sum("_gpu_combine_kernel" in line for line in text.splitlines()
                           if "xla.gpu.triton" in line),
            "norm_rope": sum("_norm_rope_kernel" in line for line in text.splitlines()
                             if "xla.gpu.triton" in line),
            "matmul": sum(("_norm_matmul_kernel" in line or "_matmul_residual_kernel" in line)
                          for line in text.splitlines() if "xla.gpu.triton" in line)}


@pytest.mark.skipif(not HAVE_TPU, reason="needs the aot extra (libtpu)")
def test_the_tpu_batch_program_attends_in_the_mosaic_kernel(tmp_path):
    # In this process: libtpu serves one process at a time, and the suite's has it.
    result = _kernel_calls("v5p", str(tmp_path))
    assert result["shapes"] == "fixed-kernel"
    # Layers stacked on a TPU: one kernel call in each layer group's body (prelude, core, coda).
    assert (result["tpu"], result["triton"]) == (3, 0)


def _gpu_kernel_calls(out, *args) -> dict:
    """:func:`_kernel_calls` for an H200, in a child with the plugin on its path where this
    process has no GPU (as _run_gpu)."""
    if HAVE_GPU:
        return _kernel_calls("h200", str(out), *args)
    code = ("import json, sys; from test_plan_cli import _kernel_calls; "
            "json.dump(_kernel_calls('h200', sys.argv[1], *json.loads(sys.argv[2])), sys.stdout)")
    done = subprocess.run([sys.executable, "-c", code, str(out), json.dumps(args)],
                          env=aot_gpu.child_env(pathlib.Path(__file__).parent),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not aot_gpu.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_the_gpu_batch_program_attends_in_the_triton_kernel(tmp_path):
    result = _gpu_kernel_calls(tmp_path)
    assert result["shapes"] == "fixed-kernel"
    # Per-layer weights on a GPU: one kernel call per layer, which also applies the heads'
    # norms and RoPE (bf16), and (2 requests x 2 KV heads, far fewer programs than SMs: the
    # prefix in parts) one combining its parts; and (32 rows) the layer's four products with
    # their norms and residual adds.
    assert result["triton"] == 6 * result["layers"] and result["tpu"] == 0
    assert result["combine"] == result["layers"] and result["norm_rope"] == 0
    assert result["matmul"] == 4 * result["layers"]


@pytest.mark.skipif(not aot_gpu.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_a_single_request_attends_in_the_triton_kernel_at_any_window(tmp_path):
    """The single-request program attends in the same kernel (a batch of one), also where the
    window's rows are no Triton tile (window 5: 10 rows, padded to 16)."""
    result = _gpu_kernel_calls(tmp_path, "single", 5)
    assert result["shapes"] == "fixed-kernel"
    # The window's prelude layers run once per window, the core and coda each pass: every layer
    # of the program calls the kernel once, which (bf16) applies the heads' norms and RoPE and
    # (its counts carried from layer to layer) combines the parts of its prefix in its last
    # part; its products stay XLA's (10 rows are no Triton dot's).
    assert result["triton"] == result["layers"] and result["tpu"] == 0
    assert result["combine"] == 0 and result["norm_rope"] == 0
    assert result["matmul"] == 0


@pytest.mark.skipif(not aot_gpu.AVAILABLE,
                    reason="needs the aot extra (jax-cuda12-plugin, -pjrt, ptxas)")
def test_the_gpu_batch_step_runs_in_command_buffers_with_graphs(tmp_path, capsys):
    steps = {}
    for choice in ("graphs", "engine"):
        status, record, out = _run_gpu(tmp_path, capsys, "--target", "h200", "--batch_size", "2",
                                       "--programs", "batch", "--command_buffers", choice)
        assert status == 0
        (steps[choice],) = record["programs"]
        assert ("WHILE" in str(record["xla_options"])) == (choice == "graphs")
    graphs, xla = steps["graphs"], steps["engine"]  # the engine compiles with XLA's defaults
    # Loops and branches in graphs: the loop of steps, its branches and loops in one command buffer.
    assert graphs["step_in_command_buffer"] is True
    assert graphs["kernels_outside_command_buffers"] == graphs["host_syncs"] == 0
    assert graphs["kernels_in_command_buffers"] > 0
    # XLA's defaults: the host reads the step loop's predicate and the branch indices back.
    assert xla["step_in_command_buffer"] is False
    assert xla["kernels_outside_command_buffers"] > 0 and xla["host_syncs"] >= 2
    assert 0 < graphs["predicted_step_seconds"] < xla["predicted_step_seconds"]
    assert graphs["flops_per_step"] == xla["flops_per_step"] > 0
