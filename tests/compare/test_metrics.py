"""Model-level metric functions on synthetic arrays and results (no model, no JAX, no torch)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from alodlm_jax import compare
from alodlm_jax.compare.per_depth import log_softmax64


def test_depth_metrics_known_values():
    # K=2, T=2, V=3. Depth 0 identical; depth 1 row 1 differs.
    t_logits = np.zeros((2, 2, 3), np.float32)
    j_logits = t_logits.copy()
    t_logits[1, 1] = [2.0, 0.0, 0.0]
    j_logits[1, 1] = [0.0, 2.0, 0.0]
    t_haz = np.full((2, 2), 0.5, np.float32)
    j_haz = t_haz.copy()
    j_haz[1, 0] = 0.25
    rows = compare.merge_depth_metrics([compare.depth_metrics(t_logits, j_logits, t_haz, j_haz)])
    assert rows[0] == {"depth": 1, "rows": 2, "max_abs_logits": 0.0, "max_logits_excess": 0.0, "mean_kl": 0.0,
                       "top1_agreement": 1.0, "max_abs_hazard": 0.0}
    p = np.exp([2.0, 0.0, 0.0]) / np.exp([2.0, 0.0, 0.0]).sum()
    q = p[[1, 0, 2]]
    kl = float((p * np.log(p / q)).sum())
    assert rows[1]["max_abs_logits"] == 2.0 and rows[1]["max_abs_hazard"] == 0.25
    assert rows[1]["top1_agreement"] == 0.5
    assert math.isclose(rows[1]["mean_kl"], kl / 2, rel_tol=1e-12)


def test_merge_weights_rows_and_takes_maxima():
    a = [{"rows": 1, "max_abs_logits": 0.5, "kl_sum": 1.0, "top1_agree": 1, "max_abs_hazard": 0.1}]
    b = [{"rows": 3, "max_abs_logits": 0.2, "kl_sum": 1.0, "top1_agree": 1, "max_abs_hazard": 0.3}]
    (row,) = compare.merge_depth_metrics([a, b])
    assert row == {"depth": 1, "rows": 4, "max_abs_logits": 0.5, "max_logits_excess": 0.5, "mean_kl": 0.5,
                   "top1_agreement": 0.5, "max_abs_hazard": 0.3}


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        compare.depth_metrics(np.zeros((2, 3, 4)), np.zeros((2, 3, 5)), np.zeros((2, 3)), np.zeros((2, 3)))


def _result(tokens, exits):
    return {"token_ids": tokens, "exit_depths": exits, "stop_reason": "length",
            "mean_exit_depth": sum(exits) / len(exits) if exits else None}


def test_decode_pair_metrics():
    same = compare.decode_pair_metrics(_result([1, 2, 3], [1, 2, 1]), _result([1, 2, 3], [1, 2, 1]))
    assert same["tokens_equal"] and same["exit_depths_equal"]
    assert same["first_divergence"] is None and same["first_exit_depth_divergence"] is None
    exits = compare.decode_pair_metrics(_result([1, 2, 3], [1, 2, 1]), _result([1, 2, 3], [1, 3, 1]))
    assert exits["tokens_equal"] and not exits["exit_depths_equal"]
    assert exits["first_exit_depth_divergence"] == 1 and exits["exit_depth_positions_equal"] == 2
    tokens = compare.decode_pair_metrics(_result([1, 2, 3, 4], [1, 1, 1, 1]), _result([1, 2, 5], [1, 1, 2]))
    assert not tokens["tokens_equal"] and tokens["first_divergence"] == 2
    assert tokens["common_prefix"] == 2 and tokens["exit_depth_positions_equal"] == 2


def test_model_report_names_failing_depth_and_metric():
    depth_rows = [
        {"depth": 1, "rows": 3, "max_abs_logits": 1e-6, "max_logits_excess": 0.0, "mean_kl": 0.0,
         "top1_agreement": 1.0, "max_abs_hazard": 1e-7},
        {"depth": 2, "rows": 3, "max_abs_logits": 5e-3, "max_logits_excess": 0.0, "mean_kl": 1e-6,
         "top1_agreement": 1.0, "max_abs_hazard": 1e-7},
    ]
    decode_rows = [compare.decode_pair_metrics(_result([1, 2], [1, 1]), _result([1, 2], [1, 2]))]
    report = compare.model_report(depth_rows=depth_rows, decode_rows=decode_rows,
                                  tolerances=compare.default_tolerances("fp32"), info={"model": "m"})
    failing = [(c["name"], c.get("depth")) for c in report["checks"] if not c["passed"]]
    assert failing == [("max_abs_logits", 2), ("exit_depth_position_agreement", None)]
    assert report["failed"][0].startswith("max_abs_logits at depth 2: 0.005")
    assert compare.exit_status(report) == 1
    # BF16 defaults accept both: logits within 0.1, exit depths judged statistically (1 of 2 here: no).
    bf16 = compare.model_report(depth_rows=depth_rows, decode_rows=decode_rows,
                                tolerances=compare.default_tolerances("bf16", min_exit_depth_agreement=0.5),
                                info={})
    assert bf16["passed"] and compare.exit_status(bf16) == 0
    text = compare.format_report({**report, "precision": "fp32", "torch_side": "x", "engine": "portable"})
    assert "FAIL max_abs_logits at depth 2" in text


def test_nan_fails_a_check():
    depth_rows = [{"depth": 1, "rows": 1, "max_abs_logits": float("nan"), "mean_kl": float("nan"),
                   "top1_agreement": 1.0, "max_abs_hazard": 0.0}]
    report = compare.model_report(depth_rows=depth_rows, decode_rows=None,
                                  tolerances=compare.default_tolerances("fp32"), info={})
    assert not report["passed"]


def test_default_tolerances():
    assert compare.default_tolerances("fp32") == compare.Tolerances(1e-4, 1.0, 1.0, rtol=0.0)
    assert compare.default_tolerances("bf16") == compare.Tolerances(0.1, 0.95, 0.9, rtol=2.0 ** -5)
    assert compare.default_tolerances("bf16", atol=0.5).atol == 0.5
    with pytest.raises(compare.CompareInputError):
        compare.default_tolerances("fp32", min_token_agreement=1.5)


def test_load_prompts_formats(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "hi there"}) + "\n\n" + json.dumps({"prompt_ids": [4, 7]}) + "\n"
                     + json.dumps({"prompt": "one two", "raw": True}) + "\n")
    specs = compare.load_prompts(str(jsonl))
    assert [(s.text, s.ids, s.raw) for s in specs] == [("hi there", None, False), (None, (4, 7), False),
                                                      ("one two", None, True)]
    assert specs[1].where.endswith("p.jsonl:3")
    text = tmp_path / "p.txt"
    text.write_text("Return value one .\n\n  two words\n")
    assert [s.text for s in compare.load_prompts(str(text))] == ["Return value one .", "  two words"]


@pytest.mark.parametrize("line,needle", [
    ('{"prompt": ""}', "field 'prompt'"),
    ('{"prompt_ids": [1, "x"]}', "field 'prompt_ids'"),
    ('{"prompt_ids": []}', "field 'prompt_ids'"),
    ('{"prompt": "a", "prompt_ids": [1]}', "exactly one"),
    ('{"text": "a"}', "exactly one"),
    ('{"prompt": "a", "raw": "yes"}', "field 'raw'"),
])
def test_load_prompts_errors(tmp_path, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(compare.CompareInputError, match="bad.jsonl:2") as info:
        compare.load_prompts(str(path))
    assert needle in str(info.value)


def test_encode_prompts_checks_ids():
    class Tok:
        def encode(self, text, add_special_tokens):
            assert add_special_tokens is False
            return [len(word) for word in text.split()]

        def apply_chat_template(self, messages, **kw):
            assert kw["add_generation_prompt"] and kw["enable_thinking"] is False and kw["tokenize"] is False
            return f"user {messages[0]['content']} </s> assistant "

    specs = [compare.PromptSpec(where="f:1", text="a b", raw=True), compare.PromptSpec(where="f:2", text="x"),
             compare.PromptSpec(where="f:3", ids=(1, 2))]
    assert compare.encode_prompts(specs, Tok(), 64) == [[1, 1], [4, 1, 4, 9], [1, 2]]
    with pytest.raises(compare.CompareInputError, match="f:1: token id 70"):
        compare.encode_prompts([compare.PromptSpec(where="f:1", ids=(70,))], Tok(), 64)


def test_a_side_that_raises_counts_as_disagreement():
    row = compare.decode_pair_metrics(_result([1, 2], [1, 1]), None, errors={"jax": "ValueError: boom"})
    assert not row["tokens_equal"] and row["errors"] == {"jax": "ValueError: boom"}
    assert row["generated_tokens"] == {"torch": 2, "jax": None}
    report = compare.model_report(depth_rows=[], decode_rows=[row], tolerances=compare.default_tolerances("fp32"),
                                  info={"precision": "fp32"})
    assert not report["passed"]
    assert "prompt 0: jax side raised ValueError: boom" in compare.format_report(report)


def test_kl_over_row_chunks_equals_direct_sum():
    rng = np.random.default_rng(0)
    t = rng.normal(size=(2, 150, 11)).astype(np.float32)  # more rows than one chunk
    j = (t + 0.1 * rng.normal(size=t.shape)).astype(np.float32)
    rows = compare.depth_metrics(t, j, np.zeros((2, 150), np.float32), np.zeros((2, 150), np.float32))
    for depth in range(2):
        lt = log_softmax64(t[depth])
        lj = log_softmax64(j[depth])
        direct = float((np.exp(lt) * (lt - lj)).sum())
        assert math.isclose(rows[depth]["kl_sum"], direct, rel_tol=1e-12)
        assert rows[depth]["kl_sum"] > 0


def test_rtol_scales_the_logits_bound_with_the_row_scale():
    # A 0.25 difference in a row whose largest logit is 40: over atol 0.1 alone, within
    # 0.1 + 2^-5 * 40 = 1.35 (bf16 defaults), wherever in the row it happens.
    t = np.array([[[40.0, 3.0]]], np.float32)
    j = np.array([[[40.0, 3.25]]], np.float32)
    haz = np.zeros((1, 1), np.float32)
    strict = compare.default_tolerances("bf16", rtol=0.0)
    relative = compare.default_tolerances("bf16")
    for tol, passed, name in ((strict, False, "max_abs_logits"), (relative, True, "max_logits_excess")):
        rows = compare.merge_depth_metrics([compare.depth_metrics(t, j, haz, haz, rtol=tol.rtol)])
        report = compare.model_report(depth_rows=rows, decode_rows=None, tolerances=tol, info={})
        assert report["passed"] is passed and report["checks"][0]["name"] == name
    # The same difference in a row of small logits is not excused.
    small = compare.depth_metrics(np.array([[[1.0, 3.0]]], np.float32), np.array([[[1.0, 3.25]]], np.float32),
                                  haz, haz, rtol=relative.rtol)
    assert math.isclose(small[0]["logits_excess"], 0.25 - 3.0 * 2.0 ** -5)
    report = compare.model_report(depth_rows=compare.merge_depth_metrics([small]), decode_rows=None,
                                  tolerances=relative, info={})
    assert not report["passed"]
