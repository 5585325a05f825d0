"""A persona's daily budget of model calls and tokens per role ([budget]): off by default; when a role's budget is
spent no call is made, observations wait pending until the day renews (00:00 UTC), replies are refused, and the
day's spend is the store's (every process sharing it), on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memstream import BudgetSpent, ConfigError, MemoryStream, Observation, Source, load_persona
from memstream.config import BudgetConfig, RoleLimit, StreamConfig
from memstream.models.roles import RoleModel
from memstream.render import budget_lines
from memstream.store import Store
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.conftest import AGENT_NAME, AGENT_SUMMARY

STREAM = "guild:1"
START = datetime(2026, 3, 9, 21, 30, tzinfo=UTC)  # a Monday evening; the budget renews at 00:00 UTC


@pytest.fixture
def wall() -> FakeClock:
    """The clock that dates model usage (the budget's day): the store's."""
    return FakeClock(START)


@pytest.fixture
async def stores(database: Path | str, wall: FakeClock) -> AsyncIterator[list[Store]]:
    """Two stores on one database, as two processes serving one persona have (each its own connections)."""
    opened = [await Store.open(database, clock=wall), await Store.open(database, clock=wall)]
    yield opened
    for store in opened:
        await store.close()


def make(store: Store, chat: ScriptedChat, clock: FakeClock, budget: BudgetConfig | None = None,
         batch: int = 32, **options: Any) -> MemoryStream:
    return MemoryStream(store, FakeEmbedder(), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "f"),
                        agent=RoleModel(chat, "a"), name=AGENT_NAME, summary=AGENT_SUMMARY, clock=clock,
                        config=StreamConfig(reflection_threshold=10**6, embed_batch_size=batch), budget=budget,
                        **options)


def rater_calls(chat: ScriptedChat) -> int:
    return len(chat.calls_with("poignancy"))


def burst(n: int, start: int = 0) -> list[Observation]:
    return [Observation(f"Klaus says thing number {i}", STREAM, None, None, Source(message_id=str(1000 + i)))
            for i in range(start, start + n)]


async def test_budget_off_changes_nothing(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4")
    memory = make(stores[0], chat, wall)
    done = await memory.observe_many(burst(5))
    assert [m.status for m in done] == ["ready"] * 5
    stats = await memory.stats()
    assert stats.budget == () and "budget" not in stats.to_json()
    assert memory.last_model_error is None


async def test_spent_rater_budget_keeps_observations_pending_until_the_day_renews(
        stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4")
    memory = make(stores[0], chat, wall, BudgetConfig({"rater": RoleLimit(calls_per_day=3)}))
    done = await memory.observe_many(burst(5))
    assert sorted(m.status for m in done) == ["pending"] * 2 + ["ready"] * 3
    assert rater_calls(chat) == 3  # never a call past the budget, though the burst's calls run at once
    renewal = datetime(2026, 3, 10, tzinfo=UTC)
    error = memory.last_model_error
    assert isinstance(error, BudgetSpent) and error.role == "rater" and error.until == renewal
    assert str(error) == "the rater budget is spent until 2026-03-10 00:00 UTC (3 of 3 calls today)"
    stats = await memory.stats(STREAM)
    assert stats.pending.count == 2 and stats.pending.failed_attempts == 0  # waiting is not failing
    assert stats.pending.next_retry_at == renewal

    # The retries of the same day make no call: not the scheduler's (due), not a restart's (all).
    wall.advance(hours=2)
    assert await memory.complete_pending(due_only=True) == 0
    assert await memory.complete_pending() == 0
    assert rater_calls(chat) == 3
    assert (await memory.stats(STREAM)).pending.count == 2

    wall.set(renewal + timedelta(minutes=1))  # the next UTC day: a new budget
    assert await memory.complete_pending(due_only=True) == 2
    assert rater_calls(chat) == 5
    [line] = (await memory.stats()).budget
    assert (line.role, line.calls, line.calls_per_day, line.spent) == ("rater", 2, 3, False)
    assert line.day == renewal


async def test_a_burst_of_many_batches_stops_at_the_budget(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4")
    memory = make(stores[0], chat, wall, BudgetConfig({"rater": RoleLimit(calls_per_day=7)}), batch=2)
    done = await memory.observe_many(burst(40))
    # The calls of a batch being written (counted, not yet committed) still count: no call slips in meanwhile.
    assert rater_calls(chat) == 7
    assert sum(m.status == "ready" for m in done) <= 7
    [line] = (await memory.stats()).budget
    assert line.calls == 7 and line.spent


async def test_a_token_budget_counts_prompt_and_completion_tokens(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4")
    memory = make(stores[0], chat, wall, BudgetConfig({"rater": RoleLimit(tokens_per_day=1)}))
    await memory.observe("Klaus says hello", stream=STREAM, importance=3)  # a given importance: no rater call
    with pytest.raises(BudgetSpent, match="rater budget is spent") as caught:
        for n in range(2):
            await memory.observe(f"Klaus says hello again {n}", stream=STREAM)
    assert "is kept and will be completed later" in str(caught.value)
    assert rater_calls(chat) == 1  # the call that crossed the limit was the day's last
    [line] = (await memory.stats()).budget
    assert line.tokens > 1 and line.tokens_per_day == 1 and line.calls == 1 and line.spent


async def test_spent_embedding_budget_holds_back_every_completion(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4")
    memory = make(stores[0], chat, wall, BudgetConfig({"embedding": RoleLimit(calls_per_day=1)}))
    assert (await memory.observe("Klaus says one", stream=STREAM)).status == "ready"
    done = await memory.observe_many(burst(3))
    assert [m.status for m in done] == ["pending"] * 3
    assert rater_calls(chat) == 1  # checked before any call: no rating wasted on a memory that cannot be embedded


async def test_spent_agent_budget_refuses_the_reply_and_keeps_the_line(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4").on("You are", "Hello there!")
    memory = make(stores[0], chat, wall, BudgetConfig({"agent": RoleLimit(calls_per_day=1)}))
    reply = await memory.respond("hi", stream=STREAM, speaker="Klaus")
    assert reply.text == "Hello there!"
    calls = len(chat.calls)
    with pytest.raises(BudgetSpent) as caught:
        await memory.respond("are you there?", stream=STREAM, speaker="Klaus")
    assert caught.value.role == "agent"
    assert len(chat.calls) == calls + 1  # the line was rated (and kept); no agent call
    assert [m.text for m in await memory.recent(STREAM, 1)] == ["Klaus: are you there?"]
    wall.advance(days=1)
    assert (await memory.respond("and now?", stream=STREAM, speaker="Klaus")).text == "Hello there!"


async def test_spent_rater_budget_still_lets_the_persona_answer(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4").on("You are", "Hello there!")
    memory = make(stores[0], chat, wall, BudgetConfig({"rater": RoleLimit(calls_per_day=1)}))
    await memory.observe("Klaus says one", stream=STREAM)
    reply = await memory.respond("hi", stream=STREAM, speaker="Klaus")
    assert reply.text == "Hello there!"
    assert [m.status for m in await memory.recent(STREAM, 1)] == ["pending"]  # the reply's memory waits


async def test_spent_reflector_budget_postpones_the_reflection(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="9")
    memory = MemoryStream(stores[0], FakeEmbedder(), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "f"),
                          agent=RoleModel(chat, "a"), name=AGENT_NAME, summary=AGENT_SUMMARY, clock=wall,
                          config=StreamConfig(reflection_threshold=10), auto_reflect=False,
                          budget=BudgetConfig({"reflector": RoleLimit(calls_per_day=1)}))
    await memory.observe_many(burst(2))
    await memory.store.record_usage("other", "reflector")  # one call today, in another stream: the persona's
    assert await memory.reflect(STREAM, only_if_due=True) is None
    assert (await memory.store.state(STREAM)).skipped_reflections == 0
    assert await memory.reflection_due(STREAM)  # still due: it runs once the budget renews
    with pytest.raises(BudgetSpent):
        await memory.reflect(STREAM)


async def test_two_processes_share_the_days_spend(stores: list[Store], wall: FakeClock) -> None:
    budget = BudgetConfig({"rater": RoleLimit(calls_per_day=4)})
    chats = [ScriptedChat(default="4"), ScriptedChat(default="4")]
    first, second = (make(store, chat, wall, budget) for store, chat in zip(stores, chats, strict=True))
    await first.observe_many(burst(3))
    done = await second.observe_many(burst(3, start=10))
    assert rater_calls(chats[0]) == 3 and rater_calls(chats[1]) == 1
    assert sorted(m.status for m in done) == ["pending", "pending", "ready"]
    for memory in (first, second):
        [line] = (await memory.stats()).budget
        assert (line.calls, line.spent) == (4, True)


async def test_usage_is_dated_by_the_usage_clock(stores: list[Store], wall: FakeClock) -> None:
    store = stores[0]
    await store.record_usage("s", "rater", prompt_tokens=5)
    wall.advance(days=1)
    await store.record_usage_many([("s", "rater", 2, 0, 1, 1, 0), ("t", "rater", 1, 0, 0, 0, 0)])
    today = await store.usage_of_day(wall.now())
    assert (today["rater"].calls, today["rater"].prompt_tokens) == (3, 1)
    yesterday = await store.usage_of_day(wall.now() - timedelta(days=1))
    assert (yesterday["rater"].calls, yesterday["rater"].prompt_tokens) == (1, 5)
    days = [(day.date().isoformat(), usage.calls) for day, _, usage in await store.usage_by_day()]
    assert days == [("2026-03-09", 1), ("2026-03-10", 3)]


async def test_stats_show_the_spend_against_the_budget(stores: list[Store], wall: FakeClock) -> None:
    chat = ScriptedChat(default="4")
    memory = make(stores[0], chat, wall, BudgetConfig({"rater": RoleLimit(calls_per_day=2),
                                                       "agent": RoleLimit(calls_per_day=50, tokens_per_day=9000)}))
    await memory.observe_many(burst(3))
    stats = await memory.stats(STREAM)
    assert [line["role"] for line in stats.to_json()["budget"]] == ["rater", "agent"]
    rater = stats.to_json()["budget"][0]
    assert rater == {"role": "rater", "calls": 2, "calls_per_day": 2, "tokens": rater["tokens"],
                     "tokens_per_day": None, "spent": True, "day": "2026-03-09T00:00:00+00:00",
                     "renews_at": "2026-03-10T00:00:00+00:00"}

    assert budget_lines(stats.budget) == [
        "budget today (2026-03-09 UTC, every stream; renews at 00:00 UTC):",
        f"  rater: 2/2 calls, {rater['tokens']} tokens: spent, no call until 2026-03-10 00:00 UTC",
        "  agent: 0/50 calls, 0/9000 tokens"]


# -- the [budget] table ------------------------------------------------------------------------------------

MINIMAL = '[persona]\nname = "Ada"\nsummary = "Ada keeps the lighthouse."\n'


def test_no_budget_table_is_no_budget(tmp_path: Path) -> None:
    (tmp_path / "ada.toml").write_text(MINIMAL)
    assert not load_persona(tmp_path / "ada.toml", environ={}).budget.enabled


def test_a_budget_table_gives_each_role_its_limits(tmp_path: Path) -> None:
    (tmp_path / "ada.toml").write_text(MINIMAL + '[budget]\nrater = { calls_per_day = 2000 }\n'
                                       '[budget.agent]\ncalls_per_day = 100\ntokens_per_day = 150000\n')
    budget = load_persona(tmp_path / "ada.toml", environ={}).budget
    assert dict(budget.roles) == {"rater": RoleLimit(calls_per_day=2000),
                                  "agent": RoleLimit(calls_per_day=100, tokens_per_day=150000)}
    assert budget.limit("embedding") is None


@pytest.mark.parametrize(("table", "expected"), [
    ("raters = { calls_per_day = 1 }", "[budget] unknown role 'raters'; known roles: rater, reflector, agent, "
                                       "embedding"),
    ("rater = { calls = 1 }", "[budget] rater: unknown key 'calls'; known keys: calls_per_day, tokens_per_day"),
    ("rater = { calls_per_day = 0 }", "[budget] rater.calls_per_day: must be a whole number of 1 or more (leave it "
                                      "out for no limit), got 0"),
    ("agent = { tokens_per_day = -5 }", "[budget] agent.tokens_per_day: must be a whole number of 1 or more"),
    ("agent = { tokens_per_day = 1.5 }", "got 1.5"),
    ('agent = { calls_per_day = "100" }', "got '100'"),
    ("agent = { calls_per_day = true }", "got True"),
    ("agent = 100", "[budget] agent: must be a table such as { calls_per_day = 1000 }, got 100"),
    ("agent = {}", "[budget] agent: give calls_per_day, tokens_per_day or both"),
])
def test_a_bad_budget_is_refused_naming_the_file_and_key(tmp_path: Path, table: str, expected: str) -> None:
    (tmp_path / "ada.toml").write_text(MINIMAL + f"[budget]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        load_persona(tmp_path / "ada.toml", environ={})
    assert str(info.value).startswith(f"{tmp_path / 'ada.toml'}: [budget]")
    assert expected in str(info.value)


def test_budget_must_be_a_table(tmp_path: Path) -> None:
    (tmp_path / "ada.toml").write_text('budget = 5\n' + MINIMAL)
    with pytest.raises(ConfigError, match=r"\[budget\] must be a table, got int"):
        load_persona(tmp_path / "ada.toml", environ={})


def test_the_readme_and_example_budgets_load(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    [block] = [b.split("\n", 1)[1] for b in readme.split("```toml")[1:] if b.split("\n", 1)[1].startswith("[budget]")]
    example = "\n".join(line.removeprefix("# ") for line in (root / "personas" / "isabella.toml").read_text(
        encoding="utf-8").splitlines() if line.startswith(("# [budget]", "# rater =", "# agent =")))
    for text in (block.split("```")[0], example):
        (tmp_path / "ada.toml").write_text(MINIMAL + text)
        budget = load_persona(tmp_path / "ada.toml", environ={}).budget
        assert budget.limit("rater") == RoleLimit(calls_per_day=5000)
