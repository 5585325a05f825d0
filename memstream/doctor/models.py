"""The doctor's checks of the model server: reachable, each configured model listed, a rating call with the
real Importance prompt answered by an integer 1..10, an embedding of the expected dimension.

The calls go through the same client and code as the persona's (memstream.models.llm, memstream.models.embed), with no
retries, so a fault shows at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai

from memstream.config import ModelConfig, PersonaConfig
from memstream.doctor.checks import Check
from memstream.errors import ConfigError, MemstreamError, ProviderError
from memstream.models.embed import Embedder, OpenAIEmbedder, SentenceTransformerEmbedder
from memstream.models.llm import OpenAIChat, make_client, map_provider_errors, redact_url
from memstream.prompts import load_prompt, one_line, tag_safe
from memstream.rate import parse_rating

__all__ = ["LIST_TIMEOUT", "OPENAI_URL", "ModelProbe", "list_models", "server_url", "unreachable_fix"]

LIST_TIMEOUT = 10.0  # seconds for GET /models: a server that answers at all answers this at once
OPENAI_URL = "https://api.openai.com/v1"
SAMPLE = "A friend stopped by to say that the new cafe in town opens next week."


def server_url(models: ModelConfig, environ: Mapping[str, str]) -> str:
    """The model server's URL as the persona resolves it (OpenAI itself when none is set), for messages."""
    return redact_url(models.resolved_base_url(environ) or OPENAI_URL)


async def list_models(client: openai.AsyncOpenAI, where: str) -> list[str] | None:
    """The model ids the server lists (GET /models); None when it lists none (404). ProviderError when it
    cannot be reached, rejects the key or answers nonsense."""
    with map_provider_errors(ProviderError, where):
        try:
            page = await client.with_options(timeout=LIST_TIMEOUT).models.list()
        except openai.NotFoundError:
            return None
        return [str(item.id) for item in page.data]


def _listed(name: str, ids: list[str]) -> bool:
    """Whether a model name is among the listed ids (Ollama lists `llama3.1` as `llama3.1:latest`)."""
    return name in ids or f"{name}:latest" in ids


_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "host.docker.internal")


def unreachable_fix(url: str) -> str:
    """What to do about a model server that cannot be reached: start it, if it runs on this machine (or in a
    container beside it); else the network or the URL is at fault (nobody runs `ollama serve` for OpenAI)."""
    host = (urlsplit(url).hostname or "").lower()
    if host in _LOCAL_HOSTS or host.endswith(".local"):
        return "start the server (Ollama: ollama serve), or correct [models] base_url"
    return f"check this machine's network (proxy, firewall, DNS) and [models] base_url ({host or url})"


@dataclass
class _Embedded:
    dimensions: int | None = None
    error: MemstreamError | None = None


class ModelProbe:
    """The persona's model server, asked once per question; `close()` when done."""

    def __init__(self, persona: PersonaConfig, environ: Mapping[str, str]) -> None:
        self.persona, self.models = persona, persona.models
        self.environ = environ
        self.url = OPENAI_URL
        self.client: openai.AsyncOpenAI | None = None
        self._embedded: _Embedded | None = None

    def _client(self) -> openai.AsyncOpenAI:
        if self.client is None:
            self.client = make_client(base_url=self.models.resolved_base_url(self.environ),
                                      api_key=self.models.api_key(self.environ),
                                      timeout=self.models.timeout, max_retries=0)
        return self.client

    async def close(self) -> None:
        """Close the HTTP client."""
        if self.client is not None:
            await self.client.close()

    async def checks(self) -> list[Check]:
        """Every model check, in order; after an unreachable server only that one."""
        try:
            self.url = server_url(self.models, self.environ)
            client = self._client()
        except ConfigError as exc:
            return [Check.fail("model server", str(exc).split(": ")[0],
                               str(exc).split(": ", 1)[1] if ": " in str(exc) else None)]
        try:
            ids = await list_models(client, f"the model server at {self.url}")
        except ProviderError as exc:
            return [Check.fail("model server", str(exc), self._fix(exc))]
        found: list[Check] = []
        if ids is None:
            hint = "" if self.url.rstrip("/").endswith("/v1") else " (does base_url need to end with /v1?)"
            found.append(Check.warn("model server", f"{self.url} answers but lists no models (GET /models: 404)"
                                                    f"{hint}; model names not checked"))
        else:
            found.append(Check.ok("model server", f"{self.url} answers, {len(ids)} model(s) listed"))
            found += self._model_checks(ids)
        found.append(await self._rating())
        found.append(await self._embedding_check())
        return found

    def _fix(self, exc: ProviderError) -> str:
        text = str(exc)
        if "API key" in text:
            return f"export the right key in {self.models.api_key_env}"
        if "cannot reach" in text:
            return unreachable_fix(self.url)
        return "check the server's log"

    def _model_checks(self, ids: list[str]) -> list[Check]:
        roles: dict[str, list[str]] = {}
        for role in ("rater", "reflector", "agent", "embedding"):
            name = getattr(self.models, role)
            if not name.startswith("local:"):
                roles.setdefault(name, []).append(role)
        checks = []
        for name, used_by in roles.items():
            if _listed(name, ids):
                checks.append(Check.ok("model", f"{name} ({', '.join(used_by)}) is listed"))
                continue
            shown = ", ".join(ids[:12]) + (", ..." if len(ids) > 12 else "") if ids else "nothing"
            checks.append(Check.fail("model", f"{name} ({', '.join(used_by)}) is not on the server, which lists "
                                              f"{shown}",
                                     f"pull or deploy it (Ollama: ollama pull {name}), or name a listed model "
                                     f"in [models] {used_by[0]}"))
        return checks

    async def _rating(self) -> Check:
        prompt = load_prompt("importance").render(agent_name=tag_safe(one_line(self.persona.name)),
                                                  observation=tag_safe(one_line(SAMPLE)))
        started = time.monotonic()
        try:
            reply = await OpenAIChat(self._client()).complete(prompt, model=self.models.rater)
        except ProviderError as exc:
            return Check.fail("rating", str(exc), self._fix(exc))
        value = parse_rating(reply.text)
        if value is None:
            return Check.fail("rating", f"{self.models.rater} answered {one_line(reply.text)[:60]!r}, not an "
                                        "integer 1..10 (memstream asks twice, then uses importance 5)",
                              "use a chat model that follows the instruction for [models] rater")
        return Check.ok("rating", f"{self.models.rater} rated a test observation {value} "
                                  f"in {time.monotonic() - started:.1f} s")

    async def embedding(self) -> _Embedded:
        """One embedding of a sample text (asked once, remembered): its dimension, or the error."""
        if self._embedded is None:
            try:
                embedder: Embedder
                if self.models.embedding.startswith("local:"):
                    embedder = SentenceTransformerEmbedder.load(self.models.embedding.removeprefix("local:"))
                else:
                    embedder = OpenAIEmbedder(self._client(), model=self.models.embedding,
                                              dimensions=self.models.embedding_dimensions)
                vectors = await embedder.embed_batch([SAMPLE])
                self._embedded = _Embedded(dimensions=int(vectors.shape[1]) if vectors.shape[0] == 1 else 0)
            except MemstreamError as exc:
                self._embedded = _Embedded(error=exc)
        return self._embedded

    async def _embedding_check(self) -> Check:
        result = await self.embedding()
        name = self.models.embedding
        if result.error is not None:
            fix = self._fix(result.error) if isinstance(result.error, ProviderError) else None
            return Check.fail("embedding", str(result.error), fix)
        wanted = self.models.embedding_dimensions
        if not result.dimensions:
            return Check.fail("embedding", f"{name} returned an empty embedding", "check the server's log")
        if wanted is not None and result.dimensions != wanted:
            return Check.fail("embedding", f"{name} returned {result.dimensions} dimensions, not the "
                                           f"{wanted} of [models] embedding_dimensions",
                              "use a model that supports the dimensions option, or remove embedding_dimensions")
        return Check.ok("embedding", f"{name} returns {result.dimensions} dimensions")
