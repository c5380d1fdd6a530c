"""The released models' shapes (amazon/ALoDLM-1.7B and -8B) as configs and parameter trees, for
benchmarks and the GPU check: nothing is downloaded, weights are random or shapes only.

    1.7B-shaped: 28 layers, loop [0,28), H 2048, I 6144, 16/8 heads x 128, vocab 151936
    8B-shaped:   36 layers, loop [10,26), H 4096, I 12288, 32/8 heads x 128, vocab 151936

``TINY`` holds small stand-ins of both topologies (a CPU smoke test of the same code paths).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from alodlm_convert.config import ModelConfig

SHAPES = {
    "1.7b": dict(num_hidden_layers=28, loop_start=0, loop_end=28, hidden_size=2048,
                 intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 vocab_size=151936),
    "8b": dict(num_hidden_layers=36, loop_start=10, loop_end=26, hidden_size=4096,
               intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               vocab_size=151936),
}
TINY = {
    "1.7b": dict(num_hidden_layers=4, loop_start=0, loop_end=4, hidden_size=64, intermediate_size=192,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512),
    "8b": dict(num_hidden_layers=6, loop_start=2, loop_end=4, hidden_size=64, intermediate_size=192,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512),
}


def model_config(name: str, *, tiny: bool = False) -> ModelConfig:
    """The :class:`ModelConfig` of ``"1.7b"`` or ``"8b"`` (``tiny``: the small stand-in)."""
    shape = (TINY if tiny else SHAPES)[name]
    return ModelConfig(rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960,
                       max_depth=4, mask_token_id=shape["vocab_size"] - 271, **shape)


def _layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    nq, nkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    return {"input_norm": (h,), "q": (h, nq, dh), "k": (h, nkv, dh), "v": (h, nkv, dh),
            "o": (nq, dh, h), "q_norm": (dh,), "k_norm": (dh,), "post_norm": (h,),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def param_specs(cfg: ModelConfig, dtype=jnp.bfloat16) -> dict:
    """The per-layer params pytree (DESIGN.md, the ordinary load's layout) as
    ``jax.ShapeDtypeStruct``s: enough to compile a program and read XLA's cost analysis."""
    spec = lambda shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt)  # noqa: E731
    h, v = cfg.hidden_size, cfg.vocab_size
    layers = lambda n: tuple({k: spec(s) for k, s in _layer_shapes(cfg).items()}  # noqa: E731
                             for _ in range(n))
    return {"embed": spec((v, h)), "final_norm": spec((h,)), "lm_head": spec((h, v)),
            "gate": {"weight": spec((h,), jnp.float32), "bias": spec((), jnp.float32),
                     "depth_bias": spec((cfg.max_depth,), jnp.float32)},
            "prelude": layers(cfg.num_prelude_layers), "core": layers(cfg.num_core_layers),
            "coda": layers(cfg.num_coda_layers)}


def random_params(cfg: ModelConfig, dtype=jnp.bfloat16, *, seed: int = 0,
                  head_scale: float = 8.0, norm_jitter: float = 0.1) -> dict:
    """Random per-layer params of ``cfg``'s shapes, generated on the default device (weights
    ~N(0, 0.02), norms ~N(1, ``norm_jitter``), the LM head scaled by ``head_scale`` so that
    entropy mode commits a few tokens per window, an exit gate that stops at several depths).
    The same arguments give the same values on every backend (JAX's counter-based generator)."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 16 + 16 * cfg.num_hidden_layers))

    def normal(shape, std):
        return (jax.random.normal(next(keys), shape, jnp.float32) * std).astype(dtype)

    def ones_ish(shape):
        return (1.0 + norm_jitter * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    def layer():
        return {k: (ones_ish(s) if "norm" in k else normal(s, 0.02))
                for k, s in _layer_shapes(cfg).items()}

    h, v = cfg.hidden_size, cfg.vocab_size
    return {
        "embed": normal((v, h), 0.02),
        "final_norm": ones_ish((h,)),
        "lm_head": normal((h, v), 0.02 * head_scale),
        "gate": {"weight": normal((h,), 0.5).astype(jnp.float32), "bias": jnp.float32(-0.25),
                 "depth_bias": jnp.asarray([-0.7, 0.2, 0.8, 0.0][:cfg.max_depth], jnp.float32)},
        "prelude": tuple(layer() for _ in range(cfg.num_prelude_layers)),
        "core": tuple(layer() for _ in range(cfg.num_core_layers)),
        "coda": tuple(layer() for _ in range(cfg.num_coda_layers)),
    }
