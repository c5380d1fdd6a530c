"""A corpus of decodes that match the PyTorch reference, for JAX releases that have no torch beside
them (CI's Python 3.12 tier: the torch CPU wheel CI installs exists for Python 3.11 only).

``write DIR`` (needs torch: the ``test`` extra) builds tiny checkpoints of both topologies into
``DIR``, decodes each case with the PyTorch reference and with the portable engine, the compiled
engine one request at a time and the compiled engine in batches, requires all of them to agree
(tokens, exit depths and the §6.6 counters exactly, first-pass halting probabilities to the
reference parity suites' 1e-6) and writes what the portable engine gave to ``DIR/corpus.json``.
``check DIR`` decodes the same cases from the same files on this JAX and requires the same
tokens, exit depths and counters from all three, and first-pass halting probabilities within the
same 1e-6 (it prints how many are identical to the bit). Exit status 1 on any difference::

    python -m alodlm_jax.compare.token_corpus write .ci/corpus      # Python 3.11, torch
    python -m alodlm_jax.compare.token_corpus check .ci/corpus      # any JAX line
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys

import numpy as np

TOPOLOGIES = ("sandwich", "all_layer")
LM_HEAD_SCALE = 64.0  # peaked logits: several tokens commit per window, depths 1-4 (tests/decode)
GROUPS_PER_TOPOLOGY = 4  # settings per topology (both modes), PROMPTS_PER_GROUP prompts each
PROMPTS_PER_GROUP = 3
MAX_NEW_TOKENS = 16  # one budget and window: one set of compiled shapes per topology
BATCH_SIZE = 2  # < PROMPTS_PER_GROUP: a slot is freed and refilled (continuous batching)
HALT_TOLERANCE = 1e-6
COUNTERS = ("outer_steps", "recurrent_passes", "loop_token_passes", "stop_reason", "prompt_tokens")


def groups(seed: int = 50) -> list[dict]:
    """Deterministic groups of cases: per topology, settings of both modes (q, tau, a position
    penalty) and prompts of 1-16 tokens each, window 4."""
    rng = random.Random(seed)
    out = []
    for topology in TOPOLOGIES:
        for i in range(GROUPS_PER_TOPOLOGY):
            out.append(dict(topology=topology, mode=("entropy", "left1")[i % 2],
                            q=rng.choice([0.3, 0.5, 1.0]), tau=rng.choice([0.0, 0.4, 2.0]),
                            position_penalty=rng.choice([None, 0.0, 0.3]),
                            prompts=[[rng.randrange(13, 64) for _ in range(rng.randint(1, 16))]
                                     for _ in range(PROMPTS_PER_GROUP)]))
    return out


def _decode_config(group: dict):
    from alodlm_jax.config import DecodeConfig

    return DecodeConfig(q=group["q"], tau=group["tau"], window_size=4, mode=group["mode"],
                        max_new_tokens=MAX_NEW_TOKENS, position_penalty=group["position_penalty"])


def record(out) -> dict:
    """The observables of a DecodeOutput (or of the reference's result dict); halting
    probabilities as fp32 bit patterns."""
    get = out.__getitem__ if isinstance(out, dict) else lambda key: getattr(out, key)
    halts = np.asarray(get("first_pass_halt_probabilities"), np.float32)
    return {"token_ids": list(get("token_ids")), "exit_depths": list(get("exit_depths")),
            "halt_bits": [int(b) for b in halts.view(np.uint32)],
            **{key: get(key) for key in COUNTERS}}


def compare(got: dict, want: dict) -> tuple[str | None, bool]:
    """``(difference or None, halting probabilities identical to the bit)``."""
    for key in ("token_ids", "exit_depths", *COUNTERS):
        if got[key] != want[key]:
            return f"{key}: {got[key]} != {want[key]}", False
    a = np.asarray(got["halt_bits"], np.uint32).view(np.float32)
    b = np.asarray(want["halt_bits"], np.uint32).view(np.float32)
    if a.shape != b.shape:
        return f"halting probabilities: {a.size} != {b.size}", False
    gap = float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
    if gap > HALT_TOLERANCE:
        return f"first-pass halting probabilities differ by {gap:.3g}", False
    return None, bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def _engines(path: pathlib.Path, topology_groups: list[dict]) -> list[dict]:
    """Per group ``{engine name: [record per prompt]}``: portable, compiled (one at a time) and
    compiled in batches of :data:`BATCH_SIZE`, each group with its settings and ``stop_ids``."""
    from alodlm_jax.decode.compiled import CompiledEngine
    from alodlm_jax.decode.portable import PortableEngine
    from alodlm_jax.network.params import load_model

    cfg, params = load_model(str(path), "fp32")
    out = []
    for group in topology_groups:
        decode, stop_ids = _decode_config(group), group["stop_ids"]
        portable = PortableEngine(cfg, params, decode, stop_ids)
        compiled = CompiledEngine(cfg, params, decode, stop_ids, measure_prefill=False)
        out.append({"portable": [record(portable.generate(p)) for p in group["prompts"]],
                    "compiled": [record(compiled.generate(p)) for p in group["prompts"]],
                    "batch": [record(o) for o in compiled.generate_batch(
                        group["prompts"], batch_size=BATCH_SIZE)]})
    return out


def write(root: pathlib.Path) -> int:
    import transformers

    from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint
    from alodlm_jax.compare.torch_reference import TorchALoDLM

    transformers.logging.set_verbosity_error()
    all_groups, failures, count = groups(), 0, 0
    for topology in TOPOLOGIES:
        path = build_tiny_checkpoint(root / topology,
                                     TinySpec.for_topology(topology, lm_head_scale=LM_HEAD_SCALE))
        ref = TorchALoDLM.from_checkpoint(path, "fp32")
        mine = [g for g in all_groups if g["topology"] == topology]
        for i, group in enumerate(mine):
            # Every other group also stops on a token of its first prompt's output ("eos").
            group["stop_ids"] = ref.default_stop_ids()
            if i % 2:
                plain = ref.generate(group["prompts"][0], _decode_config(group),
                                     stop_ids=group["stop_ids"])
                group["stop_ids"].append(plain["token_ids"][len(plain["token_ids"]) // 2])
        ours = _engines(path, mine)
        for group, outs in zip(mine, ours):
            for j, prompt in enumerate(group["prompts"]):
                want = record(ref.generate(prompt, _decode_config(group),
                                           stop_ids=group["stop_ids"]))
                for name in ("portable", "compiled", "batch"):
                    count += 1
                    difference, _ = compare(outs[name][j], want)
                    if difference:
                        failures += 1
                        print(f"{topology} {group['mode']} prompt {prompt} ({name} against the "
                              f"reference): {difference}")
            group["expected"] = outs["portable"]
    import jax

    (root / "corpus.json").write_text(json.dumps({"jax": jax.__version__, "groups": all_groups},
                                                 indent=1))
    print(f"token corpus written to {root}: {count - failures} passed, {failures} failed "
          f"(portable, compiled and batch decodes against the PyTorch reference)")
    return 1 if failures else 0


def check(root: pathlib.Path) -> int:
    import jax

    all_groups = json.loads((root / "corpus.json").read_text())["groups"]
    failures = same_bits = count = 0
    for topology in TOPOLOGIES:
        mine = [g for g in all_groups if g["topology"] == topology]
        for group, outs in zip(mine, _engines(root / topology, mine) if mine else []):
            for j, prompt in enumerate(group["prompts"]):
                for name in ("portable", "compiled", "batch"):
                    count += 1
                    difference, identical = compare(outs[name][j], group["expected"][j])
                    same_bits += identical
                    if difference:
                        failures += 1
                        print(f"{topology} {group['mode']} prompt {prompt} ({name}): {difference}")
    print(f"token corpus on JAX {jax.__version__}: {count - failures} passed, {failures} failed "
          f"(portable, compiled and batch decodes against JAX {_writer(root)}'s; halting "
          f"probabilities identical to the bit in {same_bits})")
    return 1 if failures else 0


def _writer(root: pathlib.Path) -> str:
    return json.loads((root / "corpus.json").read_text()).get("jax", "?")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alodlm_jax.compare.token_corpus",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("dir", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.action == "write":
        args.dir.mkdir(parents=True, exist_ok=True)
        return write(args.dir)
    if not (args.dir / "corpus.json").is_file():
        parser.error(f"{args.dir / 'corpus.json'}: no corpus (write it first)")
    return check(args.dir)


if __name__ == "__main__":
    sys.exit(main())
