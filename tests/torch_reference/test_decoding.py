"""The portable decoder (§6) of the PyTorch reference: the §12.2 inference properties and the
decision details other decoders are compared against."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alodlm_jax.config import DecodeConfig  # noqa: E402
from alodlm_jax.testing.tiny_checkpoint import TinySpec, build_tiny_checkpoint  # noqa: E402
from alodlm_jax.compare.torch_reference import DepthCache, TorchALoDLM  # noqa: E402

PROMPT = [4, 7, 9]
RESULT_KEYS = ["text", "token_ids", "prompt_tokens", "generated_tokens", "wall_seconds",
               "prefill_seconds", "tokens_per_second", "mean_exit_depth", "loop_token_passes",
               "loop_token_passes_per_output_token", "outer_steps", "recurrent_passes",
               "exit_depths", "first_pass_halt_probabilities", "stop_reason"]
# A peaked fixture on which entropy mode commits several tokens per window (reported for reuse):
# lm_head_scale 100 with PEAKED_CONFIG gives 3.2 tokens per window forward and exit depths 1..3.
PEAKED_SCALE = 100.0
PEAKED_CONFIG = DecodeConfig(q=0.95, tau=0.4, window_size=16, max_new_tokens=32)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), TinySpec.for_topology("sandwich"))


@pytest.fixture()
def model(tiny_dir):
    """A fresh model per test, so tests may patch it."""
    return TorchALoDLM.from_checkpoint(tiny_dir)


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    path = build_tiny_checkpoint(tmp_path_factory.mktemp("peaked"),
                                 TinySpec.for_topology("sandwich", lm_head_scale=PEAKED_SCALE))
    return TorchALoDLM.from_checkpoint(path)


class Recorder:
    """A trace callback that keeps every event."""

    def __init__(self):
        self.events = []

    def __call__(self, name, payload):
        self.events.append((name, payload))

    def of(self, name):
        return [payload for event, payload in self.events if event == name]


def check_result_shape(result, config, model):
    assert list(result) == RESULT_KEYS
    n = len(result["token_ids"])
    assert result["generated_tokens"] == n <= config.max_new_tokens
    assert len(result["exit_depths"]) == n == len(result["first_pass_halt_probabilities"])
    assert all(1 <= d <= model.max_depth for d in result["exit_depths"])
    for halt in result["first_pass_halt_probabilities"]:
        assert isinstance(halt, float) and float(np.float32(halt)) == halt and 0.0 < halt < 1.0
    assert result["wall_seconds"] > 0 and result["wall_seconds"] >= result["prefill_seconds"] > 0
    assert result["stop_reason"] in ("length", "eos")
    if n:
        assert result["mean_exit_depth"] == pytest.approx(sum(result["exit_depths"]) / n)
        assert result["loop_token_passes_per_output_token"] == result["loop_token_passes"] / n
    assert result["recurrent_passes"] <= model.max_depth * result["outer_steps"]


def test_requests_are_independent_and_respect_the_budget(model):
    """§12.2 test 2."""
    config = DecodeConfig(q=0.5, tau=0.1, max_new_tokens=8, window_size=4)
    first = model.generate(PROMPT, config)
    model.generate([5, 8, 10, 11], DecodeConfig(q=0.3, tau=0.2, max_new_tokens=5, window_size=3, mode="left1"))
    second = model.generate(PROMPT, config)
    assert first["token_ids"] == second["token_ids"]
    assert first["exit_depths"] == second["exit_depths"]
    assert first["first_pass_halt_probabilities"] == second["first_pass_halt_probabilities"]
    check_result_shape(first, config, model)
    assert first["prompt_tokens"] == 3


def test_q_controls_executed_recurrence(model):
    """§12.2 test 3."""
    low = model.generate(PROMPT, DecodeConfig(q=0.0, tau=0.0, window_size=4, max_new_tokens=6))
    assert low["recurrent_passes"] == low["outer_steps"] > 0
    high = model.generate(PROMPT, DecodeConfig(q=1.0, tau=0.0, window_size=4, max_new_tokens=6))
    assert high["recurrent_passes"] == 4 * high["outer_steps"] > 0
    assert set(high["exit_depths"]) == {4}  # tau 0: only the last-pass fallback commits


def _assert_cache_equals_fresh_forward(model, payload):
    cache, sequence = payload["cache"], payload["sequence"]
    assert cache.length == len(sequence)
    fresh, _ = model.all_passes(sequence, range(len(sequence)))
    assert sorted(cache.entries) == sorted(fresh)
    for key, (k, v) in cache.entries.items():
        torch.testing.assert_close(k, fresh[key][0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(v, fresh[key][1], atol=1e-6, rtol=1e-5)


def test_prefix_cache_equals_observed_token_forward(model):
    """§12.2 test 4: with one pass, the cache equals a fresh forward over its token sequence."""
    model.max_depth = 1
    trace = Recorder()
    result = model.generate(PROMPT, DecodeConfig(q=0.0, mode="left1", window_size=4, max_new_tokens=8),
                            trace=trace)
    assert result["generated_tokens"] == 8
    compared = 0
    for payload in trace.of("persisted"):
        if payload["cache"].length > 3:
            _assert_cache_equals_fresh_forward(model, payload)
            compared += 1
    assert compared >= 3
    assert sorted(payload["cache"].entries) == [(0, 0), (1, 0), (2, 0)]


def test_prefix_cache_equals_fresh_forward_at_every_depth_when_all_passes_run(model):
    """With q = 1 and tau = 0 every window runs all K passes, so the persisted depth-aware cache
    (core at each depth, coda from the last branch) must equal a fresh K-pass forward."""
    trace = Recorder()
    model.generate(PROMPT, DecodeConfig(q=1.0, tau=0.0, window_size=3, max_new_tokens=6), trace=trace)
    persisted = [p for p in trace.of("persisted") if p["cache"].length > 3]
    assert len(persisted) >= 3
    for payload in persisted:
        _assert_cache_equals_fresh_forward(model, payload)
    assert len(persisted[-1]["cache"].entries) == 1 + 4 + 1


def test_committed_token_continues_as_latent_after_injection(model):
    """§12.2 test 5: every layer replaced by f(h) = h + arange(H)/32."""
    shift = torch.arange(32, dtype=torch.float32) / 32
    calls = []

    def fake_layer(index, h, positions, prefix):
        calls.append(index)
        zeros = torch.zeros(h.shape[0], model.num_kv_heads, model.head_dim)
        return h + shift, (zeros, zeros)

    model.layer = fake_layer
    trace = Recorder()
    mask = model.mask_token_id
    result = model.window_step([mask] * 4, range(4), DepthCache(), [0, 1, 2, 3],
                               DecodeConfig(q=1.0, tau=0.0, mode="left1"), trace=trace)
    assert calls.count(1) == 4 and result.executed == 4
    assert result.committed == [True] * 4 and result.exits == [1, 2, 3, 4]
    inputs = [p["h"] for p in trace.of("core_input")]
    assert len(inputs) == 4
    token = model.embed([result.tokens[0]])[0]
    torch.testing.assert_close(inputs[1][0], token, atol=0, rtol=0)  # pass-2 input: the embedding
    assert not torch.allclose(inputs[2][0], inputs[1][0])
    torch.testing.assert_close(inputs[2][0], model.final_norm(inputs[1][0] + shift), atol=1e-6, rtol=1e-6)
    # Row 1 (committed at pass 2) is injected at pass 3 only, then evolves as a latent.
    torch.testing.assert_close(inputs[2][1], model.embed([result.tokens[1]])[0], atol=0, rtol=0)
    torch.testing.assert_close(inputs[3][1], model.final_norm(inputs[2][1] + shift), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(q=1.1), dict(tau=math.nan), dict(window_size=0)])
def test_invalid_configuration(kwargs):
    """§12.2 test 6 (configuration part)."""
    with pytest.raises(ValueError):
        DecodeConfig(**kwargs)


@pytest.mark.parametrize("prompt,max_new", [(list(range(4, 64)) + list(range(4, 44)), 40),
                                            ([], 4), ([4, 64], 4), ([4, -1], 4)])
def test_invalid_requests(model, prompt, max_new):
    """§12.2 test 6 (request part): 100 + 40 > 128 context, empty prompt, ids outside [0, V)."""
    with pytest.raises(ValueError):
        model.generate(prompt, DecodeConfig(max_new_tokens=max_new))


def test_context_limit_is_inclusive(model):
    result = model.generate([4] * 120, DecodeConfig(q=0.0, mode="left1", window_size=4, max_new_tokens=8))
    assert result["generated_tokens"] == 8


def test_stop_id_excluded_and_ends_generation(peaked):
    trace = Recorder()
    full = peaked.generate(PROMPT, PEAKED_CONFIG, stop_ids=[], trace=trace)
    ids = full["token_ids"]
    stop = next(t for t in ids if t != ids[0])
    cut = ids.index(stop)
    stopped = peaked.generate(PROMPT, PEAKED_CONFIG, stop_ids=[stop])
    assert stopped["stop_reason"] == "eos" and full["stop_reason"] == "length"
    assert stopped["token_ids"] == ids[:cut]
    assert stopped["exit_depths"] == full["exit_depths"][:cut]
    assert stopped["first_pass_halt_probabilities"] == full["first_pass_halt_probabilities"][:cut]
    # Decoding ends before the first window whose leading committed run holds the stop id: no
    # refresh forward for that run.
    windows = trace.of("window")
    first = next(n for n, w in enumerate(windows) if stop in w["ids"][: w["prefix"]])
    assert stopped["outer_steps"] == first < full["outer_steps"]
    check_result_shape(stopped, PEAKED_CONFIG, peaked)


def test_chat_prompt_encoding(model):
    assert model.encode_chat("Return value one") == [4, 7, 8, 9, 2, 5]


def test_default_eos_stops_with_empty_output(model):
    """Swapping the head rows of EOS (2) and the model's favourite token (4) makes EOS the first
    greedy token: nothing is emitted and the reason is "eos"."""
    config = DecodeConfig(q=0.5, tau=0.1, max_new_tokens=8, window_size=4)
    assert model.generate(PROMPT, config)["token_ids"][0] == 4
    with torch.no_grad():
        model.model.lm_head.weight[[2, 4]] = model.model.lm_head.weight[[4, 2]].clone()
    result = model.generate(PROMPT, config)
    assert result["token_ids"] == [] and result["text"] == "" and result["stop_reason"] == "eos"
    assert result["mean_exit_depth"] is None and result["loop_token_passes_per_output_token"] is None
    assert result["outer_steps"] >= 1 and result["tokens_per_second"] == 0.0


def test_window_shrinks_near_the_budget(model):
    config = DecodeConfig(q=0.0, mode="left1", window_size=4, max_new_tokens=6)
    trace = Recorder()
    result = model.generate(PROMPT, config, trace=trace)
    assert result["generated_tokens"] == 6
    windows = trace.of("window")
    for w in windows:
        desired = min(config.window_size, config.max_new_tokens - w["generated"] - w["prefix"])
        assert w["window_len"] == w["prefix"] + desired
        assert max(w["positions"]) < len(PROMPT) + config.max_new_tokens
    assert any(w["window_len"] - w["prefix"] < config.window_size for w in windows)
    assert result["loop_token_passes"] == sum(w["window_len"] for w in windows)


def test_packed_order_and_positions(peaked):
    """Observed window entries come first, then masks; positions are cache_len + window index."""
    trace = Recorder()
    peaked.generate(PROMPT, PEAKED_CONFIG, stop_ids=[], trace=trace)
    cache_len = len(PROMPT)
    saw_nonleading_observed = False
    for w in trace.of("window"):
        indices = [p - cache_len for p in w["positions"]]
        masks = w["mask_indices"]
        observed = indices[: len(indices) - len(masks)]
        assert observed == sorted(observed) and indices[len(observed):] == masks == sorted(masks)
        assert sorted(indices) == list(range(w["window_len"]))
        assert all(i == peaked.mask_token_id for i in w["ids"][len(observed):])
        saw_nonleading_observed |= len(observed) > w["prefix"]
        cache_len += w["prefix"]
    assert saw_nonleading_observed


def test_entropy_mode_commits_several_tokens_per_pass(peaked):
    trace = Recorder()
    result = peaked.generate(PROMPT, PEAKED_CONFIG, stop_ids=[], trace=trace)
    check_result_shape(result, PEAKED_CONFIG, peaked)
    passes = trace.of("pass")
    assert max(int(p["agree"].sum()) for p in passes) >= 2
    for p in passes:  # strict < tau on the penalized entropy
        assert bool((p["adjusted"][p["agree"]] < PEAKED_CONFIG.tau).all())
    per_window = result["generated_tokens"] / result["outer_steps"]
    assert 1.5 <= per_window <= 4.0
    assert len(set(result["exit_depths"])) >= 2


def test_left1_commits_exactly_one_per_pass(peaked):
    config = DecodeConfig(q=1.0, tau=0.4, window_size=4, max_new_tokens=10, mode="left1")
    trace = Recorder()
    result = peaked.generate(PROMPT, config, stop_ids=[], trace=trace)
    check_result_shape(result, config, peaked)
    passes = trace.of("pass")
    assert all(int(p["agree"].sum()) == 1 and p["fallback"] is None for p in passes)
    assert sum(int(p["agree"].sum()) for p in passes) >= result["generated_tokens"]


def test_fallback_commits_lowest_adjusted_entropy_only_when_nothing_committed(model):
    trace = Recorder()
    model.generate(PROMPT, DecodeConfig(q=0.0, tau=0.0, window_size=4, max_new_tokens=4), trace=trace)
    passes = trace.of("pass")
    assert passes and all(p["fallback"] is not None and p["stop"] for p in passes)
    for p in passes:
        assert p["fallback"] == int(torch.argmin(p["adjusted"]))


@pytest.mark.parametrize("q", [0.9, 0.95])
def test_pass_bookkeeping_follows_the_spec(peaked, q):
    """Per pass (§6.4): survival multiplies over all mask rows, the penalty is anchored at the
    leftmost mask, agree is strict < tau over uncommitted rows, and the stop test averages the
    CDF over rows still uncommitted after this pass's commits."""
    config = DecodeConfig(q=q, tau=0.4, window_size=16, max_new_tokens=24)
    trace = Recorder()
    peaked.generate(PROMPT, config, stop_ids=[], trace=trace)
    survival = committed = None
    multi_pass_windows = 0
    for p in trace.of("pass"):
        if p["depth"] == 0:
            survival = torch.ones_like(p["hazards"])
            committed = torch.zeros_like(p["agree"])
            offsets = p["offsets"]
            penalty = (offsets - offsets[0]).float() * config.effective_position_penalty
            assert torch.equal(p["adjusted"], p["entropy"] + penalty)
        else:
            multi_pass_windows += p["depth"] == 1
        survival = survival * (1 - p["hazards"])
        assert torch.equal(p["survival"], survival)
        assert torch.equal(p["agree"], (p["adjusted"] < config.tau) & ~committed)
        committed = committed | p["agree"]
        open_rows = ~committed
        expected_stop = (p["depth"] == 3 or not bool(open_rows.any())
                         or bool((1 - survival[open_rows]).mean() >= q))
        assert p["stop"] == expected_stop
        if p["fallback"] is not None:
            assert not bool(committed.any()) and p["stop"]
            committed[p["fallback"]] = True
        assert torch.equal(p["committed"], committed)
    assert multi_pass_windows > 0


def test_bf16_checkpoint_decodes(tmp_path):
    path = build_tiny_checkpoint(tmp_path / "bf16", TinySpec.for_topology("sandwich", dtype="bf16",
                                                                          lm_head_scale=PEAKED_SCALE))
    model = TorchALoDLM.from_checkpoint(path, dtype="bf16")
    assert model.dtype == torch.bfloat16 and model.gate.net.weight.dtype == torch.bfloat16
    logits, hazards = model.looped_forward(PROMPT)
    assert logits.dtype == hazards.dtype == torch.float32
    result = model.generate(PROMPT, PEAKED_CONFIG, stop_ids=[])
    check_result_shape(result, PEAKED_CONFIG, model)
    with pytest.raises(ValueError):
        TorchALoDLM.from_checkpoint(path, dtype="fp16")
