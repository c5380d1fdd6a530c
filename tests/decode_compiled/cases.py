"""Random decoding cases for the compiled-engine parity tests, and the comparison they use.

A case is a tiny random checkpoint (topology, seed, LM-head scale), a prompt and decoding settings.
Shapes are kept inside fixed buckets (prompt <= 16 tokens, ``max_new_tokens <= 32``, a fixed
window size per suite) so every case of a (topology, mode) group reuses the same compiled programs
of both engines; only the checkpoint's values, the prompt and the runtime settings vary.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random

from alodlm_jax.config import DecodeConfig

VOCAB = 64  # TinySpec default
MAX_PROMPT = 16
MAX_NEW = 32


@dataclasses.dataclass(frozen=True)
class Case:
    topology: str
    seed: int
    lm_head_scale: float
    prompt: tuple[int, ...]
    decode: DecodeConfig
    stop_ids: tuple[int, ...]
    # If set, one more stop id is taken from a plain run's output at this fraction of its length,
    # so that "eos" endings (mid-window stop ids, stop ids in the final prefix) are exercised.
    stop_from_output: float | None = None

    def label(self) -> str:
        d = self.decode
        return (f"{self.topology}-s{self.seed}-x{self.lm_head_scale:g}-P{len(self.prompt)}-{d.mode}-"
                f"q{d.q:g}-tau{d.tau:g}-w{d.window_size}-n{d.max_new_tokens}")


def make_cases(count: int, *, seed: int, topologies=("sandwich", "all_layer"),
               modes=("entropy", "left1"), window_sizes=(4,), checkpoint_seeds=4,
               min_new=17) -> list[Case]:
    """``count`` deterministic random cases drawn from the given static groups."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        topology = topologies[i % len(topologies)]
        mode = modes[(i // len(topologies)) % len(modes)]
        window = rng.choice(window_sizes)
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, MAX_PROMPT)))
        penalty = rng.choice([None, None, 0.0, 0.1, 0.5])
        decode = DecodeConfig(q=rng.choice([0.0, 0.2, 0.5, 0.5, 0.8, 1.0]),
                              tau=rng.choice([0.3, 1.0, 2.0, 2.5, 3.0, 4.0]), window_size=window,
                              max_new_tokens=rng.randint(min_new, MAX_NEW), position_penalty=penalty,
                              mode=mode)
        pick = rng.choice([None, None, 0.5, 0.9])
        cases.append(Case(topology, rng.randrange(checkpoint_seeds), rng.choice([2.0, 6.0, 12.0, 24.0]),
                          prompt, decode, (2,), pick))
    return cases


class Checkpoints:
    """Builds (once) and loads tiny checkpoints as (cfg, fp32 jax params)."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self._loaded: dict = {}

    def get(self, topology: str, seed: int, scale: float):
        key = (topology, seed, scale)
        if key not in self._loaded:
            from alodlm_jax.network.params import load_model
            from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint

            spec = TinySpec.for_topology(topology, seed=seed, lm_head_scale=scale)
            path = build_tiny_checkpoint(self.root / f"{topology}-{seed}-{scale:g}", spec)
            self._loaded[key] = load_model(str(path), "fp32")
        return self._loaded[key]


def observable(out) -> dict:
    """Everything a decoder's output must agree on (not the timings)."""
    return {
        "token_ids": out.token_ids,
        "exit_depths": out.exit_depths,
        "first_pass_halt_probabilities": out.first_pass_halt_probabilities,
        "outer_steps": out.outer_steps,
        "recurrent_passes": out.recurrent_passes,
        "loop_token_passes": out.loop_token_passes,
        "stop_reason": out.stop_reason,
        "work": out.work,
    }
