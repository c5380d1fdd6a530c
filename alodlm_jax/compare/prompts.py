"""Model level: the prompts file (JSONL or plain text) and its token ids."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Sequence

from .errors import CompareInputError

__all__ = ["PromptSpec", "load_prompts", "encode_prompts"]


def _read_lines(path: str) -> list[str]:
    try:
        data = open(path, "rb").read()
    except OSError as error:
        raise CompareInputError(f"cannot read: {error.strerror or error}", file=path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CompareInputError(f"not valid UTF-8: {error.reason}", file=path, line=line) from None
    return list(io.StringIO(text, newline=None))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """One prompt: text (chat template applied unless ``raw``) or explicit token ids."""

    where: str
    text: str | None = None
    ids: tuple[int, ...] | None = None
    raw: bool = False


def load_prompts(path: str) -> list[PromptSpec]:
    """Reads a prompts file: JSONL or plain text, one prompt per line (blank lines skipped).

    The file is JSONL when its first non-blank line is a JSON object. Each JSONL object holds either
    ``prompt`` (a non-empty string; ``"raw": true`` encodes it verbatim instead of through the chat
    template) or ``prompt_ids`` (a non-empty list of integers). A plain-text line is a chat prompt.
    """
    lines = _read_lines(path)
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise CompareInputError("no prompts", file=path)
    try:
        is_jsonl = isinstance(json.loads(numbered[0][1]), dict)
    except json.JSONDecodeError:
        is_jsonl = False
    specs = []
    for number, line in numbered:
        where = {"file": path, "line": number}
        label = f"{path}:{number}"
        if not is_jsonl:
            specs.append(PromptSpec(where=label, text=line.rstrip("\r\n")))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CompareInputError(f"invalid JSON: {error.msg} (column {error.colno})", **where) from None
        if not isinstance(record, dict):
            raise CompareInputError("each line must be a JSON object", **where)
        has_text, has_ids = "prompt" in record, "prompt_ids" in record
        if has_text == has_ids:
            raise CompareInputError("give exactly one of 'prompt' and 'prompt_ids'", **where)
        raw = record.get("raw", False)
        if not isinstance(raw, bool):
            raise CompareInputError("must be true or false", field="raw", **where)
        if has_text:
            if not isinstance(record["prompt"], str) or not record["prompt"]:
                raise CompareInputError("must be a non-empty string", field="prompt", **where)
            specs.append(PromptSpec(where=label, text=record["prompt"], raw=raw))
        else:
            ids = record["prompt_ids"]
            if not (isinstance(ids, list) and ids and all(_is_int(t) for t in ids)):
                raise CompareInputError("must be a non-empty list of integers", field="prompt_ids", **where)
            specs.append(PromptSpec(where=label, ids=tuple(ids)))
    return specs


def encode_prompts(specs: Sequence[PromptSpec], tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Token ids per prompt: the chat template rendered over one user turn with the generation
    prompt (``enable_thinking=False``, MODEL_AND_DECODING.md §4.7) and encoded without added special
    tokens, exactly as ``Generator.chat_prompt_ids`` does; or the text itself encoded verbatim for
    ``raw`` prompts; or the given ids. Every id must lie in ``[0, vocab_size)``."""
    out = []
    for spec in specs:
        if spec.ids is not None:
            ids = list(spec.ids)
        elif spec.raw:
            ids = list(tokenizer.encode(spec.text, add_special_tokens=False))
        else:
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": spec.text}], tokenize=False, add_generation_prompt=True,
                enable_thinking=False)
            ids = list(tokenizer.encode(rendered, add_special_tokens=False))
        if not ids:
            raise CompareInputError("the prompt encodes to no tokens", file=spec.where)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise CompareInputError(f"token id {bad[0]} outside [0, {vocab_size})", file=spec.where)
        out.append(ids)
    return out

