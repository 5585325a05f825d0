"""A fake OpenAI-compatible HTTP server on 127.0.0.1 for tests that drive the real `openai` SDK."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import re
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from memstream.testing import hash_embedding

__all__ = ["FAULT_KINDS", "RANDOM_FAULTS", "STREAM_MODES", "ChatRequest", "FakeOpenAIServer", "RecordedRequest",
           "pieces"]

CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
FAULT_KINDS = frozenset({"400", "500", "429", "401", "timeout", "malformed", "empty_choices", "disconnect",
                         "absurd_usage", "wrong_dim"})
# What `fail_at_random` draws from: errors, garbage and lies (usage counts of 2**64-1, vectors of the wrong size;
# a chat reply has no vectors: it gets garbage instead).
RANDOM_FAULTS = ("500", "429", "malformed", "absurd_usage", "wrong_dim")
ABSURD = 2**64 - 1
_LIE = web.RequestKey("lie", str)  # the lie a request is answered with (absurd_usage, wrong_dim)
_PATH_ALIASES = {"chat": CHAT_PATH, "embeddings": EMBEDDINGS_PATH}
# What a request with `"stream": true` gets: Server-Sent Events as OpenAI sends them ("sse"), one whole
# completion as if it had not asked ("whole", a server that ignores the field), or HTTP 400 ("refuse").
STREAM_MODES = frozenset({"sse", "whole", "refuse"})
_PIECE = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request that reached the server (including ones answered with a fault)."""

    path: str
    body: Any
    time: float
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request as seen by responders."""

    model: str
    messages: list[dict[str, Any]]
    prompt: str
    body: dict[str, Any]


ChatResponder = Callable[[ChatRequest], str]


def _tokens(text: str) -> int:
    """Approximate token count: whitespace-separated words."""
    return len(text.split())


def pieces(text: str) -> list[str]:
    """A reply cut as a streaming server sends it: one word (with the space before it) per chunk."""
    return _PIECE.findall(text)


def _content_text(content: Any) -> str:
    """The text of a message content (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _error(status: int, message: str, type_: str, code: str | None, **headers: str) -> web.Response:
    """An OpenAI-style JSON error response."""
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def _bad_request(message: str) -> web.Response:
    """A 400 invalid_request_error response."""
    return _error(400, message, "invalid_request_error", None)


def _normalize_path(path: str) -> str:
    """Map "chat"/"embeddings" or a path with or without /v1 to the full route path."""
    if path in _PATH_ALIASES:
        return _PATH_ALIASES[path]
    return "/v1/" + path.strip("/").removeprefix("v1/")


class FakeOpenAIServer:
    """A scriptable, fault-injecting fake of the OpenAI chat, embeddings and models endpoints."""

    def __init__(self, embed_dim: int = 64, latency: float = 0.0, port: int = 0) -> None:
        """Configure the fake; call start() or use `async with` to listen (on `port`, or any free one: stop()
        and start() again on the same port to play an outage with connections refused in between)."""
        self.embed_dim = embed_dim
        self.latency = latency
        self.wanted_port = port
        # Requests this predicate (path, JSON body) accepts never get an answer until the server stops:
        # a test can kill the client in the middle of a call it chose.
        self.hold: Callable[[str, Any], bool] | None = None
        self.held: list[RecordedRequest] = []
        self.timeout_sleep = 5.0
        self.require_api_key: str | None = None
        # GET /v1/models lists these; None: it answers 404, as servers that list no models do.
        self.models: list[str] | None = ["gpt-fake", "text-embedding-fake"]
        self.requests: list[RecordedRequest] = []
        self.chat_requests: list[ChatRequest] = []
        self.embedding_requests: list[list[str]] = []
        # Usage fields every reply reports instead of the counted ones (a server's numbers are untrusted:
        # {"prompt_tokens": 2**64 - 1} plays one that lies).
        self.usage: dict[str, Any] = {}
        # Streamed replies (`"stream": true`): how (STREAM_MODES), the pause before each chunk, and
        # `stream_cut_after`: after that many text chunks the connection is dropped (a stream that breaks).
        self.stream_mode = "sse"
        self.stream_delay = 0.0
        self.stream_cut_after: int | None = None
        self._script: deque[str] = deque()
        self._responder: ChatResponder | None = None
        self._faults: list[tuple[str, str | None]] = []
        self.fault_rate = 0.0
        self._random = random.Random(0)
        self.random_faults: dict[str, int] = {}  # kind -> how many were drawn
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._closing = asyncio.Event()

    async def start(self) -> None:
        """Bind to an ephemeral port on 127.0.0.1 and start serving."""
        if self._runner is not None:
            raise RuntimeError("server already started")
        app = web.Application()
        app.router.add_post(CHAT_PATH, self._handle_chat)
        app.router.add_post(EMBEDDINGS_PATH, self._handle_embeddings)
        app.router.add_get("/v1/models", self._handle_models)
        self._closing = asyncio.Event()
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.wanted_port or self._port or 0)
        await site.start()
        self._port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        """Wake any sleeping handlers and shut the server down."""
        self._closing.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        """Start the server."""
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the server."""
        await self.stop()

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The base URL to pass to the openai client."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: str) -> None:
        """Queue chat replies; each chat request pops one before the responder is consulted."""
        self._script.extend(replies)

    def on_chat(self, fn: ChatResponder | None) -> None:
        """Set (or clear with None) the function computing chat replies when the script is empty."""
        self._responder = fn

    def fail_next(self, kind: str, times: int = 1, *, path: str | None = None) -> None:
        """Answer the next `times` matching chat/embedding requests with fault `kind`."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        target = None if path is None else _normalize_path(path)
        self._faults.extend([(kind, target)] * times)

    def fail_at_random(self, rate: float, *, seed: int = 0) -> None:
        """Answer each chat/embedding request with a fault drawn from RANDOM_FAULTS with probability `rate`
        (seeded: the same seed draws the same faults for the same sequence of requests); 0 stops it."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"a fault rate is between 0 and 1, got {rate!r}")
        self.fault_rate, self._random = rate, random.Random(seed)

    def reset(self) -> None:
        """Clear recorded requests, queued replies, pending faults and the responder."""
        self.requests.clear()
        self.chat_requests.clear()
        self.embedding_requests.clear()
        self._script.clear()
        self._faults.clear()
        self._responder = None

    @property
    def pending_faults(self) -> int:
        """How many injected faults have not been consumed yet."""
        return len(self._faults)

    async def _sleep(self, seconds: float) -> None:
        """Sleep cancellably; returns early when the server is stopping."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), seconds)

    def _take_fault(self, path: str) -> str | None:
        """Pop the first pending fault that applies to `path`."""
        for i, (kind, target) in enumerate(self._faults):
            if target is None or target == path:
                del self._faults[i]
                return kind
        return None

    async def _prologue(self, request: web.Request) -> tuple[Any, web.StreamResponse | None]:
        """Record the request, apply latency, auth and faults; return (body, early response or None)."""
        try:
            body: Any = await request.json()
        except ValueError:
            body = None
        recorded = RecordedRequest(request.path, body, time.time(), dict(request.headers))
        self.requests.append(recorded)
        await self._sleep(self.latency)
        if self.hold is not None and isinstance(body, dict) and self.hold(request.path, body):
            self.held.append(recorded)
            await self._sleep(3600.0)
        if self.require_api_key is not None:
            auth = request.headers.get("Authorization", "")
            if auth != f"Bearer {self.require_api_key}":
                return body, self._auth_error()
        if not isinstance(body, dict):
            return body, _bad_request("request body must be a JSON object")
        kind = self._take_fault(request.path) or self._draw_fault(request.path)
        if kind is None:
            return body, None
        if kind == "wrong_dim" and request.path != EMBEDDINGS_PATH:
            kind = "malformed"
        if kind in ("absurd_usage", "wrong_dim"):  # answered, with a lie in it
            request[_LIE] = kind
            return body, None
        return body, await self._fault(kind, request, str(body.get("model", "")))

    def _draw_fault(self, path: str) -> str | None:
        if not self.fault_rate or self._random.random() >= self.fault_rate:
            return None
        kind = self._random.choice(RANDOM_FAULTS)
        self.random_faults[kind] = self.random_faults.get(kind, 0) + 1
        return kind

    @staticmethod
    def _auth_error() -> web.Response:
        """The 401 answer for a missing or wrong API key."""
        return _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")

    async def _fault(self, kind: str, request: web.Request, model: str) -> web.StreamResponse | None:
        """Produce the fault answer for `kind` (None means: carry on and answer normally)."""
        if kind == "400":
            return _bad_request("This model's maximum context length is 8192 tokens.")
        if kind == "500":
            return _error(500, "The server had an error while processing your request.", "server_error", None)
        if kind == "429":
            # retry-after: 0 alone makes the SDK fall back to its ~0.5 s backoff; 1 ms retries at once.
            headers = {"retry-after": "0", "retry-after-ms": "1"}
            return _error(429, "Rate limit reached.", "requests", "rate_limit_exceeded", **headers)
        if kind == "401":
            return self._auth_error()
        if kind == "timeout":
            await self._sleep(self.timeout_sleep)
            return None
        if kind == "malformed":
            return web.Response(status=200, text='{"choices": [', content_type="application/json")
        if kind == "empty_choices":
            if request.path == EMBEDDINGS_PATH:
                usage = {"prompt_tokens": 0, "total_tokens": 0}
                return web.json_response({"object": "list", "data": [], "model": model, "usage": usage})
            return web.json_response(self._completion(model, None, 0))
        assert kind == "disconnect"
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # aiohttp ends the handler quietly, as if the client had gone away

    @staticmethod
    def _completion(model: str, content: str | None, prompt_tokens: int) -> dict[str, Any]:
        """A ChatCompletion JSON object (no choices when content is None)."""
        message = {"role": "assistant", "content": content, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        choices = [] if content is None else [choice]
        completion_tokens = _tokens(content or "")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _reply(self, req: ChatRequest) -> str:
        """Choose the reply: the script first, then the responder, then the default."""
        if self._script:
            return self._script.popleft()
        if self._responder is not None:
            return self._responder(req)
        return "5" if "Reply with a single integer" in req.prompt else "OK"

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body, early = await self._prologue(request)
        if early is not None:
            return early
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _bad_request("'messages' must be a list of objects")
        prompt = "\n".join(_content_text(m.get("content")) for m in messages)
        req = ChatRequest(model=str(body.get("model", "")), messages=messages, prompt=prompt, body=body)
        self.chat_requests.append(req)
        if body.get("stream") is True and self.stream_mode == "refuse":
            return _bad_request("streaming is not supported by this server")
        text = self._reply(req)
        if body.get("stream") is True and self.stream_mode == "sse":
            return await self._stream(request, req, text, _tokens(prompt))
        completion = self._completion(req.model, text, _tokens(prompt))
        completion["usage"].update(self.usage)
        if request.get(_LIE) == "absurd_usage":
            completion["usage"].update(prompt_tokens=ABSURD, completion_tokens=ABSURD, total_tokens=ABSURD)
        return web.json_response(completion)

    async def _stream(self, request: web.Request, req: ChatRequest, text: str,
                      prompt_tokens: int) -> web.StreamResponse:
        """The reply as OpenAI streams it: `data: {chunk}` events, a word each (the first with the role), the
        finish reason, the usage when stream_options asks for it, then `data: [DONE]`."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": req.model}

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            await response.write(f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n".encode())

        await send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for n, piece in enumerate(pieces(text)):
            if self.stream_cut_after is not None and n >= self.stream_cut_after:
                if request.transport is not None:
                    request.transport.abort()
                raise asyncio.CancelledError  # the connection is gone mid-reply
            await self._sleep(self.stream_delay)
            await send([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        await send([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        options = req.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            completion_tokens = _tokens(text)
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens, **self.usage}
            await send([], usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _handle_embeddings(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/embeddings."""
        body, early = await self._prologue(request)
        if early is not None:
            return early
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return _bad_request("'input' must be a string or a non-empty list of strings (no token arrays)")
        dim = int(body.get("dimensions") or self.embed_dim)
        if request.get(_LIE) == "wrong_dim":
            dim = dim + 1 + self._random.randrange(7)
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            return _bad_request(f"unsupported encoding_format {fmt!r}")
        self.embedding_requests.append(list(texts))
        data = []
        for i, text in enumerate(texts):
            vec = hash_embedding(text, dim)
            encoded: Any = vec if fmt == "float" else base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(_tokens(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, **self.usage}
        if request.get(_LIE) == "absurd_usage":
            usage.update(prompt_tokens=ABSURD, total_tokens=ABSURD)
        return web.json_response(
            {"object": "list", "data": data, "model": body.get("model", ""), "usage": usage}
        )

    async def _handle_models(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/models."""
        self.requests.append(RecordedRequest(request.path, None, time.time(), dict(request.headers)))
        if self.require_api_key is not None and request.headers.get("Authorization", "") != (
                f"Bearer {self.require_api_key}"):
            return self._auth_error()
        if self.models is None:
            return _error(404, "Not found.", "invalid_request_error", None)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
        return web.json_response({"object": "list", "data": data})
