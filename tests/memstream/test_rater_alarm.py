"""The flat-rater alarm (memstream/calibration.py): the spec's "the rater scores everything 5", read from the
store's latest ratings on either backend, on by default with its switch (`rater_alarm_window = 0`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from memstream import MemoryStream, Observation, Store, StreamConfig
from memstream.calibration import rater_check
from memstream.errors import ConfigError
from memstream.store import NewMemory
from memstream.testing import ScriptedChat
from tests.conftest import MakeMemory

RATER = "Reply with a single integer"
STREAM = "guild:1"


def rated(values: Sequence[int], *, stream: str = STREAM, source: str = "rater", start: float = 1000.0,
          dim: int = 8) -> list[NewMemory]:
    """Ready observations with these ratings, oldest first."""
    return [NewMemory(stream=stream, kind="observation", text=f"message {i}", created_at=start + i, importance=v,
                      importance_source=source, embedding=np.ones(dim, np.float32)) for i, v in enumerate(values)]


def test_the_rule() -> None:
    assert rater_check([5] * 50, 0) is None  # switched off
    flat = rater_check([5] * 50, 50)
    assert flat is not None and flat.flat and flat.value == 5 and flat.share == 1.0 and flat.spread == 0.0
    assert "50 of its last 50 ratings are 5" in flat.text()
    nearly = rater_check([5] * 45 + [4, 6, 7, 3, 8], 50)  # 90% one value
    assert nearly is not None and nearly.flat and nearly.spread >= 0.5
    narrow = rater_check([5] * 30 + [6] * 20, 50)  # no value 90%, but a standard deviation of 0.49
    assert narrow is not None and narrow.flat and narrow.share == 0.6
    varied = rater_check([5] * 44 + [1, 2, 3, 8, 9, 10], 50)
    assert varied is not None and not varied.flat and "vary" in varied.text()
    few = rater_check([5] * 49, 50)  # not enough yet: no verdict
    assert few is not None and not few.flat and "49 of the 50 ratings" in few.text()
    latest = rater_check([5] * 50 + [1, 9] * 50, 50)  # only the latest 50 (newest first) count
    assert latest is not None and latest.flat


def test_the_switch_and_its_default() -> None:
    assert StreamConfig().rater_alarm_window == 50 == StreamConfig.for_profile("hybrid").rater_alarm_window
    assert StreamConfig(rater_alarm_window=0).rater_alarm_window == 0
    for bad in (10, -1, True, 50.0):
        with pytest.raises(ConfigError, match="rater_alarm_window must be 0"):
            StreamConfig(rater_alarm_window=bad)  # type: ignore[arg-type]


async def test_the_store_gives_the_raters_latest_ratings_newest_first(store: Store) -> None:
    await store.insert(rated([1, 2, 3]))
    await store.insert(rated([9, 9], source="given", start=2000.0))  # not the rater's
    await store.insert(rated([4], source="fallback", start=2100.0))
    await store.insert(rated([7, 8], stream="guild:2", start=3000.0))
    await store.insert([NewMemory(stream=STREAM, kind="reflection", text="insight", created_at=4000.0, importance=6,
                                  importance_source="derived", depth=1, embedding=np.ones(8, np.float32))])
    assert await store.recent_ratings(STREAM, 10) == [3, 2, 1]
    assert await store.recent_ratings(STREAM, 2) == [3, 2]
    assert await store.recent_ratings(None, 10) == [8, 7, 3, 2, 1]
    assert await store.recent_ratings("guild:3", 10) == []


async def _flat_memory(make_memory: MakeMemory, chat: ScriptedChat, window: int) -> MemoryStream:
    chat.on(RATER, "5")
    memory = make_memory(config=StreamConfig(rater_alarm_window=window), auto_reflect=False)
    await memory.observe_many([Observation(f"message number {i}", stream=STREAM) for i in range(25)])
    return memory


async def test_stats_carry_the_alarm_when_the_rater_says_5_to_everything(make_memory: MakeMemory,
                                                                         chat: ScriptedChat) -> None:
    memory = await _flat_memory(make_memory, chat, 20)
    stats = await memory.stats(STREAM)
    assert stats.rater is not None and stats.rater.flat and stats.rater.ratings == 20
    assert stats.to_json()["rater"] == {"flat": True, "ratings": 20, "window": 20, "spread": 0.0, "value": 5,
                                        "share": 1.0}
    assert (await memory.stats()).rater == stats.rater  # every stream: the same 20 here
    other = await memory.stats("guild:2")  # a stream's stats speak of its own ratings only
    assert other.rater is not None and not other.rater.flat and other.rater.ratings == 0


async def test_switched_off_there_is_no_alarm(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = await _flat_memory(make_memory, chat, 0)
    stats = await memory.stats(STREAM)
    assert stats.rater is None and stats.to_json()["rater"] is None
    assert await memory.rater_check() is None
