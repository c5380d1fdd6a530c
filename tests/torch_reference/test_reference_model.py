"""The PyTorch reference's model pieces: layer math, looped forward, gate loading, cache ops."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")

from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint  # noqa: E402
from alodlm_jax.compare.torch_reference import (  # noqa: E402
    DepthCache, TorchALoDLM, append_rows, complete_window)

IDS = [4, 7, 9, 12, 5, 8, 30, 2, 11]


@pytest.fixture(scope="module", params=["sandwich", "all_layer"])
def checkpoint(request, tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp(request.param),
                                 TinySpec.for_topology(request.param))


@pytest.fixture(scope="module")
def model(checkpoint):
    return TorchALoDLM.from_checkpoint(checkpoint)


def test_first_pass_equals_transformers_forward(model):
    """Pass 1 is the plain full stack: our hand-run layers must equal transformers' own forward."""
    logits, hazards = model.looped_forward(IDS)
    assert logits.shape == (4, len(IDS), 64) and logits.dtype == torch.float32
    assert hazards.shape == (4, len(IDS)) and hazards.dtype == torch.float32
    with torch.no_grad():
        expected = model.model(torch.tensor([IDS])).logits[0].float()
    torch.testing.assert_close(logits[0], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits[1], logits[0])  # later passes really loop
    assert bool(((hazards > 0) & (hazards < 1)).all())


def test_all_layer_passes_are_repeated_full_stacks(tmp_path):
    """All-layer topology: pass s readout = the whole transformers model applied s+1 times to
    embeddings, since the carry is FinalNorm(core) = the readout and the coda is empty."""
    model = TorchALoDLM.from_checkpoint(
        build_tiny_checkpoint(tmp_path / "ckpt", TinySpec.for_topology("all_layer")))
    logits, hazards = model.looped_forward(IDS)
    with torch.no_grad():
        h = model.model.model.embed_tokens(torch.tensor([IDS]))
        for depth in range(4):
            h = model.model.model(inputs_embeds=h).last_hidden_state
            torch.testing.assert_close(logits[depth], model.model.lm_head(h)[0].float(),
                                       atol=1e-5, rtol=1e-5)
            gate_logit = h[0] @ model.gate.net.weight[0] + model.gate.net.bias[0] + model.gate.depth_bias[depth]
            torch.testing.assert_close(hazards[depth], torch.sigmoid(gate_logit), atol=1e-6, rtol=1e-6)


def test_gate_and_metadata_loaded(model, checkpoint):
    saved = torch.load(checkpoint / "exit_gate.pt", weights_only=True)
    state = model.gate.state_dict()
    assert sorted(state) == sorted(saved)
    for key, value in saved.items():
        assert torch.equal(state[key], value)
    assert model.mask_token_id == 3 and model.max_depth == 4
    assert model.default_stop_ids() == [2]
    assert model.tokenizer.chat_template


def test_gate_file_is_loaded_strictly(checkpoint, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint, bad)
    gate = torch.load(bad / "exit_gate.pt", weights_only=True)
    gate["extra"] = torch.zeros(1)
    torch.save(gate, bad / "exit_gate.pt")
    with pytest.raises(RuntimeError, match="extra"):
        TorchALoDLM.from_checkpoint(bad)
    (bad / "exit_gate.pt").unlink()
    with pytest.raises(ValueError, match="exit_gate.pt"):
        TorchALoDLM.from_checkpoint(bad)


@pytest.mark.parametrize("completed", [1, 2, 3, 4])
def test_cache_completion_keeps_computed_depths(completed):
    """§12.2 test 1."""
    def filled(value):
        return torch.full((3, 2, 8), float(value))

    window = {(1, d): (filled(d), filled(d + 10)) for d in range(completed)}
    window[(0, 0)] = (torch.arange(48.0).view(3, 2, 8), -torch.arange(48.0).view(3, 2, 8))
    done = complete_window(window, core_layers=range(1, 2), max_depth=4, executed=completed)
    for d in range(4):
        kept = min(d, completed - 1)
        assert torch.equal(done[(1, d)][0], filled(kept)) and torch.equal(done[(1, d)][1], filled(kept + 10))
    cache = DepthCache()
    append_rows(cache, done, [2, 0])
    assert cache.length == 2 and sorted(cache.entries) == sorted(done)
    for key, (k, v) in cache.entries.items():
        assert torch.equal(k, done[key][0][[2, 0]]) and torch.equal(v, done[key][1][[2, 0]])


def test_layer_with_prefix_equals_layer_over_whole_sequence(model):
    """Splitting a causal sequence into a cached prefix plus a window changes nothing."""
    torch.manual_seed(0)
    h = torch.randn(7, 32)
    positions = torch.arange(7)
    full, (k_full, v_full) = model.layer(0, h, positions, None)
    head, prefix = model.layer(0, h[:4], positions[:4], None)
    tail, (k_tail, v_tail) = model.layer(0, h[4:], positions[4:], prefix)
    torch.testing.assert_close(torch.cat([head, tail]), full, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(k_tail, k_full[4:], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(v_tail, v_full[4:], atol=1e-6, rtol=1e-5)
