"""Tiny random ALoDLM checkpoints in the reference's own file format.

The files are exactly what the reference's trainer leaves in a model directory: a transformers
``Qwen3ForCausalLM`` saved with ``save_pretrained`` (``config.json`` + safetensors, optionally
sharded with an index), a word-level tokenizer with a chat template, the exit gate saved with
``torch.save`` and ``alodlm_config.json``. Tests, benchmarks and the README demo all build their
checkpoints here, so nothing ever has to be downloaded.

Building needs torch and transformers (the ``test`` extra). The prebuilt demo copy in
``alodlm_jax/data/tiny_checkpoint`` is :data:`DEMO_SPEC`, made with :func:`main`::

    python -m alodlm_jax.testing.tiny_checkpoint alodlm_jax/data/tiny_checkpoint --demo

Its LM head is scaled by 128 (peaked logits: entropy mode commits several tokens per window) and
its exit gate's weight by -0.5 (for seed 42 the unscaled gate puts every first-pass hazard at
0.77-0.98, so every window halted at depth 1; scaled, the hazards spread around the halting
threshold and the README demo exits at all four depths).

The tokenizer follows the reference's test fixture (MODEL_AND_DECODING.md §12.1): ids ``<pad>`` 0,
``<unk>`` 1, ``</s>`` 2, ``<mask>`` 3, ``user`` 4, ``assistant`` 5, ``system`` 6, ``Return`` 7,
``value`` 8, ``one`` 9, ``two`` 10, ``three`` 11, ``.`` 12, then ``t13``... up to the vocabulary
size; chat template ``"{role} {content} </s> "`` per message plus ``"assistant "`` as generation
prompt.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
from typing import Literal

BASE_WORDS = ["<pad>", "<unk>", "</s>", "<mask>", "user", "assistant", "system", "Return", "value",
              "one", "two", "three", "."]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} {{ message['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)
MASK_TOKEN_ID = 3

Topology = Literal["sandwich", "all_layer"]


@dataclasses.dataclass(frozen=True)
class TinySpec:
    """Shape and seed of a tiny checkpoint.

    ``sandwich`` puts the core in the middle (prelude ``[0, loop_start)``, coda ``[loop_end, N)``)
    like the 8B release; ``all_layer`` loops every layer like the 1.7B release.
    """

    topology: Topology = "sandwich"
    num_layers: int = 3
    loop_start: int = 1
    loop_end: int = 2
    hidden_size: int = 32
    intermediate_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 8
    vocab_size: int = 64
    max_position_embeddings: int = 128
    max_depth: int = 4
    rope_theta: float = 1_000_000.0
    seed: int = 42
    dtype: Literal["fp32", "bf16"] = "fp32"
    # Multiplies the LM head so that logits are peaked enough for entropy mode to commit several
    # tokens per pass (random init alone gives near-uniform logits, entropy ~ ln V).
    lm_head_scale: float = 1.0
    # Multiplies the exit gate's weight (its random part; bias and depth bias stay) so that the
    # first-pass hazards spread around the halting threshold instead of all exceeding it.
    gate_scale: float = 1.0
    # Perturbs RMSNorm weights away from 1 so that parity tests exercise them.
    norm_jitter: float = 0.1
    # The standard deviation of the random weights (transformers' ``initializer_range``; 0.02 is
    # its default).
    init_std: float = 0.02
    max_shard_size: str | None = None  # e.g. "20KB" for a sharded checkpoint with an index

    @staticmethod
    def for_topology(topology: Topology, **overrides) -> "TinySpec":
        if topology == "all_layer":
            base = dict(topology="all_layer", num_layers=2, loop_start=0, loop_end=2)
        else:
            base = dict(topology="sandwich", num_layers=3, loop_start=1, loop_end=2)
        base.update(overrides)
        return TinySpec(**base)


DEMO_SPEC = TinySpec.for_topology("sandwich", lm_head_scale=128.0, gate_scale=-0.5)


def build_tokenizer(vocab_size: int):
    """A word-level whitespace tokenizer with the fixture's ids and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = BASE_WORDS + [f"t{i}" for i in range(len(BASE_WORDS), vocab_size)]
    if len(words) != vocab_size:
        raise ValueError(f"vocab_size must be at least {len(BASE_WORDS)}")
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<unk>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_checkpoint(out_dir: str | pathlib.Path, spec: TinySpec | None = None, **overrides) -> pathlib.Path:
    """Writes a tiny random ALoDLM checkpoint to ``out_dir`` and returns the path."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = dataclasses.replace(spec or TinySpec(), **overrides) if overrides else (spec or TinySpec())
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(spec.seed)
    config = Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=spec.rope_theta,
        initializer_range=spec.init_std,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        attention_bias=False,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(spec.norm_jitter * torch.randn_like(param))
        model.lm_head.weight.mul_(spec.lm_head_scale)
    torch_dtype = torch.bfloat16 if spec.dtype == "bf16" else torch.float32
    model = model.to(torch_dtype)
    save_kwargs = {}
    if spec.max_shard_size:
        save_kwargs["max_shard_size"] = spec.max_shard_size
    model.save_pretrained(out, safe_serialization=True, **save_kwargs)

    gate_gen = torch.Generator().manual_seed(spec.seed + 1)
    gate = {
        "net.weight": (torch.randn(1, spec.hidden_size, generator=gate_gen) * 0.5
                       * spec.gate_scale).to(torch_dtype),
        "net.bias": torch.tensor([-0.25]).to(torch_dtype),
        "depth_bias": torch.tensor([-0.7, 0.2, 0.8, 0.0][: spec.max_depth]
                                   + [0.0] * max(0, spec.max_depth - 4)).to(torch_dtype),
    }
    torch.save(gate, out / "exit_gate.pt")

    alodlm_config = {
        "loop_start": spec.loop_start,
        "loop_end": spec.loop_end,
        "max_depth": spec.max_depth,
        "depth_prior_c": 0.4,
        "kl_beta_mi": 0.1,
        "kl_beta_marg": 1.0,
        "gate_init_pi": [1.0 / spec.max_depth] * spec.max_depth,
        "mask_token_id": MASK_TOKEN_ID,
        "block_size": 4,
        "gradient_checkpointing": True,
        "gradient_checkpointing_stride": 2,
        "attention_backend": "sdpa",
        "compile_layers": False,
    }
    (out / "alodlm_config.json").write_text(json.dumps(alodlm_config, indent=2) + "\n")
    build_tokenizer(spec.vocab_size).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random ALoDLM checkpoint (reference format).")
    parser.add_argument("out_dir")
    parser.add_argument("--topology", choices=["sandwich", "all_layer"], default="sandwich")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--lm_head_scale", type=float, default=1.0)
    parser.add_argument("--gate_scale", type=float, default=1.0)
    parser.add_argument("--demo", action="store_true",
                        help="the bundled demo checkpoint (DEMO_SPEC); other options are ignored")
    args = parser.parse_args(argv)
    spec = DEMO_SPEC if args.demo else TinySpec.for_topology(
        args.topology, seed=args.seed, dtype=args.dtype, lm_head_scale=args.lm_head_scale,
        gate_scale=args.gate_scale)
    print(build_tiny_checkpoint(args.out_dir, spec))


if __name__ == "__main__":
    main()
