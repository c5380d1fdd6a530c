"""``alodlm-jax-compare``: check alodlm-jax against PyTorch, or compare two prediction files.

Model level (the same checkpoint in JAX and PyTorch)::

    alodlm-jax-compare --model DIR --prompts prompts.jsonl [--precision fp32|bf16]
        [--device cpu|cuda|tpu] [--torch_device auto|cpu|cuda] [--q 0.5 --tau 0.4 --mode entropy --window-size 16 --max-new-tokens 64]
        [--output report.json]

Predictions level (two ``predictions.jsonl`` files of the same tasks; deltas are B − A)::

    alodlm-jax-compare --predictions-a A.jsonl --predictions-b B.jsonl [--input tasks.jsonl]
        [--output report.json]

Prints a table and writes the JSON report to ``--output``. Exit status: 0 when every check is
within tolerance, 1 when one is not (the table and the report's ``checks`` name it), 2 for bad input
(one line on stderr, no traceback). Flags may be spelled with dashes or underscores.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
from typing import Any, Callable, Sequence

from absl import flags

from alodlm_jax import compare
from alodlm_jax.cli import flags as cli_flags
from alodlm_jax.config import DEFAULT_ENGINE, ENGINES

_PROG = "alodlm-jax-compare"
_PRECISIONS = ("fp32", "bf16")
_DEFAULT_COMPARE_MAX_NEW_TOKENS = 64


def _define_flags() -> flags.FlagValues:
    """A private flag registry, so this CLI can be called repeatedly (tests) and next to others."""
    fv = flags.FlagValues()
    d = dict(flag_values=fv)
    # Model level
    flags.DEFINE_string("model", None, "Checkpoint directory (reference format) or Hub id.", **d)
    flags.DEFINE_string("prompts", None, "Prompts: JSONL ('prompt' [+ 'raw'] or 'prompt_ids') or "
                        "plain text, one prompt per line.", **d)
    flags.DEFINE_enum("precision", "fp32", _PRECISIONS, "Model dtype on both sides.", **d)
    flags.DEFINE_enum("engine", DEFAULT_ENGINE, list(ENGINES), "JAX decoder engine.", **d)
    flags.DEFINE_string("device", "cpu", "JAX device for the decode.", **d)
    flags.DEFINE_string("torch_device", "auto", "PyTorch side's device: cpu, cuda, or auto (cuda when "
                        "--device is cuda and PyTorch sees a GPU, else cpu). cuda needs a GPU "
                        "that PyTorch sees.", **d)
    flags.DEFINE_enum("torch_side", "auto", ("auto", "official", "reference"),
                      "PyTorch side: the official alodlm package if importable (auto), or forced.", **d)
    flags.DEFINE_boolean("decode", True, "Also decode greedily both ways (--nodecode: forward only).", **d)
    flags.DEFINE_float("q", 0.5, "Cumulative halting threshold.", **d)
    flags.DEFINE_float("tau", 0.4, "Entropy threshold.", **d)
    flags.DEFINE_string("mode", "entropy", "entropy or left1.", **d)
    flags.DEFINE_integer("window_size", 16, "Decoding window size.", **d)
    flags.DEFINE_integer("max_new_tokens", _DEFAULT_COMPARE_MAX_NEW_TOKENS,
                         "Generation budget per prompt (smaller than the reference's 4096 default: "
                         "the PyTorch side is slow).", **d)
    flags.DEFINE_float("position_penalty", None, "Position penalty (default 0.05 * tau).", **d)
    # Predictions level
    flags.DEFINE_string("predictions_a", None, "First predictions.jsonl (A).", **d)
    flags.DEFINE_string("predictions_b", None, "Second predictions.jsonl (B); deltas are B - A.", **d)
    flags.DEFINE_string("input", None, "Task file: rescore both prediction files instead of trusting "
                        "their 'correct'.", **d)
    # Both
    flags.DEFINE_string("output", None, "Write the JSON report here.", **d)
    flags.DEFINE_float("atol", None, "Max |delta| for logits and hazards (default 1e-4 fp32, 0.1 bf16).", **d)
    flags.DEFINE_float("rtol", None, "Relative part of the logits bound: |d| <= atol + rtol * (the row's max "
                       "|torch logit|) (default 0 fp32, 2^-5 bf16).", **d)
    flags.DEFINE_float("min_token_agreement", None, "Min fraction of identical token sequences / texts "
                       "(default 1.0 fp32, 0.95 bf16).", **d)
    flags.DEFINE_float("min_exit_depth_agreement", None, "Min fraction of equal exit depths over common "
                       "token prefixes (default 1.0 fp32, 0.9 bf16).", **d)
    return fv


def _json_safe(value: Any) -> Any:
    """Non-finite floats become the strings "NaN" / "Infinity" / "-Infinity" (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _write_report(path: str, report: dict) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(_json_safe(report), handle, indent=2, allow_nan=False)
        handle.write("\n")


def _tolerances(fv: flags.FlagValues) -> compare.Tolerances:
    return compare.default_tolerances(fv.precision, atol=fv.atol, rtol=fv.rtol,
                                      min_token_agreement=fv.min_token_agreement,
                                      min_exit_depth_agreement=fv.min_exit_depth_agreement)


def _predictions_report(fv: flags.FlagValues) -> dict:
    if not (fv.predictions_a and fv.predictions_b):
        raise compare.CompareInputError("--predictions_a and --predictions_b are both required")
    if fv.model or fv.prompts:
        raise compare.CompareInputError("give either --model/--prompts or --predictions_a/--predictions_b, not both")
    tolerances = _tolerances(fv)
    tasks = None
    if fv.input:
        from alodlm_scoring.tasks import load_tasks  # noqa: PLC0415

        tasks = load_tasks(fv.input)
    rows_a = compare.load_prediction_rows(fv.predictions_a, require_correct=tasks is None)
    rows_b = compare.load_prediction_rows(fv.predictions_b, require_correct=tasks is None)
    sources = {"predictions_a": fv.predictions_a, "predictions_a_sha256": compare.sha256_file(fv.predictions_a),
               "predictions_b": fv.predictions_b, "predictions_b_sha256": compare.sha256_file(fv.predictions_b),
               "input": fv.input, "input_sha256": compare.sha256_file(fv.input) if fv.input else None}
    return compare.compare_predictions(rows_a, rows_b, tolerances=tolerances, tasks=tasks, sources=sources)


def _model_report(fv: flags.FlagValues, jax_params_hook: Callable | None) -> dict:
    if fv.input:
        raise compare.CompareInputError("--input belongs to the predictions comparison")
    if not (fv.model and fv.prompts):
        raise compare.CompareInputError("--model and --prompts are required "
                                        "(or --predictions_a and --predictions_b)")
    tolerances = _tolerances(fv)
    decode_config = cli_flags.decode_config_from_flags(fv)
    torch_device = compare.resolve_torch_device(fv.torch_device, fv.device)  # before any loading
    prompts = compare.load_prompts(fv.prompts)
    _quiet_transformers()
    return compare.run_model_comparison(
        fv.model, prompts, precision=fv.precision, decode_config=decode_config, tolerances=tolerances,
        engine=fv.engine, device=fv.device, torch_side=fv.torch_side, decode=fv.decode,
        jax_params_hook=jax_params_hook, torch_device=torch_device)


def _quiet_transformers() -> None:
    """No weight-loading progress bars or warnings on stderr: an error stays one line."""
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: Sequence[str] | None = None, *, jax_params_hook: Callable | None = None) -> int:
    """Runs the command on ``argv`` (without the program name); returns the exit status.

    ``jax_params_hook`` is a test hook (see :func:`alodlm_jax.compare.run_model_comparison`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    fv = _define_flags()

    def body() -> int:
        if fv.predictions_a or fv.predictions_b:
            report = _predictions_report(fv)
        else:
            report = _model_report(fv, jax_params_hook)
        if fv.output:
            _write_report(fv.output, report)
        print(compare.format_report(report), flush=True)
        return compare.exit_status(report)

    kwargs = dict(prog=_PROG, description=__doc__, flag_values=fv, argv=[_PROG, *argv], extra_errors=(OSError,))
    if "module_name" in inspect.signature(cli_flags.run_command).parameters:  # older flags.py needs it
        kwargs["module_name"] = __name__
    return cli_flags.run_command(body, **kwargs)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
