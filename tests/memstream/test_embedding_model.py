"""Issue 30, case 6: the store knows which model made its vectors, refuses to mix two models' (a write and a
query alike, naming both), `doctor` fails on it, and `memstream reembed` is the way out (resumable)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memstream import MemoryStream, ModelConfig, PersonaConfig
from memstream.cli import main
from memstream.errors import StoreError
from memstream.store import Store
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat, hash_embedding
from tests.fakes.openai_server import FakeOpenAIServer

T0 = datetime(2024, 2, 13, 9, 0, tzinfo=UTC)


def _persona(database: Path | str, model: str) -> PersonaConfig:
    return PersonaConfig(name="Ada", summary="Ada keeps the lighthouse.", database=database,
                         models=ModelConfig(embedding=model))


async def _open(database: Path | str, model: str, embedder: FakeEmbedder | None = None) -> MemoryStream:
    return await MemoryStream.open(_persona(database, model), embedder=embedder or FakeEmbedder(),
                                   chat=ScriptedChat(), clock=FakeClock())


async def test_another_models_vectors_are_refused(database: Path | str) -> None:
    async with await _open(database, "emb-a") as memory:
        await memory.observe("Ada lights the lamp", importance=5, at=T0)
        assert await memory.store.get_meta("embedding_model") == "emb-a"  # the first embedding records it
    embedder = FakeEmbedder()
    async with await _open(database, "emb-b", embedder) as memory:
        with pytest.raises(StoreError) as write:
            await memory.observe("Ada trims the wick", importance=5, at=T0)
        with pytest.raises(StoreError) as query:
            await memory.retrieve("the lamp")
        with pytest.raises(StoreError):
            await memory.explain("the lamp")
        assert embedder.calls == []  # refused before any model call
        for refused in (write, query):
            assert "'emb-a'" in str(refused.value) and "'emb-b'" in str(refused.value)
            assert "memstream reembed" in str(refused.value)
        kept = await memory.recent(limit=5)
        assert [(m.text, m.status) for m in kept] == [("Ada trims the wick", "pending"),
                                                       ("Ada lights the lamp", "ready")]  # nothing lost
        assert await memory.store.get_meta("embedding_model") == "emb-a"


async def test_an_older_store_adopts_the_model_at_its_first_write(database: Path | str) -> None:
    store = await Store.open(database)
    await store.set_meta("embedding_dimensions", "64")  # an older store: vectors, no model recorded
    await store.close()
    async with await _open(database, "emb-a") as memory:
        assert await memory.retrieve("anything") == []  # nothing recorded: nothing to refuse
        await memory.observe("Ada lights the lamp", importance=5, at=T0)
        assert await memory.store.get_meta("embedding_model") == "emb-a"


# -- the way out: memstream reembed ---------------------------------------------------------------------------


@pytest.fixture
async def server() -> FakeOpenAIServer:
    async with FakeOpenAIServer(embed_dim=64) as running:
        running.models = ["gpt-fake", "emb-a", "emb-b"]
        yield running  # type: ignore[misc]


def _write(path: Path, database: Path | str, base_url: str, model: str) -> str:
    path.write_text(f'[persona]\nname = "Ada"\nsummary = "Ada keeps the lighthouse."\ndatabase = "{database}"\n'
                    f'[models]\nbase_url = "{base_url}"\nmax_retries = 0\nrater = "gpt-fake"\nreflector = "gpt-fake"\n'
                    f'agent = "gpt-fake"\nembedding = "{model}"\n', encoding="utf-8")
    return str(path)


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def _model_of(database: Path | str) -> str | None:
    store = await Store.open(database)
    try:
        return await store.get_meta("embedding_model")
    finally:
        await store.close()


async def test_reembed_restores_service(database: Path | str, tmp_path: Path, server: FakeOpenAIServer,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    persona = _write(tmp_path / "ada.toml", database, server.base_url, "emb-a")
    for i, stream in enumerate(("guild:1", "guild:1", "guild:1", "guild:2")):
        assert await _cli("observe", f"Ada lights lamp number {i}", "--importance", "5", "--stream", stream,
                          "--persona", persona) == 0
    persona = _write(tmp_path / "ada.toml", database, server.base_url, "emb-b")
    capsys.readouterr()
    assert await _cli("recall", "lamp", "--stream", "guild:1", "--persona", persona) != 0
    err = capsys.readouterr().err
    assert "'emb-a'" in err and "'emb-b'" in err and "memstream reembed" in err
    assert await _cli("doctor", "--persona", persona) == 1
    failed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("fail") and "embedded by" in x]
    assert len(failed) == 1 and "made by emb-a" in failed[0] and "memstream reembed --stream all" in failed[0]

    server.embedding_requests.clear()
    assert await _cli("reembed", "--batch", "2", "--persona", persona, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reembedded"] == 4 and report["recorded"] is True and report["waiting"] == []
    assert [len(texts) for texts in server.embedding_requests] == [2, 1, 1]  # in batches, per stream
    assert await _model_of(database) == "emb-b"
    assert await _cli("recall", "lamp", "--stream", "guild:1", "--persona", persona, "--json") == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    assert await _cli("observe", "Ada trims the wick", "--importance", "5", "--persona", persona) == 0
    capsys.readouterr()
    assert await _cli("reembed", "--persona", persona, "--json") == 0  # done already: nothing to do
    assert json.loads(capsys.readouterr().out)["reembedded"] == 0


async def test_an_interrupted_reembed_resumes(database: Path | str, tmp_path: Path, server: FakeOpenAIServer,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    persona = _write(tmp_path / "ada.toml", database, server.base_url, "emb-a")
    for i in range(5):
        assert await _cli("observe", f"Ada lights lamp number {i}", "--importance", "5", "--persona", persona) == 0
    persona = _write(tmp_path / "ada.toml", database, server.base_url, "emb-b")
    # A run stopped after its first batch: two memories hold emb-b's vectors, the store still says emb-a.
    store = await Store.open(database)
    try:
        first = await store.reembed_todo("default", "emb-b", 2)
        await store.reembed("default", "emb-b", [(i, hash_embedding(text, 64)) for i, text in first])
        assert await store.reembed_left("default", "emb-b") == 3
        assert await store.get_meta("embedding_model") == "emb-a"  # never recorded half way
    finally:
        await store.close()
    capsys.readouterr()
    assert await _cli("recall", "lamp", "--persona", persona) != 0  # still refused: the stream is not all emb-b
    assert "being re-embedded with 'emb-b'" in capsys.readouterr().err
    old = _write(tmp_path / "old.toml", database, server.base_url, "emb-a")
    assert await _cli("observe", "Ada trims the wick", "--importance", "5", "--persona", old) != 0  # nor emb-a's
    assert await _cli("doctor", "--persona", old) == 1
    failed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("fail") and "embedded by" in x]
    assert len(failed) == 1 and "a re-embedding with emb-b is under way" in failed[0]
    server.embedding_requests.clear()
    assert await _cli("reembed", "--stream", "all", "--persona", persona, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reembedded"] == 3 and report["recorded"] is True
    sent = [text for texts in server.embedding_requests for text in texts]
    assert sent == [f"Ada lights lamp number {i}" for i in (2, 3, 4)]  # resumed after the first batch
    assert await _model_of(database) == "emb-b"
    assert await _cli("recall", "lamp", "--persona", persona) == 0
    assert await _cli("observe", "Ada polishes the lens", "--importance", "5", "--persona", persona) == 0
    capsys.readouterr()
    assert await _cli("memories", "--persona", persona, "--json") == 0
    kept = json.loads(capsys.readouterr().out)
    assert {m["text"]: m["status"] for m in kept}["Ada trims the wick"] == "pending"  # kept, nothing lost
    async with await _open(database, "emb-b") as memory:  # the bot's next pass completes it with emb-b
        assert await memory.complete_pending() == 1
        assert [m.status for m in await memory.recent(limit=10)] == ["ready"] * 7
