"""Damaged, foreign and newer files: one line, a distinct exit status, no hang, no thread left; backup and
salvage."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from memstream import MemoryStream, Observation, PersonaConfig, RoleModel, Source, Store, StoreDamaged, StreamConfig
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat

LIMIT = 60  # seconds: a hang fails the test


def _persona(tmp_path: Path, db: Path) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(f'[persona]\nname = "I"\nsummary = "S"\ndatabase = "{db}"\n'
                    '[models]\nbase_url = "http://127.0.0.1:9/v1"\n', encoding="utf-8")
    return path


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memstream", *argv], capture_output=True, text=True,
                          timeout=LIMIT)


async def _filled(db: Path, n: int = 600) -> None:
    chat = ScriptedChat()
    chat.on("<memory>", "5")
    async with MemoryStream(await Store.open(db), FakeEmbedder(), rater=RoleModel(chat, "r"),
                            reflector=RoleModel(chat, "r"), agent=RoleModel(chat, "a"), name="I", summary="S",
                            clock=FakeClock(), config=StreamConfig(reflection_threshold=10**6)) as memory:
        await memory.observe_many([Observation(f"memory number {i} " + "words " * 30, "guild:1",
                                               source=Source(message_id=f"m{i}")) for i in range(n)])


def _truncate(db: Path) -> None:
    with open(db, "r+b") as f:
        f.truncate(os.path.getsize(db) // 3)


def _damage_page(db: Path, page: int | None) -> None:
    """Overwrite a page (the middle one by default) with bytes that are no valid page."""
    page = page or os.path.getsize(db) // 4096 // 2
    with open(db, "r+b") as f:
        f.seek(4096 * (page - 1))
        f.write(b"\xa5" * 4096)  # not a valid page type: SQLite knows the page is damaged


# Random bytes from a fixed seed: the same test ids in every run and every xdist worker.
@pytest.mark.parametrize("content", [b"hello, this is a text file\n", random.Random(4).randbytes(100),
                                     b"SQLite format 3\x00"], ids=["text", "random", "header-only"])
def test_a_file_that_is_not_a_database_is_one_line_and_exit_4(tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "bad.db"
    db.write_bytes(content)
    for command in (["stats"], ["recall", "hello"], ["observe", "hi", "--importance", "3"]):
        result = _cli(*command, "--persona", str(_persona(tmp_path, db)))
        assert result.returncode == 4, result.stderr
        assert result.stderr.count("\n") == 1 and str(db) in result.stderr and "Traceback" not in result.stderr
        assert "damaged or not a database" in result.stderr and "salvage" in result.stderr


async def test_a_truncated_database_is_one_line_and_exit_4(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    await _filled(db)
    _truncate(db)
    result = await asyncio.to_thread(_cli, "recall", "memory number 5", "--persona", str(_persona(tmp_path, db)))
    assert result.returncode in (1, 4), result.stderr  # 1: the model server (if the damage is not reached)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


async def test_opening_a_damaged_file_raises_at_once_and_leaves_no_thread(tmp_path: Path) -> None:
    db = tmp_path / "bad.db"
    db.write_bytes(b"not a database at all" * 100)
    before = threading.active_count()
    persona = PersonaConfig(name="I", summary="S", database=db)
    with pytest.raises(StoreDamaged, match="damaged or not a database"):
        await asyncio.wait_for(MemoryStream.open(persona, environ={}, chat=ScriptedChat(),
                                                 embedder=FakeEmbedder()), LIMIT)
    await asyncio.sleep(0.1)
    assert threading.active_count() == before


async def test_a_schema_newer_than_this_version_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    await _filled(db, 3)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO schema_migrations VALUES (9999, 'from_the_future', '2030-01-01')")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    result = await asyncio.to_thread(_cli, "stats", "--persona", str(_persona(tmp_path, db)))
    assert result.returncode == 5, result.stderr
    assert "made by a newer memstream" in result.stderr and result.stderr.count("\n") == 1
    assert db.read_bytes() == before


async def test_a_damaged_page_met_at_work_is_a_store_error(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    await _filled(db)
    _damage_page(db, None)
    async with await Store.open(db) as store:
        with pytest.raises(StoreDamaged) as info:
            for memory_id in range(1, 601):
                await store.get(memory_id)
    assert "\n" not in str(info.value) and str(db) in str(info.value)


async def test_backup_is_consistent_beside_a_writer_and_refuses_to_overwrite(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    await _filled(db, 300)
    persona = str(_persona(tmp_path, db))
    async with await Store.open(db) as writer:  # the bot is running
        await writer.set_meta("busy", "yes")
        dest = tmp_path / "backups" / "p-copy.db"
        dest.parent.mkdir()
        result = await asyncio.to_thread(_cli, "backup", str(dest), "--persona", persona, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["backup"] == str(dest)
        again = await asyncio.to_thread(_cli, "backup", str(dest), "--persona", persona)
        assert again.returncode == 2 and "--force" in again.stderr
        forced = await asyncio.to_thread(_cli, "backup", str(dest), "--persona", persona, "--force")
        assert forced.returncode == 0, forced.stderr
    copy = sqlite3.connect(dest)
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert copy.execute("SELECT COUNT(*) FROM memories").fetchone() == (300,)
    copy.close()
    assert oct(os.stat(dest).st_mode & 0o777) == "0o600"
    assert not list(dest.parent.glob("*.partial"))


async def test_salvage_copies_what_can_be_read_and_reports_the_rest(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    await _filled(db)
    _damage_page(db, None)
    dest = tmp_path / "saved.db"
    result = await asyncio.to_thread(_cli, "salvage", str(db), str(dest))
    assert result.returncode == 3, result.stderr
    assert "could not read" in result.stdout and "of memories" in result.stdout
    saved = sqlite3.connect(dest)
    count = saved.execute("SELECT COUNT(*) FROM memories").fetchone()[0]
    assert 400 < count < 600  # most of it, not the damaged page
    assert saved.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    saved.close()
    async with await Store.open(dest) as store:  # a working persona database again
        assert len(await store.recent("guild:1", 1000)) == count
    refused = await asyncio.to_thread(_cli, "salvage", str(db), str(dest))
    assert refused.returncode == 2 and "exists" in refused.stderr


async def test_a_read_only_file_system_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root (root ignores file modes, so a mount is the test)")
    mount = tmp_path / "ro"
    mount.mkdir()
    made = await asyncio.to_thread(subprocess.run, ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
                                   capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        db = mount / "p.db"
        await _filled(db, 20)
        await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,ro", str(mount)], check=True)
        persona = str(_persona(tmp_path, db))
        for command in (["observe", "hello", "--importance", "3"], ["forget", "1"]):
            result = await asyncio.to_thread(_cli, *command, "--persona", persona)
            assert result.returncode == 1, result.stderr
            assert result.stderr.count("\n") == 1 and str(db) in result.stderr and "Traceback" not in result.stderr
            assert "read-only file system" in result.stderr
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(mount)], check=False)
