"""The token corpus's comparison (alodlm_jax.compare.token_corpus, run by .ci/run across JAX lines):
what it lets through and what it reports."""

from alodlm_jax.compare import token_corpus as TC


def _out(tokens=(5, 6, 7), halts=(0.25, 0.5), **changes):
    base = dict(token_ids=list(tokens), exit_depths=[1, 2, 1], first_pass_halt_probabilities=list(halts),
                outer_steps=2, recurrent_passes=3, loop_token_passes=4, stop_reason="length",
                prompt_tokens=3)
    return TC.record(dict(base, **changes))


def test_identical_records_pass_to_the_bit():
    assert TC.compare(_out(), _out()) == (None, True)


def test_a_moved_token_depth_or_counter_is_reported():
    assert TC.compare(_out(tokens=(5, 6, 8)), _out())[0].startswith("token_ids")
    assert TC.compare(_out(exit_depths=[1, 1, 1]), _out())[0].startswith("exit_depths")
    assert TC.compare(_out(stop_reason="eos"), _out())[0].startswith("stop_reason")


def test_halting_probabilities_within_the_tolerance_pass_but_not_to_the_bit():
    difference, identical = TC.compare(_out(halts=(0.25, 0.5 + 2e-7)), _out())
    assert difference is None and not identical
    difference, _ = TC.compare(_out(halts=(0.25, 0.5 + 1e-5)), _out())
    assert "halting probabilities differ" in difference


def test_groups_are_deterministic_and_cover_both_topologies_and_modes():
    groups = TC.groups()
    assert groups == TC.groups()
    assert {(g["topology"], g["mode"]) for g in groups} == {
        (t, m) for t in TC.TOPOLOGIES for m in ("entropy", "left1")}
