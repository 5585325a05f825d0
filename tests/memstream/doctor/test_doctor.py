"""`memstream doctor` against the fake OpenAI server and the fake Discord, one fault at a time."""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from memstream.cli import main
from memstream.config import StreamConfig
from memstream.doctor.checks import check_lines
from memstream.doctor.memory import check_resident
from memstream.doctor.models import unreachable_fix
from memstream.doctor.store import check_sqlite
from memstream.store import NewMemory, Store, sqlite_module
from tests.fakes.discord_server import (
    DEFAULT_BOT_PERMISSIONS,
    READ_MESSAGE_HISTORY,
    SEND_MESSAGES,
    FakeDiscord,
    FakeGuild,
)
from tests.fakes.openai_server import FakeOpenAIServer

TOKEN = "fake-bot-token"


@dataclass
class World:
    openai: FakeOpenAIServer
    discord: FakeDiscord
    guild: FakeGuild
    persona: Path
    database: Path

    def write(self, *, models: str = "", memory: str = 'profile = "hybrid"', guilds: list[int] | None = None,
              persona: str = "") -> None:
        """(Re)write the persona file with these parts."""
        ids = ", ".join(str(g) for g in ([self.guild.id] if guilds is None else guilds))
        self.persona.write_text(
            f'[persona]\nname = "Ada"\nsummary = "Ada keeps the lighthouse."\ndatabase = "{self.database}"\n'
            f"{persona}\n"
            f'[models]\nbase_url = "{self.openai.base_url}"\nrater = "gpt-fake"\nreflector = "gpt-fake"\n'
            f'agent = "gpt-fake"\nembedding = "text-embedding-fake"\n{models}\n'
            f"[memory]\n{memory}\n[discord]\nguilds = [{ids}]\n", encoding="utf-8")


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    async with FakeOpenAIServer(embed_dim=64) as server, FakeDiscord(valid_token=TOKEN) as discord:
        guild = discord.add_guild("Lighthouse")
        monkeypatch.setenv("DISCORD_TOKEN", TOKEN)
        monkeypatch.setenv("MEMSTREAM_DISCORD_API", discord.api_base)
        for name in ("MEMSTREAM_DATA_DIR", "OPENAI_BASE_URL", "MEMSTREAM_PERSONA"):
            monkeypatch.delenv(name, raising=False)
        made = World(server, discord, guild, tmp_path / "ada.toml", tmp_path / "ada.db")
        made.write()
        yield made


async def doctor(world: World, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str]]:
    """Run `memstream doctor` (in a thread: the fakes serve on this loop); its exit status and lines."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["doctor", "--persona", str(world.persona), *extra])
    return code, capsys.readouterr().out.splitlines()


def line(lines: list[str], name: str, status: str = "fail") -> str:
    """The one line of a check with this name and status."""
    found = [x for x in lines if x.split()[:1] == [status] and x[6:20].rstrip() == name]
    assert len(found) == 1, "\n".join(lines)
    return found[0]


async def memories_db(world: World, dimensions: int, model: str | None = "text-embedding-fake") -> None:
    """A database that holds embeddings of `dimensions`, made by `model` (None: not recorded, an older store)."""
    store = await Store.open(world.database)
    await store.set_meta("embedding_dimensions", str(dimensions))
    if model is not None:
        await store.set_meta("embedding_model", model)
    await store.close()


# -- all well ------------------------------------------------------------------------------------------------


async def test_everything_ok(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await memories_db(world, 64)
    code, lines = await doctor(world, capsys)
    assert code == 0
    assert all(x.startswith("ok ") for x in lines), "\n".join(lines)
    names = [x[6:20].rstrip() for x in lines]
    assert names == ["persona", "sqlite", "schema", "integrity", "embedded by", "dimensions", "model server",
                     "model", "model", "rating", "embedding", "memory", "ratings", "discord token",
                     "discord intent", "discord server"]
    assert "64 dimensions" in line(lines, "embedding", "ok")
    assert "resident_mb 1,024: about" in line(lines, "memory", "ok")
    assert "memories of 64 dimensions held at once per process" in line(lines, "memory", "ok")
    assert "Lighthouse" in line(lines, "discord server", "ok")
    assert "rated a test observation 5" in line(lines, "rating", "ok")
    assert "0 of the 50 ratings the flat-rater check needs so far" in line(lines, "ratings", "ok")
    # The rating call used the real Importance prompt, for the persona's name.
    [rating] = world.openai.chat_requests
    assert "Reply with a single integer." in rating.prompt and "for Ada." in rating.prompt


async def test_json_and_a_new_database(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = await doctor(world, capsys, "--json")
    report = json.loads("\n".join(lines))
    assert code == 0 and report["ok"] is True
    database = next(c for c in report["checks"] if c["name"] == "database")
    assert database["status"] == "ok" and "created at the first run" in database["detail"]
    assert not world.database.exists()  # the doctor creates nothing


# -- the persona file ----------------------------------------------------------------------------------------


async def test_every_problem_of_the_persona_file(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.write(persona='timezone = "Mars/Base"\ncolour = "red"')
    code, lines = await doctor(world, capsys)
    assert code == 1
    fails = [x for x in lines if x.startswith("fail  persona")]
    assert len(fails) == 2 and "timezone" in fails[0] + fails[1] and "colour" in fails[0] + fails[1]
    assert line(lines, "sqlite", "ok")  # checks that need no persona still run


async def test_missing_persona_file(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.persona.unlink()
    code, lines = await doctor(world, capsys)
    assert code == 1 and "memstream init" in line(lines, "persona")


async def test_profile_spec_is_a_warning(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.write(memory='profile = "spec"')
    code, lines = await doctor(world, capsys)
    assert code == 0 and 'profile = "hybrid"' in line(lines, "persona", "warn")


# -- SQLite and the database ---------------------------------------------------------------------------------


def test_sqlite_that_cannot_load_extensions() -> None:
    stdlib_like = types.SimpleNamespace(__name__="sqlite3", sqlite_version="3.40.0", Connection=type("C", (), {}))
    check = check_sqlite(binding=lambda: stdlib_like)
    assert check.status == "fail" and "pip install pysqlite3" in check_lines([check])[0]


def test_sqlite_vec_that_cannot_be_loaded(tmp_path: Path) -> None:
    check = check_sqlite(extension=lambda: str(tmp_path / "no-vec0"))
    assert check.status == "fail" and "sqlite-vec" in check.detail and "pip install" in str(check.fix)
    assert check_sqlite().status == "ok"


async def test_schema_made_by_a_newer_memstream(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    store = await Store.open(world.database)
    await store.conn.execute("INSERT INTO schema_migrations VALUES (9999, 'future', '2099-01-01')")
    await store.close()
    code, lines = await doctor(world, capsys)
    assert code == 1 and "newer memstream (schema 9999" in line(lines, "schema")


async def test_a_file_that_is_not_a_database(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.database.write_bytes(b"this is not SQLite" * 300)
    code, lines = await doctor(world, capsys)
    assert code == 1 and "salvage" in line(lines, "database")


async def test_a_damaged_page_fails_quick_check(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await memories_db(world, 64)
    conn = sqlite_module().connect(world.database)
    conn.execute("CREATE TABLE filler (x TEXT)")
    conn.executemany("INSERT INTO filler VALUES (?)", [(f"row {i} " * 8,) for i in range(3000)])
    conn.commit()
    root, size = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'filler'").fetchone()[0], \
        conn.execute("PRAGMA page_size").fetchone()[0]
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    with world.database.open("r+b") as file:  # an interior page whose first cell points nowhere
        file.seek(size * (root - 1))
        file.write(b"\x05\x00\x00\x00\x01\x0f\xf0\x00\x00\x00\x00\x02\x00\x00")
    code, lines = await doctor(world, capsys)
    assert code == 1 and "quick_check: *** in database main ***" in line(lines, "integrity")


async def test_embedding_dimension_changed(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await memories_db(world, 1536)
    code, lines = await doctor(world, capsys)
    assert code == 1
    assert "holds 1536-dimension embeddings, but text-embedding-fake returns 64" in line(lines, "dimensions")


async def test_embeddings_of_another_model(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await memories_db(world, 64, "text-embedding-old")
    code, lines = await doctor(world, capsys)
    assert code == 1
    failed = line(lines, "embedded by")
    assert "made by text-embedding-old" in failed and "embedding model is text-embedding-fake" in failed
    assert "memstream reembed --stream all" in failed


async def test_an_older_store_adopts_the_model(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await memories_db(world, 64, None)
    code, lines = await doctor(world, capsys)
    assert code == 0
    assert "text-embedding-fake is recorded at the next write" in line(lines, "embedded by", "warn")


# -- the model server ----------------------------------------------------------------------------------------


async def test_model_server_unreachable(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await world.openai.stop()
    code, lines = await doctor(world, capsys)
    assert code == 1
    assert "is the server running? -> start the server" in line(lines, "model server")
    assert not [x for x in lines if x[6:20].rstrip() in ("model", "rating", "embedding")]  # nothing more to say


def test_an_unreachable_hosted_api_is_not_told_to_start_ollama() -> None:
    assert "ollama serve" in unreachable_fix("http://127.0.0.1:11434/v1")
    assert "ollama serve" in unreachable_fix("http://localhost:8080/v1")
    hosted = unreachable_fix("https://api.openai.com/v1")
    assert "ollama" not in hosted.lower() and "network" in hosted and "api.openai.com" in hosted


async def test_model_server_rejects_the_key(world: World, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    world.openai.require_api_key = "right-key"
    monkeypatch.setenv("OPENAI_API_KEY", "wrong-key")
    code, lines = await doctor(world, capsys)
    assert code == 1 and "export the right key in OPENAI_API_KEY" in line(lines, "model server")


async def test_configured_model_not_on_the_server(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.openai.models = ["gpt-fake", "llama3.1:latest"]
    code, lines = await doctor(world, capsys)
    assert code == 1
    assert "text-embedding-fake (embedding) is not on the server" in line(lines, "model")
    assert "gpt-fake (rater, reflector, agent) is listed" in line(lines, "model", "ok")


async def test_server_that_lists_no_models_is_a_warning(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.openai.models = None
    code, lines = await doctor(world, capsys)
    assert code == 0 and "lists no models" in line(lines, "model server", "warn")


async def test_malformed_rating_answer(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.openai.fail_next("malformed", path="chat")
    code, lines = await doctor(world, capsys)
    assert code == 1 and "malformed answer" in line(lines, "rating")


async def test_rater_that_answers_words(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.openai.script("Sure! I would rate it a 7.")
    code, lines = await doctor(world, capsys)
    assert code == 1 and "answered 'Sure! I would rate it a 7.', not an integer 1..10" in line(lines, "rating")


async def test_rating_server_error(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.openai.fail_next("500", path="chat")
    code, lines = await doctor(world, capsys)
    assert code == 1 and "HTTP 500" in line(lines, "rating")


async def test_embeddings_missing_from_the_answer(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.openai.fail_next("empty_choices", path="embeddings")
    code, lines = await doctor(world, capsys)
    assert code == 1 and "malformed answer" in line(lines, "embedding")


async def test_no_api_key_for_openai(world: World, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    world.write()
    world.persona.write_text(world.persona.read_text().replace(f'base_url = "{world.openai.base_url}"', ""))
    code, lines = await doctor(world, capsys)
    assert code == 1 and "OPENAI_API_KEY is not set -> export it" in line(lines, "model server")
    assert not world.openai.requests  # and nothing was sent anywhere


# -- Discord -------------------------------------------------------------------------------------------------


async def test_no_token_skips_discord(world: World, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISCORD_TOKEN")
    code, lines = await doctor(world, capsys)
    assert code == 0 and "skipped: set DISCORD_TOKEN to check the bot" in line(lines, "discord", "warn")
    assert not world.discord.requests


async def test_wrong_token(world: World, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISCORD_TOKEN", "not-the-token")
    code, lines = await doctor(world, capsys)
    assert code == 1 and "Discord rejected the token in DISCORD_TOKEN" in line(lines, "discord token")
    assert world.discord.requests[0].authorization == "Bot not-the-token"


async def test_discord_unreachable(world: World, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    await world.discord.close()
    code, lines = await doctor(world, capsys)
    assert code == 1 and "cannot reach Discord at http://127.0.0.1:" in line(lines, "discord token")


async def test_message_content_intent_off(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.discord.application_flags = 1 << 23
    code, lines = await doctor(world, capsys)
    assert code == 1 and "MESSAGE CONTENT INTENT" in line(lines, "discord intent")


async def test_limited_message_content_intent_is_enough(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.discord.application_flags = 1 << 18
    code, lines = await doctor(world, capsys)
    assert code == 0 and "enabled" in line(lines, "discord intent", "ok")


async def test_missing_permissions_in_a_guild(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    bare = world.discord.add_guild("Bare", bot_permissions=DEFAULT_BOT_PERMISSIONS & ~SEND_MESSAGES
                                   & ~READ_MESSAGE_HISTORY)
    bare.everyone_role.permissions = 0
    world.write(guilds=[world.guild.id, bare.id])
    code, lines = await doctor(world, capsys)
    assert code == 1
    failing = line(lines, "discord server")
    assert f"Bare ({bare.id}): the bot lacks Send Messages, Read Message History" in failing
    assert "Lighthouse" in line(lines, "discord server", "ok")


async def test_bot_not_in_a_configured_guild(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.write(guilds=[world.guild.id, 123456789012345678])
    code, lines = await doctor(world, capsys)
    assert code == 1
    assert "not in server 123456789012345678" in line(lines, "discord server")
    assert f"client_id={world.discord.application_id}" in line(lines, "discord server")


async def test_every_joined_guild_when_none_configured(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    world.discord.add_guild("Second")
    world.write(guilds=[])
    code, lines = await doctor(world, capsys)
    assert code == 0
    assert len([x for x in lines if x.startswith("ok    discord server")]) == 2



def test_the_resident_budget_in_memories_and_against_the_machine() -> None:
    hybrid = StreamConfig.for_profile("hybrid", resident_mb=100)
    ok = check_resident(hybrid, 384, 8 << 30)
    per = 384 * 6 + 44 + 1170  # row, screen row, columns, the lexical index's and the context's share
    assert ok.status == "ok" and f"about {(100 << 20) // per:,} memories of 384 dimensions" in ok.detail
    assert "this machine has 8,192 MiB" in ok.detail
    assert f"about {(100 << 20) // (384 * 6 + 44):,} memories" in check_resident(StreamConfig(resident_mb=100), 384,
                                                                                 None).detail
    big = check_resident(StreamConfig(resident_mb=7000), None, 8 << 30)
    assert big.status == "warn" and "more than three quarters" in big.detail and "384 dimensions" in big.detail
    unbounded = check_resident(StreamConfig(resident_mb=0), 384, None)
    assert unbounded.status == "warn" and "stays in memory for the life of the process" in unbounded.detail
    assert unbounded.fix is not None and "resident_mb" in unbounded.fix


def test_the_package_exports_the_report_and_its_checks() -> None:
    import memstream.doctor as doctor
    from memstream.doctor.report import run_doctor

    assert doctor.__all__ == ["Check", "Status", "run_doctor"]
    assert doctor.run_doctor is run_doctor and doctor.Check.ok("x", "fine").status == "ok"


# -- the rater's latest ratings ------------------------------------------------------------------------------


async def rated_db(world: World, ratings: list[int]) -> None:
    """A database whose rater gave these ratings, oldest first."""
    await memories_db(world, 64)
    store = await Store.open(world.database)
    await store.insert([NewMemory(stream="guild:1", kind="observation", text=f"message {i}", created_at=1000.0 + i,
                                  importance=v, importance_source="rater", embedding=np.ones(64, np.float32))
                        for i, v in enumerate(ratings)])
    await store.close()


async def test_a_rater_that_scores_everything_5_is_a_warning(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await rated_db(world, [3, 8] * 30 + [5] * 50)  # the latest 50 are flat
    code, lines = await doctor(world, capsys)
    assert code == 0
    warning = line(lines, "ratings", "warn")
    assert "the rater looks miscalibrated: 50 of its last 50 ratings are 5 (standard deviation 0.00)" in warning
    assert "[models] rater" in warning
    world.write(memory='profile = "hybrid"\nrater_alarm_window = 0')  # the switch
    code, lines = await doctor(world, capsys)
    assert "the flat-rater alarm is off" in line(lines, "ratings", "ok")


async def test_ratings_that_vary_are_ok(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    await rated_db(world, [5] * 30 + [1, 2, 3, 7, 8, 9, 10] * 3)
    code, lines = await doctor(world, capsys)
    assert code == 0 and "its last 50 ratings vary" in line(lines, "ratings", "ok")
