"""Shared fixtures: fakes passed through constructors, a store on each backend (a temporary SQLite file, a fresh
PostgreSQL database), a fake OpenAI server.

A test that uses `store` (or `memory`, `make_memory`, `database`) runs once per backend: [sqlite] and
[postgres]. A test about SQLite's file itself is marked `sqlite_only`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memstream.config import StreamConfig
from memstream.models.embed import Embedder
from memstream.models.roles import RoleModel
from memstream.store import Store
from memstream.stream import MemoryStream
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests import postgres
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


BACKENDS = ("sqlite", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: a test of SQLite's file itself (not run on PostgreSQL)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("backend", ("sqlite",) if only else BACKENDS)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The maintenance URL of a PostgreSQL server with pgvector and a template holding memstream's schema."""
    with postgres.server() as admin:
        postgres.make_template(admin)
        yield admin


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh database of its own for one test."""
    url = postgres.create(postgres_server)
    yield url
    postgres.drop(postgres_server, url)


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Path | str:
    """Where a test's store lives: a SQLite file's path, or a PostgreSQL database's URL."""
    if backend == "sqlite":
        return tmp_path / "memory.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def store(database: Path | str) -> AsyncIterator[Store]:
    opened = await Store.open(database)
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
