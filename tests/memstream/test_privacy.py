"""Forgetting leaves no copy of the text anywhere in the database files (checked byte by byte, WAL included),
and everything built from it (insights, replies, reply traces) goes with it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from memstream import (
    ConfigError,
    MemoryStream,
    ModelConfig,
    Observation,
    PersonaConfig,
    RoleModel,
    Source,
    Store,
    StreamConfig,
    cli,
)
from memstream.store import NewMemory
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.helpers import AGENT, INSIGHTS, QUESTIONS, run_sql

STREAM = "guild:1"
SECRET = "ZQXV-my-phone-is-555-0199-ZQXV"
LONG_SECRET = "ZQXL-" + "my address is 12 Hidden Lane, " * 140 + "-ZQXL"  # ~4,000 characters: overflow pages


def leftovers(db: Path, *needles: str) -> list[str]:
    """Which needles still appear, in UTF-8 or in part, in the database file, its WAL or its shared memory."""
    found = []
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = Path(f"{db}{suffix}")
        if path.exists():
            data = path.read_bytes()
            found += [f"{needle[:12]} in {path.name}" for needle in needles
                      if needle.encode() in data or (len(needle) > 30 and needle[5:25].encode() in data)]
    return found


@pytest.fixture
def db(database: Path | str) -> Path:
    """The SQLite file of a test about its bytes (marked sqlite_only; PostgreSQL's: test_postgres.py)."""
    assert isinstance(database, Path)
    return database


@pytest.fixture
async def memory(database: Path | str, clock: FakeClock) -> AsyncIterator[MemoryStream]:
    chat = ScriptedChat()
    chat.on("<memory>", "6")
    chat.on(QUESTIONS, "What does Klaus share?\nWho is Maria?\nWhat is planned?")
    chat.on(INSIGHTS, f"Klaus shares private details like {SECRET} (because of 1, 2, 3, 4, 5)")
    chat.on(AGENT, f"Noted, Klaus: {SECRET}.")
    store = await Store.open(database)
    stream = MemoryStream(store, FakeEmbedder(), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "r"),
                          agent=RoleModel(chat, "a"), name="Isabella", summary="Runs a cafe.", clock=clock,
                          config=StreamConfig(reflection_threshold=10_000))
    yield stream
    await stream.close()


async def _klaus_talks(memory: MemoryStream) -> None:
    klaus = Source(author="Klaus", author_id="7", message_id="m1")
    await memory.observe_many([
        Observation(f"Klaus: call me, {SECRET}", STREAM, source=klaus),
        Observation(f"Klaus: {LONG_SECRET}", STREAM, source=Source(author="Klaus", author_id="7", message_id="m2")),
        Observation("Maria: I like tea", STREAM, source=Source(author="Maria", author_id="8", message_id="m3")),
        Observation("Maria: the party is on Friday", STREAM, source=Source(author="Maria", author_id="8",
                                                                          message_id="m4")),
    ])
    # Klaus asks the persona something (the bot stores the question itself separately, as m5): the trace
    # keeps his words as its query, the reply echoes them, an insight cites them.
    await memory.respond(f"remember {SECRET}", stream=STREAM, speaker="Klaus", observe_message=False,
                         source=Source(author_id="7", message_id="m5"))
    result = await memory.reflect(STREAM)
    assert result is not None and result.insights


@pytest.mark.sqlite_only
async def test_secure_delete_is_on(memory: MemoryStream) -> None:
    async with memory.store.conn.execute("PRAGMA secure_delete") as cursor:
        assert (await cursor.fetchone())[0] == 1


@pytest.mark.sqlite_only
async def test_forget_author_leaves_no_byte_of_their_text_and_drops_what_was_built_on_it(
        memory: MemoryStream, db: Path) -> None:
    await _klaus_talks(memory)
    assert leftovers(db, SECRET, LONG_SECRET)  # the test can see the text while it is there
    own = await memory.store.by_author(STREAM, "7")
    gone = await memory.forget_author(STREAM, "7")
    assert set(own) < set(gone)  # plus the insight and the reply that echoed the secret
    texts = [m.text for m in await memory.recent(STREAM, 50)]
    assert texts == ["Maria: the party is on Friday", "Maria: I like tea"]
    assert await run_sql(memory.store, "SELECT COUNT(*) FROM reply_traces") == [(0,)]
    assert leftovers(db, SECRET, LONG_SECRET) == []


@pytest.mark.sqlite_only
async def test_a_deleted_message_takes_its_trace_reply_and_insights_even_if_never_stored(
        memory: MemoryStream, db: Path) -> None:
    await _klaus_talks(memory)
    # m5 (the question) was never stored as a memory, only answered: its deletion still forgets the trace.
    await memory.forget_messages(["m1", "m2", "m5"])
    assert [m.text for m in await memory.recent(STREAM, 50)] == ["Maria: the party is on Friday",
                                                                  "Maria: I like tea"]
    assert leftovers(db, SECRET, LONG_SECRET) == []
    await memory.close()
    assert leftovers(db, SECRET, LONG_SECRET) == []


@pytest.mark.sqlite_only
async def test_a_scrub_beside_another_tasks_write_waits_for_it_and_leaves_no_byte(memory: MemoryStream,
                                                                                db: Path) -> None:
    # The bot forgets a deleted message while another task of the process (storing messages, a reflection)
    # is in the middle of a write transaction on the same store: the scrub waits for it, neither fails.
    await _klaus_talks(memory)
    store = memory.store
    await store.delete(await store.by_author(STREAM, "7"), author=(STREAM, "7"))
    writing = asyncio.Event()

    async def write() -> None:
        async with store.transaction():
            await store.insert([NewMemory(stream="guild:2", kind="observation", text="stored meanwhile",
                                          created_at=1.7e9, importance=3, importance_source="given",
                                          embedding=(await FakeEmbedder().embed_batch(["x"]))[0])])
            writing.set()
            await asyncio.sleep(0.2)  # still open while the scrub starts

    writer = asyncio.create_task(write())
    await writing.wait()
    assert await store.scrub()
    await writer
    assert [m.text for m in await memory.recent("guild:2")] == ["stored meanwhile"]
    assert leftovers(db, SECRET, LONG_SECRET) == []


@pytest.mark.sqlite_only
async def test_an_edit_leaves_no_copy_of_the_text_before_it(memory: MemoryStream, db: Path) -> None:
    await memory.observe_many([Observation(f"Klaus: oops {SECRET}", STREAM, source=Source(message_id="m1"))])
    assert leftovers(db, SECRET)
    await memory.edit_message(STREAM, "m1", "Klaus: (removed)")
    assert (await memory.recent(STREAM))[0].text == "Klaus: (removed)"
    assert leftovers(db, SECRET) == []


@pytest.mark.sqlite_only
async def test_purging_a_server_leaves_no_byte_of_it(memory: MemoryStream, db: Path) -> None:
    await _klaus_talks(memory)
    await memory.observe_many([Observation("Other server news", "guild:2")])
    await memory.purge(STREAM)
    assert await memory.recent(STREAM, 50) == []
    assert [m.text for m in await memory.recent("guild:2")] == ["Other server news"]
    assert leftovers(db, SECRET, LONG_SECRET, "Maria: I like tea") == []
    assert (await memory.stats(STREAM)).usage == {}


async def test_forgetting_one_observation_keeps_unrelated_replies(memory: MemoryStream, clock: FakeClock) -> None:
    await memory.observe_many([Observation("Maria: hello", STREAM, source=Source(author_id="8", message_id="m2"))])
    reply = await memory.respond("hi there", stream=STREAM, speaker="Maria", observe_message=False,
                                 source=Source(author_id="8", message_id="m9"))
    assert reply.memory is not None
    await memory.observe_many([Observation("Maria: bye", STREAM, source=Source(author_id="8", message_id="m3"))])
    await memory.forget_messages(["m3"])  # neither the message the reply answered nor one it was built from
    assert (await memory.get(reply.memory.id)).text.startswith("Isabella:")
    assert await memory.explain_reply(trace_id=reply.trace_id) is not None


@pytest.mark.sqlite_only
async def test_deleting_a_message_deletes_the_replies_built_from_it_and_what_cites_them(
        memory: MemoryStream, db: Path) -> None:
    """bob's message is deleted: the persona's reply that used it (to answer ann) goes, with its trace, the
    insight citing that reply, and every byte of both."""
    await memory.observe_many([Observation(f"Bob: my favourite colour is {SECRET}", STREAM,
                                           source=Source(author="Bob", author_id="5", message_id="b1")),
                               Observation("Ann: I like tea", STREAM,
                                           source=Source(author="Ann", author_id="6", message_id="a0"))])
    reply = await memory.respond("what is Bob's favourite colour?", stream=STREAM, speaker="Ann",
                                 observe_message=False, source=Source(author_id="6", message_id="a1"))
    assert reply.memory is not None and SECRET in reply.memory.text  # the scripted agent quotes it
    [insight] = await memory.store.save_reflection(STREAM, [(NewMemory(
        STREAM, "reflection", "Isabella told Ann a colour", 0.0, importance=5, depth=1), [reply.memory.id])], at=0.0)
    assert [m.memory.id for m in await memory.explain(SECRET, stream=STREAM, k=5)][:1] != []
    await memory.forget_messages(["b1"])
    left = {m.id for m in await memory.recent(STREAM, 50)}
    assert reply.memory.id not in left and insight not in left
    assert await memory.explain_reply(trace_id=reply.trace_id) is None
    assert all(SECRET not in m.memory.text for m in await memory.explain(SECRET, stream=STREAM, k=5))
    assert [m.text for m in await memory.recent(STREAM, 50)] == ["Ann: I like tea"]
    await memory.close()
    assert leftovers(db, SECRET) == []


async def test_a_password_in_the_base_url_is_refused_and_never_shows(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # Credentials in the URL are not supported (the key goes in the environment, sent as a bearer token):
    # a library user passing one gets a clear error at once, which does not repeat the password.
    caplog.set_level(logging.DEBUG)
    async with FakeOpenAIServer() as server:
        for base_url in (server.base_url, "http://127.0.0.1:9/v1"):
            url = base_url.replace("http://", "http://bob:PW-Secret-77@")
            persona = PersonaConfig(name="I", summary="S", database=tmp_path / "p.db",
                                    models=ModelConfig(base_url=url, max_retries=0, timeout=2))
            with pytest.raises(ConfigError, match="credentials in the URL") as info:
                await MemoryStream.open(persona, environ={})
            assert "PW-Secret-77" not in str(info.value)
        assert server.chat_requests == []
    assert not [r for r in caplog.records if "PW-Secret-77" in logging.Formatter().format(r)]


async def test_the_operator_honours_a_deletion_request_from_the_command_line(tmp_path: Path) -> None:
    db, persona = tmp_path / "p.db", tmp_path / "p.toml"
    persona.write_text(f'[persona]\nname = "Isabella"\nsummary = "Runs a cafe."\ndatabase = "{db}"\n', encoding="utf-8")
    chat = ScriptedChat()
    chat.on("<memory>", "4")
    store = await Store.open(db)
    async with MemoryStream(store, FakeEmbedder(), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "r"),
                            agent=RoleModel(chat, "a"), name="Isabella", summary="S") as memory:
        await memory.observe_many([
            Observation(f"Klaus: {SECRET} here", "guild:1", source=Source(author_id="7", message_id="a")),
            Observation(f"Klaus: {SECRET} there", "guild:2", source=Source(author_id="7", message_id="b")),
            Observation("Maria: hello", "guild:1", source=Source(author_id="8", message_id="c")),
            Observation("Maria: a DM ZQXDM", "dm:8", source=Source(author_id="8", message_id="d")),
        ])
    base = ["--persona", str(persona)]
    assert await asyncio.to_thread(cli.main, ["forget", "--author", "7", *base]) == 0  # every stream
    assert await asyncio.to_thread(cli.main, ["forget", "--stream", "dm:8", "--all", *base]) == 0
    assert leftovers(db, SECRET, "ZQXDM") == []
    async with await Store.open(db) as store:
        assert [m.text for m in await store.recent("guild:1", 10)] == ["Maria: hello"]
        assert await store.recent("guild:2", 10) == [] and await store.recent("dm:8", 10) == []


@pytest.mark.sqlite_only
async def test_an_edit_forgets_what_was_drawn_from_the_old_text(memory: MemoryStream, db: Path) -> None:
    await _klaus_talks(memory)
    klaus = await memory.store.find_message(STREAM, "m1")
    assert klaus is not None
    await memory.edit_message(STREAM, "m1", "Klaus: (removed)")
    await memory.edit_message(STREAM, "m2", "Klaus: (removed too)")
    await memory.edit_message(STREAM, "m5", "Klaus: never mind")  # the question, answered but never stored
    texts = sorted(m.text for m in await memory.recent(STREAM, 50))
    assert texts == ["Klaus: (removed too)", "Klaus: (removed)", "Maria: I like tea", "Maria: the party is on Friday"]
    assert (await memory.get(klaus)).text == "Klaus: (removed)"  # the memory itself stays, with the new text
    assert leftovers(db, SECRET, LONG_SECRET) == []


@pytest.mark.sqlite_only
async def test_forgetting_an_author_after_a_big_import_leaves_no_stale_copy_in_live_pages(
        memory: MemoryStream, db: Path) -> None:
    # 600 messages of three authors, completed in bursts: page splits leave old copies of rows inside pages
    # that still hold live rows, which secure_delete does not zero (2-3 of 200 stayed before the rewrite).
    def text(i: int) -> str:
        return f"user{i % 3}: ZQS{i:04d}-secret message number {i} " + "pad " * (i % 40)

    lines = [Observation(text(i), STREAM, source=Source(author=f"user{i % 3}", author_id=str(i % 3),
                                                          message_id=f"m{i}")) for i in range(600)]
    for start in range(0, 600, 256):
        await memory.observe_many(lines[start:start + 256])
    forgotten = [f"ZQS{i:04d}-secret" for i in range(600) if i % 3 == 1]
    kept = [f"ZQS{i:04d}-secret" for i in range(600) if i % 3 != 1]
    assert len(await memory.forget_author(STREAM, "1")) == 200
    assert leftovers(db, *forgotten) == []
    assert len(leftovers(db, *kept)) == 400  # the search sees text that is there
    assert len(await memory.recent(STREAM, 1000)) == 400


def test_residue_needles_cover_long_texts_in_pieces() -> None:
    from memstream.store import residue_needles

    long = "x" * 5 + "".join(f"{i:05d}" for i in range(400))  # 2,005 bytes
    needles = residue_needles([long, "ok", "exactly-twelve"])
    assert b"exactly-twelve" in needles and b"ok" not in needles
    assert all(len(n) == 24 for n in needles if n != b"exactly-twelve")
    # every stretch of 280 bytes of the long text contains a needle: a piece on an overflow page is found
    data = long.encode()
    assert all(any(n in data[i:i + 280] for n in needles) for i in range(0, len(data) - 280, 7))
