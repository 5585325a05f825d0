"""`memstream export`: a user's memories for a data-access request, and a stream that `memstream import` reads
back, through the real command line against the fake OpenAI server."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memstream.cli import main
from memstream.data.export import import_line
from memstream.records import Memory, Source
from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.cli.test_cli import _answer, _cli, _persona

KLAUS, MARIA = "1100000000000000001", "1100000000000000002"
EVIL = "ends \x1b[2J\x07 and \x9b31m \u202eevil\x00"


@pytest.fixture
async def server() -> FakeOpenAIServer:
    async with FakeOpenAIServer() as running:
        running.on_chat(_answer)
        yield running  # type: ignore[misc]


def _jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _said(stream: str, author: str, author_id: str, text: str, minute: int, message_id: str,
          **extra: Any) -> dict[str, Any]:
    return {"text": f"{author} in #general: {text}", "at": f"2024-03-0{minute % 9 + 1}T10:{minute:02d}:00.250000Z",
            "stream": stream, "author": author, "author_id": author_id, "channel": "general",
            "channel_id": "1300000000000000001", "message_id": message_id, **extra}


async def _seed(tmp_path: Path, persona: str) -> None:
    """Klaus and Maria in two servers; one of Klaus's lines is hostile text."""
    lines = [
        _said("guild:1", "Klaus", KLAUS, "the recipe uses cardamom", 1, "1200000000000000001", importance=4),
        _said("guild:1", "Maria", MARIA, "I live at 12 Hidden Lane", 2, "1200000000000000002", importance=6),
        _said("guild:2", "Klaus", KLAUS, f"paint brushes {EVIL}", 3, "1200000000000000003", importance=2),
        _said("guild:2", "Maria", MARIA, "my cat is called Pixel", 4, "1200000000000000004", importance=3),
    ]
    assert await _cli("import", str(_jsonl(tmp_path / "seed.jsonl", lines)), "--persona", persona) == 0


async def test_an_author_export_holds_that_author_s_memories_in_every_stream_and_nobody_else_s(
        tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    await _seed(tmp_path, persona)
    capsys.readouterr()
    assert await _cli("export", "--author", KLAUS, "--persona", persona) == 0
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x07\x9b\u202e\x00"), "control characters reach the terminal raw"
    document = json.loads(out)
    assert document["persona"] == "Isabella Rodriguez" and document["author_id"] == KLAUS
    assert datetime.fromisoformat(document["exported_at"]).tzinfo is not None
    assert document["count"] == 2
    first, second = document["memories"]
    assert (first["stream"], second["stream"]) == ("guild:1", "guild:2")
    assert first["text"] == "Klaus in #general: the recipe uses cardamom"
    assert second["text"] == f"Klaus in #general: paint brushes {EVIL}"  # escaped in the file, intact to a reader
    assert first["created_at"] == "2024-03-02T10:01:00.250000Z" and first["importance"] == 4
    assert first["message_id"] == "1200000000000000001" and first["channel_id"] == "1300000000000000001"
    assert first["kind"] == "observation" and isinstance(first["id"], int)
    assert "Maria" not in out and "Hidden Lane" not in out and "Pixel" not in out

    assert await _cli("export", "--author", "999", "--persona", persona) == 0
    nobody = json.loads(capsys.readouterr().out)
    assert nobody["count"] == 0 and nobody["memories"] == []  # an honest "nothing", not an error


async def test_a_stream_export_imports_into_a_fresh_persona_as_the_same_memories(
        tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    first, fresh = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    fresh.mkdir()
    persona = str(_persona(first, server.base_url))
    await _seed(first, persona)
    lines = [_said("guild:1", "Klaus", KLAUS, "party at the cafe tonight", 5, "1200000000000000005"),  # rated: 7
             {"text": "a line with a key of its own", "at": "2024-03-07T09:00:00+02:00", "stream": "guild:1",
              "id": "note-1"}]
    assert await _cli("import", str(_jsonl(first / "more.jsonl", lines)), "--persona", persona) == 0
    assert await _cli("observe", f"typed at the terminal {EVIL}", "--stream", "guild:1", "--importance", "5",
                      "--at", "2024-03-08T12:00:00Z", "--persona", persona) == 0
    assert await _cli("reflect", "--stream", "guild:1", "--persona", persona) == 0  # an insight: left out
    capsys.readouterr()

    exported = first / "guild-1.jsonl"
    assert await _cli("export", "--stream", "guild:1", "-o", str(exported), "--persona", persona) == 0
    summary = capsys.readouterr().out
    assert "exported 5 memory(ies) of stream guild:1" in summary and "1 insight(s) left out" in summary
    assert stat.S_IMODE(exported.stat().st_mode) == 0o600
    assert not any(ch in exported.read_text(encoding="utf-8") for ch in "\x1b\x9b\u202e")

    copy = str(_persona(fresh, server.base_url, threshold=1000))
    assert await _cli("import", str(exported), "--persona", copy, "--json") == 0
    assert json.loads(capsys.readouterr().out)["new"] == 5
    assert await _cli("import", str(exported), "--persona", copy, "--json") == 0  # nothing stored twice
    assert json.loads(capsys.readouterr().out)["already_imported"] == 5

    before, after = await _observations(persona, capsys), await _observations(copy, capsys)
    assert len(before) == len(after) == 5
    for old, new in zip(before, after, strict=True):
        assert {k: new[k] for k in ("text", "created_at", "importance", "stream")} == \
               {k: old[k] for k in ("text", "created_at", "importance", "stream")}
        if old["source"].get("message_id"):
            assert new["source"] == old["source"]  # author, author id, channel and message id
        else:  # typed at the terminal: no message id to keep; the import gives it one, stable from then on
            assert new["source"]["message_id"].startswith("import:")
    assert [m["importance"] for m in before] == [4, 6, 7, 1, 5]
    assert before[3]["source"]["message_id"] == "import:note-1"
    assert before[0]["source"]["author_id"] == KLAUS and before[-1]["text"].endswith(EVIL)
    # The copy exports the same lines again (a second move loses nothing).
    again = fresh / "again.jsonl"
    assert await _cli("export", "--stream", "guild:1", "-o", str(again), "--persona", copy) == 0
    old_lines = exported.read_text(encoding="utf-8").splitlines()
    new_lines = again.read_text(encoding="utf-8").splitlines()
    assert old_lines[:4] == new_lines[:4]
    assert json.loads(old_lines[4]).items() <= json.loads(new_lines[4]).items()


async def _observations(persona: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """A stream's observations, oldest first, as `memstream memories --json` shows them."""
    assert await _cli("memories", "--stream", "guild:1", "-n", "100", "--persona", persona, "--json") == 0
    return [m for m in reversed(json.loads(capsys.readouterr().out)) if m["kind"] == "observation"]


@pytest.mark.parametrize(("argv", "says"), [
    ([], "one of the arguments --author --stream is required"),
    (["--author", KLAUS, "--stream", "guild:1"], "not allowed with argument"),
    (["--author", " "], "argument --author: must be a Discord user id"),
    (["--author", "Maria"], "argument --author: must be a Discord user id, its digits such as 123456789012345678, "
                            "got 'Maria' (a name is not an id"),
    (["--author", "-5"], "must be a Discord user id"),
    (["--author", "١٢٣"], "must be a Discord user id"),  # digits, but not the ones Discord writes
    (["--stream", ""], "argument --stream: must be a non-empty key"),
])
def test_export_needs_exactly_one_of_author_and_stream(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                       says: str) -> None:
    with pytest.raises(SystemExit) as done:
        main(["export", *argv])
    assert done.value.code == 2
    err = capsys.readouterr().err
    [error] = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
    assert error.startswith("memstream export: error: ") and says in error
    assert "Traceback" not in err


async def test_output_refuses_to_overwrite_unless_forced_and_errors_are_one_line(
        tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    await _seed(tmp_path, persona)
    target = tmp_path / "klaus.json"
    target.write_text("keep me", encoding="utf-8")
    capsys.readouterr()
    assert await _cli("export", "--author", KLAUS, "-o", str(target), "--persona", persona) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"memstream: error: {target} exists: choose another path, or --force to replace it"
    assert captured.out == "" and target.read_text(encoding="utf-8") == "keep me"
    assert await _cli("export", "--author", KLAUS, "-o", str(target), "--force", "--persona", persona,
                      "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"author_id": KLAUS, "memories": 2,
                                                   "streams": ["guild:1", "guild:2"], "file": str(target)}
    assert json.loads(target.read_text(encoding="utf-8"))["count"] == 2
    assert stat.S_IMODE(target.stat().st_mode) == 0o600

    missing = tmp_path / "nothing.jsonl"
    assert await _cli("export", "--stream", "guild:404", "-o", str(missing), "--persona", persona) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stream 'guild:404' has no memories to export" in err
    assert not missing.exists() and _partials(tmp_path) == []
    assert await _cli("export", "--author", KLAUS, "-o", str(tmp_path / "no" / "such" / "dir.json"),
                      "--persona", persona) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err and "Traceback" not in err


def _partials(folder: Path) -> list[Path]:
    return list(folder.glob("*.partial"))


def test_a_fallback_importance_is_left_for_the_importing_persona_to_rate() -> None:
    at = datetime(2024, 3, 1, 10, tzinfo=UTC)
    rated = Memory(1, "guild:1", "observation", "hello", at, at, 3, "rater", source=Source(author="Klaus"))
    guessed = Memory(2, "guild:1", "observation", "hello", at, at, 3, "fallback")
    pending = Memory(3, "guild:1", "observation", "hello", at, at, None, None, status="pending")
    assert import_line(rated) == {"text": "hello", "at": "2024-03-01T10:00:00Z", "stream": "guild:1",
                                  "importance": 3, "author": "Klaus"}
    assert "importance" not in import_line(guessed) and "importance" not in import_line(pending)
