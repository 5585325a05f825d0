"""Scoring profiles: every one passes the spec's own example; actr keeps old relevant memories reachable."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from memstream import ConfigError, StreamConfig
from memstream.profiles import PROFILES, score_parts
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.conftest import MakeMemory
from tests.memstream.helpers import cosine_vector, e0

CONFIGS = [StreamConfig(profile=p) for p in PROFILES] + [StreamConfig(recency_from="both"),
                                                           StreamConfig(recency_from="created")]


def _score(config: StreamConfig, *, cos: list[float], imp: list[float], age_hours: list[float],
           accessed_hours: list[float] | None = None) -> np.ndarray:
    now = 1_000_000.0
    created = now - np.asarray(age_hours) * 3600
    last = now - np.asarray(accessed_hours if accessed_hours is not None else age_hours) * 3600
    parts = score_parts(config, cosine=np.asarray(cos), importance=np.asarray(imp), last_accessed=last,
                        created=created, now=now)
    return config.weight_recency * parts[0] + config.weight_importance * parts[1] + config.weight_relevance * parts[2]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.profile}-{c.recency_from}")
def test_old_important_relevant_beats_recent_trivial(config: StreamConfig) -> None:
    score = _score(config, cos=[0.8, 0.1, 0.3], imp=[7, 1, 3], age_hours=[48, 1, 20])
    assert int(np.argmax(score)) == 0


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.profile}-{c.recency_from}")
def test_with_equal_relevance_and_importance_the_more_recent_wins(config: StreamConfig) -> None:
    score = _score(config, cos=[0.5, 0.5, 0.2], imp=[4, 4, 9], age_hours=[300, 2, 50])
    assert score[1] > score[0]


def test_actr_needs_no_whole_stream_normalization() -> None:
    """Adding a brand-new memory does not change how two old ones compare, or their scores."""
    config = StreamConfig(profile="actr")
    two = _score(config, cos=[0.5, 0.3], imp=[5, 5], age_hours=[24 * 90, 24 * 10])
    three = _score(config, cos=[0.5, 0.3, 0.0], imp=[5, 5, 1], age_hours=[24 * 90, 24 * 10, 0.1])
    assert np.allclose(two, three[:2])


def test_actr_lets_a_relevant_memory_from_march_beat_yesterdays_chatter() -> None:
    spec, actr = StreamConfig(), StreamConfig(profile="actr")
    # a relevant fact (cos .55) from 90 days ago vs. chatter (cos .3) from yesterday, equal importance
    kw = {"cos": [0.55, 0.3] + [0.2] * 50, "imp": [5, 5] + [1] * 50,
          "age_hours": [24 * 90, 20] + [float(h) for h in range(1, 51)]}
    assert int(np.argmax(_score(actr, **kw))) == 0  # type: ignore[arg-type]
    assert int(np.argmax(_score(spec, **kw))) == 1  # type: ignore[arg-type]


def test_recency_from_both_caps_a_stale_favourite() -> None:
    """A 60-day-old memory retrieved an hour ago keeps winning on `access`; `both` lets a fresh one win."""
    kw = {"cos": [0.5, 0.5], "imp": [5, 5], "age_hours": [24 * 60, 3], "accessed_hours": [1, 3]}
    assert int(np.argmax(_score(StreamConfig(), **kw))) == 0  # type: ignore[arg-type]
    assert int(np.argmax(_score(StreamConfig(recency_from="both"), **kw))) == 1  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"profile": "magic"}, {"recency_from": "never"}, {"actr_decay": 0},
                                 {"relevance_temperature": -1}])
def test_bad_profile_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        StreamConfig(**bad)  # type: ignore[arg-type]


async def test_the_stream_retrieves_with_the_configured_profile(make_memory: MakeMemory, clock: FakeClock) -> None:
    embedder = FakeEmbedder(dim=3, fixed={"query": e0(), "fact": cosine_vector(0.55), "chatter": cosine_vector(0.3)})
    memory = make_memory(embedder=embedder, chat=ScriptedChat(), config=StreamConfig(profile="actr"))
    await memory.observe("fact", importance=5)
    clock.advance(days=90)
    for _ in range(20):
        await memory.observe("chatter", importance=5)
        clock.advance(hours=1)
    [top] = await memory.explain("query", k=1)
    assert top.memory.text == "fact"
    assert top.memory.created_at == clock.now() - timedelta(days=90, hours=20)
