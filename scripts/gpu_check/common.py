"""What every block of the check, and gpu_parity.py, share: the device's rates, a pass's bytes,
prompts, times per pass, how far apart two outputs are, where two decodes first differ."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from alodlm_jax.plan.fit import tree_bytes


@functools.cache
def device_rates():
    """The plan's target (alodlm_jax/data/targets) whose memory bandwidth and dense bf16 matrix
    rate this script measures against: the attached GPU's kind where the plan describes it (A100,
    H100, H200, B200), else the H200's (a CPU's --tiny run)."""
    from alodlm_jax.plan.targets import load_target

    kind = jax.devices()[0].device_kind.upper()
    return load_target(next((n for n in ("h200", "h100", "b200", "a100") if n.upper() in kind),
                            "h200"))


def tb_per_s() -> str:
    return f"{device_rates().bandwidth_bytes_per_second / 1e12:.2f} TB/s ({device_rates().name})"


def pass_bytes(params) -> int:
    """Weight bytes one recurrent pass reads: core + coda layers, final norm, LM head, gate."""
    return tree_bytes((params["core"], params["coda"], params["final_norm"], params["lm_head"],
                       params["gate"]))


def random_prompts(cfg, count: int, tokens: int, seed: int = 2) -> list[list[int]]:
    """``count`` prompts of ``tokens`` random ids below the mask token (the same for a seed)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.mask_token_id, size=tokens).tolist() for _ in range(count)]


def ms_per_pass(*outs) -> float:
    """Single requests' decode time per recurrent pass, their prefills left out (ms)."""
    return (1e3 * sum(o.wall_seconds - o.prefill_seconds for o in outs)
            / max(sum(o.recurrent_passes for o in outs), 1))


def agreement(want, got) -> tuple[float, float]:
    """The share of the outputs ``got`` equal bit for bit to ``want`` (two lists of arrays, pair
    by pair), and the largest difference between them."""
    pairs = list(zip(want, got, strict=True))
    equal = sum(int(jnp.sum(a == b)) for a, b in pairs) / sum(a.size for a, _ in pairs)
    diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
               for a, b in pairs)
    return equal, diff


# A decode's fields that must be equal to the reference's (DecodeOutput's names).
FIELDS = ("token_ids", "exit_depths", "recurrent_passes", "outer_steps", "loop_token_passes",
          "stop_reason")


def difference(out, ref, halt_tolerance: float = float("inf")) -> str | None:
    """The first difference of ``out`` from ``ref`` (DecodeOutput) in :data:`FIELDS` or, beyond
    ``halt_tolerance``, in the first-pass halting probabilities; None where there is none."""
    for field in FIELDS:
        a, b = getattr(out, field), getattr(ref, field)
        if a != b:
            if isinstance(a, list):
                at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                return f"{field} differ from position {at} (lengths {len(a)}, {len(b)})"
            return f"{field} {a!r} against {b!r}"
    a, b = out.first_pass_halt_probabilities, ref.first_pass_halt_probabilities
    worst = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    if worst > halt_tolerance:
        return f"first-pass halting probabilities differ by up to {worst:.3g}"
    return None
