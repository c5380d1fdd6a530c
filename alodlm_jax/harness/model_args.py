"""lm-eval's ``model_args`` read as ``alodlm-jax-evaluate``'s flags.

A key is one of the evaluate command's generation flags in its underscore spelling (the dash
spelling works too), and its value is parsed and checked by that flag's own definition, so the
defaults, types, choices and bounds are the evaluate command's (both define them with
``alodlm_jax.cli.flags``): ``pretrained`` is lm-eval's name for ``model``. lm-eval adds ``batch_size`` (our request slots),
``device`` and ``max_batch_size`` from its own flags (:func:`with_lm_eval_settings`), and
``trust_remote_code`` with ``--trust_remote_code``; the last two are accepted and unused (nothing
here runs remote code, and ``batch_size=auto`` is refused). ``device`` also takes lm-eval's
spellings ``cuda:0`` (= ``cuda``) and ``auto`` (the default: ``cuda`` when JAX sees a GPU, else
``cpu``); another device index is refused (select GPUs with ``CUDA_VISIBLE_DEVICES``). The
evaluate command's input/output, scoring and multi-process flags are not keys: lm-eval reads the tasks, scores them and writes the files.

A bad key or value is a :class:`ModelArgsError` naming it (the command prints it as one line,
exit status 2). No JAX and no lm-eval here.
"""

from __future__ import annotations

from typing import Any, Mapping

from absl import flags

from alodlm_jax.harness.errors import ModelArgsError

# The evaluate command's flags that choose and run the decoder, in --help order.
MODEL_ARG_KEYS = (
    "model", "model_config", "device", "precision", "engine", "batch_size", "mesh",
    "q", "tau", "mode", "window_size", "max_new_tokens", "position_penalty",
    "compilation_cache", "compilation_cache_dir", "max_compiled_programs",
)
ALIASES = {"pretrained": "model"}
UNUSED_LM_EVAL_KEYS = ("max_batch_size", "trust_remote_code")


def model_arg_flags() -> flags.FlagValues:
    """Fresh, unparsed flags that :data:`MODEL_ARG_KEYS` name, with the evaluate command's
    definitions (:func:`alodlm_jax.cli.flags.define_generator_flags` and
    :func:`~alodlm_jax.cli.flags.define_decode_flags`)."""
    from alodlm_jax.cli.flags import define_decode_flags, define_generator_flags

    values = flags.FlagValues()
    define_generator_flags(values)
    define_decode_flags(values)
    values.mark_as_parsed()
    return values


# lm-eval's command line always passes --device (default cuda:0) and --batch_size (default 1);
# ``alodlm-jax-lm-eval`` passes --device auto when the user gave none.
LM_EVAL_DEFAULTS = {"device": "auto", "batch_size": 1}


def with_lm_eval_settings(model_args: Mapping[str, Any],
                          settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """``model_args`` plus lm-eval's own settings (``batch_size``, ``max_batch_size``, ``device``),
    which lm-eval passes beside them: a setting at its default (:data:`LM_EVAL_DEFAULTS`) or unset
    yields to a ``model_args`` value; two different values are a :class:`ModelArgsError`."""
    merged = dict(model_args)
    for key, value in (settings or {}).items():
        if value is None:
            continue
        if key not in merged:
            merged[key] = value
        elif LM_EVAL_DEFAULTS.get(key) != value and _flag_text(merged[key]) != _flag_text(value):
            raise ModelArgsError(f"model_args {key}={merged[key]!r} and lm-eval's --{key} "
                                 f"{value!r} disagree; give one")
    return merged


def _device_text(text: str) -> str | None:
    """lm-eval's device spellings: ``auto`` (None: the default), ``cuda:0`` (``cuda``)."""
    if text == "auto":
        return None
    if text.startswith("cuda:"):
        if text != "cuda:0":
            raise ValueError("only the first GPU (cuda or cuda:0) is addressable; select others "
                             "with CUDA_VISIBLE_DEVICES")
        return "cuda"
    return text


def _flag_text(value: Any) -> str:
    if isinstance(value, bool):  # lm-eval turns "true"/"false" into booleans
        return "true" if value else "false"
    return str(value)


def parse_model_args(model_args: Mapping[str, Any]) -> flags.FlagValues:
    """The flag values that ``model_args`` (lm-eval's parsed ``key=value`` pairs, or keyword
    arguments) give; keys not given keep the evaluate command's defaults."""
    from alodlm_jax.data import resolve_builtin

    values = model_arg_flags()
    given: dict[str, str] = {}
    for key, value in model_args.items():
        if key in UNUSED_LM_EVAL_KEYS:
            continue
        name = ALIASES.get(key, key.replace("-", "_"))
        if name not in MODEL_ARG_KEYS:
            raise ModelArgsError(
                f"model_args: unknown key {key!r} (keys: pretrained or model, "
                + ", ".join(MODEL_ARG_KEYS[1:]) + ")")
        if name in given:
            raise ModelArgsError(f"model_args: {key!r} repeats {given[name]!r}")
        given[name] = key
        if value is None:  # lm-eval passes unset options as None
            continue
        try:
            text = resolve_builtin(_flag_text(value))
            if name == "device":
                text = _device_text(text)
                if text is None:
                    continue
            if name == "batch_size" and text == "auto":  # evaluate takes it; lm-eval's runs do not
                raise ValueError("not a number")
            values[name].parse(text)
        except (flags.Error, ValueError) as error:
            reason = str(error).split(": ", 1)[-1] if str(error).startswith("flag --") else str(error)
            if name == "batch_size":
                reason += " (a number of request slots; 'auto' is not supported)"
            raise ModelArgsError(f"model_args {key}={value!r}: {reason}") from None
    if values.batch_size < 1:
        raise ModelArgsError(f"model_args batch_size={values.batch_size!r}: must be at least 1")
    return values


def decode_config(values: flags.FlagValues):
    """The validated decoding configuration of parsed model_args; a bad value names its key."""
    from alodlm_jax.cli.flags import FlagError, decode_config_from_flags

    try:
        return decode_config_from_flags(values)
    except FlagError as error:
        message = str(error).split(": ", 1)[-1]
        raise ModelArgsError(f"model_args {error.flag}={values[error.flag].value!r}: {message}") from None
