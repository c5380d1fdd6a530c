"""The OpenAI request bodies the server accepts, and its OpenAI-style error bodies.

Unknown fields are accepted and ignored, as OpenAI's own server does, except the ones this decoder
cannot honour, which :func:`unsupported` names. ALoDLM's decoding settings may be given as extra
fields (``mode``, ``window_size``, ``q``, ``tau``, ``position_penalty``); they are the server's
(the batch program takes them for every slot), so a request may only repeat the server's values.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

# ALoDLM's decoding settings a request may name: all are the server's (module docstring).
SERVER_SETTINGS = ("mode", "window_size", "q", "tau", "position_penalty")

Number = Union[StrictInt, StrictFloat]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None


class _Common(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="allow")
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    n: StrictInt | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    seed: StrictInt | None = None
    user: StrictStr | None = None
    # ALoDLM's own settings (the server's; a request may only repeat them).
    mode: StrictStr | None = None
    window_size: StrictInt | None = None
    q: Number | None = None
    tau: Number | None = None
    position_penalty: Number | None = None


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is text (tokenized verbatim, no special tokens) or
    token ids; a list of one of either is that one prompt."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    logprobs: Any = None
    echo: StrictBool | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``: the messages through the checkpoint's chat template."""

    messages: list[Message] = Field(min_length=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind, self.headers = kind, headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def unsupported(request: _Common) -> None:
    """RequestError (400) for what this decoder cannot do: several choices, log-probabilities,
    echo, suffix, best_of, sampling (the decoder is greedy: ``temperature`` 0 and ``top_p`` 1
    only, or left out)."""
    if request.n not in (None, 1):
        raise RequestError(400, f"n must be 1 (one choice per request), got {request.n}",
                           param="n")
    logprobs = getattr(request, "logprobs", None)
    if logprobs not in (None, False) or getattr(request, "top_logprobs", None) is not None:
        raise RequestError(400, "logprobs are not defined for this decoder (adaptive diffusion "
                           "decoding commits tokens by entropy, not by a left-to-right "
                           "likelihood)", param="logprobs")
    if getattr(request, "echo", None):
        raise RequestError(400, "echo is not supported", param="echo")
    if getattr(request, "suffix", None):
        raise RequestError(400, "suffix is not supported", param="suffix")
    if getattr(request, "best_of", None) not in (None, 1):
        raise RequestError(400, "best_of must be 1", param="best_of")
    if request.temperature not in (None, 0, 0.0):
        raise RequestError(400, f"temperature must be 0: the decoder is greedy, got "
                           f"{request.temperature}", param="temperature")
    if request.top_p not in (None, 1, 1.0):
        raise RequestError(400, f"top_p must be 1: the decoder is greedy, got {request.top_p}",
                           param="top_p")
