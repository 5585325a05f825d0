"""Chat models: the ChatModel protocol and OpenAIChat, for any OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import openai

from memstream.errors import CompletionError, ProviderError

__all__ = ["ChatModel", "Completion", "OpenAIChat", "make_client", "map_provider_errors", "redact_url"]


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


_USERINFO = re.compile(r"(://[^/:@\s]*:)[^/@\s]*@")


def redact_url(text: str) -> str:
    """Text with the password of any user:password@ URL in it masked."""
    return _USERINFO.sub(r"\1***@", text)


class _RedactUrls(logging.Filter):
    """The HTTP client logs each request's URL at INFO: never with a password a base_url may carry."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "@" in message:
            record.msg, record.args = redact_url(message), ()
        return True


def make_client(*, base_url: str | None, api_key: str, timeout: float, max_retries: int) -> openai.AsyncOpenAI:
    """An AsyncOpenAI client for OpenAI, Ollama, vLLM, LM Studio or a llama.cpp server."""
    if base_url and _USERINFO.search(base_url):
        for name in ("httpx2", "httpx", "openai"):
            target = logging.getLogger(name)
            if not any(isinstance(f, _RedactUrls) for f in target.filters):
                target.addFilter(_RedactUrls())
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries)


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
        raise kind(f"{where} did not answer in time", retryable=True) from exc
    except openai.APIConnectionError as exc:
        raise kind(f"cannot reach {where}: is the server running?", retryable=True) from exc
    except openai.APIStatusError as exc:
        retry = exc.status_code >= 500
        raise kind(f"{where} failed with HTTP {exc.status_code}", retryable=retry) from exc
    except (openai.OpenAIError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # ValueError covers a body that is not JSON; the others a JSON of the wrong shape.
        raise kind(f"{where} sent a malformed answer ({type(exc).__name__})", retryable=True) from exc


def describe(client: openai.AsyncOpenAI, model: str) -> str:
    """A short name for a model on a server, for error messages."""
    return f"the model server at {redact_url(str(client.base_url)).rstrip('/')} (model {model})"


class OpenAIChat:
    """Chat completions through openai.AsyncOpenAI."""

    def __init__(self, client: openai.AsyncOpenAI, *, temperature: float | None = None) -> None:
        self.client = client
        self.temperature = temperature

    async def complete(self, prompt: str, *, model: str) -> Completion:
        """One user message in, the first choice's text out."""
        where = describe(self.client, model)
        with map_provider_errors(CompletionError, where):
            raw = await self.client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": prompt}],
                temperature=openai.omit if self.temperature is None else self.temperature,
            )
            response = raw.parse()
            if not response.choices:
                raise CompletionError(f"{where} returned no choices", retryable=True)
            text = response.choices[0].message.content or ""
            usage = response.usage
        return Completion(
            text=text,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            retries=raw.retries_taken,
        )


