"""The one module that decides which form of each operation runs (alodlm_jax.kernels.select):
its table names kernels and conditions that exist, and its conditions say what the kernels'
own predicates say."""

import importlib

import jax.numpy as jnp

from alodlm_jax.kernels import select
from alodlm_jax.kernels import head_norm as HK
from alodlm_jax.kernels import matmul as MK
from alodlm_jax.kernels import window as WK
from alodlm_jax.network import rows as R


def _resolve(text: str):
    module, names = text.split(":")
    return [getattr(importlib.import_module(module), n.strip()) for n in names.split(",")]


def test_every_form_names_a_kernel_and_a_condition_that_exist():
    assert len(select.FORMS) >= 6
    for form in select.FORMS:
        assert all(callable(f) for f in _resolve(form.kernel)), form
        assert not form.condition or callable(_resolve(form.condition)[0]), form
        assert form.policy in R.SHAPES and form.platforms and form.when
    assert {p for form in select.FORMS for p in form.platforms} == {"cpu", "cuda", "tpu"}


def test_the_conditions_are_the_kernels_predicates():
    bf16, f32 = jnp.bfloat16, jnp.float32
    (norms,) = [f for f in select.FORMS if f.kernel.endswith(":norm_rope")]
    for rows, dtype in ((32, bf16), (512, bf16), (32, f32)):
        want = HK.supported((rows, 16, 128), (rows, 8, 128), dtype)
        assert select.head_norm(rows, 16, 8, 128, dtype) == want
        assert select.allowed(norms, (rows, 16, 128), (rows, 8, 128), dtype) == want
    assert select.head_norm(32, 16, 8, 128, bf16) and not select.head_norm(32, 16, 8, 128, f32)
    for rows in (16, 32, 128):
        assert select.qkv_products(rows, 2048, 16, 8, 128, bf16) == MK.supported(
            rows, 2048, (16 * 128, 8 * 128, 8 * 128), bf16)
    assert select.qkv_products(32, 2048, 16, 8, 128, bf16)
    assert not select.qkv_products(128, 2048, 16, 8, 128, bf16)  # XLA's tiles take more rows
    shape = dict(slots=5376, n_kv=8, head_dim=128, rows=32, group=2, dtype=bf16)
    assert select.normed_attention(16, 8, 128, bf16, bf16, 5376, 32) == WK.supported("gpu", **shape)
    assert not select.normed_attention(16, 8, 128, bf16, f32, 5376, 32)  # a cache of another dtype
    assert select.attention_options(R.KERNEL) == {"bucketed": False, "kernel": True}
    assert select.attention_options(R.BUCKETED) == {"bucketed": True, "kernel": False}
    assert select.attention_options(R.FIXED) == {"bucketed": False, "kernel": False}


def test_the_window_attention_forms_fall_back_to_xla_where_no_kernel_takes_the_shapes():
    def xla():
        return None

    taken = select.window_attention_forms(
        dict(slots=5376, n_kv=8, head_dim=128, rows=32, group=2, dtype=jnp.bfloat16), xla)
    assert list(taken) == ["tpu", "cuda", "cpu", "default"] and taken["default"] is xla
    assert all(taken[p] is not xla for p in ("tpu", "cuda", "cpu"))
    odd = select.window_attention_forms(
        dict(slots=5376, n_kv=8, head_dim=96, rows=32, group=3, dtype=jnp.bfloat16), xla)
    assert odd["tpu"] is xla and odd["cuda"] is xla and odd["cpu"] is not xla  # interpreted
