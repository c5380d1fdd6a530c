"""lm-eval's model_args read as the evaluate command's flags (alodlm_jax.harness.model_args)."""

from __future__ import annotations

import pytest

from alodlm_jax.cli import evaluate
from alodlm_jax.data import BUILTINS
from alodlm_jax.harness.errors import ModelArgsError
from alodlm_jax.harness.model_args import (MODEL_ARG_KEYS, decode_config, parse_model_args,
                                           with_lm_eval_settings)


def test_keys_are_evaluate_flags_with_their_defaults():
    values = parse_model_args({})
    for key in MODEL_ARG_KEYS:
        assert values[key].value == evaluate.FLAGS[key].default, key
    assert decode_config(values).as_dict() == {"q": 0.5, "tau": 0.4, "window_size": 16,
                                               "max_new_tokens": 4096, "position_penalty": None,
                                               "mode": "entropy"}


def test_values_as_lm_eval_passes_them():
    # lm-eval turns "0.3" into a float, "4" into an int and "false" into a boolean.
    values = parse_model_args({"pretrained": "builtin:tiny", "q": 0.3, "window-size": 4,
                               "mode": "left1", "compilation_cache": False, "device": "cuda:0",
                               "trust_remote_code": True, "max_batch_size": 8})
    assert values.model == str(BUILTINS["builtin:tiny"])
    assert (values.q, values.window_size, values.mode) == (0.3, 4, "left1")
    assert values.compilation_cache is False and values.device == "cuda"
    assert parse_model_args({"device": "auto"}).device is None


@pytest.mark.parametrize("args, words", [
    ({"workers": 2}, ["unknown key 'workers'", "pretrained"]),
    ({"q": "abc"}, ["model_args q='abc'", "could not convert"]),
    ({"mode": "greedy"}, ["model_args mode='greedy'"]),
    ({"batch_size": "auto"}, ["batch_size='auto'", "'auto' is not supported"]),
    ({"batch_size": 0}, ["batch_size=0"]),
    ({"device": "cuda:1"}, ["device='cuda:1'", "CUDA_VISIBLE_DEVICES"]),
    ({"pretrained": "x", "model": "y"}, ["'model' repeats 'pretrained'"]),
    ({"pretrained": "builtin:nothing"}, ["unknown bundled name"]),
    ({"max_compiled_programs": 0}, ["max_compiled_programs=0"]),
])
def test_bad_key_or_value_is_one_line_naming_it(args, words):
    with pytest.raises(ModelArgsError) as caught:
        parse_model_args(args)
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_decoding_checks_name_the_key():
    with pytest.raises(ModelArgsError, match=r"model_args window_size=0: Window size and generation"):
        decode_config(parse_model_args({"window_size": 0}))
    with pytest.raises(ModelArgsError, match=r"model_args tau=-1.0: q must be in \[0,1\]"):
        decode_config(parse_model_args({"tau": -1.0}))


def test_lm_eval_settings_yield_at_their_defaults_and_clash_otherwise():
    args = {"device": "cpu", "batch_size": 4}
    assert with_lm_eval_settings(args, {"device": "auto", "batch_size": 1,
                                        "max_batch_size": None}) == args
    assert with_lm_eval_settings({}, {"device": "cpu", "batch_size": "8"}) == {
        "device": "cpu", "batch_size": "8"}
    assert with_lm_eval_settings(args, {"batch_size": "4"}) == args
    with pytest.raises(ModelArgsError, match="model_args device='cpu' and lm-eval's --device"):
        with_lm_eval_settings(args, {"device": "cuda:0"})


@pytest.mark.parametrize("argv, added", [
    (["--tasks", "t"], ["--model", "alodlm-jax", "--device", "auto"]),
    (["run", "--tasks", "t", "--device=cpu"], ["--model", "alodlm-jax"]),
    (["--tasks", "t", "--model", "alodlm-jax", "--device", "cuda:0"], []),
    (["--tasks", "t", "-M", "hf"], []),  # another lm-eval model keeps lm-eval's defaults
    (["--tasks", "t", "--model=alodlm-jax"], ["--device", "auto"]),
    (["--config", "c.yaml"], []),
    (["ls", "tasks"], []),
])
def test_command_defaults_to_our_model_and_its_device(argv, added):
    from alodlm_jax.cli.lm_eval import with_our_defaults

    assert with_our_defaults(["prog", *argv]) == ["prog", *argv, *added]
