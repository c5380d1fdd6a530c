"""The plan's memory from the shapes (alodlm_jax.plan.fit): what a JAX process gets of a GPU, a
batch that cannot fit refused in one line before anything is compiled, with the largest batch
that fits by the same arithmetic, and that arithmetic exact at every batch."""

import time

import jax
import jax.numpy as jnp
import pytest

from alodlm_jax.cli import plan as plan_cli
from alodlm_jax.config import DecodeConfig
from alodlm_jax.plan import compile as plan_compile
from alodlm_jax.plan import fit, targets
from alodlm_jax.plan.programs import evaluate_programs
from alodlm_jax.testing.released_shapes import model_config, param_specs

EIGHT_B = ["alodlm-jax-plan", "--model", "released:8b", "--target", "h100", "--precision", "bf16",
           "--prompt_tokens", "1024", "--max_new_tokens", "4096", "--window_size", "16"]


def test_a_gpu_gives_a_jax_process_its_client_memory_fraction():
    h100 = targets.load_target("h100")
    usable, basis = fit.usable_memory(h100, {})
    assert usable == 60_000_000_000 and "75% of 80.00 GB" in basis
    usable, basis = fit.usable_memory(h100, {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".9"})
    assert usable == 72_000_000_000 and "XLA_PYTHON_CLIENT_MEM_FRACTION" in basis
    assert fit.usable_memory(h100, {"XLA_CLIENT_MEM_FRACTION": "0.5"})[0] == 40_000_000_000
    with pytest.raises(ValueError, match="XLA_CLIENT_MEM_FRACTION"):
        fit.usable_memory(h100, {"XLA_CLIENT_MEM_FRACTION": "lots"})
    # XLA:TPU checks its own assignment against the whole HBM.
    assert fit.usable_memory(targets.load_target("v5p"), {})[0] == 95_000_000_000


def _no_compile(monkeypatch):
    """The aot extra taken as installed, and any compile-only device creation (the first step of
    a compile) answered with a one-line error instead."""
    monkeypatch.setattr(targets, "_importable", lambda module: True)

    def devices(self):
        raise ValueError("would compile now")

    monkeypatch.setattr(targets.Target, "devices", devices)


def test_a_batch_that_cannot_fit_is_refused_before_compiling_in_one_line(monkeypatch, capsys):
    _no_compile(monkeypatch)
    start = time.perf_counter()
    status = plan_cli.main(EIGHT_B + ["--batch_size", "4096"])
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    line = err[0]
    assert "batch 4096 does not fit h100" in line and "would compile now" not in line
    assert "cache 7576.32 GB" in line and "60.00 GB" in line
    assert seconds < 60
    largest = int(line.rsplit(" ", 1)[1])
    assert 1 <= largest < 32
    # The largest batch is where the same arithmetic turns: one more is refused, it is not.
    assert plan_cli.main(EIGHT_B + ["--batch_size", str(largest + 1)]) == 2
    assert "does not fit" in capsys.readouterr().err
    assert plan_cli.main(EIGHT_B + ["--batch_size", str(largest)]) == 2
    assert "would compile now" in capsys.readouterr().err


def test_the_arguments_of_the_batch_programs_are_linear_in_the_batch_exactly():
    cfg = model_config("8b", tiny=True)
    params = param_specs(cfg, jnp.bfloat16)
    decode = DecodeConfig(window_size=4, max_new_tokens=32)

    def programs(batch):
        return evaluate_programs(cfg, params, decode, prompt_tokens=20, batch_size=batch,
                                 batch_programs=True, shapes="fixed-kernel")[0]

    linear = fit.per_request(programs)
    assert set(linear) == {"batch", "admit"}
    for batch in (2, 5, 64):
        for program in programs(batch):
            fixed, step = linear[program.name]
            assert fit.argument_bytes(program)["total"] == fixed + batch * step
    fixed, step = linear["batch"]
    admit_fixed, admit_step = linear["admit"]
    usable = max(fixed, admit_fixed) + 10 * max(step, admit_step) + 7
    assert fit.largest_batch(linear, usable) == 10
    assert fit.largest_batch(linear, usable, extra=8) == 9
    assert fit.largest_batch(linear, 0) == 0 and fit.largest_batch(linear, None) is None


def test_what_a_program_needs_beyond_its_arguments_leaves_out_those_it_does_not_read():
    """JAX leaves an argument a program does not read out of it (an admit program's LM head):
    its bytes are not memory the program needs beyond its arguments, and not a saving either."""
    program = jax.jit(lambda unread, x: 2 * x)
    unread, x = jnp.zeros((1 << 18,), jnp.float32), jnp.zeros((1024,), jnp.float32)
    memory = program.lower(unread, x).compile().memory_analysis()
    shapes_total = unread.nbytes + x.nbytes
    assert memory.argument_size_in_bytes < shapes_total
    beyond = plan_compile._beyond_arguments(memory, shapes_total)
    assert beyond == plan_compile._device_memory(memory) - memory.argument_size_in_bytes
    assert beyond >= memory.output_size_in_bytes == x.nbytes
