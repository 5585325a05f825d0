"""The daily budget at the command line: separate processes share the day's spend (it is in the store), `stats`
shows it against the budget, and the terminal chat says why it gives no reply."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memstream.cli import main
from tests.fakes.openai_server import FakeOpenAIServer


def _persona(tmp_path: Path, base_url: str, database: Path | str, budget: str) -> str:
    path = tmp_path / "isabella.toml"
    path.write_text(
        '[persona]\nname = "Isabella Rodriguez"\nsummary = "Runs Hobbs Cafe."\n'
        f'database = "{database}"\n[models]\nbase_url = "{base_url}"\nmax_retries = 0\n'
        f"[budget]\n{budget}\n", encoding="utf-8")
    return str(path)


def _run(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memstream", *argv], input=stdin, capture_output=True, text=True,
                          timeout=90)


async def test_processes_share_the_days_spend_and_stats_show_it(tmp_path: Path, server: FakeOpenAIServer,
                                                                database: Path | str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    persona = _persona(tmp_path, server.base_url, database, "rater = { calls_per_day = 2 }")
    for n in range(2):  # each its own process
        done = await asyncio.to_thread(_run, "observe", f"Isabella plans party number {n}", "--persona", persona)
        assert done.returncode == 0, done.stderr
    spent = await asyncio.to_thread(_run, "observe", "Isabella plans one more party", "--persona", persona)
    assert spent.returncode != 0
    assert "the rater budget is spent until" in spent.stderr and "2 of 2 calls today" in spent.stderr
    assert "is kept and will be completed later" in spent.stderr
    raters = [r for r in server.chat_requests if "Reply with a single integer" in r.prompt]
    assert len(raters) == 2  # the third process made no call

    assert await asyncio.to_thread(main, ["stats", "--persona", persona, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["pending"] == 1 and stats["failed_attempts"] == 0
    [line] = stats["budget"]
    assert (line["role"], line["calls"], line["calls_per_day"], line["spent"]) == ("rater", 2, 2, True)
    assert stats["next_retry_at"] == line["renews_at"]  # the pending one waits for the renewal
    assert await asyncio.to_thread(main, ["stats", "--persona", persona]) == 0
    out = capsys.readouterr().out
    assert "budget today (" in out and "UTC, every stream; renews at 00:00 UTC):" in out
    assert "  rater: 2/2 calls, " in out and ": spent, no call until " in out


async def test_the_terminal_chat_says_why_it_gives_no_reply(tmp_path: Path, server: FakeOpenAIServer) -> None:
    persona = _persona(tmp_path, server.base_url, tmp_path / "isabella.db", "agent = { calls_per_day = 1 }")
    result = await asyncio.to_thread(_run, "chat", "--persona", persona, "--as", "Maria",
                                     stdin="what are you doing tonight?\nand tomorrow?\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Isabella Rodriguez: Come to my party!"]
    assert "memstream: Isabella Rodriguez gives no reply, the agent budget is spent until " in result.stderr
    assert "(1 of 1 calls today); your line is kept" in result.stderr
    agent = [r for r in server.chat_requests if "What do you do or say next?" in r.prompt]
    assert len(agent) == 1
