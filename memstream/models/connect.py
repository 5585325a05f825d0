"""A persona's models, connected: its chat model and embedder from its persona file and the environment."""

from __future__ import annotations

from collections.abc import Mapping

import openai

from memstream.config import PersonaConfig
from memstream.errors import ConfigError
from memstream.models.embed import Embedder, OpenAIEmbedder, SentenceTransformerEmbedder
from memstream.models.llm import ChatModel, Completion, OpenAIChat, make_client

__all__ = ["connect_models"]


class _Unavailable:
    """A chat model that cannot be reached, saying why when (and only if) it is used."""

    def __init__(self, error: ConfigError) -> None:
        self.error = error

    async def complete(self, prompt: str, *, model: str) -> Completion:
        raise ConfigError(str(self.error))


def connect_models(persona: PersonaConfig, environ: Mapping[str, str] | None = None
                   ) -> tuple[ChatModel, Embedder, openai.AsyncOpenAI | None]:
    """The persona's chat model and embedder: an OpenAI-compatible server, or for an embedding model
    named `local:NAME`, a local sentence-transformers model (the `local` extra)."""
    models = persona.models
    local = models.embedding.startswith("local:")
    embedder: Embedder
    try:
        key = models.api_key(environ)
    except ConfigError as exc:
        if not local:
            raise
        embedder = SentenceTransformerEmbedder.load(models.embedding.removeprefix("local:"))
        return _Unavailable(exc), embedder, None
    client = make_client(base_url=models.resolved_base_url(environ), api_key=key,
                         timeout=models.timeout, max_retries=models.max_retries)
    if local:
        embedder = SentenceTransformerEmbedder.load(models.embedding.removeprefix("local:"))
    else:
        embedder = OpenAIEmbedder(client, model=models.embedding, dimensions=models.embedding_dimensions)
    return OpenAIChat(client, streaming=models.stream_replies), embedder, client
