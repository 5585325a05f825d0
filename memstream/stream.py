"""MemoryStream: observe, retrieve, reflect, respond, explain and forget, over one persona's store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn
from zoneinfo import ZoneInfo

from memstream.agent import Agent
from memstream.calibration import rater_check
from memstream.clock import Clock, SystemClock, to_timestamp
from memstream.config import BudgetConfig, PersonaConfig, StreamConfig
from memstream.errors import BudgetSpent, ConfigError, ProviderError
from memstream.index.retriever import Retriever, RetrieverLike
from memstream.index.vector_index import VectorIndex
from memstream.ingest import Ingest
from memstream.models.connect import connect_models
from memstream.models.embed import Embedder
from memstream.models.llm import ChatModel, OpenAIChat
from memstream.models.roles import Models, RoleModel
from memstream.rate import Rater
from memstream.records import (
    DEFAULT_STREAM,
    EvidenceNode,
    ExplainedReply,
    Memory,
    Observation,
    RaterCheck,
    ScoredMemory,
    Source,
    Stats,
    TraceItem,
    storable_id,
)
from memstream.reflect import Reflection, Reflector
from memstream.replying import Reply, ReplyDraft
from memstream.store import NewTrace, Store
from memstream.text import check_text

__all__ = ["DEFAULT_STREAM", "MemoryStream", "Observation", "Reply", "ReplyDraft"]

log = logging.getLogger("memstream")
ReflectionHook = Callable[[str], Awaitable[None]]


def _silent(step: str) -> None:
    return None


def _raise_kept(memory: Memory, error: ProviderError) -> NoReturn:
    """The model failure that left `memory` pending, saying that it is kept."""
    again = "" if memory.source.message_id else "; observing the same text again completes it"
    message = f"{error} (memory #{memory.id} is kept and will be completed later{again})"
    if isinstance(error, BudgetSpent):
        raise BudgetSpent(message, role=error.role, until=error.until) from error
    raise type(error)(message, retryable=error.retryable) from error


class MemoryStream:
    """One persona's memory: every stream of its store, its models, its clock."""

    def __init__(self, store: Store, embedder: Embedder, *, rater: RoleModel, reflector: RoleModel,
                 agent: RoleModel, name: str, summary: str, config: StreamConfig | None = None,
                 clock: Clock | None = None, tz: ZoneInfo | None = None,
                 retriever: RetrieverLike | None = None, on_reflection_due: ReflectionHook | None = None,
                 auto_reflect: bool = True, budget: BudgetConfig | None = None) -> None:
        self.store, self.name, self.summary = store, name, summary
        self.config = config or StreamConfig()
        self.clock: Clock = clock or SystemClock()
        self.tz = tz or ZoneInfo("UTC")
        self.models = Models(store, embedder, rater=rater, reflector=reflector, agent=agent, budget=budget)
        self.index = VectorIndex.for_config(store, self.config)
        self.retriever = Retriever(store, self.index, self.models, self.config, self.clock)
        self.rater = Rater(self.models, agent_name=name, faults=store)
        self.ingest = Ingest(store, self.models, self.rater, self.config, self.clock)
        self.reflector = Reflector(store, self.models, retriever or self.retriever, self.config, agent_name=name)
        self.agent = Agent(self.models, name=name, summary=summary, tz=self.tz)
        self.on_reflection_due = on_reflection_due
        self.auto_reflect = auto_reflect
        self._reflecting: dict[str, asyncio.Lock] = {}
        # False after a deletion whose old copies another reader kept in the store's log (Store.scrub).
        self.scrubbed = True
        self._closers: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def open(cls, persona: PersonaConfig, *, clock: Clock | None = None, embedder: Embedder | None = None,
                   chat: ChatModel | None = None, environ: Mapping[str, str] | None = None,
                   **options: Any) -> MemoryStream:
        """Open a persona's store and connect its models (OpenAI-compatible unless fakes are given)."""
        client = None
        rater = chat
        if chat is None or embedder is None:
            made_chat, made_embedder, client = connect_models(persona, environ)
            chat, embedder = chat or made_chat, embedder or made_embedder
            if rater is None and persona.models.rater_extra_body and client is not None:
                rater = OpenAIChat(client, extra_body=persona.models.rater_extra_body)
        try:
            store = await Store.open(persona.database)
            store.use_embedding_model(persona.models.embedding)  # the store refuses to mix two models' vectors
        except BaseException:
            if client is not None:
                await client.close()
            raise
        m = persona.models
        memory = cls(store, embedder, rater=RoleModel(rater or chat, m.rater), reflector=RoleModel(chat, m.reflector),
                     agent=RoleModel(chat, m.agent), name=persona.name, summary=persona.summary,
                     config=persona.memory, clock=clock, tz=persona.tz, budget=persona.budget, **options)
        if client is not None:
            memory._closers.append(client.close)
        return memory

    async def close(self) -> None:
        """Close the store and the model clients this stream opened."""
        for close in self._closers:
            await close()
        self._closers.clear()
        self.index.close()
        await self.store.close()

    async def __aenter__(self) -> MemoryStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def now(self) -> datetime:
        """The clock's time."""
        return self.clock.now()

    @property
    def last_model_error(self) -> ProviderError | None:
        """The last model failure that left a memory pending (why something is pending, for the operator)."""
        return self.ingest.last_model_error

    # -- observing -------------------------------------------------------------------------------

    async def observe(self, text: str, *, stream: str = DEFAULT_STREAM, at: datetime | None = None,
                      importance: int | None = None, source: Source | None = None) -> Memory:
        """Rate, embed and append one observation. On a model failure it is kept as pending and the
        ProviderError is raised; `complete_pending` finishes it later."""
        [memory], errors = await self._observe([Observation(text, stream, at, importance, source or Source())])
        if memory.status == "pending" and errors:
            _raise_kept(memory, errors[0])
        return memory

    async def observe_many(self, items: Sequence[Observation], *, defer: bool = False) -> list[Memory]:
        """Observe a burst: persisted first, rated concurrently (bounded), embedded in batches.

        A memory whose model calls failed comes back with status `pending`; nothing is lost.
        A message id already stored in the stream is not stored twice. With `defer`, the burst is only
        persisted (pending, no model call): `complete` or `complete_pending` finishes it.
        """
        memories, _ = await self._observe(items, defer=defer)
        return memories

    async def complete(self, ids: Sequence[int]) -> int:
        """Rate and embed these pending memories now (a deferred burst); returns how many are ready."""
        await self.ingest.complete(ids)
        done = [m for m in (await self.store.get_many(list(ids))).values() if m.status == "ready"]
        await self._reflect_if_due({m.stream for m in done})
        return len(done)

    async def _observe(self, items: Sequence[Observation], *,
                       defer: bool = False) -> tuple[list[Memory], list[ProviderError]]:
        added = await self.ingest.add(items, defer=defer)
        if not defer:
            await self._reflect_if_due({m.stream for m in added.fresh})
        return added.memories, added.errors

    async def complete_pending(self, limit: int = 1000, *, due_only: bool = False,
                               streams: Sequence[str] | None = None) -> int:
        """Finish observations left pending by a model outage or a crash; returns how many are done.

        With `due_only`, only those whose retry is due (store.retry_delay: a backoff per memory, which
        the bot's periodic check respects; at start it tries them all); with `streams`, only those of
        these streams (a process of a sharded bot completes its own).
        """
        pending = await self.ingest.pending(limit, due_only=due_only, streams=streams)
        await self.ingest.complete([m.id for m in pending])
        done = await self.store.get_many([m.id for m in pending])
        finished = [m for m in done.values() if m.status == "ready"]
        await self._reflect_if_due({m.stream for m in finished})
        return len(finished)

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
        return (await self.store.state(stream)).importance_since_reflection

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
        """Reflect on a stream now (one at a time per stream, across every process sharing the store); None if
        `only_if_due` and it is not, or if another process is reflecting on it right now."""
        lock = self._reflecting.setdefault(stream, asyncio.Lock())
        async with lock, self.store.reflection_claim(stream) as claimed:
            # Checked once the claim is held: a reflection another process just saved has reset the total.
            if not claimed or (only_if_due and not await self.reflection_due(stream)):
                return None
            try:  # a spent budget: not tried (nor counted as skipped) until it renews; the total stays due
                await self.models.check_budget("reflector", "embedding")
            except BudgetSpent as exc:
                if only_if_due:
                    log.info("reflection on %s waits: %s", stream, exc)
                    return None
                raise
            # Its retrievals' touches are committed with the insights, or not at all (the index hears of
            # both from the store, after that commit).
            try:
                result = await self.reflector.reflect(stream, at=at or self.clock.now())
            except ProviderError as exc:
                await self.store.count_skipped_reflection(stream)
                log.warning("reflection on %s failed, it will be tried again: %s", stream, exc)
                raise
            if result.insights or result.dropped:
                log.info("reflection on %s: %d insight(s), %d dropped", stream, len(result.insights),
                         len(result.dropped))
            return result

    # -- responding ------------------------------------------------------------------------------

    async def respond(self, message: str, *, stream: str = DEFAULT_STREAM, situation: str | None = None,
                      speaker: str = "Someone", at: datetime | None = None, observe_message: bool = True,
                      source: Source | None = None, reply_source: Source | None = None,
                      exclude_message: str | None = None, defer_reply: bool = False,
                      on_step: Callable[[str], None] | None = None) -> Reply:
        """Answer a message: observe it, retrieve for it, ask the agent model, remember the reply.

        The reply is stored at once, as a pending memory, with the trace of what it was built from; then it is
        rated and embedded like any observation (a model failure leaves it pending, retried later: the answer
        is never lost to it). With `defer_reply` that second step is the caller's, after the reply is out:
        `reply_sent` (or `reply_unsent` if it could not be delivered), so a reply waits for no model call but
        the agent's. The message's own memory never fills one of the k places (observed here, or already
        stored from the Discord message `exclude_message`). `on_step` hears each step as it starts
        ("observing", "retrieving", "answering"), for whoever shows the wait. `start_reply` is the same,
        the reply shown as it is written.
        """
        draft = await self.start_reply(message, stream=stream, situation=situation, speaker=speaker, at=at,
                                       observe_message=observe_message, source=source, reply_source=reply_source,
                                       exclude_message=exclude_message, on_step=on_step, streamed=False)
        async for _ in draft.deltas():
            pass
        reply = await draft.finish()
        if not defer_reply:
            await self.reply_sent(reply, [])
        return reply

    async def start_reply(self, message: str, *, stream: str = DEFAULT_STREAM, situation: str | None = None,
                          speaker: str = "Someone", at: datetime | None = None, observe_message: bool = True,
                          source: Source | None = None, reply_source: Source | None = None,
                          exclude_message: str | None = None, on_step: Callable[[str], None] | None = None,
                          streamed: bool = True) -> ReplyDraft:
        """`respond`, the reply streamed: the message observed and the memories retrieved, a draft whose
        `deltas` are the agent model's text as it comes (one piece from a model that does not stream, or
        unless `streamed`) and whose `finish(shown)` stores what was shown, and the trace, in one
        transaction; then `reply_sent` (or `reply_unsent`) as after `respond(defer_reply=True)`."""
        step = on_step or _silent
        when = at or self.clock.now()
        exclude: set[int] = set()
        incoming: Memory | None = None
        if exclude_message is not None:
            found = await self.store.find_message(stream, exclude_message)
            if found is not None:
                exclude.add(found)
        if observe_message:
            step("observing")
            [incoming], errors = await self._observe([Observation(f"{speaker}: {message}", stream, when, None,
                                                                  source or Source())])
            exclude.add(incoming.id)
            if incoming.status == "pending" and errors and not isinstance(errors[0], BudgetSpent):
                _raise_kept(incoming, errors[0])  # a spent rater budget keeps it pending, and the reply goes on
        # A spent agent (or embedding) budget: no reply, and no call made for one (BudgetSpent).
        await self.models.check_budget("embedding", "agent")
        step("retrieving")
        memories = await self.retriever.retrieve(message, stream=stream, at=when, exclude=exclude)
        step("answering")
        prompt = self.agent.render(situation=situation or f'{speaker} says to you: "{message}"', memories=memories,
                                   at=when)
        asked = source or Source()

        async def save(text: str, cut: bool) -> Reply:
            own: Memory | None = None
            # The reply's memory (pending) and its trace: both or neither.
            async with self.ingest.persisting, self.store.transaction():
                if text:
                    [(own_id, _)] = await self.ingest.persist([Observation(
                        f"{self.name}: {text}", stream, when, None, reply_source or Source(author=self.name))])
                    own = await self.store.get(own_id)
                trace = await self.store.save_trace(NewTrace(
                    stream, to_timestamp(when), message, tuple(TraceItem.of(m) for m in memories),
                    None if own is None else own.id, query_memory_id=None if incoming is None else incoming.id,
                    query_message_id=asked.message_id or exclude_message, query_author_id=asked.author_id))
            return Reply(text, prompt, memories, trace, own, cut)

        return ReplyDraft(self.agent.speak(prompt, stream=stream, streamed=streamed), save, prompt=prompt,
                          memories=memories)

    async def reply_sent(self, reply: Reply, message_ids: Sequence[str]) -> None:
        """The reply is out (as these Discord messages, if any): link them, then rate and embed its memory
        (a model failure leaves it pending and retried, with a warning)."""
        if message_ids:
            await self.link_reply(reply, message_ids)
        if reply.memory is not None and reply.memory.status == "pending":
            await self.complete([reply.memory.id])

    async def reply_unsent(self, reply: Reply) -> None:
        """The reply could not be delivered: nobody saw it, so the persona does not remember saying it."""
        if reply.memory is not None:
            await self.forget([reply.memory.id])
        await self.store.delete_trace(reply.trace_id)

    # -- inspecting and forgetting ---------------------------------------------------------------

    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory:
        """One memory by id."""
        return await self.store.get(storable_id(memory_id), stream=stream)

    async def recent(self, stream: str = DEFAULT_STREAM, limit: int = 10, offset: int = 0) -> list[Memory]:
        """The most recent memories of a stream, newest first (pending ones included)."""
        return await self.store.recent(stream, limit, offset=offset, include_pending=True)

    async def get_many(self, ids: Sequence[int]) -> dict[int, Memory]:
        """Memories by id (missing ones left out)."""
        return await self.store.get_many(ids)

    async def streams(self) -> list[str]:
        """Every stream key in the store."""
        return await self.store.streams()

    async def by_number(self, stream: str, number: int) -> int:
        """The id of the memory a stream shows as #number (MemoryNotFound if there is none)."""
        return await self.store.by_number(stream, storable_id(number, f" in stream {stream!r}"))

    async def by_author(self, stream: str, author_id: str) -> list[int]:
        """Ids of the observations made from one author's messages in a stream."""
        return await self.store.by_author(stream, author_id)

    async def author_memories(self, author_id: str, *, stream: str | None = None) -> list[Memory]:
        """One author's observations, oldest first: in one stream, or in every one (a data-access request)."""
        return await self.store.author_memories(author_id, stream=stream)

    async def why(self, memory_id: int, *, stream: str | None = None) -> EvidenceNode:
        """The evidence tree of a memory, down to observations."""
        return await self.store.evidence_tree(storable_id(memory_id), stream=stream)

    async def forget(self, ids: Sequence[int], *, stream: str | None = None, messages: Sequence[str] = (),
                     author: tuple[str, str] | None = None) -> list[int]:
        """Delete memories, every reflection built on them and every reply (with its trace) answering them,
        leaving no copy of their text in the file; returns every id deleted. `messages` and `author`
        (stream, author id) also delete the traces that answered those messages or that author."""
        for memory_id in ids if stream is not None else ():
            await self.get(memory_id, stream=stream)
        deleted = await self.store.delete([storable_id(i) for i in ids], messages=messages, author=author)
        self.scrubbed = await self.store.scrub()
        return deleted

    async def forget_messages(self, message_ids: Sequence[str]) -> list[int]:
        """Delete the memories made from these Discord messages (and reflections built on them)."""
        return await self.forget(await self.store.by_message(list(message_ids)), messages=message_ids)

    async def forget_author(self, stream: str, author_id: str) -> list[int]:
        """Delete every observation made from one author's messages in a stream."""
        return await self.forget(await self.store.by_author(stream, author_id), author=(stream, author_id))

    async def purge(self, stream: str) -> int:
        """Delete a whole stream."""
        removed = await self.store.purge_stream(stream)
        self.scrubbed = await self.store.scrub()
        return removed

    async def edit_message(self, stream: str, message_id: str, text: str) -> Memory | None:
        """Replace the text of the observation made from an edited message. The old text is kept nowhere: one
        transaction forgets the insights and replies drawn from it (and the traces quoting it) and gives the
        memory its new text, pending again (out of retrieval until embedded), so the edit is never lost; the
        old text is then scrubbed from the files, and the new one embedded now if the models answer, else by
        the retries of pending memories (`complete_pending`). The memory as it is afterwards (pending if
        the models failed), None if no memory was made from the message. Text that cannot be stored (empty, or
        not valid text) is ConfigError, before anything is written."""
        _check_edit(text)
        async with self.store.transaction():
            memory_id = await self.store.find_message(stream, message_id)
            keep = [] if memory_id is None else [memory_id]
            await self.store.delete(keep, messages=[message_id], keep=keep)
            if memory_id is not None:
                await self.store.update_text(memory_id, text)
        self.scrubbed = await self.store.scrub()  # the text before the edit is gone from the file too
        if memory_id is None:
            return None
        await self.complete([memory_id])  # a model failure is counted as an attempt and retried with backoff
        return (await self.store.get_many([memory_id])).get(memory_id)

    async def link_reply(self, reply: Reply, message_ids: Sequence[str]) -> None:
        """Remember which Discord messages carried a reply, so each can be explained later."""
        own = None if reply.memory is None else reply.memory.id
        await self.store.link_reply(reply.trace_id, list(message_ids), own)

    async def explain_reply(self, *, message_id: str | None = None, trace_id: int | None = None,
                            stream: str | None = None) -> ExplainedReply | None:
        """What a reply was built from: its trace and each memory (None where since forgotten)."""
        trace = await self.store.trace(trace_id=trace_id, message_id=message_id)
        if trace is None or (stream is not None and trace.stream != stream):
            return None
        found = await self.store.get_many([item.memory_id for item in trace.items])
        return ExplainedReply(trace, tuple((item, found.get(item.memory_id)) for item in trace.items))

    async def stats(self, stream: str | None = None) -> Stats:
        """Counts, importance histogram, fallbacks, the total towards the next reflection, model calls (of one
        stream, with its reflection progress, or of every stream)."""
        store = self.store
        return Stats(counts=await store.counts(stream), pending=await store.pending_state(stream),
                     usage=await store.usage(stream), faults=await store.faults(stream),
                     retries=await store.retries(stream), reflection_threshold=self.config.reflection_threshold,
                     state=None if stream is None else await store.state(stream),
                     rater=await self.rater_check(stream), budget=await self.models.budget_lines(),
                     resident=self.index.resident.stats())

    async def rater_check(self, stream: str | None = None) -> RaterCheck | None:
        """The rater's latest ratings (of one stream, or of all) against the flat-rater rule
        (memstream.calibration); None when the alarm is off (`rater_alarm_window = 0`)."""
        window = self.config.rater_alarm_window
        return rater_check(await self.store.recent_ratings(stream, window), window) if window else None


def _check_edit(text: str) -> None:
    """An edited message's text, refused as an observation's would be (ConfigError): never stored, never retried."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("an edited message needs some text: it is empty or only white space (delete it instead)")
    try:
        check_text(text, "edited text")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
