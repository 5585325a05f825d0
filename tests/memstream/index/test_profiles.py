"""Scoring profiles: every one passes the spec's own example; hybrid keeps old relevant memories reachable and
makes no stale favourites; actr is retired with a clear message."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from memstream import ConfigError, StreamConfig
from memstream.config import load_persona
from memstream.index.profiles import PROFILES, configured, score_parts
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.conftest import MakeMemory
from tests.memstream.helpers import cosine_vector, e0

CONFIGS = [StreamConfig.for_profile(p) for p in PROFILES] + [StreamConfig(recency_from="both"),
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


def test_hybrid_lets_a_relevant_memory_from_march_beat_yesterdays_chatter() -> None:
    spec, hybrid = StreamConfig(), StreamConfig.for_profile("hybrid")
    # a relevant fact (cos .55) from 90 days ago vs. chatter (cos .3) from yesterday, equal importance
    kw = {"cos": [0.55, 0.3] + [0.2] * 50, "imp": [5, 5] + [1] * 50,
          "age_hours": [24 * 90, 20] + [float(h) for h in range(1, 51)]}
    assert int(np.argmax(_score(hybrid, **kw))) == 0  # type: ignore[arg-type]
    assert int(np.argmax(_score(spec, **kw))) == 1  # type: ignore[arg-type]


def test_hybrid_makes_no_stale_favourites() -> None:
    """Being retrieved an hour ago does not lift a 60-day-old memory over a fresh one of equal worth."""
    kw = {"cos": [0.5, 0.5], "imp": [5, 5], "age_hours": [24 * 60, 3], "accessed_hours": [1, 3]}
    assert int(np.argmax(_score(StreamConfig(), **kw))) == 0  # type: ignore[arg-type]
    hybrid = StreamConfig.for_profile("hybrid")
    assert int(np.argmax(_score(hybrid, **kw))) == 1  # type: ignore[arg-type]
    untouched = {**kw, "accessed_hours": [24 * 60, 3]}
    assert np.array_equal(_score(hybrid, **kw), _score(hybrid, **untouched))  # type: ignore[arg-type]


def test_keywords_lift_the_memory_that_names_the_thing() -> None:
    """Equal cosines: the memory sharing the query's rare word wins only when lexical relevance counts."""
    config = StreamConfig.for_profile("hybrid")
    now = 1_000_000.0
    parts = score_parts(config, cosine=np.array([0.4, 0.4]), importance=np.array([5.0, 5.0]),
                        last_accessed=np.array([now, now]), created=np.array([now - 3600, now - 7200]), now=now,
                        lexical=np.array([0.0, 2.5]))
    score = config.weight_recency * parts[0] + config.weight_importance * parts[1] + config.weight_relevance * parts[2]
    assert int(np.argmax(score)) == 1
    assert parts[2].tolist() == [0.6 * 0.5, 0.6 * 0.5 + 0.4]


def test_actr_is_retired_with_the_numbers_and_the_way_on() -> None:
    with pytest.raises(ConfigError, match=r"retired.*15\.0.*41\.3.*hybrid"):
        StreamConfig(profile="actr")


def test_a_profile_brings_its_own_weights_and_the_file_can_override_them(tmp_path: Path) -> None:
    hybrid = StreamConfig.for_profile("hybrid")
    assert (hybrid.weight_recency, hybrid.weight_importance, hybrid.weight_relevance) == (0.05, 0.2, 1.0)
    path = tmp_path / "p.toml"
    path.write_text('[persona]\nname = "P"\nsummary = "s"\n[memory]\nprofile = "hybrid"\nweight_importance = 0.5\n')
    memory = load_persona(path).memory
    assert (memory.weight_recency, memory.weight_importance, memory.lexical_weight) == (0.05, 0.5, 0.4)
    path.write_text('[persona]\nname = "P"\nsummary = "s"\n[memory]\nprofile = "actr"\n')
    with pytest.raises(ConfigError, match="retired"):
        load_persona(path)


def test_eval_baselines_keep_the_personas_other_knobs() -> None:
    persona = StreamConfig(k=7, decay=0.99)
    relevance, lexical = configured(persona, "relevance"), configured(persona, "lexical")
    assert (relevance.profile, relevance.weight_recency, relevance.weight_importance) == ("spec", 0.0, 0.0)
    assert (lexical.profile, lexical.lexical_weight, lexical.weight_relevance) == ("hybrid", 1.0, 1.0)
    assert relevance.k == lexical.k == 7 and configured(persona, "hybrid").decay == 0.99
    assert configured(persona, "spec") is persona


def test_recency_from_both_caps_a_stale_favourite() -> None:
    """A 60-day-old memory retrieved an hour ago keeps winning on `access`; `both` lets a fresh one win."""
    kw = {"cos": [0.5, 0.5], "imp": [5, 5], "age_hours": [24 * 60, 3], "accessed_hours": [1, 3]}
    assert int(np.argmax(_score(StreamConfig(), **kw))) == 0  # type: ignore[arg-type]
    assert int(np.argmax(_score(StreamConfig(recency_from="both"), **kw))) == 1  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"profile": "magic"}, {"recency_from": "never"}, {"lexical_weight": 1.5},
                                 {"lexical_weight": float("nan")}])
def test_bad_profile_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        StreamConfig(**bad)  # type: ignore[arg-type]


async def test_the_stream_retrieves_with_the_configured_profile(make_memory: MakeMemory, clock: FakeClock) -> None:
    embedder = FakeEmbedder(dim=3, fixed={"query": e0(), "fact": cosine_vector(0.55), "chatter": cosine_vector(0.3)})
    memory = make_memory(embedder=embedder, chat=ScriptedChat(), config=StreamConfig.for_profile("hybrid"))
    await memory.observe("fact", importance=5)
    clock.advance(days=90)
    for _ in range(20):
        await memory.observe("chatter", importance=5)
        clock.advance(hours=1)
    [top] = await memory.explain("query", k=1)
    assert top.memory.text == "fact"
    assert top.memory.created_at == clock.now() - timedelta(days=90, hours=20)
