"""A small PyTorch reference of ALoDLM's portable decoder: the oracle for JAX parity tests.

Written from MODEL_AND_DECODING.md (§2, §3, §4.3-4.7, §5, §6, §8), on top of transformers' Qwen3
modules. Each decoder layer is run by calling its submodules (``q_proj``, ``q_norm``, ``mlp``, ...)
directly so that the depth-aware prefix cache (§5) and the packed-window attention mask (§3) stay
explicit and readable; nothing here is tuned for speed.

Only tests and the ``compare`` command import this module; torch and transformers are imported at
module top, so nothing on the package's import path may import it.

Numerics (§8), chosen to mirror transformers' eager Qwen3 path:

* RMSNorm: transformers' ``Qwen3RMSNorm`` modules (fp32 internals, cast back, then weight).
* RoPE: the model's own ``Qwen3RotaryEmbedding`` (fp32 inverse frequencies and tables, cast to the
  activation dtype) and transformers' ``apply_rotary_pos_emb`` (rotate-half).
* Attention: scores ``q·kᵀ · d_h^-0.5`` in the activation dtype, masked entries set to ``-inf``
  (every row sees at least itself), softmax in fp32 and cast back, as eager attention does.
* Heads: ``lm_head`` in the model dtype, logits cast to fp32; entropy in fp32 as
  ``logsumexp(l) − Σ softmax(l)·l``; gate linear + depth bias in the model dtype, logit cast to
  fp32, then sigmoid.
* Decisions in fp32: the position penalty is ``float32(window offset) * penalty``; ``tau`` and ``q``
  are compared against fp32 tensors (torch rounds the Python scalars to fp32).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from alodlm_jax.config import DecodeConfig
from alodlm_jax.generate import load_tokenizer, stop_ids_for

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# A trace callback receives an event name and a dict payload; see TorchALoDLM.generate.
Trace = Callable[[str, dict], None]
KV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [T, n_kv, d_h] each (keys after norm + RoPE)


class ExitGate(nn.Module):
    """The linear exit gate of §2.5: ``net`` (H → 1) plus a per-depth bias ``depth_bias`` [K]."""

    def __init__(self, hidden_size: int, max_depth: int):
        super().__init__()
        self.net = nn.Linear(hidden_size, 1)
        self.depth_bias = nn.Parameter(torch.zeros(max_depth))

    def forward(self, readout: torch.Tensor, depth: int) -> torch.Tensor:
        """Gate logits [T] in the model dtype (the portable rule: depth bias added in that dtype)."""
        return self.net(readout).squeeze(-1) + self.depth_bias[depth]


# ---------------------------------------------------------------------------------------------
# Depth-aware prefix cache (§5)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DepthCache:
    """The prefix cache: ``entries[(layer, depth)] = (K, V)``, each ``[length, n_kv, d_h]``.

    Core layers have one entry per depth, prelude and coda layers only depth 0. An empty cache has
    no entries; readers then see an empty prefix.
    """

    entries: dict[tuple[int, int], KV] = dataclasses.field(default_factory=dict)
    length: int = 0

    def snapshot(self) -> "DepthCache":
        """A copy that later appends do not change (appends replace tensors, never mutate them)."""
        return DepthCache(entries=dict(self.entries), length=self.length)


def complete_window(window: dict[tuple[int, int], KV], core_layers: Iterable[int], max_depth: int,
                    executed: int) -> dict[tuple[int, int], KV]:
    """§5 complete: for every core layer, depths ``≥ executed`` inherit depth ``executed − 1``.

    Depths already computed are left untouched. Returns a new dict (the input is not modified).
    """
    if not 1 <= executed <= max_depth:
        raise ValueError(f"executed must be in [1, {max_depth}], got {executed}")
    out = dict(window)
    for layer in core_layers:
        for depth in range(executed, max_depth):
            out[(layer, depth)] = window[(layer, executed - 1)]
    return out


def append_rows(cache: DepthCache, window: dict[tuple[int, int], KV], rows: Sequence[int]) -> None:
    """§5 append: concatenates the selected window rows, in the given order, onto every entry."""
    index = torch.tensor(list(rows), dtype=torch.long)
    for key, (k, v) in window.items():
        new_k, new_v = k.index_select(0, index), v.index_select(0, index)
        if key in cache.entries:
            old_k, old_v = cache.entries[key]
            new_k, new_v = torch.cat([old_k, new_k]), torch.cat([old_v, new_v])
        cache.entries[key] = (new_k, new_v)
    cache.length += len(index)


# ---------------------------------------------------------------------------------------------
# Result of one window step (§6.4)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class WindowResult:
    """What a window step returns (§6.4 step 9); per-mask lists are in mask order."""

    kv: dict[tuple[int, int], KV]  # completed window K/V, rows in packed order
    committed: list[bool]
    tokens: list[int]
    exits: list[int]  # 1-based pass of the commit, 0 if uncommitted
    executed: int
    first_pass_halt: list[float]  # λ at pass 1, as Python floats of fp32 values


class TorchALoDLM:
    """ALoDLM on a transformers ``Qwen3ForCausalLM``: looped forward and the portable decoder."""

    def __init__(self, model: nn.Module, gate: ExitGate, tokenizer: Any, *, loop_start: int,
                 loop_end: int, max_depth: int, mask_token_id: int):
        self.model = model.eval()
        self.gate = gate.eval()
        self.tokenizer = tokenizer
        self.loop_start = loop_start
        self.loop_end = loop_end
        self.max_depth = max_depth  # tests may lower it (§12.2 test 4)
        self.mask_token_id = mask_token_id
        config = model.config
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.vocab_size = config.vocab_size
        self.max_position_embeddings = config.max_position_embeddings

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def from_checkpoint(cls, model_dir: str | pathlib.Path, dtype: str = "fp32",
                        device: str = "cpu") -> "TorchALoDLM":
        """Loads a checkpoint directory in the reference's format (§4.5) onto ``device`` (a torch
        device: ``cpu`` or ``cuda``). On another device than the CPU, call the model inside
        ``with torch.device(device):`` so the tensors it builds are made there too."""
        from transformers import Qwen3ForCausalLM

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        torch_dtype = _DTYPES[dtype]
        model_dir = pathlib.Path(model_dir)
        meta = json.loads((model_dir / "alodlm_config.json").read_text())
        fields = {}
        for name in ("loop_start", "loop_end", "max_depth", "mask_token_id"):
            value = meta.get(name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{model_dir / 'alodlm_config.json'}: {name} must be an integer")
            fields[name] = value

        model = Qwen3ForCausalLM.from_pretrained(
            model_dir, dtype=torch_dtype, attn_implementation="eager", local_files_only=True)
        config = model.config
        if getattr(config, "tie_word_embeddings", False):
            raise ValueError(f"{model_dir / 'config.json'}: tie_word_embeddings must be false")
        if not 0 <= fields["loop_start"] < fields["loop_end"] <= config.num_hidden_layers:
            raise ValueError(f"{model_dir / 'alodlm_config.json'}: need 0 <= loop_start < loop_end "
                             f"<= num_hidden_layers ({config.num_hidden_layers})")
        if fields["max_depth"] < 2:
            raise ValueError(f"{model_dir / 'alodlm_config.json'}: max_depth must be >= 2")
        if not 0 <= fields["mask_token_id"] < config.vocab_size:
            raise ValueError(f"{model_dir / 'alodlm_config.json'}: mask_token_id out of range")

        gate_path = model_dir / "exit_gate.pt"
        if not gate_path.is_file():
            raise ValueError(f"{gate_path}: exit gate file is missing")
        gate = ExitGate(config.hidden_size, fields["max_depth"]).to(torch_dtype)
        gate.load_state_dict(torch.load(gate_path, map_location="cpu", weights_only=True), strict=True)

        tokenizer = load_tokenizer(pathlib.Path(model_dir))
        return cls(model.to(device), gate.to(device), tokenizer, **fields)

    def default_stop_ids(self) -> list[int]:
        """§4.7: the tokenizer's EOS id(s) plus whichever named stop tokens exist in the vocab."""
        return stop_ids_for(self.tokenizer)

    def encode_chat(self, prompt: str, thinking: bool = False) -> list[int]:
        """§4.7 generation prompt: one user turn through the chat template with the generation
        prompt added, rendered to text and encoded without extra special tokens."""
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True,
            enable_thinking=thinking, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- building blocks -----------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def core_layers(self) -> range:
        return range(self.loop_start, self.loop_end)

    @property
    def prelude_layers(self) -> range:
        return range(0, self.loop_start)

    @property
    def coda_layers(self) -> range:
        return range(self.loop_end, self.num_layers)

    def embed(self, ids: Sequence[int]) -> torch.Tensor:
        return self.model.model.embed_tokens(torch.as_tensor(list(ids), dtype=torch.long))

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.model.norm(h)

    def layer(self, index: int, h: torch.Tensor, positions: torch.Tensor,
              prefix: KV | None) -> tuple[torch.Tensor, KV]:
        """One decoder layer on ``T`` rows at logical ``positions`` after a key/value ``prefix``.

        Each row attends to every prefix key and causally to the window rows (row ``a`` sees rows
        ``b ≤ a`` in the given order). Returns the new rows and this call's (K, V).
        """
        layer = self.model.model.layers[index]
        attn = layer.self_attn
        rows = h.shape[0]
        a = layer.input_layernorm(h)
        q = attn.q_norm(attn.q_proj(a).view(rows, self.num_heads, self.head_dim))
        k = attn.k_norm(attn.k_proj(a).view(rows, self.num_kv_heads, self.head_dim))
        v = attn.v_proj(a).view(rows, self.num_kv_heads, self.head_dim)
        cos, sin = self.model.model.rotary_emb(h, positions[None, :])  # [1, T, d_h], h's dtype
        q, k = apply_rotary_pos_emb(q, k, cos[0], sin[0], unsqueeze_dim=1)

        if prefix is None:
            keys, values, num_prefix = k, v, 0
        else:
            keys, values, num_prefix = torch.cat([prefix[0], k]), torch.cat([prefix[1], v]), prefix[0].shape[0]
        group = self.num_heads // self.num_kv_heads
        keys_q = keys.repeat_interleave(group, dim=1)  # query head h uses kv head h // group
        values_q = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q, keys_q) * attn.scaling
        key_index = torch.arange(num_prefix + rows)
        allowed = (key_index[None, :] < num_prefix) | (
            key_index[None, :] - num_prefix <= torch.arange(rows)[:, None])
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.einsum("hts,shd->thd", probs, values_q).reshape(rows, self.num_heads * self.head_dim)
        x = h + attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, (k, v)

    def _run_layers(self, layers: range, depth: int, h: torch.Tensor, positions: torch.Tensor,
                    cache: DepthCache, window: dict[tuple[int, int], KV]) -> torch.Tensor:
        """Runs ``layers`` reading prefix entries ``(layer, depth)`` and recording window K/V there."""
        for index in layers:
            h, kv = self.layer(index, h, positions, cache.entries.get((index, depth)))
            window[(index, depth)] = kv
        return h

    def prelude(self, h, positions, cache, window):
        return self._run_layers(self.prelude_layers, 0, h, positions, cache, window)

    def core(self, h, positions, cache, window, depth: int):
        return self._run_layers(self.core_layers, depth, h, positions, cache, window)

    def readout(self, h, positions, cache, window):
        """FinalNorm(Coda(h)) on a copy of the carry; coda entries are overwritten each pass."""
        return self.final_norm(self._run_layers(self.coda_layers, 0, h, positions, cache, window))

    def heads(self, r: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 logits [T, V] and fp32 hazards [T] of readout rows ``r`` at pass ``depth``."""
        logits = self.model.lm_head(r).float()
        hazards = torch.sigmoid(self.gate(r, depth).float())
        return logits, hazards

    # -- full forwards -------------------------------------------------------------------------

    @torch.no_grad()
    def all_passes(self, ids: Sequence[int], positions: Sequence[int] | torch.Tensor,
                   cache: DepthCache | None = None) -> tuple[dict[tuple[int, int], KV], list[torch.Tensor]]:
        """A window forward with no mask rows (§6.2): all K passes, causal, no decisions.

        Returns the window K/V (every core depth computed, coda holding the last branch) and the
        readout of every pass.
        """
        cache = cache if cache is not None else DepthCache()
        positions = torch.as_tensor(list(positions) if not torch.is_tensor(positions) else positions,
                                    dtype=torch.long)
        window: dict[tuple[int, int], KV] = {}
        h = self.prelude(self.embed(ids), positions, cache, window)
        readouts = []
        for depth in range(self.max_depth):
            if depth > 0:
                h = self.final_norm(h)
            h = self.core(h, positions, cache, window, depth)
            readouts.append(self.readout(h, positions, cache, window))
        return window, readouts

    @torch.no_grad()
    def looped_forward(self, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill-style forward (positions 0..T−1, causal): fp32 logits [K, T, V], hazards [K, T]."""
        _, readouts = self.all_passes(ids, range(len(ids)))
        logits, hazards = zip(*(self.heads(r, depth) for depth, r in enumerate(readouts)))
        return torch.stack(logits), torch.stack(hazards)

    # -- the window step (§6.4) ----------------------------------------------------------------

    @torch.no_grad()
    def window_step(self, ids: Sequence[int], positions: Sequence[int], cache: DepthCache,
                    mask_window_indices: Sequence[int], config: DecodeConfig,
                    trace: Trace | None = None) -> WindowResult:
        """One denoising step over a packed window whose last ``len(mask_window_indices)`` rows
        are the masks (§6.4). ``mask_window_indices`` are their window indices, ascending.
        """
        num_masks = len(mask_window_indices)
        if num_masks < 1:
            raise ValueError("a window step needs at least one mask row")
        first_mask = len(ids) - num_masks
        mask_rows = torch.arange(first_mask, len(ids))
        positions_t = torch.as_tensor(list(positions), dtype=torch.long)
        window: dict[tuple[int, int], KV] = {}

        committed = torch.zeros(num_masks, dtype=torch.bool)
        newly = torch.zeros(num_masks, dtype=torch.bool)
        tok = torch.zeros(num_masks, dtype=torch.long)
        exits = torch.zeros(num_masks, dtype=torch.long)
        survival = torch.ones(num_masks, dtype=torch.float32)
        lambda1 = torch.zeros(num_masks, dtype=torch.float32)
        offsets = torch.as_tensor(list(mask_window_indices), dtype=torch.long)
        penalty = (offsets - offsets[0]).to(torch.float32) * config.effective_position_penalty

        h = self.prelude(self.embed(ids), positions_t, cache, window)
        for depth in range(self.max_depth):
            if depth > 0 and bool(newly.any()):
                h = h.clone()
                h[mask_rows[newly]] = self.embed(tok[newly].tolist())
            if trace is not None:
                trace("core_input", {"depth": depth, "h": h.clone()})
            h = self.core(h, positions_t, cache, window, depth)
            r = self.readout(h, positions_t, cache, window)
            logits, hazards = self.heads(r[first_mask:], depth)
            predicted = torch.argmax(logits, dim=-1)  # first maximal index on ties
            entropy = torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)
            if depth == 0:
                lambda1 = hazards.clone()
            survival = survival * (1.0 - hazards)
            adjusted = entropy + penalty

            if config.mode == "entropy":
                agree = (adjusted < config.tau) & ~committed
            else:  # left1: the uncommitted mask with the smallest window index
                agree = torch.zeros(num_masks, dtype=torch.bool)
                open_rows = torch.nonzero(~committed).flatten()
                if len(open_rows):
                    agree[open_rows[0]] = True
            tok = torch.where(agree, predicted, tok)
            exits = torch.where(agree, torch.full_like(exits, depth + 1), exits)
            committed = committed | agree
            newly = agree

            uncommitted = ~committed
            stop = (depth == self.max_depth - 1 or not bool(uncommitted.any())
                    or bool((1.0 - survival[uncommitted]).mean() >= config.q))
            fallback = None
            if stop and not bool(committed.any()):
                fallback = int(torch.argmin(adjusted))  # first minimal index on ties
                committed[fallback] = True
                tok[fallback] = predicted[fallback]
                exits[fallback] = depth + 1
            if trace is not None:
                trace("pass", {"depth": depth, "agree": agree.clone(), "fallback": fallback,
                               "committed": committed.clone(), "offsets": offsets,
                               "entropy": entropy, "adjusted": adjusted, "hazards": hazards,
                               "predicted": predicted, "survival": survival.clone(), "stop": stop})
            if stop:
                executed = depth + 1
                return WindowResult(
                    kv=complete_window(window, self.core_layers, self.max_depth, executed),
                    committed=committed.tolist(), tokens=tok.tolist(), exits=exits.tolist(),
                    executed=executed, first_pass_halt=[float(x) for x in lambda1])
            h = self.final_norm(h)
        raise AssertionError("unreachable: the last pass always stops")

    # -- the outer loop (§6.5) -----------------------------------------------------------------

    def check_request(self, prompt_ids: Sequence[int], config: DecodeConfig) -> list[int]:
        """§6.1 request checks; returns the prompt as a list of ints."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("The prompt must contain at least one token")
        if any(not 0 <= t < self.vocab_size for t in prompt):
            raise ValueError(f"Prompt token ids must be in [0, {self.vocab_size})")
        if len(prompt) + config.max_new_tokens > self.max_position_embeddings:
            raise ValueError(
                f"Prompt length {len(prompt)} plus max_new_tokens {config.max_new_tokens} exceeds "
                f"max_position_embeddings {self.max_position_embeddings}")
        return prompt

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[int], config: DecodeConfig,
                 stop_ids: Iterable[int] | None = None, trace: Trace | None = None) -> dict:
        """The portable decoder (§6): returns the result dict of §6.6, keys in that order.

        ``stop_ids`` defaults to :meth:`default_stop_ids`. ``trace(event, payload)`` is called with
        ``"core_input"`` and ``"pass"`` (from :meth:`window_step`), ``"window"`` (before each
        window forward: ids, positions, prefix, generated count) and ``"persisted"`` (after each
        cache append: a snapshot of the cache and the token sequence it holds).
        """
        prompt = self.check_request(prompt_ids, config)
        stops = set(self.default_stop_ids() if stop_ids is None else (int(s) for s in stop_ids))
        max_new = config.max_new_tokens

        start = time.perf_counter()
        cache = DepthCache()
        window_kv, _ = self.all_passes(prompt, range(len(prompt)), cache)
        append_rows(cache, window_kv, range(len(prompt)))
        prefill_seconds = time.perf_counter() - start
        sequence = list(prompt)  # tokens whose K/V are in the cache
        if trace is not None:
            trace("persisted", {"cache": cache.snapshot(), "sequence": list(sequence)})

        tokens: list[int] = []
        is_mask: list[bool] = []
        win_exit: list[int] = []
        win_halt: list[float] = []
        generated: list[int] = []
        exit_depths: list[int] = []
        first_pass_halt: list[float] = []
        outer_steps = recurrent_passes = loop_token_passes = 0
        stop_reason = "length"

        while len(generated) < max_new:
            prefix = is_mask.index(True) if True in is_mask else len(tokens)
            stop_at = next((i for i in range(prefix) if tokens[i] in stops), None)
            if len(generated) + prefix >= max_new or stop_at is not None:
                end = prefix if stop_at is None else stop_at
                generated += tokens[:end]
                exit_depths += win_exit[:end]
                first_pass_halt += win_halt[:end]
                if stop_at is not None:
                    stop_reason = "eos"
                break

            desired = min(config.window_size, max_new - len(generated) - prefix)
            while len(tokens) < prefix + desired:
                tokens.append(self.mask_token_id)
                is_mask.append(True)
                win_exit.append(0)
                win_halt.append(0.0)
            observed = [i for i in range(len(tokens)) if not is_mask[i]]
            masks = [i for i in range(len(tokens)) if is_mask[i]]
            order = observed + masks
            ids = [tokens[i] if not is_mask[i] else self.mask_token_id for i in order]
            positions = [cache.length + i for i in order]
            if trace is not None:
                trace("window", {"ids": ids, "positions": positions, "prefix": prefix,
                                 "generated": len(generated), "window_len": len(tokens),
                                 "mask_indices": masks})
            result = self.window_step(ids, positions, cache, masks, config, trace)

            outer_steps += 1
            recurrent_passes += result.executed
            loop_token_passes += len(tokens) * result.executed

            if prefix:
                append_rows(cache, result.kv, range(prefix))
                sequence += tokens[:prefix]
                generated += tokens[:prefix]
                exit_depths += win_exit[:prefix]
                first_pass_halt += win_halt[:prefix]
                if trace is not None:
                    trace("persisted", {"cache": cache.snapshot(), "sequence": list(sequence)})

            for j, index in enumerate(masks):
                if result.committed[j]:
                    tokens[index] = result.tokens[j]
                    is_mask[index] = False
                    win_exit[index] = result.exits[j]
                    win_halt[index] = result.first_pass_halt[j]
            del tokens[:prefix], is_mask[:prefix], win_exit[:prefix], win_halt[:prefix]

        wall_seconds = time.perf_counter() - start
        count = len(generated)
        return {
            "text": self.tokenizer.decode(generated, skip_special_tokens=True),
            "token_ids": generated,
            "prompt_tokens": len(prompt),
            "generated_tokens": count,
            "wall_seconds": wall_seconds,
            "prefill_seconds": prefill_seconds,
            "tokens_per_second": count / wall_seconds,
            "mean_exit_depth": sum(exit_depths) / count if count else None,
            "loop_token_passes": loop_token_passes,
            "loop_token_passes_per_output_token": loop_token_passes / count if count else None,
            "outer_steps": outer_steps,
            "recurrent_passes": recurrent_passes,
            "exit_depths": exit_depths,
            "first_pass_halt_probabilities": first_pass_halt,
            "stop_reason": stop_reason,
        }
