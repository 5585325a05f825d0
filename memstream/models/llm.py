"""Chat models: the ChatModel protocol and OpenAIChat, for any OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import openai

from memstream.config import check_base_url, redact_text
from memstream.errors import CompletionError, ProviderError
from memstream.store.policy import bounded_count

__all__ = ["CALL_COUNT_MAX", "ChatModel", "Completion", "OpenAIChat", "StreamingChatModel", "call_count",
           "make_client", "map_provider_errors", "post_json", "raw_requests", "redact_url"]

log = logging.getLogger(__name__)

# The most tokens (or retries) one model call is believed to have used: a model server's numbers are untrusted
# input, and one absurd reply (2**64 - 1 prompt tokens) must not poison the totals it is added to.
CALL_COUNT_MAX = 10**9


def call_count(value: object) -> int:
    """A number a model server (or the client) reported for one call, in [0, CALL_COUNT_MAX]; what is not a
    number counts 0 (the reply itself is kept: its usage is bookkeeping)."""
    return bounded_count(value, CALL_COUNT_MAX)


@dataclass(frozen=True)
class Completion:
    """A model's reply and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0  # failed attempts the client retried before this reply


class ChatModel(Protocol):
    """Anything that completes a prompt with a named model."""

    async def complete(self, prompt: str, *, model: str) -> Completion: ...


@runtime_checkable
class StreamingChatModel(Protocol):
    """A chat model that can also stream: its reply's text as it comes (str deltas), then one Completion (the
    whole text and what it cost). A ProviderError may come after some deltas: the reply broke off there."""

    async def complete(self, prompt: str, *, model: str) -> Completion: ...

    def stream(self, prompt: str, *, model: str) -> AsyncGenerator[str | Completion, None]: ...


def redact_url(text: str) -> str:
    """Text with every URL in it masked as memstream.config.redact masks one (its password, its keys)."""
    return redact_text(text)


class _RedactUrls(logging.Filter):
    """The HTTP client logs each request's URL at INFO: never with a password a base_url may carry."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact_url(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


def make_client(*, base_url: str | None, api_key: str, timeout: float, max_retries: int) -> openai.AsyncOpenAI:
    """An AsyncOpenAI client for OpenAI, Ollama, vLLM, LM Studio or a llama.cpp server.

    Over aiohttp where the SDK offers it (openai.DefaultAioHttpClient; aiohttp comes with discord.py): its
    connection handling costs a fraction of the default transport's CPU, which is what caps a burst of
    rating calls on a small machine.
    """
    if base_url:
        check_base_url(base_url, "base_url", "the API key variable")
    if base_url and redact_text(base_url) != base_url:
        for name in ("httpx2", "httpx", "openai", "aiohttp"):
            target = logging.getLogger(name)
            if not any(isinstance(f, _RedactUrls) for f in target.filters):
                target.addFilter(_RedactUrls())
    http_client = None
    aio = getattr(openai, "DefaultAioHttpClient", None)
    if aio is not None:
        with contextlib.suppress(Exception):  # the SDK's aiohttp extra is missing: its default transport
            http_client = aio(timeout=timeout)
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries,
                              http_client=http_client)


def _response_class() -> type | None:
    """The HTTP response class of the installed SDK (httpx2 from openai 3, httpx before), for client.post."""
    base = getattr(openai, "_base_client", None)
    found = getattr(base, "httpx2", None) or getattr(base, "httpx", None)
    response = getattr(found, "Response", None)
    return response if isinstance(response, type) else None


_RESPONSE = _response_class()
_BEARER = {"bearer_auth": True}


def raw_requests() -> bool:
    """Whether post_json can be used with this openai SDK."""
    return _RESPONSE is not None


async def post_json(client: openai.AsyncOpenAI, path: str, body: Mapping[str, Any]) -> tuple[Any, int]:
    """POST a JSON body through the SDK's client (`client.post`, its way to make raw requests: same base
    URL, auth, timeouts, retries and errors as its typed methods) and return (the decoded JSON, retries).

    The typed methods spend about 3 ms of CPU per call checking the request against the API's types and
    building models of the response; for the two request shapes memstream sends, that is most of the CPU of
    a burst. Only where raw_requests() (else the typed methods are used).
    """
    if _RESPONSE is None:
        raise LookupError("no raw requests in this openai SDK")
    options: Any = {"security": _BEARER}
    response: Any = await client.post(path, cast_to=_RESPONSE, body=dict(body), options=options)
    retries = response.request.headers.get("x-stainless-retry-count", "0")
    return json.loads(response.content), call_count(retries)



@contextlib.contextmanager
def map_provider_errors(kind: type[ProviderError], where: str) -> Iterator[None]:
    """The one place where the openai SDK's exceptions become ours."""
    try:
        yield
    except openai.AuthenticationError as exc:
        raise kind(f"{where} rejected the API key (HTTP 401): check the API key variable") from exc
    except openai.RateLimitError as exc:
        raise kind(f"{where} is rate limiting us (HTTP 429)", retryable=True) from exc
    except openai.NotFoundError as exc:
        raise kind(f"{where} answered 404: is the model name right and pulled/deployed?") from exc
    except openai.APITimeoutError as exc:
        if _refused(exc):  # the aiohttp transport reports a refused connection as a connect timeout
            raise kind(f"cannot reach {where}: is the server running?", retryable=True) from exc
        raise kind(f"{where} did not answer in time", retryable=True) from exc
    except openai.APIConnectionError as exc:
        raise kind(f"cannot reach {where}: is the server running?", retryable=True) from exc
    except openai.APIStatusError as exc:
        retry = exc.status_code >= 500
        raise kind(f"{where} failed with HTTP {exc.status_code}", retryable=retry) from exc
    except (openai.OpenAIError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # ValueError covers a body that is not JSON; the others a JSON of the wrong shape.
        raise kind(f"{where} sent a malformed answer ({type(exc).__name__})", retryable=True) from exc


def _refused(exc: BaseException) -> bool:
    """Whether an error was caused by a connection that failed outright (refused, reset, no such host)."""
    seen: BaseException | None = exc
    for _ in range(12):
        seen = seen.__cause__ or seen.__context__ if seen is not None else None
        if seen is None:
            return False
        if isinstance(seen, OSError) and not isinstance(seen, TimeoutError):
            return True
    return False


def describe(client: openai.AsyncOpenAI, model: str) -> str:
    """A short name for a model on a server, for error messages."""
    return f"the model server at {redact_url(str(client.base_url)).rstrip('/')} (model {model})"


# What a server that does not stream answers to `"stream": true` (bad request, unprocessable, not implemented).
_NO_STREAMING = frozenset({400, 422, 501})


def _whole(data: Any, where: str, retries: int) -> Completion:
    """A whole chat completion (decoded JSON) as a Completion; the first choice's text."""
    choices = data["choices"]
    if not choices:
        raise CompletionError(f"{where} returned no choices", retryable=True)
    text = choices[0]["message"].get("content") or ""
    if not isinstance(text, str):
        raise TypeError("content is not text")
    usage = data.get("usage") or {}
    if not isinstance(usage, Mapping):
        usage = {}
    return Completion(text=text, prompt_tokens=call_count(usage.get("prompt_tokens")),
                      completion_tokens=call_count(usage.get("completion_tokens")), retries=retries)


async def _broken_off(chunks: AsyncIterator[Any], where: str) -> AsyncIterator[Any]:
    """The chunks of a stream; a connection lost (or timed out) in the middle is the reply broken off."""
    try:
        async for chunk in chunks:
            yield chunk
    except openai.APIConnectionError as exc:
        raise CompletionError(f"{where} broke off its reply (the connection was lost)", retryable=True) from exc


class OpenAIChat:
    """Chat completions through openai.AsyncOpenAI."""

    def __init__(self, client: openai.AsyncOpenAI, *, temperature: float | None = None,
                 extra_body: Mapping[str, Any] | None = None, streaming: bool = True) -> None:
        self.client = client
        self.temperature = temperature
        # Fields the server understands beyond OpenAI's (llama.cpp's `grammar`), sent with every request.
        self.extra_body = dict(extra_body or {})
        # False: `stream` asks for the whole reply (a persona's [models] stream_replies, for a server that
        # streams badly); it also becomes False once the server refused a streamed request and answered it
        # unstreamed (a 400 the unstreamed request gets too was not about streaming).
        self.streaming = streaming

    async def stream(self, prompt: str, *, model: str) -> AsyncGenerator[str | Completion, None]:
        """The reply's text as the server sends it, then the Completion. A server that refuses to stream (HTTP
        400, 422 or 501 to `"stream": true`) or answers with one whole body is asked the usual way from then on:
        the caller sees one delta, never an error. A stream that breaks after some text raises CompletionError
        (what came before it was yielded)."""
        where = describe(self.client, model)
        async with contextlib.AsyncExitStack() as stack:
            streaming = self.streaming
            response = await self._open_stream(stack, prompt, model, where) if streaming else None
            if response is None:
                whole = await self.complete(prompt, model=model)
                if streaming:  # refused, and the same request unstreamed was answered: streaming was the cause
                    log.info("%s does not stream: asking for whole replies from now on", where)
                    self.streaming = False
                yield whole.text
                yield whole
                return
            retries = call_count(response.retries_taken)
            if "text/event-stream" not in response.headers.get("content-type", ""):
                self.streaming = False  # it ignores the field: one whole completion, as if not asked
                with map_provider_errors(CompletionError, where):
                    whole = _whole(await response.json(), where, retries)
                yield whole.text
                yield whole
                return
            parts: list[str] = []
            usage: Any = None
            finished = False
            with map_provider_errors(CompletionError, where):
                chunks = await response.parse()
                async for chunk in _broken_off(chunks, where):
                    usage = chunk.usage or usage
                    for choice in chunk.choices:
                        if choice.index != 0:
                            continue
                        finished = finished or choice.finish_reason is not None
                        text = choice.delta.content if choice.delta is not None else None
                        if text:
                            parts.append(text)
                            yield text
            if not finished:
                raise CompletionError(f"{where} ended its reply before the end (no finish reason)", retryable=True)
            yield Completion(text="".join(parts), prompt_tokens=call_count(getattr(usage, "prompt_tokens", 0)),
                             completion_tokens=call_count(getattr(usage, "completion_tokens", 0)), retries=retries)

    async def _open_stream(self, stack: contextlib.AsyncExitStack, prompt: str, model: str,
                           where: str) -> Any | None:
        """The streamed response, its body not yet read; None if the server refuses to stream."""
        with map_provider_errors(CompletionError, where):
            try:
                return await stack.enter_async_context(self.client.chat.completions.with_streaming_response.create(
                    model=model, messages=[{"role": "user", "content": prompt}], stream=True,
                    stream_options={"include_usage": True},
                    temperature=openai.omit if self.temperature is None else self.temperature,
                    extra_body=self.extra_body or None))
            except openai.APIStatusError as exc:
                if exc.status_code not in _NO_STREAMING:
                    raise
                return None

    async def complete(self, prompt: str, *, model: str) -> Completion:
        """One user message in, the first choice's text out."""
        where = describe(self.client, model)
        if raw_requests():
            body: dict[str, Any] = {**self.extra_body, "model": model,
                                    "messages": [{"role": "user", "content": prompt}]}
            if self.temperature is not None:
                body["temperature"] = self.temperature
            with map_provider_errors(CompletionError, where):
                data, retries = await post_json(self.client, "/chat/completions", body)
                return _whole(data, where, retries)
        with map_provider_errors(CompletionError, where):
            raw = await self.client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": prompt}],
                temperature=openai.omit if self.temperature is None else self.temperature,
                extra_body=self.extra_body or None,
            )
            response = raw.parse()
            if not response.choices:
                raise CompletionError(f"{where} returned no choices", retryable=True)
            text = response.choices[0].message.content or ""
            usage = response.usage
        return Completion(
            text=text,
            prompt_tokens=call_count(usage.prompt_tokens if usage else 0),
            completion_tokens=call_count(usage.completion_tokens if usage else 0),
            retries=call_count(raw.retries_taken),
        )


