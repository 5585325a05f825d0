"""`memstream copy`: SQLite -> PostgreSQL and back, same ids, evidence, traces, usage and meta; resumable after
a stop, nothing written twice; checked at the end; the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstream import MemoryStream, Observation, RoleModel, Source, StreamConfig
from memstream.cli import main
from memstream.data.transfer import copy_store
from memstream.errors import ConfigError
from memstream.store import NewMemory, Store
from memstream.store.tables import TABLES, Table
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.memstream.helpers import AGENT, INSIGHTS, QUESTIONS


async def _persona(location: Path | str) -> dict[str, Any]:
    """A persona with a bit of everything: streams, a reflection, a reply trace, a forgotten memory, usage."""
    chat = ScriptedChat().on("<memory>", "7").on(QUESTIONS, "What does Klaus like?")
    chat.on(INSIGHTS, "Klaus likes bikes (because of 1, 2)").on(AGENT, "Nice bike, Klaus.")
    async with MemoryStream(await Store.open(location), FakeEmbedder(dim=8), rater=RoleModel(chat, "r"),
                            reflector=RoleModel(chat, "r"), agent=RoleModel(chat, "a"), name="Isabella",
                            summary="Runs a cafe.", clock=FakeClock(), config=StreamConfig(reflection_threshold=20),
                            auto_reflect=False) as memory:
        for stream in ("guild:1", "guild:2", "dm:3"):
            await memory.observe_many([Observation(f"{stream}: Klaus talks about bikes {i}", stream,
                                                   source=Source(author="Klaus", author_id="7",
                                                                 message_id=f"{stream}-{i}")) for i in range(40)])
        await memory.reflect("guild:1")
        reply = await memory.respond("what about bikes?", stream="guild:1", speaker="Ann",
                                     source=Source(author="Ann", author_id="8", message_id="q1"))
        await memory.reply_sent(reply, ["r1", "r2"])
        doomed = await memory.observe("a message soon forgotten", stream="guild:2")
        await memory.forget([doomed.id])
        await memory.store.count_fault("guild:1", "rating_fallback", 2)
        return {"top": doomed.id, "trace": reply.trace_id}


async def _everything(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for table in TABLES:
        rows = await store.table_rows(table, None, 10**9)
        out[table.name] = [tuple(v.tolist() if isinstance(v, np.ndarray) else v for v in row) for row in rows
                           if table.name != "meta" or row[0] != "copied_from"]
    return out


async def test_a_persona_goes_to_postgresql_and_back_unchanged(tmp_path: Path, postgres_url: str) -> None:
    made = await _persona(tmp_path / "a.db")
    async with await Store.open(tmp_path / "a.db") as src, await Store.open(postgres_url) as pg:
        report = await copy_store(src, pg, source="a.db", batch=17)
        assert report.streams == 3 and report.queries == 9
        original = await _everything(src)
        assert await _everything(pg) == original
        assert len(original["evidence"]) == 2 and len(original["trace_items"]) > 0
        assert len(original["trace_messages"]) == 2 and original["model_usage"] and original["faults"]
        [after] = await pg.insert([NewMemory(stream="s", kind="observation", text="new", created_at=0.0)])
        assert after > made["top"]  # the forgotten memory's id is not given again
        trace = await pg.trace(message_id="r2")
        assert trace is not None and trace.id == made["trace"]
    async with await Store.open(tmp_path / "a.db") as src, await Store.open(postgres_url) as pg, \
            await Store.open(tmp_path / "b.db") as back:
        await copy_store(pg, back, source=postgres_url)
        copied = await _everything(back)
        assert copied["memories"][:-1] == original["memories"] and copied["memories"][-1][0] == after
        assert copied["stream_numbers"] == sorted([*original["stream_numbers"], ("s", 1)])  # the memory added
        assert {k: v for k, v in copied.items() if k not in ("memories", "stream_numbers")} == {
            k: v for k, v in original.items() if k not in ("memories", "stream_numbers")}


class _StopsAfter:
    """A destination store that fails on its n-th batch (the copy stopped: killed, a lost connection)."""

    def __init__(self, store: Store, batches: int) -> None:
        self.store, self.batches = store, batches

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def put_rows(self, table: Table, rows: Any) -> None:
        self.batches -= 1
        if self.batches < 0:
            raise ConnectionError("the copy was stopped")
        await self.store.put_rows(table, rows)


async def test_a_stopped_copy_is_resumed_and_writes_nothing_twice(tmp_path: Path, database: Path | str) -> None:
    await _persona(tmp_path / "a.db")
    target = database if isinstance(database, str) else tmp_path / "copy.db"
    async with await Store.open(tmp_path / "a.db") as src:
        for stop in (2, 2):  # stopped twice in memories
            async with await Store.open(target) as dst:
                with pytest.raises(ConnectionError):
                    await copy_store(src, _StopsAfter(dst, stop), source="a.db", batch=25)  # type: ignore[arg-type]
        async with await Store.open(target) as dst:
            memories = await dst.count_rows(TABLES[0])
            report = await copy_store(src, dst, source="a.db", batch=25)
            assert report.copied["memories"] == await src.count_rows(TABLES[0]) - memories > 0
            assert await _everything(dst) == await _everything(src)
            again = await copy_store(src, dst, source="a.db", batch=25)  # a finished copy: nothing more
            assert set(again.copied.values()) == {0}, sorted(again.copied.items())


async def test_a_copy_into_a_database_holding_a_persona_is_refused(tmp_path: Path, database: Path | str) -> None:
    await _persona(tmp_path / "a.db")
    async with await Store.open(database) as other:
        await other.insert([NewMemory(stream="s", kind="observation", text="someone else", created_at=0.0)])
        async with await Store.open(tmp_path / "a.db") as src:
            with pytest.raises(ConfigError, match="already holds a persona's memory"):
                await copy_store(src, other, source="a.db")


def test_the_command_line_copies_and_says_what_it_checked(tmp_path: Path, postgres_url: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    asyncio.run(_persona(tmp_path / "a.db"))
    persona = tmp_path / "p.toml"
    persona.write_text(f'[persona]\nname = "I"\nsummary = "S"\ndatabase = "{tmp_path / "a.db"}"\n', encoding="utf-8")
    assert main(["copy", str(persona), postgres_url]) == 0
    out = capsys.readouterr().out
    assert "copied" in out and "123 memories" in out and "9 sample queries" in out and "checked" in out
    assert main(["copy", str(tmp_path / "a.db"), postgres_url]) == 0  # resumed: already complete
    assert main(["copy", str(tmp_path / "missing.db"), str(tmp_path / "x.db")]) != 0
    err = capsys.readouterr().err
    assert "no such database file" in err and err.count("\n") == 1
