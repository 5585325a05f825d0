"""The reflector: parsing, the stop rule, citations, derived importance and depth, evidence trees."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import pytest

from memstream.config import StreamConfig
from memstream.errors import CompletionError
from memstream.records import EvidenceNode
from memstream.reflect import Insight, parse_citations, parse_insights, parse_questions
from memstream.stream import MemoryStream
from memstream.testing import FakeClock, ScriptedChat
from tests.conftest import MakeMemory
from tests.memstream.helpers import INSIGHTS, QUESTIONS, CountingRetriever, tagged

THREE = "What does Maria care about?\nWho does Maria spend time with?\nWhat is Maria planning?"

# -- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "expected"), [
    ("", []),
    ("\n  \n\t\n", []),
    ("Why?\nWho?\nWhat?", ["Why?", "Who?", "What?"]),
    ("1. Why?\n2) Who?\n- What?", ["Why?", "Who?", "What?"]),
    ("\n".join(f"Question {n}?" for n in range(1, 8)), ["Question 1?", "Question 2?", "Question 3?"]),
    ("  Only one?  ", ["Only one?"]),
])
def test_parse_questions(reply: str, expected: list[str]) -> None:
    assert parse_questions(reply) == expected


@pytest.mark.parametrize(("text", "count", "expected"), [
    ("1, 5, 3", 5, (1, 5, 3)),
    ("2-4", 5, (2, 3, 4)),
    ("2–4, 1", 5, (2, 3, 4, 1)),
    ("1 and 3", 5, (1, 3)),
    ("1, 3 and 4", 5, (1, 3, 4)),
    ("1, 9, 0, 3", 5, (1, 3)),
    ("4-9", 5, (4, 5)),
    ("2, 2, 1, 2", 5, (2, 1)),
    ("", 5, ()),
    ("7", 5, ()),
])
def test_parse_citations(text: str, count: int, expected: tuple[int, ...]) -> None:
    assert parse_citations(text, count) == expected


def test_parse_insights() -> None:
    reply = "\n".join([
        "1. Maria wants to spend more time with Klaus (because of 1, 5, 3)",
        "- Maria is dedicated to painting (because of 2-4).",
        "Maria is busy (mostly in the mornings)",
        "Maria likes parties",
        "Maria dislikes rain (because of 9)",
        "",
        "Maria and Klaus are friends (because of 1 and 2)",
    ])
    assert parse_insights(reply, 5) == [
        Insight("Maria wants to spend more time with Klaus", (1, 5, 3)),
        Insight("Maria is dedicated to painting", (2, 3, 4)),
        Insight("Maria is busy (mostly in the mornings)", ()),
        Insight("Maria likes parties", ()),
        Insight("Maria dislikes rain", ()),
        Insight("Maria and Klaus are friends", (1, 2)),
    ]


# -- helpers for reflections over a real stream ------------------------------------------------------

_STATEMENT = re.compile(r"^(\d+)\. (.*)$")


def statement_numbers(prompt: str) -> dict[str, int]:
    """The number of each statement in an insights prompt."""
    out = {}
    for line in tagged(prompt, "statements").strip().splitlines():
        match = _STATEMENT.match(line)
        assert match, line
        out[match.group(2)] = int(match.group(1))
    return out


def citing(*insights: tuple[str, list[str]]) -> Callable[[str, str], str]:
    """An insights reply citing statements by their text, whatever numbers they were given."""

    def answer(prompt: str, model: str) -> str:
        numbers = statement_numbers(prompt)
        lines = []
        for text, cited in insights:
            refs = ", ".join(str(numbers[c]) for c in cited)
            lines.append(f"{text} (because of {refs})" if refs else text)
        return "\n".join(lines)

    return answer


async def observe_all(memory: MemoryStream, clock: FakeClock, items: dict[str, int]) -> dict[str, int]:
    """Observe texts with given importance, one minute apart; their ids by text."""
    ids = {}
    for text, importance in items.items():
        clock.advance(minutes=1)
        ids[text] = (await memory.observe(text, importance=importance)).id
    return ids


def leaves(node: EvidenceNode) -> set[int]:
    if not node.evidence:
        assert node.memory.kind == "observation"
        return {node.memory.id}
    return set().union(*(leaves(child) for child in node.evidence))


# -- one reflection --------------------------------------------------------------------------------


async def test_insight_importance_is_derived_from_its_citations_with_depth_one(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    ids = await observe_all(memory, clock, {"Klaus visited Maria": 3, "Maria painted Klaus": 8,
                                            "Klaus cooked for Maria": 9, "Maria fed the cat": 1})
    chat.on(QUESTIONS, THREE)
    chat.on(INSIGHTS, citing(("Maria is close to Klaus", ["Maria painted Klaus", "Klaus visited Maria",
                                                          "Klaus cooked for Maria"])))
    result = await memory.reflect()
    assert result is not None
    [insight] = result.insights
    assert insight.kind == "reflection"
    assert insight.text == "Maria is close to Klaus"
    assert (insight.importance, insight.importance_source, insight.depth) == (round((3 + 8 + 9) / 3), "derived", 1)
    cited = [ids["Maria painted Klaus"], ids["Klaus visited Maria"], ids["Klaus cooked for Maria"]]
    assert await memory.store.evidence(insight.id) == cited
    assert result.evidence == {insight.id: cited}
    assert insight.created_at == clock.now()
    # The insight is in the same stream and retrievable like any memory (the loaded matrix included).
    assert insight.id in {item.memory.id for item in await memory.explain("Maria is close to Klaus", k=5)}


async def test_the_statements_are_deduplicated_and_numbered_from_one(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    texts = [f"Maria saw bird {n}" for n in range(8)]
    await observe_all(memory, clock, dict.fromkeys(texts, 2))
    chat.on(QUESTIONS, THREE)
    result = await memory.reflect()
    assert result is not None
    [prompt] = chat.calls_with(INSIGHTS)
    numbers = statement_numbers(prompt)
    assert sorted(numbers.values()) == list(range(1, len(numbers) + 1))
    assert [m.text for m in result.statements] == sorted(numbers, key=numbers.__getitem__)
    assert len({m.id for m in result.statements}) == len(result.statements)
    assert 5 <= len(result.statements) <= 8  # three retrievals of 5 over 8 memories, overlapping


async def test_the_questions_prompt_lists_the_most_recent_memories_oldest_first(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory(config=StreamConfig(recent_for_questions=3))
    await observe_all(memory, clock, {f"event {n}": 2 for n in range(5)})
    chat.on(QUESTIONS, "")
    await memory.reflect()
    [prompt] = chat.calls_with(QUESTIONS)
    assert tagged(prompt, "memories").strip().splitlines() == ["- event 2", "- event 3", "- event 4"]
    assert "Here are Maria's most recent memories" in prompt


async def test_insights_with_too_few_citations_are_dropped_and_logged(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    memory = make_memory(config=StreamConfig(min_citations=2))
    await observe_all(memory, clock, {"A happened": 4, "B happened": 4, "C happened": 4})
    chat.on(QUESTIONS, THREE)
    chat.on(INSIGHTS, citing(("Two reasons", ["A happened", "B happened"]), ("One reason", ["C happened"]),
                             ("No reason", [])))
    with caplog.at_level(logging.INFO, logger="memstream.reflect"):
        result = await memory.reflect()
    assert result is not None
    assert [m.text for m in result.insights] == ["Two reasons"]
    assert result.dropped == ["One reason", "No reason"]
    logged = [r.getMessage() for r in caplog.records if r.name == "memstream.reflect"]
    assert len(logged) == 2
    assert "'One reason'" in logged[0] and "'No reason'" in logged[1]
    assert [m.text for m in await memory.recent(limit=10) if m.kind == "reflection"] == ["Two reasons"]


async def test_with_the_default_one_citation_is_enough(make_memory: MakeMemory, chat: ScriptedChat,
                                                         clock: FakeClock) -> None:
    memory = make_memory()
    await observe_all(memory, clock, {"A happened": 4, "B happened": 4})
    chat.on(QUESTIONS, THREE)
    chat.on(INSIGHTS, citing(("One reason", ["B happened"]), ("No reason", [])))
    result = await memory.reflect()
    assert result is not None
    assert [m.text for m in result.insights] == ["One reason"]
    assert result.dropped == ["No reason"]


# -- the importance total and the stop rule ----------------------------------------------------------


async def test_the_total_resets_even_when_every_insight_is_dropped(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    await observe_all(memory, clock, {"A happened": 7, "B happened": 9})
    assert await memory.importance_total() == 16
    chat.on(QUESTIONS, THREE)
    chat.on(INSIGHTS, "Something unsupported\nAnother thing (because of 42)")
    result = await memory.reflect()
    assert result is not None
    assert result.insights == [] and result.dropped == ["Something unsupported", "Another thing"]
    assert await memory.importance_total() == 0
    state = await memory.store.state("default")
    assert (state.reflections, state.last_reflection_at) == (1, clock.now())


async def test_a_questions_reply_without_questions_skips_the_reflection(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    memory = make_memory()
    await observe_all(memory, clock, {"A happened": 7, "B happened": 9})
    chat.on(QUESTIONS, "\n \n")
    with caplog.at_level(logging.WARNING, logger="memstream.reflect"):
        result = await memory.reflect()
    assert result is not None and result.skipped is not None
    assert len(chat.calls_with(QUESTIONS)) == 1
    assert chat.calls_with(INSIGHTS) == []
    assert await memory.importance_total() == 16
    state = await memory.store.state("default")
    assert (state.reflections, state.skipped_reflections) == (0, 1)
    assert [r.levelno for r in caplog.records if r.name == "memstream.reflect"] == [logging.WARNING]


async def test_seven_questions_make_three_retrievals(make_memory: MakeMemory, chat: ScriptedChat,
                                                     clock: FakeClock) -> None:
    counting = CountingRetriever()
    memory = make_memory(retriever=counting)
    counting.inner = memory.retriever
    await observe_all(memory, clock, {"A happened": 4, "B happened": 4})
    chat.on(QUESTIONS, "\n".join(f"Question {n}?" for n in range(1, 8)))
    result = await memory.reflect()
    assert result is not None
    assert result.questions == ["Question 1?", "Question 2?", "Question 3?"]
    assert [query for query, _ in counting.calls] == result.questions
    [prompt] = chat.calls_with(INSIGHTS)
    assert '"Question 3?"' in prompt and "Question 4?" not in prompt
    assert len(chat.calls_with(QUESTIONS)) == 1


async def test_an_empty_stream_makes_no_model_call(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = make_memory()
    result = await memory.reflect()
    assert result is not None and result.skipped is not None
    assert chat.calls == []


async def test_a_failed_reflection_raises_keeps_the_total_and_counts_a_skip(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    await observe_all(memory, clock, {"A happened": 7})
    chat.fail_with = CompletionError("the model server is down")
    with pytest.raises(CompletionError, match="down"):
        await memory.reflect()
    assert await memory.importance_total() == 7
    assert (await memory.store.state("default")).skipped_reflections == 1
    assert (await memory.stats()).usage["reflector"].failures == 1


async def test_crossing_the_threshold_calls_the_hook_instead_when_given(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    due: list[str] = []

    async def hook(stream: str) -> None:
        due.append(stream)

    memory = make_memory(config=StreamConfig(reflection_threshold=10), on_reflection_due=hook)
    await memory.observe("A happened", stream="guild:1", importance=6)
    assert due == []
    await memory.observe("B happened", stream="guild:1", importance=6)
    assert due == ["guild:1"]
    assert chat.calls == []
    assert await memory.due_streams() == ["guild:1"]


async def test_reflections_are_not_counted_towards_the_total(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory(config=StreamConfig(reflection_threshold=10))
    chat.on(QUESTIONS, THREE)
    chat.on(INSIGHTS, citing(("A and B matter", ["A happened", "B happened"])))
    await observe_all(memory, clock, {"A happened": 9})
    await observe_all(memory, clock, {"B happened": 9})  # 18 >= 10: reflects automatically
    assert len(chat.calls_with(INSIGHTS)) == 1
    assert await memory.importance_total() == 0
    stats = await memory.stats("default")
    assert (stats.counts.reflections, stats.state.reflections) == (1, 1)


# -- reflections on reflections ----------------------------------------------------------------------


async def test_reflections_cite_earlier_reflections_and_why_reaches_the_observations(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    ids = await observe_all(memory, clock, {"Klaus visited Maria": 4, "Klaus cooked for Maria": 6,
                                            "Maria painted all day": 5})
    chat.on(QUESTIONS, THREE)
    chat.on(INSIGHTS, citing(("Klaus cares for Maria", ["Klaus visited Maria", "Klaus cooked for Maria"])))
    first = await memory.reflect()
    assert first is not None
    [level1] = first.insights
    assert level1.depth == 1

    clock.advance(hours=1)
    chat.rules.clear()
    chat.on(QUESTIONS, THREE)
    chat.on(INSIGHTS, citing(("Maria is loved and busy", ["Klaus cares for Maria", "Maria painted all day"])))
    second = await memory.reflect()
    assert second is not None
    [level2] = second.insights
    assert level2.depth == 2
    assert await memory.store.evidence(level2.id) == [level1.id, ids["Maria painted all day"]]

    tree = await memory.why(level2.id)
    assert tree.memory.id == level2.id
    assert [child.memory.id for child in tree.evidence] == [level1.id, ids["Maria painted all day"]]
    assert [child.memory.id for child in tree.evidence[0].evidence] == [ids["Klaus visited Maria"],
                                                                        ids["Klaus cooked for Maria"]]
    assert leaves(tree) == set(ids.values())
    assert (await memory.why(ids["Maria painted all day"])).evidence == ()
