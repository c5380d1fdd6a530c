"""Mesh parsing, divisibility errors, partition rules and the deterministic task split (no
devices needed beyond the default one)."""

from __future__ import annotations

import types

import pytest
from jax.sharding import PartitionSpec as P

from alodlm_jax.cli import distributed
from alodlm_jax.network import sharding


def cfg(**overrides):
    base = dict(num_key_value_heads=8, num_attention_heads=32, intermediate_size=12288, vocab_size=151936)
    base.update(overrides)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize("text, model, data", [
    (None, 1, 1), ("", 1, 1), ("model=4", 4, 1), ("model=2,data=2", 2, 2), ("data=3 model=2", 2, 3),
])
def test_mesh_spec_parse(text, model, data):
    spec = sharding.MeshSpec.parse(text)
    assert (spec.model, spec.data, spec.num_devices) == (model, data, model * data)


@pytest.mark.parametrize("text, fragment", [
    ("model", "cannot parse 'model'"), ("tensor=2", "unknown axis 'tensor'"),
    ("model=2,model=4", "given twice"), ("model=0", "positive integer"),
])
def test_mesh_spec_errors(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        sharding.MeshSpec.parse(text)


def test_divisibility_error_names_the_sizes():
    sharding.check_divisibility(cfg(), 8)
    with pytest.raises(ValueError) as error:
        sharding.check_divisibility(cfg(), 16)
    message = str(error.value)
    assert "model=16" in message and "num_key_value_heads=8" in message
    assert "num_attention_heads" not in message  # 32 is divisible by 16
    assert "[1, 2, 4, 8]" in message
    assert "\n" not in message


def test_make_mesh_needs_enough_devices():
    with pytest.raises(ValueError, match="needs 64 devices"):
        sharding.make_mesh("model=64")
    mesh = sharding.make_mesh("model=1")
    assert mesh.axis_names == ("data", "model") and mesh.devices.shape == (1, 1)


def test_partition_rules():
    specs = sharding.param_specs()
    core = specs["core"]
    assert core["q"] == P(None, None, "model", None)  # [L, H, n_q, d_h]: heads
    assert core["k"] == core["v"] == P(None, None, "model", None)
    assert core["o"] == P(None, "model", None, None)  # [L, n_q, d_h, H]: input heads
    assert core["gate_proj"] == core["up_proj"] == P(None, None, "model")  # I out
    assert core["down_proj"] == P(None, "model", None)  # I in
    for norm in ("input_norm", "q_norm", "k_norm", "post_norm"):
        assert "model" not in tuple(core[norm])
    assert specs["lm_head"] == P(None, "model") and specs["embed"] == P("model", None)
    assert all("model" not in tuple(s) for s in specs["gate"].values())
    assert sharding.CACHE_SPECS["core_k"] == P(None, None, None, "model", None)  # [L, K, T, n_kv, d_h]
    assert sharding.CACHE_SPECS["prelude_v"] == P(None, None, "model", None)


@pytest.mark.parametrize("scheme", distributed.SPLITS)
@pytest.mark.parametrize("num_tasks, num_processes", [(0, 2), (1, 3), (7, 2), (20, 3), (5, 5), (4, 8)])
def test_split_is_a_partition(scheme, num_tasks, num_processes):
    parts = [distributed.split_tasks(num_tasks, num_processes, p, scheme) for p in range(num_processes)]
    flat = sorted(i for part in parts for i in part)
    assert flat == list(range(num_tasks))
    assert all(part == sorted(part) for part in parts)
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1


def test_split_schemes():
    assert distributed.split_tasks(7, 2, 0, "round_robin") == [0, 2, 4, 6]
    assert distributed.split_tasks(7, 2, 1, "round_robin") == [1, 3, 5]
    assert distributed.split_tasks(7, 2, 0, "contiguous") == [0, 1, 2]
    assert distributed.split_tasks(7, 2, 1, "contiguous") == [3, 4, 5, 6]
    with pytest.raises(ValueError):
        distributed.split_tasks(7, 2, 2)
    with pytest.raises(ValueError):
        distributed.split_tasks(7, 2, 0, "random")


def test_initialize_single_process_and_flag_errors():
    assert distributed.initialize() == distributed.ProcessInfo(0, 1)
    assert distributed.initialize(num_processes=1) == distributed.ProcessInfo(0, 1)
    with pytest.raises(ValueError, match="--coordinator_address"):
        distributed.initialize(num_processes=2, process_id=0)
    with pytest.raises(ValueError, match=r"--process_id must be in \[0, 2\)"):
        distributed.initialize("127.0.0.1:1", num_processes=2, process_id=2)
    assert distributed.ProcessInfo(1, 2).suffix == "process-00001-of-00002"
