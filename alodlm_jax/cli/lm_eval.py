"""``alodlm-jax-lm-eval``: lm-eval's own command line with the ``alodlm-jax`` model registered.

Every lm-eval flag works as in ``lm-eval`` (``--tasks``, ``--include_path``, ``--limit``,
``--num_fewshot``, ``--apply_chat_template``, ``--log_samples``, ``--output_path``,
``--batch_size`` (our request slots), ``--gen_kwargs``, ``--use_cache``, ...); ``--model`` may be
left out (it defaults to ``alodlm-jax`` here), and other lm-eval models keep working. The
``alodlm-jax`` model takes the evaluate command's flags as ``--model_args``
(``alodlm_jax.harness.model_args``). A failure of our model (a bad ``model_args`` key or value, a
prompt the model refuses, a loglikelihood task) is one line on stderr, exit status 2.

Needs the optional extra: ``pip install -e '.[lm-eval]'``.
"""

from __future__ import annotations

import sys
from typing import Sequence

from alodlm_jax.harness import MODEL_NAME

PROG = "alodlm-jax-lm-eval"


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
