"""Shared command-line plumbing for the ``alodlm-jax-*`` commands (absl flags).

Two jobs:

* :func:`normalize_argv` accepts the reference's dash spellings (``--max-new-tokens``,
  ``--window-size``, ``--position-penalty``, ``--model-config``, …) as well as absl's underscore
  names, by rewriting known flag names before absl parses them, and replaces the bundled names
  ``builtin:tiny``, ``builtin:sample`` and ``builtin:sample-predictions`` (see
  :mod:`alodlm_jax.data`) by their paths;
* :func:`run_command` parses flags into a private ``FlagValues`` (so several commands can be
  imported into one process, e.g. by tests), prints help, and turns expected user errors into one
  line ``<prog>: error: <message>`` on stderr with exit status 2 — no traceback (SCORING.md D8).

This module imports no JAX.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import textwrap
from typing import Callable, Iterator, Sequence

from absl import flags

from alodlm_jax.config import default_compilation_cache_dir  # noqa: F401 - re-exported

__all__ = ["USER_ERRORS", "FlagError", "normalize_argv", "parse_flags", "run_command", "error_line",
           "first_line",
           "define_decode_flags", "decode_config_from_flags", "naming_decode_flags",
           "define_model_flags", "define_code_scoring_flags", "code_scoring_from_flags",
           "define_compilation_flags", "apply_compilation_flags", "default_compilation_cache_dir",
           "generate_run_settings", "FREE_SETTINGS_HELP", "require_model", "generator_from_flags"]


def _user_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [
        ValueError,  # includes TaskFileError and json.JSONDecodeError
        KeyError,
        FileExistsError,
        FileNotFoundError,
        NotADirectoryError,
        IsADirectoryError,
        PermissionError,
        json.JSONDecodeError,
        UnicodeDecodeError,
    ]
    try:
        from alodlm_scoring.pool import WorkerError

        errors.append(WorkerError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


USER_ERRORS = _user_errors()


class UsageError(Exception):
    """A command-line usage problem (unknown flag, missing required flag, bad value)."""


def normalize_argv(argv: Sequence[str], flag_values: flags.FlagValues) -> list[str]:
    """Rewrite ``--some-flag`` to ``--some_flag`` for flags defined in ``flag_values``.

    Only the name part before ``=`` is touched, and only when the underscore spelling (or its
    ``--no`` boolean negation) is a defined flag; values and positional arguments are untouched.
    Everything after a bare ``--`` is left alone. A flag value naming bundled data
    (``builtin:...``) becomes that data's path.
    """
    from alodlm_jax.data import resolve_builtin

    known = set(flag_values)
    result = [argv[0]] if argv else []
    passthrough = False
    for argument in argv[1:]:
        if passthrough or not argument.startswith("--") or argument == "--":
            passthrough = passthrough or argument == "--"
            result.append(argument if passthrough else resolve_builtin(argument))
            continue
        name, sep, value = argument[2:].partition("=")
        value = resolve_builtin(value) if sep else value
        candidate = name.replace("-", "_")
        if candidate in known:
            argument = "--" + candidate + sep + value
        elif candidate.startswith("no") and candidate[2:].lstrip("_") in known:
            argument = "--no" + candidate[2:].lstrip("_") + sep + value  # --no-resume
        result.append(argument)
    return result


def error_line(prog: str, message: object) -> str:
    """The one-line error report: ``<prog>: error: <first line of message>``."""
    return f"{prog}: error: {first_line(message)}"


def first_line(message: object) -> str:
    """The first line of an error message (a ``KeyError`` reads ``missing key '...'``; an
    exception without a message, its type's name)."""
    text = str(message).strip() or type(message).__name__
    if isinstance(message, KeyError) and len(message.args) == 1:
        text = f"missing key {message.args[0]!r}"
    return text.splitlines()[0] if text else text


def parse_flags(argv: Sequence[str], flag_values: flags.FlagValues,
                required: Sequence[str] = ()) -> list[str]:
    """Parse ``argv`` (dash spellings accepted) into ``flag_values``; raise UsageError on misuse."""
    flag_values.unparse_flags()  # a previous in-process run must not leak values into this one
    try:
        remaining = flag_values(normalize_argv(argv, flag_values))
    except flags.UnrecognizedFlagError as error:
        raise UsageError(f"--{error.flagname}: {error}") from None
    except (flags.Error, ValueError) as error:
        raise UsageError(str(error)) from None
    if len(remaining) > 1:
        raise UsageError(f"unrecognized arguments: {' '.join(remaining[1:])}")
    missing = [name for name in required if flag_values[name].value is None]
    if missing:
        raise UsageError(
            "the following arguments are required: " + ", ".join(f"--{name}" for name in missing)
        )
    return remaining


def _help_text(prog: str, description: str, flag_values: flags.FlagValues) -> str:
    lines = [f"usage: {prog} [flags]", "", description.strip(), "", "flags:"]
    unique = {id(flag_values[name]): flag_values[name] for name in flag_values}
    for flag in sorted(unique.values(), key=lambda f: f.name):
        spelled = flag.name.replace("_", "-")
        names = f"--{flag.name}" + (f" (or --{spelled})" if spelled != flag.name else "")
        default = "" if flag.default is None else f" (default: {flag.default!r})"
        lines.append(f"  {names}{default}")
        lines.extend(textwrap.wrap(flag.help or "", width=96, initial_indent="      ",
                                   subsequent_indent="      "))
    return "\n".join(lines) + "\n"


def run_command(
    main: Callable[[], int | None],
    *,
    prog: str,
    description: str,
    flag_values: flags.FlagValues,
    argv: Sequence[str] | None = None,
    required: Sequence[str] = (),
    extra_errors: tuple[type[BaseException], ...] = (),
    module_name: str | None = None,
) -> int:
    """Parse flags and run ``main()``; expected errors become one stderr line and status 2.

    Returns the exit status (0 on success) instead of exiting, so tests can call it in-process.
    ``flag_values`` should be the command's own ``FlagValues``; help lists all of its flags
    (``module_name`` is accepted for compatibility and ignored). A command with a ``--device``
    flag fixes JAX's platforms from it before ``main()`` runs
    (:func:`alodlm_jax.cli.platforms.start_jax_for`: a CPU run starts no accelerator plugin).
    """
    argv = list(sys.argv if argv is None else argv)
    if any(arg in ("-h", "--help", "--helpshort", "--helpfull", "-help") for arg in argv[1:]):
        sys.stdout.write(_help_text(prog, description, flag_values))
        return 0
    try:
        parse_flags(argv, flag_values, required)
    except UsageError as error:
        print(error_line(prog, error), file=sys.stderr, flush=True)
        return 2
    if "device" in flag_values:  # before JAX is imported: a CPU run starts no accelerator plugin
        from alodlm_jax.cli.platforms import start_jax_for

        start_jax_for(flag_values["device"].value)
    try:
        status = main()
    except USER_ERRORS + tuple(extra_errors) as error:
        message = error.summary_line() if hasattr(error, "summary_line") else error
        print(error_line(prog, message), file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    return int(status or 0)


def define_model_flags(flag_values: flags.FlagValues, *, device_note: str = "") -> None:
    """``--model_config``, ``--device`` and ``--precision``: one definition for every command that
    loads a model (``device_note`` adds a command's own remark to the device help)."""
    d = {"flag_values": flag_values}
    flags.DEFINE_string("model_config", None, "YAML file whose `model` section builds the recurrence "
                        "config for checkpoints without ALoDLM metadata.", **d)
    flags.DEFINE_enum("device", None, ["cpu", "cuda", "gpu", "tpu"], "JAX device (cuda and gpu both "
                      "select JAX's GPU backend). Default: cuda when JAX sees a GPU, else cpu"
                      + (f" ({device_note})" if device_note else "") + ".", **d)
    flags.DEFINE_enum("precision", "fp32", ["fp32", "bf16"], "Model weight and activation precision.",
                      **d)


def define_decode_flags(flag_values: flags.FlagValues) -> None:
    """The reference's decoding flags, defaults and help (MODEL_AND_DECODING.md §6.1, §6.7).

    One definition for every command that decodes; :func:`decode_config_from_flags` turns the
    parsed values into a validated :class:`~alodlm_jax.config.DecodeConfig`.
    """
    from alodlm_jax.config import MODES

    d = {"flag_values": flag_values}
    flags.DEFINE_float("q", 0.5, "Cumulative halting threshold, in [0, 1].", **d)
    flags.DEFINE_float("tau", 0.4, "Entropy threshold for committing tokens, finite and >= 0.", **d)
    flags.DEFINE_enum("mode", "entropy", list(MODES), "Commit rule: entropy, or left1 (commit the "
                      "leftmost token). Table 1 presets: 8B --mode left1 --q 0.5; 1.7B --q 0.4.", **d)
    flags.DEFINE_integer("window_size", 16, "Decoding window size in tokens (>= 1).", **d)
    flags.DEFINE_integer("max_new_tokens", 4096, "Generation budget per task in tokens (>= 1).", **d)
    flags.DEFINE_float("position_penalty", None, "Entropy penalty per window position, finite and "
                       ">= 0. Default: 0.05 * tau.", **d)


class FlagError(ValueError):
    """A bad flag value: ``--<flag>: <message>`` (the message keeps the reference's text)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"--{flag}: {message}")
        self.flag = flag


@contextlib.contextmanager
def naming_decode_flags() -> Iterator[None]:
    """Re-raise a :class:`~alodlm_jax.config.DecodeConfigError` as a :class:`FlagError` naming
    the flag of the offending field (the flags are spelled as the fields are)."""
    from alodlm_jax.config import DecodeConfigError

    try:
        yield
    except DecodeConfigError as error:
        raise FlagError(error.field, str(error)) from None


def decode_config_from_flags(flag_values: flags.FlagValues):
    """The validated decoding configuration of parsed :func:`define_decode_flags` values; an
    invalid value is a :class:`FlagError` naming its flag."""
    from alodlm_jax.config import DecodeConfig

    fv = flag_values
    with naming_decode_flags():
        return DecodeConfig(q=fv.q, tau=fv.tau, window_size=fv.window_size,
                            max_new_tokens=fv.max_new_tokens, position_penalty=fv.position_penalty,
                            mode=fv.mode)



def define_code_scoring_flags(flag_values: flags.FlagValues) -> None:
    """``--code_sandbox`` and ``--code_verdicts``: how code metrics run and judge programs
    (alodlm_scoring.sandbox, alodlm_scoring.strict; SCORING.md D10)."""
    d = {"flag_values": flag_values}
    flags.DEFINE_enum("code_sandbox", "on", ["on", "off"], "Run every program that code scoring "
                      "runs (python_tests' check.py, evalplus's executions, anything they start) "
                      "in the OS sandbox: Landlock, user/pid/network/mount namespaces, a read-only "
                      "filesystem with a private working directory, no capabilities, hard "
                      "resource limits, a short environment allowlist. Mechanisms the machine "
                      "lacks are named in one warning and in protocol.code_sandbox. off: no "
                      "containment (the reference's behaviour).", **d)
    flags.DEFINE_enum("code_verdicts", "reference", ["reference", "strict"], "Code verdict "
                      "rules. reference: the reference's verdicts. strict: a python_tests pass "
                      "needs the tests to have run to their end (an early exit cannot pass); "
                      "evalplus outputs are compared outside the program's process as plain "
                      "data, and the program never sees the expected outputs. Needs "
                      "--code_sandbox=on. Recorded as protocol.code_verdicts.", **d)


def code_scoring_from_flags(flag_values: flags.FlagValues) -> tuple[str, str]:
    """``(code_sandbox, code_verdicts)``, checked together."""
    if flag_values.code_verdicts == "strict" and flag_values.code_sandbox == "off":
        raise ValueError("--code_verdicts=strict needs the code sandbox (--code_sandbox=on)")
    return flag_values.code_sandbox, flag_values.code_verdicts


def define_compilation_flags(flag_values: flags.FlagValues) -> None:
    """``--compilation_cache``, ``--compilation_cache_dir`` and ``--max_compiled_programs``: where
    compiled programs are kept, across runs (JAX's persistent compilation cache, on by default)
    and inside the process (a bounded store). :func:`apply_compilation_flags` reads them."""
    from alodlm_jax.config import DEFAULT_COMPILATION_CACHE_BYTES, DEFAULT_MAX_PROGRAMS

    d = {"flag_values": flag_values}
    flags.DEFINE_boolean("compilation_cache", True, "Keep compiled programs in JAX's persistent "
                         "compilation cache, so a rerun with the same shapes reads them back instead "
                         "of compiling (protocol.compile_seconds then drops). The cache is bounded "
                         f"to {DEFAULT_COMPILATION_CACHE_BYTES / 1e9:g} GB (least recently used entries "
                         "are deleted; JAX_COMPILATION_CACHE_MAX_SIZE, in bytes, overrides it). "
                         "--nocompilation_cache turns it off.", **d)
    flags.DEFINE_string("compilation_cache_dir", None, "Directory of the persistent compilation "
                        "cache. Default: $XDG_CACHE_HOME/alodlm-jax/xla (~/.cache/alodlm-jax/xla "
                        "when XDG_CACHE_HOME is unset).", **d)
    flags.DEFINE_integer("max_compiled_programs", DEFAULT_MAX_PROGRAMS, "Compiled "
                         "programs kept in memory by this process (every distinct prompt bucket, "
                         "window, budget and mode compiles its own; the least recently used are "
                         "dropped beyond this, and compiled again if needed). Each holds hundreds "
                         "of memory maps, so an unbounded number would exhaust vm.max_map_count.",
                         lower_bound=1, **d)


def define_generator_flags(flag_values: flags.FlagValues, *, model_note: str = "",
                           device_note: str = "") -> None:
    """Every flag :func:`generator_from_flags` reads: ``--model``, the model flags
    (:func:`define_model_flags`), ``--engine``, ``--batch_size``, ``--mesh`` and the compilation
    flags. One definition for the evaluate command and for front ends that take the same settings
    (``alodlm_jax.harness``: lm-eval's ``model_args``); ``model_note`` and ``device_note`` add a
    command's own remark to those flags' help."""
    from alodlm_jax.config import DEFAULT_ENGINE, ENGINES
    from alodlm_jax.plan.auto import BatchSizeParser

    d = {"flag_values": flag_values}
    flags.DEFINE_string("model", None, "Local model directory or Hugging Face model id."
                        + (f" {model_note}" if model_note else ""), **d)
    define_model_flags(flag_values, device_note=device_note)
    flags.DEFINE_enum("engine", DEFAULT_ENGINE, list(ENGINES), "Decoder engine for generate mode: "
                      "compiled (the default: one XLA while-loop program per shape bucket) or "
                      "portable (jitted passes, Python host loop); their outputs are identical. The "
                      "compiled engine runs on any --mesh with --batch_size; the portable one "
                      "decodes one task at a time (--mesh model=N only). Recorded as "
                      "protocol.decoder.", **d)
    flags.DEFINE(BatchSizeParser(), "batch_size", 1, "Generate mode: N tasks decoded together by "
                 "one compiled program, a finished task's slot taking the next waiting task "
                 "(continuous batching; needs the compiled engine; with --mesh data=D a multiple "
                 "of D, with several processes per process). Each row equals decoding its task "
                 "alone; its wall_seconds is its prefill plus an even share of each batch run it "
                 "took part in. Recorded in the protocol when > 1. auto: the largest batch whose "
                 "programs fit the device (alodlm_jax.plan.auto; at most the number of tasks), "
                 "recorded with how it was chosen as protocol.batch_size_auto.",
                 serializer=flags.ArgumentSerializer(), **d)
    # Scaling out on local devices (alodlm_jax.network.sharding; docs/scaling.md).
    flags.DEFINE_string("mesh", None, "Generate mode: a (data, model) mesh over this process's "
                        "local devices, e.g. model=4, data=8 or data=2,model=4: model splits the "
                        "weights and KV cache (tensor parallelism), data the --batch_size request "
                        "slots. Default: one device.", **d)
    define_compilation_flags(flag_values)


def apply_compilation_flags(flag_values: flags.FlagValues) -> str | None:
    """Bounds the process's compiled programs by ``--max_compiled_programs`` and returns the
    persistent compilation cache directory the flags ask for (None with --nocompilation_cache).

    Imports JAX: commands call it only when they will generate."""
    from alodlm_jax.decode.programs import set_max_programs

    set_max_programs(flag_values.max_compiled_programs)
    if not flag_values.compilation_cache:
        return None
    return flag_values.compilation_cache_dir or str(default_compilation_cache_dir())


# What --resume lets differ from the run it continues (they change no token or verdict).
FREE_SETTINGS_HELP = ("--engine, --batch_size, --mesh (the protocol then lists which rows each "
                      "wrote, as protocol.parts), --workers, --math_in_workers, "
                      "--overlap_scoring, the compilation cache flags, --quiet, --print_summary_json")


def generate_run_settings(*, input_path: str, model: str | None, model_config: str | None,
                          precision: str, device: str | None, decode, code_sandbox: str,
                          code_verdicts: str, free=None, extra=None):
    """The :class:`~alodlm_scoring.run_record.RunSettings` of a generating run: what a resume
    must share with it (the task file's content, the resolved model directory and its files'
    digests, the recurrence YAML's content, every decoding setting, precision, device, the code
    verdict rules and sandbox, and ``extra``), and the ``free`` settings recorded per part.

    ``model=None`` (with ``--model_config``) or ``device=None`` leaves them out (a command that
    generates nothing and so decides neither). Resolving a Hub id downloads it (or finds it in the cache).
    """
    from alodlm_convert.resolve import model_files, resolve_model
    from alodlm_scoring.run_record import RunSettings, file_digest

    bound = {"--input": file_digest(input_path), "--predictions": None}
    if model is not None:
        directory = resolve_model(model)
        bound["--model"] = str(directory)
        bound["--model files"] = model_files(directory)
        bound["--model_config"] = file_digest(model_config) if model_config else None
    bound.update({f"--{key}": value for key, value in decode.as_dict().items()})
    bound["--precision"] = precision
    if device is not None:
        bound["--device"] = "cuda" if device == "gpu" else device
    bound["--code_verdicts"] = code_verdicts
    bound["--code_sandbox"] = code_sandbox
    bound.update(extra or {})
    return RunSettings(bound=bound, free=dict(free or {}))


def require_model(flag_values: flags.FlagValues) -> None:
    """Generate mode needs ``--model`` (checked before anything reads it)."""
    if not flag_values.model:
        raise ValueError("--model is required for generation")


def generator_from_flags(flag_values: flags.FlagValues, decode, *, several_processes: bool = False):
    """The generator that the model flags ask for (``--model``, ``--model_config``, ``--device``,
    ``--precision``, ``--engine``, ``--batch_size``, ``--mesh``, the compilation flags) with the
    decoding configuration ``decode``; returns ``(generator, engine name, device)``. Imports JAX.

    One definition for the evaluate command's generate mode and for other front ends that take
    these flags' values (``alodlm_jax.harness``: lm-eval's ``model_args``). A ``--mesh``, or
    several processes, decodes on this process's local devices
    (:func:`alodlm_jax.generate.build_generator`'s ``mesh``).
    """
    fv = flag_values
    require_model(fv)
    engine = fv.engine  # no fallback: the engine asked for (or the default) runs, or none
    from alodlm_jax import generate as generation  # imports JAX when it generates
    from alodlm_jax.network import sharding

    mesh = sharding.MeshSpec.parse(fv.mesh)
    generation.check_batch_size(engine, fv.batch_size)
    sharding.check_layout(mesh, engine, fv.batch_size)
    device = fv.device or generation.default_device()
    cache_dir = apply_compilation_flags(fv)
    scale_out = fv.mesh is not None or several_processes  # local devices, a mesh
    generator = generation.build_generator(
        model=fv.model, mesh=mesh if scale_out else None, model_config=fv.model_config,
        device=device, precision=fv.precision, decode_config=decode, engine=engine,
        compilation_cache_dir=cache_dir, batch_size=fv.batch_size)
    return generator, engine, device
