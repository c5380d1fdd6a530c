"""The FastAPI application: OpenAI's completions, chat completions and models endpoints, health
and Prometheus metrics, on an :class:`~alodlm_jax.serve.engine.EngineLoop`.

Every refusal is an OpenAI-style error body (:func:`alodlm_jax.serve.schemas.error_body`): a
malformed JSON body 400, a body of the wrong shape or types 422, what the decoder cannot do or
the server's settings forbid 400, an unknown model 404, a missing or wrong API key 401, a full
queue 429 with ``Retry-After``, a draining server 503. Only an engine error answers 500 (the
requests in the batch when it happened); the server goes on. Streaming is server-sent events
(``sse-starlette``), OpenAI's chunk objects ending with ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from alodlm_jax.serve import output as O
from alodlm_jax.serve.engine import EngineLoop, QueueFull, Request as EngineRequest, Stopped
from alodlm_jax.serve.metrics import Metrics
from alodlm_jax.serve.schemas import (SERVER_SETTINGS, ChatCompletionRequest, CompletionRequest,
                                      RequestError, error_body, unsupported)

RETRY_AFTER_SECONDS = 1


@dataclasses.dataclass
class Server:
    """What the application serves: the generator (tokenizer, chat template, decoding settings),
    the engine loop, the model's name, limits and the API key (None: no authentication)."""

    generator: Any
    loop: EngineLoop
    model_name: str
    max_prompt_tokens: int
    api_key: str | None = None
    drain_seconds: float = 30.0
    metrics: Metrics = dataclasses.field(default_factory=Metrics)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def decode(self):
        return self.generator.decode_config

    def settings(self) -> dict[str, Any]:
        d = self.decode
        return {"mode": d.mode, "window_size": d.window_size, "q": d.q, "tau": d.tau,
                "position_penalty": d.effective_position_penalty,
                "max_tokens": d.max_new_tokens}


def create_app(server: Server, *, on_ready: Callable[[], None] = lambda: None) -> FastAPI:
    """The application; ``on_ready`` is called once it listens. Its shutdown drains the engine
    loop (at most ``server.drain_seconds``)."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        on_ready()
        yield
        await asyncio.get_running_loop().run_in_executor(None, server.loop.drain,
                                                         server.drain_seconds)

    app = FastAPI(title="alodlm-jax-serve", description="OpenAI-compatible ALoDLM server",
                  lifespan=lifespan)
    metrics = server.metrics

    def count(request: Request, status: int) -> None:
        metrics.requests.labels(request.url.path, str(status)).inc()

    def refuse(request: Request, status: int, body: dict, headers=None) -> JSONResponse:
        count(request, status)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError):
        return refuse(request, error.status, error.body(), error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        errors = error.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return refuse(request, 400, error_body("the request body is not valid JSON"))
        first = errors[0] if errors else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid value')}" if where else first.get(
            "msg", "invalid request body")
        return refuse(request, 422, error_body(message, param=where or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return refuse(request, error.status_code, error_body(str(error.detail), kind=kind),
                      getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception):
        return refuse(request, 500, error_body(f"internal error: {type(error).__name__}: {error}",
                                               kind="internal_error"))

    def authorize(request: Request) -> None:
        if server.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token.strip() != server.api_key:
            raise RequestError(401, "a valid API key is required (Authorization: Bearer ...)",
                               kind="authentication_error", code="invalid_api_key")

    @app.get("/health")
    async def health():
        ok = server.loop.alive and server.loop.accepting
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok
                            else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models():
        return {"object": "list", "data": [{
            "id": server.model_name, "object": "model", "created": server.created,
            "owned_by": "alodlm-jax", "max_model_len": server.max_prompt_tokens
            + server.decode.max_new_tokens, "alodlm": server.settings()}]}

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request):
        check(server, body)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise RequestError(400, f"one prompt per request (n=1), got {len(prompt)}",
                                   param="prompt")
            prompt = prompt[0]
        ids = (server.generator.encode_verbatim(prompt) if isinstance(prompt, str)
               else list(prompt))
        return await respond(server, request, body, ids, chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check(server, body)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = server.generator.render_chat(messages)
        except Exception as error:  # noqa: BLE001 - the template refused these messages
            raise RequestError(400, f"the chat template refused the messages: {error}",
                               param="messages") from None
        ids = server.generator.encode_verbatim(text)
        return await respond(server, request, body, ids, chat=True)

    return app


def check(server: Server, body) -> None:
    """The request's model, what the decoder cannot do, the server's settings and budget."""
    if body.model != server.model_name:
        raise RequestError(404, f"The model `{body.model}` does not exist (this server serves "
                           f"`{server.model_name}`)", param="model", code="model_not_found",
                           kind="not_found_error")
    unsupported(body)
    settings = server.settings()
    for name in SERVER_SETTINGS:
        value = getattr(body, name)
        if value is not None and value != settings[name]:
            shown = ", ".join(f"{k}={v}" for k, v in settings.items())
            raise RequestError(400, f"{name}={value} differs from the server's settings "
                               f"({shown}): the batch program takes them for every slot",
                               param=name)
    budget = server.decode.max_new_tokens
    asked = body.max_completion_tokens or body.max_tokens
    if asked is not None and asked > budget:
        raise RequestError(400, f"max_tokens {asked} is over the server's budget {budget} "
                           "(--max_new_tokens)", param="max_tokens")
    if asked is not None and asked != budget:
        raise RequestError(400, f"max_tokens must be the server's {budget} (or left out): the "
                           "batch program takes the budget for every slot, and a smaller "
                           "budget decodes other tokens", param="max_tokens")


async def respond(server: Server, request: Request, body, ids, *, chat: bool):
    generator = server.generator
    if len(ids) > server.max_prompt_tokens:
        raise RequestError(400, f"the prompt has {len(ids)} tokens; this server takes at most "
                           f"{server.max_prompt_tokens} (--max_prompt_tokens)", param="prompt",
                           code="context_length_exceeded")
    try:
        ids = generator.check_prompt_ids(ids)
    except ValueError as error:
        raise RequestError(400, str(error), param="prompt") from None
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    tracker = O.Tracker(generator.decode_text, stops, body.stop_token_ids or ())
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def notify(kind, payload):
        try:
            loop.call_soon_threadsafe(events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is closed: nobody listens any more
            pass

    job = EngineRequest(ids, notify)
    try:
        server.loop.submit(job)
    except QueueFull as error:
        raise RequestError(429, f"the server is busy: {error}; retry later",
                           kind="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
    except Stopped as error:
        raise RequestError(503, str(error), kind="service_unavailable") from None
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    run = _Run(server, job, tracker, events, len(ids))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        server.metrics.requests.labels(request.url.path, "200").inc()
        return EventSourceResponse(
            _stream(run, ident, chat, include_usage), ping=15,
            shutdown_grace_period=server.drain_seconds)
    try:
        out = await run.finish()
    except _EngineFailed as error:
        raise RequestError(500, str(error), kind="internal_error", code="engine_error") from None
    server.metrics.requests.labels(request.url.path, "200").inc()
    choice: dict[str, Any] = {"index": 0, "finish_reason": O.finish_reason(tracker, out),
                              "logprobs": None, O.EXTRA_KEY: O.extra(tracker, out)}
    if chat:
        choice["message"] = {"role": "assistant", "content": tracker.text}
    else:
        choice["text"] = tracker.text
    return {"id": ident, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": server.model_name, "choices": [choice],
            "usage": O.usage(run.prompt_tokens, tracker)}


class _EngineFailed(Exception):
    pass


class _Run:
    """One submitted request's events, as the listener sees them."""

    def __init__(self, server: Server, job: EngineRequest, tracker: O.Tracker, events, prompt_tokens):
        self.server, self.job, self.tracker, self.events = server, job, tracker, events
        self.prompt_tokens = prompt_tokens
        self.first_token: float | None = None
        self.done = False

    async def next(self):
        """The next event: ``("tokens", None)`` after new ids (the tracker updated),
        ``("done", DecodeOutput | None)``; an engine error raises :class:`_EngineFailed`."""
        kind, payload = await self.events.get()
        if kind == "tokens":
            if self.first_token is None:
                self.first_token = time.monotonic()
                self.server.metrics.ttft.observe(self.first_token - self.job.arrived)
            self.tracker.update(payload)
            if self.tracker.stopped_by:
                self.server.loop.cancel(self.job)
            return kind, None
        if kind == "error":
            self.done = True
            self.server.metrics.requests.labels("engine", "500").inc()
            raise _EngineFailed(payload)
        self.done = True
        metrics = self.server.metrics
        metrics.latency.observe(time.monotonic() - self.job.arrived)
        return kind, payload

    async def finish(self):
        try:
            while True:
                kind, payload = await self.next()
                if kind == "done":
                    return payload
        finally:
            if not self.done:  # the client went away: free the slot
                self.server.loop.cancel(self.job)


async def _stream(run: _Run, ident: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
    server, tracker = run.server, run.tracker
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices, **more) -> str:
        return json.dumps({"id": ident, "object": kind, "created": created,
                           "model": server.model_name, "choices": choices, **more})

    def choice(text: str, finish=None, extra=None) -> dict:
        c: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            c["delta"] = {"content": text} if text or finish else {"role": "assistant",
                                                                   "content": ""}
        else:
            c["text"] = text
        if extra is not None:
            c[O.EXTRA_KEY] = extra
        return c

    try:
        if chat:
            yield chunk([choice("")])
        while True:
            try:
                event, out = await run.next()
            except _EngineFailed as error:
                yield json.dumps(error_body(str(error), kind="internal_error", code="engine_error"))
                return
            if event == "tokens":
                piece = tracker.delta()
                if piece:
                    yield chunk([choice(piece)])
                continue
            piece = tracker.delta(final=True)
            yield chunk([choice(piece, O.finish_reason(tracker, out), O.extra(tracker, out))])
            if include_usage:
                yield chunk([], usage=O.usage(run.prompt_tokens, tracker))
            yield "[DONE]"
            return
    finally:
        if not run.done:  # the client went away (or the server stops): free the slot
            server.loop.cancel(run.job)
