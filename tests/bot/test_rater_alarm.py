"""The flat-rater alarm in the bot: `/memory-stats` says it for the server whose ratings are flat (and only
there), and the bot's log says it once, not on every message."""

from __future__ import annotations

import logging

import pytest

from tests.bot.conftest import World


async def test_a_rater_that_scores_everything_alike_is_shown_and_logged_once(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bot.scheduler")
    for i in range(50):  # the fake rater rates chatter 1, every time
        await world.say(world.town, world.general, world.klaus, f"just chatting, message {i}")
    await world.say(world.other, world.lounge, world.maria, "a party on Valentine's Day")  # rated 7, elsewhere
    record = await world.fake.slash(world.town.id, world.general, world.maria, "memory-stats")
    [stats] = await record.wait_done()
    assert "Warning: the rater looks miscalibrated: 50 of its last 50 ratings are 1" in stats.content
    record = await world.fake.slash(world.other.id, world.lounge, world.maria, "memory-stats")
    [elsewhere] = await record.wait_done()
    assert "miscalibrated" not in elsewhere.content  # a server's stats tell of its own ratings only

    for _ in range(3):  # the scheduler's periodic check (at start, then every reflect_check_minutes)
        await world.bot.reflections.check()
    await world.say(world.town, world.general, world.klaus, "one more message")
    logged = [r.getMessage() for r in caplog.records if "miscalibrated" in r.getMessage()]
    assert len(logged) == 1 and "importance ratings: the rater looks miscalibrated" in logged[0]
