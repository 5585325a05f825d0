"""Splitting long replies: every part fits Discord's limit, and no code block is broken."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.render import LIMIT, split_message


def _unfenced(parts: list[str]) -> str:
    """The text back without the fences added at the cuts."""
    out = []
    for i, part in enumerate(parts):
        if i > 0 and part.startswith("```") and parts[i - 1].endswith("\n```"):
            part = part.split("\n", 1)[1]
        if i < len(parts) - 1 and part.endswith("\n```") and parts[i + 1].startswith("```"):
            part = part[: -len("\n```")]
        out.append(part)
    return "".join(out)


def test_a_code_block_cut_in_two_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"print({i})" for i in range(400))
    text = "Here you go:\n```python\n" + code + "\n```\nThat's all."
    parts = split_message(text)
    assert len(parts) >= 2 and all(len(p) <= LIMIT for p in parts)
    for part in parts:
        assert part.count("```") % 2 == 0  # every part renders its code as code
    assert parts[1].startswith("```python\n")
    assert "".join(_unfenced(parts).split()) == "".join(text.split())  # nothing lost or added


def test_a_short_message_is_left_alone() -> None:
    assert split_message("hello") == ["hello"]


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["word ", "\n", "```\n", "```", "```js\n", "x" * 300, "`", "line of text\n"]),
                max_size=60))
def test_parts_always_fit_and_keep_fences_balanced(pieces: list[str]) -> None:
    text = "".join(pieces)
    if not text.strip():
        return
    parts = split_message(text)
    assert all(0 < len(p) <= LIMIT for p in parts)
    if text.count("```") % 2 == 0:
        assert all(p.count("```") % 2 == 0 for p in parts)
    assert "".join(_unfenced(parts).split()) == "".join(text.split())


def test_a_code_block_cut_at_a_space_starts_its_next_part_without_a_stray_space() -> None:
    code = " ".join(f"token{i}" for i in range(600))  # one long line: the cut falls on a space
    parts = split_message("```\n" + code + "\n```")
    assert len(parts) >= 2
    for part in parts[1:]:
        assert part.startswith("```\n") and not part.startswith("```\n ")
    prose = split_message(" ".join(["word"] * 900))
    assert len(prose) >= 2 and not any(part.startswith(" ") for part in prose)


def test_memory_times_are_discord_timestamps_each_viewer_sees_in_their_zone() -> None:
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    from bot.render import memory_line
    from memstream import Memory, Source

    at = datetime(2024, 2, 13, 17, 0, tzinfo=UTC)
    memory = Memory(id=3, stream="guild:1", kind="observation", text="hello", created_at=at, last_accessed_at=at,
                    importance=4, importance_source="rater", depth=0, source=Source(), status="ready")
    line = memory_line(memory, ZoneInfo("America/Chicago"))
    assert f"<t:{int(at.timestamp())}:f>" in line and "2024-02-13" not in line
