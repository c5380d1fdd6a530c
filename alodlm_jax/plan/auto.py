"""``alodlm-jax-evaluate --batch_size auto``: the largest batch whose programs fit the device the
run decodes on, by the plan's memory analysis (:func:`alodlm_jax.plan.compile.plan`).

The batch and admit programs are compiled for the suite's bucket (its longest prompt, tokenized as
evaluate does) at a batch of two per data shard on the run's own devices; what they need beyond
their arguments is added to their arguments at any batch (from the shapes) and held against the
capacity the device reports (its ``bytes_limit``; on the CPU, the machine's memory), as
:func:`alodlm_jax.plan.fit.largest_batch` does. The batch chosen is the largest that fits, but no
more than the number of tasks (a slot without a task decodes nothing). The record goes into
the summary's ``protocol`` (``batch_size_auto``).
"""

from __future__ import annotations

from absl import flags

__all__ = ["BATCH_AUTO", "BatchSizeParser", "parse_batch_size", "auto_batch_size"]

BATCH_AUTO = "auto"


class BatchSizeParser(flags.ArgumentParser):
    """absl parser of ``--batch_size``: a positive integer or ``auto``."""

    syntactic_help = "a positive integer or auto"

    def parse(self, argument):
        return parse_batch_size(argument)

    def flag_type(self) -> str:
        return "int or auto"


def parse_batch_size(value) -> int | str:
    """``"auto"`` or an integer (ValueError otherwise; the command checks the integer's range)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lower() == BATCH_AUTO:
        return BATCH_AUTO
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"--batch_size must be a positive integer or auto, got {value!r}") from None
    return number


def auto_batch_size(*, model: str, precision: str, model_config: str | None, decode, prompts,
                    device: str, mesh_spec, log=None) -> tuple[int, dict]:
    """``(batch size, protocol record)`` for the run (module docstring). ``prompts``: the task
    prompts as evaluate tokenizes them (verbatim); ``device``: evaluate's ``--device``."""
    import jax
    import jax.numpy as jnp

    from alodlm_convert.resolve import resolve_model
    from alodlm_convert.sources import open_checkpoint
    from alodlm_jax.generate import DEVICES, load_tokenizer
    from alodlm_jax.plan.compile import plan
    from alodlm_jax.plan.targets import attached_target
    from alodlm_jax.testing.released_shapes import param_specs

    model_dir = resolve_model(model)
    cfg = open_checkpoint(str(model_dir), precision, model_config).config
    tokenizer = load_tokenizer(model_dir)
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    dtype = {"fp32": jnp.float32, "bf16": jnp.bfloat16}[precision]
    target = attached_target(DEVICES[device])
    data = mesh_spec.data if mesh_spec is not None else 1
    probe = 2 * data
    record = plan(target, cfg, param_specs(cfg, dtype), decode, prompt_tokens=longest,
                  batch_size=probe, mesh_spec=mesh_spec if mesh_spec and mesh_spec.num_devices > 1
                  else None, log=log)
    fits = record["max_batch_size"]
    if fits is None:
        raise ValueError(f"--batch_size auto: {target.description} reports no memory capacity; "
                         f"give --batch_size N")
    if fits < data:
        raise ValueError(f"--batch_size auto: not even {data} request(s) fit {target.description} "
                         f"({target.capacity_bytes} bytes) with this model")
    chosen = min(fits, len(prompts))
    chosen = max(data, chosen - chosen % data)
    summary = {
        "chosen": chosen,
        "largest_that_fits": fits,
        "tasks": len(prompts),
        "capacity_bytes": target.capacity_bytes,
        "device": record["device"],
        "probe_batch": probe,
        "probe_device_memory_bytes": {p["name"]: p["device_memory_bytes"] for p in record["programs"]},
        "prompt_bucket": record["bucket"]["prompt_bucket"],
        "basis": "the batch and admit programs' arguments from their shapes, plus the most "
                 "either needs beyond them compiled at the probe batch (alodlm_jax.plan.fit)",
        "jax": jax.__version__,
    }
    return chosen, summary
