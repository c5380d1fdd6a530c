"""Model level: the same checkpoint run by JAX and by a PyTorch side, and its report.

The per-depth forward comparison (:mod:`.per_depth`) over every row of every prompt, then a
greedy decode both ways with the same ``DecodeConfig``: token agreement, exit-depth agreement and
the first divergence per prompt (MODEL_AND_DECODING.md §8 "parity expectations"). JAX and torch are
imported lazily, inside :func:`run_model_comparison` and :func:`perturb_core_q`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import numpy as np

from .per_depth import depth_metrics, merge_depth_metrics
from .errors import CompareInputError
from .official import TORCH_SIDE_OFFICIAL, TORCH_SIDE_REFERENCE, OfficialDecoder, official_alodlm_available
from .predictions import first_divergence
from .prompts import PromptSpec, encode_prompts
from .tolerances import Tolerances, check, check_label

__all__ = ["decode_pair_metrics", "model_report", "perturb_core_q", "run_model_comparison"]


def decode_pair_metrics(torch_result: dict | None, jax_result: dict | None, *,
                        errors: dict | None = None) -> dict:
    """Compares one prompt's two generation results (``token_ids``, ``exit_depths``, ...).

    A side that raised instead of returning a result is passed as ``None`` with its message in
    ``errors`` (``{"torch": ..., "jax": ...}``): the prompt then counts as a disagreement.
    """
    if torch_result is None or jax_result is None:
        results = {"torch": torch_result, "jax": jax_result}
        return {
            "tokens_equal": False, "exit_depths_equal": False, "first_divergence": None,
            "first_exit_depth_divergence": None, "common_prefix": 0, "exit_depth_positions_equal": 0,
            "generated_tokens": {k: (len(r["token_ids"]) if r else None) for k, r in results.items()},
            "stop_reason": {k: (r.get("stop_reason") if r else None) for k, r in results.items()},
            "mean_exit_depth": {k: (r.get("mean_exit_depth") if r else None) for k, r in results.items()},
            "token_ids": {k: (list(r["token_ids"]) if r else None) for k, r in results.items()},
            "exit_depths": {k: (list(r["exit_depths"]) if r else None) for k, r in results.items()},
            "errors": dict(errors or {}),
        }
    t_tok, j_tok = list(torch_result["token_ids"]), list(jax_result["token_ids"])
    t_exit, j_exit = list(torch_result["exit_depths"]), list(jax_result["exit_depths"])
    common = first_divergence(t_tok, j_tok)
    common = min(len(t_tok), len(j_tok)) if common is None else common
    equal_exits = sum(a == b for a, b in zip(t_exit[:common], j_exit[:common]))
    return {
        "tokens_equal": t_tok == j_tok,
        "exit_depths_equal": t_tok == j_tok and t_exit == j_exit,
        "first_divergence": first_divergence(t_tok, j_tok),
        "first_exit_depth_divergence": first_divergence(t_exit[:common], j_exit[:common]),
        "common_prefix": common,
        "exit_depth_positions_equal": equal_exits,
        "generated_tokens": {"torch": len(t_tok), "jax": len(j_tok)},
        "stop_reason": {"torch": torch_result.get("stop_reason"), "jax": jax_result.get("stop_reason")},
        "mean_exit_depth": {"torch": torch_result.get("mean_exit_depth"), "jax": jax_result.get("mean_exit_depth")},
        "token_ids": {"torch": t_tok, "jax": j_tok},
        "exit_depths": {"torch": t_exit, "jax": j_exit},
    }


def _generate_or_error(generate_fn: Callable[[list[int]], dict], ids: list[int]) -> tuple[dict | None, str | None]:
    """Runs one side's generation; an exception becomes a recorded error (the prompt then fails the
    comparison) instead of aborting the other prompts. Inputs are validated before this point."""
    try:
        return generate_fn(ids), None
    except Exception as error:  # noqa: BLE001 - any failure of one side is a finding to report
        return None, f"{type(error).__name__}: {error}"


def model_report(*, depth_rows: list[dict], decode_rows: list[dict] | None, tolerances: Tolerances,
                 info: dict) -> dict:
    """Assembles the model-level report and its checks.

    Checks: per depth, max |Δ logits| ≤ atol (with ``rtol`` > 0: max(|Δ| − rtol · row scale) ≤ atol,
    named ``max_logits_excess``) and max |Δ hazard| ≤ atol; over prompts, the fraction
    with identical token sequences ≥ ``min_token_agreement``; over the common token prefixes, the
    fraction of positions with equal exit depths ≥ ``min_exit_depth_agreement``. KL and top-1 are
    reported, not checked: they follow from the logits bound.
    """
    checks = []
    for row in depth_rows:
        if tolerances.rtol:
            checks.append(check("max_logits_excess", row["max_logits_excess"], tolerances.atol,
                                 at_most=True, depth=row["depth"]))
        else:
            checks.append(check("max_abs_logits", row["max_abs_logits"], tolerances.atol, at_most=True,
                                 depth=row["depth"]))
        checks.append(check("max_abs_hazard", row["max_abs_hazard"], tolerances.atol, at_most=True,
                             depth=row["depth"]))
    decode = None
    if decode_rows is not None:
        n = len(decode_rows)
        positions = sum(r["common_prefix"] for r in decode_rows)
        equal_positions = sum(r["exit_depth_positions_equal"] for r in decode_rows)
        decode = {
            "prompts": n,
            "token_agreement": sum(r["tokens_equal"] for r in decode_rows) / n if n else None,
            "exit_depth_sequence_agreement": sum(r["exit_depths_equal"] for r in decode_rows) / n if n else None,
            # No common positions (both empty) means nothing disagrees.
            "exit_depth_position_agreement": equal_positions / positions if positions else 1.0,
            "per_prompt": [{"prompt": i, **r} for i, r in enumerate(decode_rows)],
        }
        checks.append(check("token_agreement", decode["token_agreement"], tolerances.min_token_agreement,
                             at_most=False))
        checks.append(check("exit_depth_position_agreement", decode["exit_depth_position_agreement"],
                             tolerances.min_exit_depth_agreement, at_most=False))
    return {
        "kind": "model",
        **info,
        "tolerances": dataclasses.asdict(tolerances),
        "forward": {"depths": depth_rows},
        "decode": decode,
        "checks": checks,
        "failed": [check_label(c) for c in checks if not c["passed"]],
        "passed": all(c["passed"] for c in checks),
    }



def perturb_core_q(params: dict, *, layer: int = 0, delta: float = 1e-2) -> dict:
    """A copy of ``params`` with ``delta`` added to one core layer's q kernel (a test hook: a
    conversion error of this size must fail the comparison)."""
    import jax.numpy as jnp  # noqa: PLC0415

    core = dict(params["core"])
    core["q"] = core["q"].at[layer].add(jnp.asarray(delta, core["q"].dtype))
    return {**params, "core": core}


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)



TORCH_DEVICES = ("auto", "cpu", "cuda")


def resolve_torch_device(torch_device: str, jax_device: str) -> str:
    """The torch side's device: ``cpu`` or ``cuda`` as given; ``auto`` = ``cuda`` when the JAX side
    runs on a GPU (``--device cuda`` or ``gpu``) and PyTorch sees one, else ``cpu``. ``cuda``
    given without a GPU PyTorch sees is a :class:`CompareInputError` naming the flag."""
    if torch_device not in TORCH_DEVICES:
        raise CompareInputError(f"--torch_device must be one of {', '.join(TORCH_DEVICES)}, "
                                f"got {torch_device!r}")
    if torch_device == "cpu" or (torch_device == "auto" and jax_device not in ("cuda", "gpu")):
        return "cpu"
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        return "cuda"
    if torch_device == "auto":
        return "cpu"
    raise CompareInputError("--torch_device cuda: PyTorch sees no CUDA device (a CPU-only torch "
                            "build, or no GPU); use --torch_device cpu")


def run_model_comparison(model: str, prompts: Sequence[PromptSpec], *, precision: str, decode_config: Any,
                         tolerances: Tolerances, engine: str = "compiled", device: str = "cpu",
                         torch_side: str = "auto", decode: bool = True,
                         jax_params_hook: Callable[[dict], dict] | None = None,
                         torch_device: str = "cpu") -> dict:
    """Runs the checkpoint in JAX and PyTorch and returns the model-level report.

    ``device`` is the JAX side's device, ``torch_device`` the torch side's (see
    :func:`resolve_torch_device`).

    ``torch_side``: ``"auto"`` (the official package if importable, else our reference),
    ``"official"`` or ``"reference"``. ``jax_params_hook`` transforms the JAX params before they are
    used (tests perturb them with :func:`perturb_core_q`); it applies to the forward comparison and,
    when the generator exposes its params, to the JAX decode too.
    """
    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    from alodlm_jax import generate  # noqa: PLC0415
    from alodlm_jax.network.model import looped_forward  # noqa: PLC0415
    from alodlm_jax.network.params import load_model  # noqa: PLC0415
    from alodlm_jax.compare.torch_reference import TorchALoDLM  # noqa: PLC0415

    if torch_side not in ("auto", "official", "reference"):
        raise CompareInputError(f"--torch_side must be auto, official or reference, got {torch_side!r}")
    use_official = official_alodlm_available() if torch_side == "auto" else torch_side == "official"
    if use_official and not official_alodlm_available():
        raise CompareInputError("--torch_side official: the alodlm package is not importable")

    torch_device = resolve_torch_device(torch_device, device)
    target = generate.jax_device(device)
    model_dir = _resolve_model_dir(model)
    reference = TorchALoDLM.from_checkpoint(model_dir, precision, device=torch_device)
    on_torch_device = torch.device(torch_device)  # tensors the torch side builds are made there
    prompt_ids = encode_prompts(prompts, reference.tokenizer, reference.vocab_size)
    budget = decode_config.max_new_tokens if decode else 0
    for spec, ids in zip(prompts, prompt_ids):
        if len(ids) + budget > reference.max_position_embeddings:
            raise CompareInputError(
                f"prompt of {len(ids)} tokens plus max_new_tokens {budget} exceeds "
                f"max_position_embeddings {reference.max_position_embeddings}", file=spec.where)

    placement = jax.sharding.SingleDeviceSharding(target)
    cfg, params = load_model(model_dir, precision, sharding=lambda path, array: placement)
    if jax_params_hook is not None:
        params = jax_params_hook(params)
    forward = jax.jit(looped_forward, static_argnums=1)
    per_prompt = []
    with jax.default_device(target):
        for ids in prompt_ids:
            with on_torch_device:
                t_logits, t_hazards = reference.looped_forward(ids)
            j_logits, j_hazards = forward(params, cfg, jax.numpy.asarray(ids, dtype=jax.numpy.int32))
            per_prompt.append(depth_metrics(_to_numpy(t_logits), _to_numpy(j_logits),
                                            _to_numpy(t_hazards), _to_numpy(j_hazards), rtol=tolerances.rtol))
    depth_rows = merge_depth_metrics(per_prompt)

    decode_rows = None
    if decode:
        # Built from the params above (hook included), so both comparisons test the same weights.
        generator = generate.Generator(
            cfg=cfg, params=params, tokenizer=generate.load_tokenizer(model_dir), model_dir=model_dir,
            precision=precision, device=device, engine=engine, decode_config=decode_config,
            jax_device=target)
        stop_ids = list(generator.stop_ids)
        official = OfficialDecoder(model_dir, precision, torch_device) if use_official else None
        if official is not None:
            torch_generate = lambda ids: official.generate(ids, decode_config)  # noqa: E731
        else:
            torch_generate = lambda ids: reference.generate(ids, decode_config, stop_ids=stop_ids)  # noqa: E731
        decode_rows = []
        for ids in prompt_ids:
            with on_torch_device:
                torch_result, torch_error = _generate_or_error(torch_generate, ids)
            jax_result, jax_error = _generate_or_error(generator.generate_ids, ids)
            errors = {k: v for k, v in (("torch", torch_error), ("jax", jax_error)) if v is not None}
            decode_rows.append(decode_pair_metrics(torch_result, jax_result, errors=errors))

    info = {
        "model": model,
        "precision": precision,
        "jax_side": "alodlm-jax",
        "torch_side": TORCH_SIDE_OFFICIAL if (use_official and decode) else TORCH_SIDE_REFERENCE,
        "torch_forward_side": TORCH_SIDE_REFERENCE,
        "engine": engine,
        "device": device,
        "torch_device": torch_device,
        "decode_config": decode_config.as_dict() if decode else None,
        "prompts": [{"where": s.where, "tokens": len(ids)} for s, ids in zip(prompts, prompt_ids)],
        "jax_params_hook": getattr(jax_params_hook, "__name__", "hook") if jax_params_hook else None,
        "versions": _versions(),
    }
    return model_report(depth_rows=depth_rows, decode_rows=decode_rows, tolerances=tolerances, info=info)


def _resolve_model_dir(model: str) -> str:
    from alodlm_convert.resolve import resolve_model  # noqa: PLC0415

    return os.fspath(resolve_model(model))


def _versions() -> dict:
    from importlib import metadata  # noqa: PLC0415

    out = {}
    for name in ("jax", "jaxlib", "flax", "torch", "transformers", "alodlm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out

