"""The Python API's defaults are the commands': ``build_generator`` with only a model builds what
``alodlm-jax-evaluate --model M`` would (docs/api.md)."""

from __future__ import annotations

import inspect

from alodlm_jax.cli import evaluate, generate as generate_cli
from alodlm_jax.cli.flags import decode_config_from_flags
from alodlm_jax.config import DecodeConfig
from alodlm_jax.generate import build_generator


def _defaults(flag_values):
    flag_values.unparse_flags()
    flag_values(["prog"])
    return flag_values


def test_build_generator_defaults_are_the_commands_defaults():
    signature = inspect.signature(build_generator).parameters
    for command in (evaluate.FLAGS, generate_cli.FLAGS):
        fv = _defaults(command)
        assert signature["engine"].default == fv["engine"].default
        assert signature["precision"].default == fv["precision"].default
        assert signature["device"].default is None and fv["device"].default is None  # both:
        # default_device(), a GPU when JAX sees one
        assert signature["mesh"].default is None and fv["mesh"].default is None
        assert fv["compilation_cache"].default is True
        assert signature["compilation_cache_dir"].default is True  # the commands' directory
        assert signature["decode_config"].default is None  # DecodeConfig(): the flags' defaults
        assert decode_config_from_flags(fv) == DecodeConfig()
    fv = _defaults(evaluate.FLAGS)
    assert signature["batch_size"].default == fv["batch_size"].default == 1


def test_a_generator_built_from_a_model_alone():
    from alodlm_jax.data import resolve_builtin
    from alodlm_jax.generate import default_device

    generator = build_generator(model=resolve_builtin("builtin:tiny"))
    assert generator.device == default_device()
    assert generator.engine_name == "compiled" and generator.precision == "fp32"
    assert generator.decode_config == DecodeConfig()
