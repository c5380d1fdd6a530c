"""``alodlm-jax-lm-eval``: lm-eval's own command line with the ``alodlm-jax`` model registered.

Every lm-eval flag works as in ``lm-eval`` (``--tasks``, ``--include_path``, ``--limit``,
``--num_fewshot``, ``--apply_chat_template``, ``--log_samples``, ``--output_path``,
``--batch_size`` (our request slots), ``--gen_kwargs``, ``--use_cache``, ...); ``--model`` may be
left out (it defaults to ``alodlm-jax`` here), and other lm-eval models keep working. The
``alodlm-jax`` model takes the evaluate command's flags as ``--model_args``
(``alodlm_jax.harness.model_args``). A failure of our model (a bad ``model_args`` key or value, a
prompt the model refuses, a loglikelihood task) is one line on stderr, exit status 2.

``--help`` prints our part first (the model, its ``model_args`` keys with their defaults, an
example), then lm-eval's. Flags take dash or underscore spellings (``--model-args`` is
``--model_args``): every flag of lm-eval 0.4.13 is spelled with underscores, so a dash in a flag's
name is read as one.

Needs the optional extra: ``pip install -e '.[lm-eval]'``.
"""

from __future__ import annotations

import re
import sys
from typing import Sequence

from alodlm_jax.harness import MODEL_NAME

PROG = "alodlm-jax-lm-eval"
EXAMPLE = (f"{PROG} --model {MODEL_NAME} \\\n"
           "    --model_args pretrained=amazon/ALoDLM-1.7B,q=0.4,tau=0.4,precision=bf16,device=cuda \\\n"
           "    --tasks gsm8k --apply_chat_template --batch_size 16 --log_samples "
           "--output_path outputs/lm-eval")
_HELP_FLAGS = ("-h", "--help")


def _first_sentence(text: str) -> str:
    sentence = re.split(r"(?<!e\.g)\.\s", text)[0].rstrip(".")
    return sentence if len(sentence) <= 100 else sentence[:97].rstrip() + "..."


def our_help() -> str:
    """The part of ``--help`` that is ours: the ``alodlm-jax`` model, its ``model_args`` keys
    (the evaluate command's flags, with their defaults) and an example."""
    from alodlm_jax.harness.model_args import MODEL_ARG_KEYS, model_arg_flags

    values = model_arg_flags()
    lines = [
        f"{PROG}: lm-eval's command line with the alodlm-jax decoder registered as the model "
        f"'{MODEL_NAME}' (the default --model here; --device defaults to auto: a GPU when JAX "
        "sees one, else the CPU). Generative tasks only: a loglikelihood task is refused.",
        "",
        "Example:",
        "  " + EXAMPLE,
        "",
        f"--model_args keys of {MODEL_NAME} (key=value, comma-separated; the same flags, "
        "defaults and checks as alodlm-jax-evaluate):",
    ]
    rows = []
    for key in MODEL_ARG_KEYS:
        flag = values[key]
        name = "pretrained (or model)" if key == "model" else key
        default = "" if flag.default is None else f" (default: {flag.default_as_str or flag.default})"
        rows.append((name, _first_sentence(flag.help) + default))
    width = max(len(name) for name, _ in rows)
    lines += [f"  {name.ljust(width)}  {text}" for name, text in rows]
    lines += [
        "",
        "lm-eval's --batch_size is the number of request slots (a number; not auto), and its "
        "--device one of auto, cpu, cuda (cuda:0), tpu. Flags take dash or underscore spellings.",
        "",
        "lm-eval's own help follows.",
        "",
    ]
    return "\n".join(lines)


def _underscored(argv: list[str]) -> list[str]:
    """``argv`` with each flag's name in lm-eval's underscore spelling (``--model-args=x`` ->
    ``--model_args=x``); values and single-dash flags unchanged."""
    spelled = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, sep, value = arg.partition("=")
            arg = "--" + name[2:].replace("-", "_") + sep + value
        spelled.append(arg)
    return spelled


def _value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last of ``names`` in ``argv`` (``--flag value`` or ``--flag=value``)."""
    found = None
    for index, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name in names:
            found = value if sep else (argv[index + 1] if index + 1 < len(argv) else "")
    return found


def with_our_defaults(argv: list[str]) -> list[str]:
    """``argv`` of a run with ``--model alodlm-jax`` when it names no model and, for our model,
    ``--device auto`` when it names no device (lm-eval's default device, ``cuda:0``, would
    override the model's own default: a GPU when JAX sees one, else the CPU). A run with
    ``--config`` (whose file may name both) is left as it is."""
    commands = ("run", "ls", "validate")
    if len(argv) < 2 or argv[1] in ("-h", "--help") or (argv[1] in commands and argv[1] != "run"):
        return argv
    if _value(argv[1:], "--config", "-C") is not None:
        return argv
    argv = list(argv)
    model = _value(argv[1:], "--model", "-M")
    if model is None:
        argv += ["--model", MODEL_NAME]
    if (model is None or model == MODEL_NAME) and _value(argv[1:], "--device") is None:
        argv += ["--device", "auto"]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    """Runs lm-eval's command line with ``argv`` (``sys.argv`` by default); the exit status."""
    from alodlm_jax.cli.flags import error_line

    argv = list(sys.argv if argv is None else argv)
    argv = argv[:1] + _underscored(argv[1:])
    if any(arg in _HELP_FLAGS for arg in argv[1:3]) and (
            len(argv) < 3 or argv[1] in _HELP_FLAGS or argv[1] == "run"):
        print(our_help(), flush=True)
    try:
        from lm_eval.__main__ import cli_evaluate

        import lm_eval.models  # noqa: F401  (lm-eval's own models, before ours joins the registry)
        from alodlm_jax.harness.errors import HarnessError
        from alodlm_jax.harness import model  # noqa: F401  (registers "alodlm-jax")
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == "lm_eval":
            print(error_line(PROG, "lm-eval is not installed: pip install -e '.[lm-eval]'"),
                  file=sys.stderr, flush=True)
            return 2
        raise
    saved = sys.argv
    sys.argv = [PROG] + with_our_defaults(argv)[1:]
    try:
        cli_evaluate()
    except HarnessError as error:
        print(error_line(PROG, error), file=sys.stderr, flush=True)
        return 2
    except SystemExit as exit_:  # argparse's usage errors (status 2) and lm-eval's own exits
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


def run() -> None:
    """Console entry point ``alodlm-jax-lm-eval``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
