"""Shared fixtures: fakes passed through constructors, a store on a temporary file, a fake OpenAI server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from memstream.config import StreamConfig
from memstream.embed import Embedder
from memstream.models import RoleModel
from memstream.store import Store
from memstream.stream import MemoryStream
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.fakes.openai_server import FakeOpenAIServer

AGENT_NAME = "Maria"
AGENT_SUMMARY = "Maria Lopez is a student who lives in Smallville and loves painting."

MakeMemory = Callable[..., MemoryStream]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
def chat() -> ScriptedChat:
    return ScriptedChat()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(tmp_path / "memory.db")
    yield opened
    await opened.close()


@pytest.fixture
def make_memory(store: Store, embedder: FakeEmbedder, chat: ScriptedChat, clock: FakeClock) -> MakeMemory:
    """Build a MemoryStream over the `store` fixture; keywords override the fakes and the config."""

    def make(*, embedder: Embedder = embedder, chat: ScriptedChat = chat, config: StreamConfig | None = None,
             **options: Any) -> MemoryStream:
        options.setdefault("clock", clock)
        return MemoryStream(
            store, embedder,
            rater=RoleModel(chat, "rater-model"), reflector=RoleModel(chat, "reflector-model"),
            agent=RoleModel(chat, "agent-model"), name=AGENT_NAME, summary=AGENT_SUMMARY,
            config=config or StreamConfig(), **options,
        )

    return make


@pytest.fixture
def memory(make_memory: MakeMemory) -> MemoryStream:
    return make_memory()


@pytest.fixture
async def openai_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(embed_dim=64) as server:
        yield server
