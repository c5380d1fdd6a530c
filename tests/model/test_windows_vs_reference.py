"""Prefix cache + packed windows against the torch reference's dict-based depth-aware cache.

A prompt prefill, then a window that executes only 2 of K passes, is completed and persists 2 of
its 3 rows, then a window in packed (non-monotone) logical order runs all K passes. Every pass's
readout logits and hazards of the last window must match: this exercises logical-position RoPE,
causal attention in packed order, depth-aware reading of a prefix computed with fewer passes
(§5 complete), and the coda buffer holding the last executed branch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alodlm_jax.network import model
from alodlm_jax.network import cache as KC
from alodlm_jax.network.params import to_device

PROMPT = [1, 4, 7, 8, 9, 12, 2]
WINDOW2 = [10, 3, 11]  # executes 2 passes; rows 0 and 1 persist
WINDOW3_IDS = [30, 3, 41, 3]
WINDOW3_OFFSETS = [1, 3, 0, 2]  # packed order: observed rows first, then masks, by window index


def _torch_side(path: str, ids_positions):
    import torch

    ref_mod = pytest.importorskip("alodlm_jax.compare.torch_reference")
    ref = ref_mod.TorchALoDLM.from_checkpoint(path, "fp32")
    cache = ref_mod.DepthCache()
    (p_ids, p_pos), (w2_ids, w2_pos), (w3_ids, w3_pos) = ids_positions
    with torch.no_grad():
        window, _ = ref.all_passes(p_ids, p_pos, cache)
        ref_mod.append_rows(cache, window, range(len(p_ids)))

        window = {}
        pos = torch.tensor(w2_pos, dtype=torch.long)
        h = ref.prelude(ref.embed(w2_ids), pos, cache, window)
        for depth in range(2):
            if depth:
                h = ref.final_norm(h)
            h = ref.core(h, pos, cache, window, depth)
            ref.readout(h, pos, cache, window)
        window = ref_mod.complete_window(window, ref.core_layers, ref.max_depth, 2)
        ref_mod.append_rows(cache, window, [0, 1])

        _, readouts = ref.all_passes(w3_ids, w3_pos, cache)
        heads = [ref.heads(r, d) for d, r in enumerate(readouts)]
    return (np.stack([l.numpy() for l, _ in heads]), np.stack([h.numpy() for _, h in heads]))


ROWS = 8  # every JAX call is padded to one window shape: one compilation per function


@functools.partial(jax.jit, static_argnums=1)
def _prelude(params, cfg, ids, positions, cache, start):
    return model.prelude(params, cfg, model.embed(params, ids), positions, cache, start)


@functools.partial(jax.jit, static_argnums=1)
def _one_pass(params, cfg, h, positions, cache, start, depth):
    """carry norm (from pass 1 on), core, readout, heads: what a decoder runs per pass."""
    h = jnp.where(depth > 0, model.carry_norm(params, cfg, h), h)
    h, cache = model.core_pass(params, cfg, h, positions, cache, start, depth)
    r, cache = model.readout(params, cfg, h, positions, cache, start)
    return h, cache, model.lm_logits(params, r), model.gate_hazard(params, r, depth)


def _jax_side(params, cfg, ids_positions):
    (p_ids, p_pos), (w2_ids, w2_pos), (w3_ids, w3_pos) = ids_positions

    def run(ids, positions, cache, start, passes):
        pad = ROWS - len(ids)  # padding rows: garbage in slots that later windows overwrite
        ids = jnp.asarray(list(ids) + [3] * pad, jnp.int32)
        positions = jnp.asarray(list(positions) + [0] * pad, jnp.int32)
        start = jnp.int32(start)
        h, cache = _prelude(params, cfg, ids, positions, cache, start)
        outs = []
        for depth in range(passes):
            h, cache, logits, hazards = _one_pass(params, cfg, h, positions, cache, start, jnp.int32(depth))
            outs.append((np.asarray(logits), np.asarray(hazards)))
        return outs, cache

    cache = KC.init_cache(cfg, 24, jnp.float32)
    _, cache = run(p_ids, p_pos, cache, 0, cfg.max_depth)
    start = len(p_ids)
    _, cache = run(w2_ids, w2_pos, cache, start, 2)
    cache = KC.complete_depths(cache, jnp.int32(start), ROWS, jnp.int32(2))
    start += 2  # rows 0 and 1 persist; row 2 and the padding get overwritten
    outs, _ = run(w3_ids, w3_pos, cache, start, cfg.max_depth)
    n = len(w3_ids)
    return np.stack([l[:n] for l, _ in outs]), np.stack([h[:n] for _, h in outs])


def test_packed_windows_match_torch_reference(tiny):
    p = len(PROMPT)
    ids_positions = (
        (PROMPT, list(range(p))),
        (WINDOW2, [p + i for i in range(len(WINDOW2))]),
        (WINDOW3_IDS, [p + 2 + i for i in WINDOW3_OFFSETS]),
    )
    want_logits, want_hazards = _torch_side(str(tiny.path), ids_positions)
    got_logits, got_hazards = _jax_side(to_device(tiny.np_params, "fp32"), tiny.cfg, ids_positions)
    assert got_logits.shape == want_logits.shape
    err_l = np.abs(got_logits - want_logits).max()
    err_h = np.abs(got_hazards - want_hazards).max()
    print(f"{tiny.topology}: max|dlogits|={err_l:.2e} max|dhazard|={err_h:.2e}")
    assert err_l < 1e-4 and err_h < 1e-4
