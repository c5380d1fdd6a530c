"""Tensor parallelism on 4 forced host CPU devices (a subprocess, so the device count is ours):
sharded loading reads only each device's slice and equals the unsharded loader exactly; the
looped forward matches within 1e-5; the portable engine decodes the same tokens (fp32). The
compiled engine's layouts: ``test_compiled_layouts.py``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[2]
PROMPTS = [[4, 7, 8, 9, 2, 5], [6, 20, 31, 12, 44, 45, 46, 5, 7], [7, 8, 10]]


def forced_devices_env(count: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("torch")
    from alodlm_convert.convert import convert_checkpoint
    from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint

    root = tmp_path_factory.mktemp("tp")
    # kv heads 4: model=2 and model=4 work; several safetensors files with an index.
    hf4 = build_tiny_checkpoint(root / "hf_kv4", TinySpec.for_topology(
        "sandwich", num_heads=4, num_kv_heads=4, lm_head_scale=64.0, max_shard_size="20KB", seed=3))
    conv4 = convert_checkpoint(hf4, root / "conv_kv4")
    # kv heads 2 (GQA groups of 2): model=2 works, model=4 must be refused.
    hf2 = build_tiny_checkpoint(root / "hf_kv2", TinySpec.for_topology(
        "all_layer", num_heads=4, num_kv_heads=2, lm_head_scale=64.0, seed=5))
    return {"hf4": str(hf4), "conv4": str(conv4), "hf2": str(hf2)}


def run_worker(args: dict, devices: int = 4, timeout: int = 600) -> dict:
    proc = subprocess.run([sys.executable, str(HERE), json.dumps(args)], env=forced_devices_env(devices),
                          capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_load(report, name, model):
    entry = report["load"][name]
    assert entry["equal"], name
    shapes = entry["shard_shapes"]
    h, hq, i, v = 32, 4 // model, 64 // model, 64 // model
    kv = report["kv_heads"][name.split("/")[0]] // model
    n = shapes["core.input_norm"][0]  # core layers: 1 (sandwich) or 2 (all-layer)
    assert shapes["core.q"] == [n, h, hq, 8]                # [L, H, n_q/m, d_h]
    assert shapes["core.k"] == shapes["core.v"] == [n, h, kv, 8]  # [L, H, n_kv/m, d_h]
    assert shapes["core.o"] == [n, hq, 8, h]                # [L, n_q/m, d_h, H]
    assert shapes["core.gate_proj"] == [n, h, i]            # [L, H, I/m]
    assert shapes["core.down_proj"] == [n, i, h]            # [L, I/m, H]
    assert shapes["lm_head"] == [h, v] and shapes["embed"] == [v, h]
    assert shapes["core.input_norm"] == [n, h]              # replicated
    assert shapes["gate.weight"] == [h]


def check_decode(report, name, base):
    if base == "hf4/single":  # the fixture exercises varied tokens, exit depths, multi-token commits
        runs = report["decode"][base]
        assert all(len(set(r["token_ids"])) >= 2 for r in runs), "degenerate fixture"
        assert len({d for r in runs for d in r["exit_depths"]}) >= 2, "degenerate fixture"
        assert any(r["outer_steps"] < r["generated_tokens"] for r in runs), "degenerate fixture"
    for got, want in zip(report["decode"][name], report["decode"][base], strict=True):
        assert got["token_ids"] == want["token_ids"], name
        assert got["exit_depths"] == want["exit_depths"], name
        assert got["stop_reason"] == want["stop_reason"], name
        halts = zip(got["first_pass_halt_probabilities"], want["first_pass_halt_probabilities"], strict=True)
        assert max((abs(a - b) for a, b in halts), default=0.0) < 1e-5, name


@pytest.mark.slow  # the default suite splits the weights with model=2 (test_compiled_layouts)
def test_model4_load_and_decode_equal_single_device(checkpoints):
    """model=4 on a 3-file HF checkpoint: exact params, same tokens, KV cache split by head."""
    report = run_worker({"paths": checkpoints, "level": "quick"})
    check_load(report, "hf4/model=4", 4)
    check_decode(report, "hf4/model=4", "hf4/single")
    cache = report["cache_spec"]["hf4/model=4"]  # core_k [L, K, T_max, n_kv, d_h]: n_kv over 4 devices
    assert cache["devices"] == 4 and cache["global"][3] == 4
    assert cache["shard"] == cache["global"][:3] + [1, cache["global"][4]]
    assert report["bf16_equal"] and report["bf16_dtypes"] == ["bfloat16", "float32"]  # gate stays fp32
    assert report["mesh22"] == {"equal": True, "shards": [[0, 2], [2, 2]], "devices": 4}
    # Divisibility: n_kv = 2 and model = 4 is refused with the sizes named.
    assert "model=4" in report["kv2_model4_error"] and "num_key_value_heads=2" in report["kv2_model4_error"]


@pytest.mark.slow
def test_converted_dir_gqa_and_forward(checkpoints):
    """Converted dir (Flax layout) at model=2 and 4, GQA (n_kv=2) all-layer topology at model=2:
    exact params, looped-forward logits within 1e-5, same tokens."""
    report = run_worker({"paths": checkpoints, "level": "full"})
    check_load(report, "conv4/model=4", 4)
    check_load(report, "hf2/model=2", 2)
    for name, diff in report["forward"].items():
        assert diff["logits"] <= 1e-5 and diff["hazards"] <= 1e-5, (name, diff)
    check_decode(report, "conv4/model=2", "hf4/single")
    check_decode(report, "hf2/model=2", "hf2/single")


# ---------------------------------------------------------------------------------------------
# The worker (runs in the subprocess)
# ---------------------------------------------------------------------------------------------


def _worker(args: dict) -> dict:
    import jax
    import numpy as np

    from alodlm_jax.network import sharding
    from alodlm_jax.generate import build_generator
    from alodlm_jax.config import DecodeConfig
    from alodlm_jax.network.model import looped_forward
    from alodlm_jax.network.params import load_model

    paths, full = args["paths"], args["level"] == "full"
    assert len(jax.local_devices()) == 4, jax.local_devices()
    report: dict = {"load": {}, "forward": {}, "decode": {}, "cache_spec": {}, "kv_heads": {}}
    forward = jax.jit(looped_forward, static_argnums=1)
    ids = jax.numpy.asarray([4, 7, 8, 9, 2, 5, 30, 31, 32, 12, 5], jax.numpy.int32)
    loads = [("conv4", 4), ("hf2", 2)] if full else [("hf4", 4)]
    for key, model in loads:
        cfg, ref = load_model(paths[key], "fp32")
        report["kv_heads"][key] = cfg.num_key_value_heads
        mesh = sharding.make_mesh(f"model={model}")
        cfg2, sharded = sharding.load_sharded_model(paths[key], mesh, "fp32")
        assert cfg2 == cfg
        equal = all(bool(np.array_equal(np.asarray(a), np.asarray(b))) and a.shape == b.shape
                    and a.dtype == b.dtype
                    for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(sharded),
                                    strict=True))
        shapes = {}
        for path, leaf in jax.tree_util.tree_leaves_with_path(sharded):
            name = ".".join(str(getattr(k, "key", k)) for k in path)
            shapes[name] = list(leaf.addressable_shards[0].data.shape)
        report["load"][f"{key}/model={model}"] = {"equal": equal, "shard_shapes": shapes}
        if full:
            l1, h1 = forward(ref, cfg, ids)
            l2, h2 = forward(sharded, cfg, ids)
            report["forward"][f"{key}/model={model}"] = {"logits": float(abs(l1 - l2).max()),
                                                         "hazards": float(abs(h1 - h2).max())}

    decode = DecodeConfig(q=1.0, tau=1.0, window_size=4, max_new_tokens=24)

    def run(name, model_dir, mesh):
        gen = build_generator(model=model_dir, mesh=mesh, device="cpu", precision="fp32",
                                       decode_config=decode, engine="portable")
        report["decode"][name] = [gen.generate_ids(p) for p in (PROMPTS if full else PROMPTS[:2])]
        return gen

    if full:
        run("hf4/single", paths["hf4"], "model=1")
        run("conv4/model=2", paths["conv4"], "model=2")
        run("hf2/single", paths["hf2"], "model=1")
        run("hf2/model=2", paths["hf2"], "model=2")
    else:
        run("hf4/single", paths["hf4"], "model=1")
        gen = run("hf4/model=4", paths["hf4"], "model=4")
        cache = gen.engine._cache
        report["cache_spec"]["hf4/model=4"] = {
            "global": list(cache.core_k.shape), "shard": list(cache.core_k.addressable_shards[0].data.shape),
            "devices": len(cache.core_k.sharding.device_set)}
        # bf16 from fp32 files: the converter's exact casts, slice by slice; the brief's entry point.
        mesh4 = sharding.make_mesh("model=4")
        cfg, ref16 = load_model(paths["hf4"], "bf16")
        got16 = sharding.load_sharded_params(paths["hf4"], cfg, mesh4, "bf16")
        report["bf16_equal"] = all(
            a.dtype == b.dtype and bool(np.array_equal(np.asarray(a).reshape(-1).view(np.uint8), np.asarray(b).reshape(-1).view(np.uint8)))
            for a, b in zip(jax.tree_util.tree_leaves(ref16), jax.tree_util.tree_leaves(got16), strict=True))
        report["bf16_dtypes"] = sorted({str(x.dtype) for x in jax.tree_util.tree_leaves(got16)})
        # A 2 x 2 mesh: split on model, replicated on data.
        mesh22 = sharding.make_mesh("model=2,data=2")
        _, p22 = sharding.load_sharded_model(paths["hf4"], mesh22, "bf16")
        q = p22["core"]["q"]
        report["mesh22"] = {
            "equal": bool(np.array_equal(np.asarray(q), np.asarray(ref16["core"]["q"]))),
            "shards": sorted({(s.index[2].start or 0, s.data.shape[2]) for s in q.addressable_shards}),
            "devices": len(q.sharding.device_set)}
        try:
            sharding.load_sharded_model(paths["hf2"], sharding.make_mesh("model=4"), "fp32")
            report["kv2_model4_error"] = ""
        except ValueError as error:
            report["kv2_model4_error"] = str(error)
    return report


if __name__ == "__main__":
    result = _worker(json.loads(sys.argv[1]))
    print(json.dumps(result))
