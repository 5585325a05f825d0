"""MemoryStream: observe, retrieve, reflect, respond, explain and forget, over one persona's store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import openai

from memstream.agent import Agent
from memstream.clock import Clock, SystemClock, to_timestamp
from memstream.config import PersonaConfig, StreamConfig
from memstream.embed import Embedder, OpenAIEmbedder, SentenceTransformerEmbedder
from memstream.errors import ConfigError, ProviderError
from memstream.llm import ChatModel, Completion, OpenAIChat, make_client
from memstream.models import Models, RoleModel
from memstream.rate import Rater, Rating
from memstream.records import EvidenceNode, Memory, ScoredMemory, Source
from memstream.reflect import Reflection, Reflector
from memstream.retrieve import Retriever, RetrieverLike
from memstream.store import NewMemory, Store
from memstream.vectors import VectorIndex

__all__ = ["DEFAULT_STREAM", "MemoryStream", "Observation", "Reply", "connect_models"]

log = logging.getLogger("memstream")
DEFAULT_STREAM = "default"
ReflectionHook = Callable[[str], Awaitable[None]]
ExplainedReply = tuple[dict[str, Any], list[tuple[dict[str, Any], Memory | None]]]


@dataclass(frozen=True)
class Observation:
    """Something to observe: text, when, in which stream, from where, and optionally its importance."""

    text: str
    stream: str = DEFAULT_STREAM
    at: datetime | None = None
    importance: int | None = None
    source: Source = field(default_factory=Source)


@dataclass(frozen=True)
class Reply:
    """A persona's reply and what it was built from."""

    text: str
    prompt: str
    memories: list[ScoredMemory]
    trace_id: int
    memory: Memory | None


def _check_importance(value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10):
        raise ConfigError(f"importance must be a whole number from 1 to 10, got {value!r}")


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
    return OpenAIChat(client), embedder, client


class MemoryStream:
    """One persona's memory: every stream of its store, its models, its clock."""

    def __init__(self, store: Store, embedder: Embedder, *, rater: RoleModel, reflector: RoleModel,
                 agent: RoleModel, name: str, summary: str, config: StreamConfig | None = None,
                 clock: Clock | None = None, tz: ZoneInfo | None = None,
                 retriever: RetrieverLike | None = None, on_reflection_due: ReflectionHook | None = None,
                 auto_reflect: bool = True) -> None:
        self.store, self.name, self.summary = store, name, summary
        self.config = config or StreamConfig()
        self.clock: Clock = clock or SystemClock()
        self.tz = tz or ZoneInfo("UTC")
        self.models = Models(store, embedder, rater=rater, reflector=reflector, agent=agent)
        self.index = VectorIndex(store)
        self.retriever = Retriever(store, self.index, self.models, self.config, self.clock)
        self.rater = Rater(self.models, agent_name=name)
        self.reflector = Reflector(store, self.models, retriever or self.retriever, self.config, agent_name=name)
        self.agent = Agent(self.models, name=name, summary=summary, tz=self.tz)
        self.on_reflection_due = on_reflection_due
        self.auto_reflect = auto_reflect
        self._reflecting: dict[str, asyncio.Lock] = {}
        self._limit = asyncio.Semaphore(self.config.max_concurrency)
        self._closers: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def open(cls, persona: PersonaConfig, *, clock: Clock | None = None, embedder: Embedder | None = None,
                   chat: ChatModel | None = None, environ: Mapping[str, str] | None = None,
                   **options: Any) -> MemoryStream:
        """Open a persona's store and connect its models (OpenAI-compatible unless fakes are given)."""
        client = None
        if chat is None or embedder is None:
            made_chat, made_embedder, client = connect_models(persona, environ)
            chat, embedder = chat or made_chat, embedder or made_embedder
        try:
            store = await Store.open(persona.database)
        except BaseException:
            if client is not None:
                await client.close()
            raise
        m = persona.models
        memory = cls(store, embedder, rater=RoleModel(chat, m.rater), reflector=RoleModel(chat, m.reflector),
                     agent=RoleModel(chat, m.agent), name=persona.name, summary=persona.summary,
                     config=persona.memory, clock=clock, tz=persona.tz, **options)
        if client is not None:
            memory._closers.append(client.close)
        return memory

    async def close(self) -> None:
        """Close the store and the model clients this stream opened."""
        for close in self._closers:
            await close()
        self._closers.clear()
        await self.store.close()

    async def __aenter__(self) -> MemoryStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def now(self) -> datetime:
        """The clock's time."""
        return self.clock.now()

    # -- observing -------------------------------------------------------------------------------

    async def observe(self, text: str, *, stream: str = DEFAULT_STREAM, at: datetime | None = None,
                      importance: int | None = None, source: Source | None = None) -> Memory:
        """Rate, embed and append one observation. On a model failure it is kept as pending and the
        ProviderError is raised; `complete_pending` finishes it later."""
        [memory], errors = await self._observe([Observation(text, stream, at, importance, source or Source())])
        if memory.status == "pending" and errors:
            raise type(errors[0])(f"{errors[0]} (memory #{memory.id} is kept and will be completed later)",
                                  retryable=errors[0].retryable) from errors[0]
        return memory

    async def observe_many(self, items: Sequence[Observation]) -> list[Memory]:
        """Observe a burst: persisted first, rated concurrently (bounded), embedded in batches.

        A memory whose model calls failed comes back with status `pending`; nothing is lost.
        A message id already stored in the stream is not stored twice.
        """
        memories, _ = await self._observe(items)
        return memories

    async def _observe(self, items: Sequence[Observation]) -> tuple[list[Memory], list[ProviderError]]:
        for item in items:
            _check_importance(item.importance)
            if not isinstance(item.text, str):
                raise ConfigError(f"observation text must be a string, got {type(item.text).__name__}")
        ids = await self._persist(items)
        fresh = sorted({i for i, new in ids if new})
        errors = await self._complete(fresh)
        found = await self.store.get_many([i for i, _ in ids])
        await self._reflect_if_due({found[i].stream for i in fresh if i in found})
        return [found[i] for i, _ in ids], errors

    async def _persist(self, items: Sequence[Observation]) -> list[tuple[int, bool]]:
        out: list[tuple[int, bool]] = []
        new: list[NewMemory] = []
        slots: list[int] = []
        first: dict[tuple[str, str], int] = {}  # a message repeated within this batch is stored once
        twins: list[tuple[int, int]] = []
        for item in items:
            existing = (await self.store.find_message(item.stream, item.source.message_id)
                        if item.source.message_id else None)
            if existing is not None:
                out.append((existing, False))
                continue
            if item.source.message_id:
                key = (item.stream, item.source.message_id)
                if key in first:
                    twins.append((len(out), first[key]))
                    out.append((-1, False))
                    continue
                first[key] = len(out)
            at = to_timestamp(item.at or self.clock.now())
            new.append(NewMemory(stream=item.stream, kind="observation", text=item.text, created_at=at,
                                 importance=item.importance,
                                 importance_source=None if item.importance is None else "given",
                                 source=item.source))
            slots.append(len(out))
            out.append((-1, True))
        for slot, memory_id in zip(slots, await self.store.insert(new), strict=True):
            out[slot] = (memory_id, True)
        for slot, earlier in twins:
            out[slot] = (out[earlier][0], False)
        return out

    async def complete_pending(self, limit: int = 1000) -> int:
        """Finish observations left pending by a model outage or a crash; returns how many are done."""
        pending = await self.store.pending_memories(limit)
        await self._complete([m.id for m in pending])
        done = await self.store.get_many([m.id for m in pending])
        finished = [m for m in done.values() if m.status == "ready"]
        await self._reflect_if_due({m.stream for m in finished})
        return len(finished)

    async def _complete(self, ids: Sequence[int]) -> list[ProviderError]:
        memories = [m for m in (await self.store.get_many(list(ids))).values() if m.status == "pending"]
        errors: list[ProviderError] = []
        ratings = await asyncio.gather(*(self._rate(m, errors) for m in memories))
        size = self.config.embed_batch_size
        for start in range(0, len(memories), size):
            batch = [(m, r) for m, r in zip(memories[start:start + size], ratings[start:start + size],
                                            strict=True) if r is not None]
            await self._embed_and_store(batch, errors)
        return errors

    async def _rate(self, memory: Memory, errors: list[ProviderError]) -> Rating | None:
        if memory.importance is not None:
            return Rating(memory.importance, memory.importance_source or "given")
        async with self._limit:
            try:
                return await self.rater.rate(memory.text, stream=memory.stream)
            except ProviderError as exc:
                await self._failed(memory, exc, errors)
                return None

    async def _failed(self, memory: Memory, exc: ProviderError, errors: list[ProviderError]) -> None:
        errors.append(exc)
        await self.store.count_attempt(memory.id)
        log.warning("memory #%d kept as pending: %s", memory.id, exc)

    async def _embed_and_store(self, batch: list[tuple[Memory, Rating]], errors: list[ProviderError]) -> None:
        if not batch:
            return
        by_stream: dict[str, list[tuple[Memory, Rating]]] = {}
        for memory, rating in batch:
            by_stream.setdefault(memory.stream, []).append((memory, rating))
        for stream, group in by_stream.items():
            try:
                vectors = await self.models.embed([m.text for m, _ in group], stream=stream)
            except ProviderError as exc:
                for memory, _ in group:
                    await self._failed(memory, exc, errors)
                continue
            for (memory, rating), vector in zip(group, vectors, strict=True):
                if await self.store.complete(memory.id, rating.importance, rating.source, vector):
                    await self.store.add_importance(stream, rating.importance)
                    loaded = self.index.loaded(stream)
                    if loaded is not None:
                        created = to_timestamp(memory.created_at)
                        loaded.append([memory.id], vector[None, :], [rating.importance], [created], [created])

    # -- retrieving ------------------------------------------------------------------------------

    async def retrieve(self, query: str, *, stream: str = DEFAULT_STREAM, k: int | None = None,
                       at: datetime | None = None) -> list[ScoredMemory]:
        """The top k memories for a query; their last access becomes now."""
        return await self.retriever.retrieve(query, stream=stream, k=k, at=at)

    async def explain(self, query: str, *, stream: str = DEFAULT_STREAM, k: int | None = None,
                      at: datetime | None = None) -> list[ScoredMemory]:
        """The same ranking with its score parts, touching nothing."""
        return await self.retriever.explain(query, stream=stream, k=k, at=at)

    # -- reflecting ------------------------------------------------------------------------------

    async def importance_total(self, stream: str = DEFAULT_STREAM) -> int:
        """The importance observed since the last reflection."""
        return int((await self.store.state(stream))["importance_since_reflection"])

    async def reflection_due(self, stream: str = DEFAULT_STREAM) -> bool:
        """Whether the importance total has reached the threshold."""
        return await self.importance_total(stream) >= self.config.reflection_threshold

    async def due_streams(self) -> list[str]:
        """Every stream whose importance total has reached the threshold."""
        return await self.store.due_streams(self.config.reflection_threshold)

    async def _reflect_if_due(self, streams: set[str]) -> None:
        if not self.auto_reflect:
            return
        for stream in sorted(streams):
            if await self.reflection_due(stream):
                if self.on_reflection_due is not None:
                    await self.on_reflection_due(stream)
                else:
                    await self.reflect(stream, only_if_due=True)

    async def reflect(self, stream: str = DEFAULT_STREAM, *, at: datetime | None = None,
                      only_if_due: bool = False) -> Reflection | None:
        """Reflect on a stream now (one at a time per stream); None if `only_if_due` and it is not."""
        lock = self._reflecting.setdefault(stream, asyncio.Lock())
        async with lock:
            if only_if_due and not await self.reflection_due(stream):
                return None
            try:
                result = await self.reflector.reflect(stream, at=at or self.clock.now())
            except ProviderError as exc:
                await self.store.count_skipped_reflection(stream)
                log.warning("reflection on %s failed, it will be tried again: %s", stream, exc)
                raise
            for memory in result.insights:
                loaded = self.index.loaded(stream)
                if loaded is not None:
                    vector = (await self.store.load_vector(memory.id))
                    created = to_timestamp(memory.created_at)
                    loaded.append([memory.id], vector[None, :], [memory.importance or 1], [created], [created])
            if result.insights or result.dropped:
                log.info("reflection on %s: %d insight(s), %d dropped", stream, len(result.insights),
                         len(result.dropped))
            return result

    # -- responding ------------------------------------------------------------------------------

    async def respond(self, message: str, *, stream: str = DEFAULT_STREAM, situation: str | None = None,
                      speaker: str = "Someone", at: datetime | None = None, observe_message: bool = True,
                      source: Source | None = None, reply_source: Source | None = None,
                      exclude_message: str | None = None) -> Reply:
        """Answer a message: observe it, retrieve for it, ask the agent model, observe the reply.

        The message's own memory never fills one of the k places (observed here, or already stored
        from the Discord message `exclude_message`).
        """
        when = at or self.clock.now()
        exclude: set[int] = set()
        if exclude_message is not None:
            found = await self.store.find_message(stream, exclude_message)
            if found is not None:
                exclude.add(found)
        if observe_message:
            incoming = await self.observe(f"{speaker}: {message}", stream=stream, at=when, source=source)
            exclude.add(incoming.id)
        memories = await self.retriever.retrieve(message, stream=stream, at=when, exclude=exclude)
        situation = situation or f'{speaker} says to you: "{message}"'
        prompt, text = await self.agent.act(situation=situation, memories=memories, at=when, stream=stream)
        own: Memory | None = None
        if text:
            own = await self.observe(f"{self.name}: {text}", stream=stream, at=when,
                                     source=reply_source or Source(author=self.name))
        trace = await self.store.save_trace(stream, to_timestamp(when), message, [
            {"id": m.memory.id, "score": m.score, "recency": m.recency, "importance": m.importance,
             "relevance": m.relevance, "cosine": m.cosine} for m in memories
        ], None if own is None else own.id)
        return Reply(text, prompt, memories, trace, own)

    # -- inspecting and forgetting ---------------------------------------------------------------

    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory:
        """One memory by id."""
        return await self.store.get(memory_id, stream=stream)

    async def recent(self, stream: str = DEFAULT_STREAM, limit: int = 10, offset: int = 0) -> list[Memory]:
        """The most recent memories of a stream, newest first (pending ones included)."""
        return await self.store.recent(stream, limit, offset=offset, include_pending=True)

    async def why(self, memory_id: int, *, stream: str | None = None) -> EvidenceNode:
        """The evidence tree of a memory, down to observations."""
        return await self.store.evidence_tree(memory_id, stream=stream)

    async def forget(self, ids: Sequence[int], *, stream: str | None = None) -> list[int]:
        """Delete memories, and every reflection built on them; returns every id deleted."""
        if stream is not None:
            for memory_id in ids:
                await self.store.get(memory_id, stream=stream)
        deleted = await self.store.delete(ids)
        self.index.remove(deleted)
        return deleted

    async def forget_messages(self, message_ids: Sequence[str]) -> list[int]:
        """Delete the memories made from these Discord messages (and reflections built on them)."""
        return await self.forget(await self.store.by_message(list(message_ids)))

    async def forget_author(self, stream: str, author_id: str) -> list[int]:
        """Delete every observation made from one author's messages in a stream."""
        return await self.forget(await self.store.by_author(stream, author_id))

    async def purge(self, stream: str) -> int:
        """Delete a whole stream."""
        self.index.drop(stream)
        return await self.store.purge_stream(stream)

    async def edit_message(self, stream: str, message_id: str, text: str) -> Memory | None:
        """Replace the text (and embedding) of the observation made from an edited message."""
        memory_id = await self.store.find_message(stream, message_id)
        if memory_id is None:
            return None
        vector = (await self.models.embed([text], stream=stream))[0]
        await self.store.update_text(memory_id, text, vector)
        loaded = self.index.loaded(stream)
        if loaded is not None:
            loaded.update(memory_id, vector)
        return await self.store.get(memory_id)

    async def link_reply(self, reply: Reply, message_ids: Sequence[str]) -> None:
        """Remember which Discord messages carried a reply, so each can be explained later."""
        own = None if reply.memory is None else reply.memory.id
        await self.store.link_reply(reply.trace_id, list(message_ids), own)

    async def explain_reply(self, *, message_id: str | None = None, trace_id: int | None = None,
                            stream: str | None = None) -> ExplainedReply | None:
        """What a reply was built from: its trace and each memory (None where since forgotten)."""
        trace = await self.store.trace(trace_id=trace_id, message_id=message_id)
        if trace is None or (stream is not None and trace["stream"] != stream):
            return None
        found = await self.store.get_many([item["id"] for item in trace["items"]])
        return trace, [(item, found.get(item["id"])) for item in trace["items"]]

    async def stats(self, stream: str | None = None) -> dict[str, Any]:
        """Counts, importance histogram, fallbacks, the total towards the next reflection, model calls."""
        out = await self.store.counts(stream)
        out["usage"] = await self.store.usage(stream)
        if stream is not None:
            state = await self.store.state(stream)
            out["importance_since_reflection"] = state["importance_since_reflection"]
            out["reflection_threshold"] = self.config.reflection_threshold
            last = state["last_reflection_at"]
            out["last_reflection_at"] = None if last is None else last.astimezone(UTC).isoformat()
            out["reflections_run"] = state["reflections"]
            out["reflections_skipped"] = state["skipped_reflections"]
        return out
