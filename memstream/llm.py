"""Chat models: the ChatModel protocol and OpenAIChat, for any OpenAI-compatible server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import openai

from memstream.errors import CompletionError, ProviderError

__all__ = ["ChatModel", "Completion", "OpenAIChat", "make_client", "map_provider_errors"]


@dataclass(frozen=True)
class Completion:
    """A model's reply and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ChatModel(Protocol):
    """Anything that completes a prompt with a named model."""

    async def complete(self, prompt: str, *, model: str) -> Completion: ...


def make_client(*, base_url: str | None, api_key: str, timeout: float, max_retries: int) -> openai.AsyncOpenAI:
    """An AsyncOpenAI client for OpenAI, Ollama, vLLM, LM Studio or a llama.cpp server."""
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
    return f"the model server at {str(client.base_url).rstrip('/')} (model {model})"


class OpenAIChat:
    """Chat completions through openai.AsyncOpenAI."""

    def __init__(self, client: openai.AsyncOpenAI, *, temperature: float | None = None) -> None:
        self.client = client
        self.temperature = temperature

    async def complete(self, prompt: str, *, model: str) -> Completion:
        """One user message in, the first choice's text out."""
        where = describe(self.client, model)
        with map_provider_errors(CompletionError, where):
            response = await self.client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}],
                temperature=openai.omit if self.temperature is None else self.temperature,
            )
            if not response.choices:
                raise CompletionError(f"{where} returned no choices", retryable=True)
            text = response.choices[0].message.content or ""
            usage = response.usage
        return Completion(
            text=text,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )


