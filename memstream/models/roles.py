"""The model roles (rater, reflector, agent, embedding) behind one metered door, which a daily budget can close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from memstream.config import BudgetConfig
from memstream.errors import EmbeddingError, ProviderError
from memstream.models.budget import Budget
from memstream.models.embed import Embedder, RetryMeter, TokenMeter, normalize_rows
from memstream.models.llm import ChatModel, Completion, StreamingChatModel, call_count
from memstream.records import RoleBudget, RoleUsage
from memstream.store import Store, UsageRow
from memstream.store.policy import bounded_count

__all__ = ["ROLES", "Models", "RoleModel"]

log = logging.getLogger("memstream.models.roles")
ROLES = ("rater", "reflector", "agent")
_deferred: ContextVar[bool] = ContextVar("memstream_deferred_usage", default=False)


@dataclass(frozen=True)
class RoleModel:
    """A chat model and the model name to ask it for."""

    chat: ChatModel
    model: str


class Models:
    """Calls the models of each role and counts calls, failures and tokens per stream in the store."""

    def __init__(self, store: Store, embedder: Embedder, *, rater: RoleModel, reflector: RoleModel,
                 agent: RoleModel, budget: BudgetConfig | None = None) -> None:
        self.store, self.embedder = store, embedder
        self.roles = {"rater": rater, "reflector": reflector, "agent": agent}
        self.budget = Budget(budget or BudgetConfig(), store)
        self._usage: dict[tuple[str, str], list[int]] = {}
        self._in_flight: dict[str, int] = {}  # calls made and not yet counted, by role (the budget counts them)
        self._writing: dict[int, list[UsageRow]] = {}  # counts being written (usage_to_write), counted too
        self._admitting = asyncio.Lock()  # a budget's check and the call's place in flight: one step
        self._dimensions: int | None = None  # the store's embedding size, once it has one

    async def complete(self, role: str, prompt: str, *, stream: str) -> str:
        """Ask the model of `role`; ProviderError on failure (counted), BudgetSpent (no call) when the role's
        daily budget is spent."""
        target = self.roles[role]
        async with self._call(role):
            try:
                result = await target.chat.complete(prompt, model=target.model)
            except ProviderError:
                await self._count(stream, role, failures=1)
                raise
            await self._count(stream, role, prompt_tokens=result.prompt_tokens,
                              completion_tokens=result.completion_tokens, retries=result.retries)
        return result.text

    async def stream(self, role: str, prompt: str, *, stream: str) -> AsyncGenerator[str, None]:
        """Ask the model of `role`, its reply's text as it comes (one piece from a model that does not stream);
        counted once it ends. A ProviderError after some text: the reply broke off there (counted a failure).
        BudgetSpent before anything is asked when the role's daily budget is spent."""
        target = self.roles[role]
        if not isinstance(target.chat, StreamingChatModel):
            yield await self.complete(role, prompt, stream=stream)
            return
        done: Completion | None = None
        failed = False
        async with self._call(role):
            try:
                async with contextlib.aclosing(target.chat.stream(prompt, model=target.model)) as items:
                    async for item in items:
                        if isinstance(item, Completion):
                            done = item
                        elif item:
                            yield item
            except ProviderError:
                failed = True
                await self._count(stream, role, failures=1)
                raise
            finally:
                if done is None and not failed:  # the reader left before the end: a call all the same, written
                    self._add(stream, role, (1, 0, 0, 0, 0))  # with the next counts (no await while it leaves)
            if done is not None:
                await self._count(stream, role, prompt_tokens=done.prompt_tokens,
                                  completion_tokens=done.completion_tokens, retries=done.retries)

    # -- budget ------------------------------------------------------------------------------------

    async def check_budget(self, *roles: str) -> None:
        """BudgetSpent when the daily budget of one of `roles` is spent (counting this process's calls not yet
        written and in flight)."""
        if self.budget.enabled:
            await self.budget.check(roles, self.unwritten())

    async def budget_lines(self) -> tuple[RoleBudget, ...]:
        """Each limited role's spend today against its budget (empty when the budget is off)."""
        return await self.budget.lines(self.unwritten()) if self.budget.enabled else ()

    def unwritten(self) -> dict[str, RoleUsage]:
        """Per role, the calls and tokens counted here and not yet in the store, and the calls in flight."""
        out: dict[str, RoleUsage] = {role: RoleUsage(calls=n) for role, n in self._in_flight.items() if n}
        rows: list[tuple[str, Sequence[int]]] = [(role, counts) for (_, role), counts in self._usage.items()]
        rows += [(row[1], row[2:]) for taken in self._writing.values() for row in taken]
        for role, (calls, failures, prompt, completion, *_) in rows:
            had = out.get(role, RoleUsage())
            out[role] = RoleUsage(had.calls + calls, had.failures + failures, had.prompt_tokens + prompt,
                                  had.completion_tokens + completion)
        return out

    @contextlib.asynccontextmanager
    async def _call(self, role: str) -> AsyncIterator[None]:
        """One call of `role`: refused when its budget is spent, else in flight until counted (a burst's
        concurrent calls are checked one after another, each counting those admitted before it)."""
        if self.budget.config.limit(role) is not None:
            async with self._admitting:
                await self.check_budget(role)
                self._in_flight[role] = self._in_flight.get(role, 0) + 1
        else:
            self._in_flight[role] = self._in_flight.get(role, 0) + 1
        try:
            yield
        finally:
            self._in_flight[role] -= 1

    # -- usage -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def deferred_usage(self) -> Iterator[None]:
        """Inside this block (this task and the tasks it starts) calls are counted in memory only: a write
        takes them with `take_usage` into its own transaction, and `flush_usage` writes the rest.

        A burst of thousands of observations then costs one usage write per batch, not one per call.
        """
        token = _deferred.set(True)
        try:
            yield
        finally:
            _deferred.reset(token)

    async def _count(self, stream: str, role: str, *, failures: int = 0, prompt_tokens: int = 0,
                     completion_tokens: int = 0, retries: int = 0) -> None:
        # Every model (a plugin's too) comes through here: what it reports is bounded per call.
        counts = (1, failures, *(call_count(n) for n in (prompt_tokens, completion_tokens, retries)))
        self._add(stream, role, counts)
        if not _deferred.get():
            await self.flush_usage()

    @contextlib.contextmanager
    def usage_to_write(self) -> Iterator[list[UsageRow]]:
        """The calls counted and not yet written, for the caller to write in the block (put back if the block
        fails). Until the block ends they still count toward the daily budget: no call slips in meanwhile."""
        rows = self.take_usage()
        self._writing[id(rows)] = rows
        try:
            yield rows
        except BaseException:
            self.restore_usage(rows)
            raise
        finally:
            del self._writing[id(rows)]

    def take_usage(self) -> list[UsageRow]:
        """The calls counted and not yet written (they are then the caller's to write)."""
        rows = [(stream, role, c[0], c[1], c[2], c[3], c[4]) for (stream, role), c in self._usage.items()]
        self._usage = {}
        return rows

    def restore_usage(self, rows: Sequence[UsageRow]) -> None:
        """Put back counts taken by a write that failed."""
        for stream, role, *counts in rows:
            self._add(stream, role, counts)

    def _add(self, stream: str, role: str, counts: Sequence[int]) -> None:
        """Add to the counts not yet written, each staying a count the store can hold (COUNT_CEILING)."""
        row = self._usage.setdefault((stream, role), [0, 0, 0, 0, 0])
        for i, value in enumerate(counts):
            row[i] = bounded_count(row[i] + bounded_count(value))

    async def flush_usage(self) -> None:
        """Write every count not yet written."""
        with self.usage_to_write() as rows:
            await self.store.record_usage_many(rows)

    async def embed(self, texts: Sequence[str], *, stream: str, any_size: bool = False) -> npt.NDArray[np.float32]:
        """Unit-length embeddings for `texts`, in one call to the embedder (BudgetSpent, no call, when the
        embedding budget is spent). A model server's vectors are untrusted input: the wrong count or shape, NaN,
        or a size other than the store's (unless `any_size`: a re-embedding into another model) is
        EmbeddingError, a failed call, never written."""
        async with self._call("embedding"):
            try:
                vectors = await self.embedder.embed_batch(list(texts))
                matrix = np.asarray(vectors, dtype=np.float32)
                if matrix.ndim != 2 or matrix.shape[0] != len(texts) or matrix.shape[1] == 0:
                    raise EmbeddingError(f"the embedder returned shape {matrix.shape} for {len(texts)} texts")
                if not np.isfinite(matrix).all():
                    raise EmbeddingError("the embedder returned NaN or infinite values")
                if not any_size:
                    await self._sized(matrix)
            except ProviderError:
                await self._count(stream, "embedding", failures=1)
                raise
            tokens = self.embedder.take_tokens() if isinstance(self.embedder, TokenMeter) else 0
            retries = self.embedder.take_retries() if isinstance(self.embedder, RetryMeter) else 0
            await self._count(stream, "embedding", prompt_tokens=tokens, retries=retries)
        return normalize_rows(matrix)

    async def _sized(self, matrix: npt.NDArray[np.float32]) -> None:
        """EmbeddingError unless the vectors have the store's size (any size while the store has none yet)."""
        if self._dimensions is None:
            known = await self.store.get_meta("embedding_dimensions")
            if known is None:
                return
            self._dimensions = int(known)  # a store's size changes only by a re-embedding, in its own process
        if matrix.shape[1] != self._dimensions:
            raise EmbeddingError(f"the embedding model answered with vectors of {matrix.shape[1]} dimensions, the "
                                 f"store's have {self._dimensions}; the answer is not used")
