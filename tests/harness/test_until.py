"""The until rule (alodlm_jax.harness.until): the cut, and its independence of the early stop."""

from __future__ import annotations

from alodlm_jax.harness.until import UntilRule, until_rule

# A toy vocabulary: ids to text pieces, special tokens decode to nothing (as skip_special_tokens).
PIECES = {1: "a", 2: "b", 3: "\n", 4: "\n\n", 5: "", 6: "ab", 7: "Q:"}
SPECIAL = {5}
TEXT_IDS = {"a": [1], "b": [2], "\n": [3], "\n\n": [4], "<|end|>": [5], "ab": [6], "Q:": [7],
            "a\n": [1, 3], "Question": [7, 1], "<unknown>": [0]}
TOKEN_TEXT = {0: "<unk>", 1: "a", 2: "b", 3: "\n", 4: "\n\n", 5: "<|end|>", 6: "ab", 7: "Q:"}


def decode(ids):
    return "".join(PIECES[i] for i in ids if i not in SPECIAL)


def encode(text):
    return TEXT_IDS[text]


def test_rule_knows_which_strings_are_one_token_and_drops_empty_ones():
    rule = until_rule(["\n\n", "", "Question", "<|end|>", "\n\n", "<unknown>"], encode,
                      TOKEN_TEXT.get)
    assert rule.strings == ("\n\n", "Question", "<|end|>", "<unknown>")
    assert rule.tokens == (("\n\n", 4), ("<|end|>", 5))


def test_text_is_cut_at_the_first_until_string():
    rule = until_rule(["b", "Q:"], encode, TOKEN_TEXT.get)
    # "ab" contains "b" inside a token: the text cut finds it (the ids are not cut there).
    assert rule.finish([1, 1, 6, 1, 7, 1], decode) == ("aaa", "b", 4)  # ids cut before "Q:"
    assert rule.finish([1, 1], decode) == ("aa", None, 2)


def test_until_token_cuts_the_ids_before_it_even_when_special():
    rule = until_rule(["<|end|>", "b"], encode, TOKEN_TEXT.get)
    text, ended, kept = rule.finish([1, 1, 5, 2, 1], decode)
    assert (text, ended, kept) == ("aa", "<|end|>", 2)  # plain text search could not see it


def test_answer_is_the_same_with_and_without_the_early_stop():
    """An engine stopped on an until token emits the ids before it: the same answer."""
    rule = until_rule(["\n\n", "Q:"], encode, TOKEN_TEXT.get)
    for full in ([1, 2, 4, 1, 1], [1, 7, 4], [1, 2, 3, 1], [4], [2, 2, 2]):
        first = next((i for i, t in enumerate(full) if t in rule.token_ids), len(full))
        assert rule.finish(full[:first], decode)[0] == rule.finish(full, decode)[0]


def test_the_documented_difference_from_a_plain_split():
    """A match starting before an until token and ending inside it is not seen (module doc)."""
    rule = until_rule(["\n\n"], encode, TOKEN_TEXT.get)
    full = [1, 3, 4]  # "a" "\n" "\n\n": the text is "a\n\n\n"
    assert decode(full).split("\n\n")[0] == "a"
    assert rule.finish(full, decode)[0] == "a\n"


def test_engine_stop_ids_keep_the_base_and_respect_the_capacity():
    rule = UntilRule(strings=("x", "y", "z"), tokens=(("x", 9), ("y", 4), ("z", 7)))
    assert rule.engine_stop_ids([2, 3], capacity=8) == [2, 3, 4, 7, 9]
    assert rule.engine_stop_ids([2, 3], capacity=4) == [2, 3, 4, 9]
    assert rule.engine_stop_ids([2, 9], capacity=3) == [2, 4, 9]
