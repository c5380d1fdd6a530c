"""What a request's ``until`` strings do to a generation: one rule, the same with or without an
early stop.

lm-eval's ``generate_until`` requests carry ``until`` (stop strings) and ``max_gen_toks``. The
answer a request gets (:meth:`UntilRule.finish`):

1. the generated ids are cut *before* the first token that is, on its own, one of the until
   strings (an *until token*: the string tokenizes verbatim to exactly that one id, whose text
   is the string; special tokens such as ``<|im_end|>`` included, whose text the decoded answer
   would not show; an unknown word that becomes ``<unk>`` is not one);
2. the rest is decoded as every result's ``text`` is (special tokens skipped);
3. the text is cut at the first occurrence of any until string (lm-eval's ``split(term)[0]``
   for each term; empty strings are ignored, as lm-eval's Hugging Face model ignores them).

Early stop: until tokens can join the engine's stop ids (:meth:`UntilRule.engine_stop_ids`). An
engine ends a generation when a stop id appears in the leading committed prefix of a window and
emits the tokens before it, and committed tokens never change, so a stopped generation's ids are
exactly step 1's cut of the generation run to its budget: the answer is the same with or without
the early stop, and the tests check that. An until string of several tokens cannot stop the
engine (it has stop *ids*, no stop strings), so such a request decodes to ``max_gen_toks`` (or a
stop id) and is cut afterwards: the same answer, more decoding.

Where this differs from plain ``text.split(term)[0]`` (lm-eval's Hugging Face model, which stops
on the decoded text): an occurrence of an until string that starts in the text before an until
token and ends inside it (``"...\\n"`` followed by the token ``"\\n\\n"`` with until ``"\\n\\n"``)
is not seen, since the until token is gone before the text is searched; the answer then keeps
that partial start (``"...\\n"`` instead of ``"..."``).

No JAX and no lm-eval here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class UntilRule:
    """The until strings of a group of requests and those of them that are one token."""

    strings: tuple[str, ...]  # non-empty until strings, in request order
    tokens: tuple[tuple[str, int], ...]  # (string, id) of the strings that are exactly one token

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(token for _, token in self.tokens)

    def engine_stop_ids(self, base: Sequence[int], capacity: int) -> list[int]:
        """The engine's stop ids for this group: ``base`` plus until tokens while fewer than
        ``capacity`` ids are held (the rest are cut afterwards, with the same answer)."""
        ids = sorted({int(i) for i in base})
        for token in self.token_ids:
            if len(ids) >= capacity:
                break
            if token not in ids:
                ids.append(token)
        return sorted(ids)

    def finish(self, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]
               ) -> tuple[str, str | None, int]:
        """The request's answer from a generation's ids (module docstring, steps 1-3).

        Returns ``(text, the until string that ended it or None, ids kept in step 1)``.
        """
        ids = list(token_ids)
        by_id = {token: term for term, token in reversed(self.tokens)}
        kept = next((index for index, token in enumerate(ids) if token in by_id), len(ids))
        text = decode(ids[:kept])
        ended = by_id[ids[kept]] if kept < len(ids) else None
        where = len(text)
        for term in self.strings:
            found = text.find(term)
            if 0 <= found < where:
                ended, where = term, found
        return text[:where], ended, kept


def until_rule(until: Sequence[str], encode: Callable[[str], Sequence[int]],
               token_text: Callable[[int], str]) -> UntilRule:
    """The rule of a request's until strings. ``encode`` tokenizes verbatim (no special tokens
    added), as prompts are; ``token_text`` is one id's text, special tokens included."""
    strings = tuple(dict.fromkeys(term for term in until if term))
    encoded = [(term, list(encode(term))) for term in strings]
    return UntilRule(strings=strings, tokens=tuple(
        (term, ids[0]) for term, ids in encoded if len(ids) == 1 and token_text(ids[0]) == term))
