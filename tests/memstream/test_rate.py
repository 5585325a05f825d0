"""The importance rater: strict parsing, one retry, then the fallback importance with a warning."""

from __future__ import annotations

import logging

import pytest

from memstream.rate import FALLBACK_IMPORTANCE, parse_rating
from memstream.testing import ScriptedChat
from tests.conftest import MakeMemory
from tests.memstream.helpers import RATER, memory_text


@pytest.mark.parametrize(("reply", "expected"), [
    ("7", 7), (" 7 ", 7), ("\n10\n", 10), ("1", 1), ("+3", 3), ("07", 7),
    ("7.5", None), ("seven", None), ("11", None), ("0", None), ("-2", None), ("", None), ("   ", None),
    ("I cannot rate that.", None), ("7/10", None), ("Rating: 7", None), ("7 8", None),
])
def test_parse_rating(reply: str, expected: int | None) -> None:
    assert parse_rating(reply) == expected


async def test_a_valid_reply_is_used_after_one_call(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = make_memory()
    chat.on(RATER, " 8 ")
    stored = await memory.observe("Klaus asked Maria out")
    assert (stored.importance, stored.importance_source) == (8, "rater")
    [(model, prompt)] = chat.calls
    assert model == "rater-model"
    assert memory_text(prompt) == "Klaus asked Maria out"
    assert "for Maria." in prompt


async def test_an_invalid_reply_is_retried_once(make_memory: MakeMemory, chat: ScriptedChat,
                                                caplog: pytest.LogCaptureFixture) -> None:
    memory = make_memory()
    chat.on(RATER, ["seven", "6"])
    with caplog.at_level(logging.WARNING, logger="memstream.rate"):
        stored = await memory.observe("Maria bought a new easel")
    assert (stored.importance, stored.importance_source) == (6, "rater")
    assert len(chat.calls_with(RATER)) == 2
    assert not [r for r in caplog.records if r.name == "memstream.rate"]


@pytest.mark.parametrize("replies", [["I cannot rate that.", "11"], ["7.5", "seven"], ["", "0"]])
async def test_two_invalid_replies_fall_back_to_5_with_a_warning(
    make_memory: MakeMemory, chat: ScriptedChat, caplog: pytest.LogCaptureFixture, replies: list[str]
) -> None:
    memory = make_memory()
    chat.on(RATER, [*replies, "9"])  # a third call would get a valid 9
    with caplog.at_level(logging.WARNING, logger="memstream.rate"):
        stored = await memory.observe("Maria found a coin")
    assert len(chat.calls_with(RATER)) == 2
    assert (stored.importance, stored.importance_source) == (FALLBACK_IMPORTANCE, "fallback")
    assert FALLBACK_IMPORTANCE == 5
    [record] = [r for r in caplog.records if r.name == "memstream.rate"]
    assert record.levelno == logging.WARNING
    assert repr(replies[0][:40]) in record.getMessage()
    assert (await memory.stats()).counts.fallback == 1
    assert await memory.importance_total() == 5


async def test_given_importance_skips_the_rater(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = make_memory()
    stored = await memory.observe("Isabella's party invitation", importance=7)
    assert (stored.importance, stored.importance_source) == (7, "given")
    assert chat.calls == []
