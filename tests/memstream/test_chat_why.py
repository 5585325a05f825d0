"""`/why` in `memstream chat`: the last reply's memories with their score parts, as the Discord menu shows."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.cli.test_cli import _answer, _persona


def _chat(persona: str, lines: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memstream", "chat", "--persona", persona, "--as", "Maria"],
                          input=lines, capture_output=True, text=True, timeout=60)


async def test_why_gives_each_memory_its_score_and_parts(tmp_path: Path) -> None:
    async with FakeOpenAIServer() as server:
        server.on_chat(_answer)
        persona = str(_persona(tmp_path, server.base_url))
        done = await asyncio.to_thread(_chat, persona, "/why\nthe party is on friday\nare you having a party?\n/why\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("no reply yet")
    start = out.index('asked: "are you having a party?"')
    assert out[start + 1] == ("score = 1 × recency + 1 × importance + 1 × relevance (profile spec; each part "
                              "normalized to 0..1 over the stream)")
    rows = [line for line in out[start + 3:] if re.match(r"\s*\d+ ", line)]
    # The memories before the question: the first line said, and the first reply (the question itself is left out).
    assert len(rows) == 2
    texts = " ".join(rows)
    assert "Maria: the party is on friday" in texts and "Isabella Rodriguez: Come to my party!" in texts
    assert "are you having a party?" not in texts
    for row in rows:
        score, rec, imp, rel = row.split()[1:5]
        assert abs(float(score) - (float(rec) + float(imp) + float(rel))) < 0.02  # weights 1, 1, 1


async def test_why_shows_an_insight_s_evidence_down_to_the_observation(tmp_path: Path) -> None:
    async with FakeOpenAIServer() as server:
        server.on_chat(_answer)
        path = _persona(tmp_path, server.base_url, threshold=5)
        persona = str(path)
        run = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "memstream", "observe",
                                                       "Isabella plans a party", "--persona", persona, "--importance",
                                                       "9"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        done = await asyncio.to_thread(_chat, persona, "what are you planning?\n/why\n")
    assert done.returncode == 0, done.stderr
    insight = [line for line in done.stdout.splitlines() if "insight" in line and "planning a party" in line]
    assert insight, done.stdout
    below = done.stdout.splitlines()[done.stdout.splitlines().index(insight[0]) + 1]
    assert "↳ #1 observation" in below and "Isabella plans a party" in below
