"""A request's committed tokens as the text a client sees: deltas, stop strings, stop ids.

:class:`Tracker` receives all committed ids after each batch execution. It cuts them at the
first of the request's stop ids (the id excluded, as the engine's own stop ids are) and the text at
the first of its stop strings (the string excluded, as OpenAI's ``stop``), and says when either
has stopped the request, which the server then cancels (its slot frees). The tokens before a stop
are exactly the decoder's: a stop only ends the request, it changes nothing before it.

Streaming sends the text committed since the last delta, holding back a trailing piece that may be
an incomplete UTF-8 character (decoded as U+FFFD) or the start of a stop string.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from alodlm_jax.decode.result import DecodeOutput

# The key of ALoDLM's own result in every choice (docs/serve.md).
EXTRA_KEY = "alodlm"


class Tracker:
    """One request's text (module docstring); ``decode(ids) -> text``."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop_strings: Sequence[str] = (),
                 stop_ids: Sequence[int] = ()):
        self._decode = decode
        self.stop_strings = [s for s in stop_strings if s]
        self.stop_ids = set(int(i) for i in stop_ids)
        self.ids: list[int] = []  # the request's ids (cut at a stop)
        self.text = ""
        self.sent = ""  # the text already streamed
        self.stopped_by: str | None = None  # "stop_id" or "stop_string"

    def update(self, ids: Sequence[int]) -> None:
        """All committed ids so far (nothing changes once a stop was found)."""
        if self.stopped_by:
            return
        ids = list(ids)
        for k, token in enumerate(ids):
            if token in self.stop_ids:
                ids, self.stopped_by = ids[:k], "stop_id"
                break
        text = self._decode(ids)
        cut = [(text.find(s), s) for s in self.stop_strings if s in text]
        if cut:
            position, _ = min(cut)
            # The ids up to the one that completed the stop string.
            k = next(k for k in range(1, len(ids) + 1)
                     if any(s in self._decode(ids[:k]) for s in self.stop_strings))
            ids, text, self.stopped_by = ids[:k], text[:position], "stop_string"
        self.ids, self.text = ids, text

    def delta(self, final: bool = False) -> str:
        """The text committed since the last delta (module docstring)."""
        text = self.text
        if not final and not self.stopped_by:
            keep = len(text)
            while keep and text[keep - 1] == "\ufffd":
                keep -= 1
            for stop in self.stop_strings:  # a partial stop string waits
                for n in range(min(len(stop) - 1, keep), 0, -1):
                    if text[:keep].endswith(stop[:n]):
                        keep -= n
                        break
            text = text[:keep]
        if not text.startswith(self.sent):  # the decoded text changed before the cursor
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece


def finish_reason(tracker: Tracker, out: DecodeOutput | None) -> str:
    """OpenAI's finish reason: ``stop`` (a stop token, id or string), ``length`` (the budget)."""
    if tracker.stopped_by or out is None:
        return "stop"
    return "stop" if out.stop_reason == "eos" else "length"


def extra(tracker: Tracker, out: DecodeOutput | None) -> dict[str, Any]:
    """ALoDLM's per-choice result (``choices[i].alodlm``, docs/serve.md)."""
    n = len(tracker.ids)
    depths = list(out.exit_depths[:n]) if out is not None else []
    result = {
        "token_ids": list(tracker.ids),
        "exit_depths": depths,
        "mean_exit_depth": sum(depths) / len(depths) if depths else None,
        "outer_steps": out.outer_steps if out is not None else 0,
        "recurrent_passes": out.recurrent_passes if out is not None else 0,
        "loop_token_passes": out.loop_token_passes if out is not None else 0,
        "stop_reason": tracker.stopped_by or (out.stop_reason if out is not None else "stop_id"),
    }
    return result


def usage(prompt_tokens: int, tracker: Tracker) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": len(tracker.ids),
            "total_tokens": prompt_tokens + len(tracker.ids)}
