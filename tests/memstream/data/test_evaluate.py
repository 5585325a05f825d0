"""`memstream eval`: hit@k and recall@k per profile and label, with a model cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memstream import ConfigError, StreamConfig
from memstream.data.evaluate import CachedChat, CachedEmbedder, ModelCache, evaluate, read_eval
from memstream.records import Source
from memstream.testing import FakeEmbedder, ScriptedChat
from tests.memstream.helpers import cosine_vector, e0


def _write(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _observation(key: str, text: str, at: str, importance: int | None = 5) -> dict[str, object]:
    line: dict[str, object] = {"type": "observation", "key": key, "text": text, "at": at, "stream": "s1"}
    if importance is not None:
        line["importance"] = importance
    return line


def _query(text: str, at: str, expect: list[str], label: str) -> dict[str, object]:
    return {"type": "query", "text": text, "at": at, "stream": "s1", "expect": expect, "label": label}


async def test_hit_and_recall_per_profile_and_label(tmp_path: Path) -> None:
    lines = [_observation("fact", "the fact", "2023-03-01T10:00:00Z"),
             *[_observation(f"c{i}", f"chatter {i}", f"2023-06-01T{10 + i}:00:00Z") for i in range(8)],
             _query("what fact?", "2023-06-02T10:00:00Z", ["fact"], "old"),
             _query("what chatter?", "2023-06-02T10:00:00Z", ["c7", "c0"], "recent")]
    path = _write(tmp_path / "eval.jsonl", lines)
    vectors = {"the fact": cosine_vector(0.55), "what fact?": e0(), "what chatter?": cosine_vector(0.3, axis=2)}
    vectors.update({f"chatter {i}": cosine_vector(0.3) for i in range(8)})
    embedder = FakeEmbedder(dim=3, fixed=vectors)
    report = await evaluate(read_eval(path), config=StreamConfig(), embedder=embedder, chat=ScriptedChat(),
                            rater_model="r", profiles=["spec", "hybrid", "relevance", "lexical"], ks=(1, 10))
    assert report["hybrid"]["labels"]["old"]["hit@1"] == 1.0
    assert report["relevance"]["labels"]["old"]["hit@1"] == 1.0  # plain vector search finds it too
    assert report["lexical"]["labels"]["old"]["hit@1"] == 1.0  # "fact" is a word of the query
    assert report["spec"]["labels"]["old"]["hit@1"] == 0.0  # yesterday's chatter swamps the March fact
    assert report["spec"]["labels"]["old"]["hit@10"] == 1.0
    for profile in ("spec", "hybrid"):
        recent = report[profile]["labels"]["recent"]
        assert recent["queries"] == 1 and recent["recall@10"] == 1.0 and recent["recall@1"] <= 0.5
        assert report[profile]["overall"]["queries"] == 2


async def test_a_second_run_costs_no_model_calls(tmp_path: Path) -> None:
    path = _write(tmp_path / "eval.jsonl", [
        _observation("a", "Klaus likes sociology", "2023-01-01T00:00:00Z", importance=None),
        _observation("b", "toast for breakfast", "2023-01-01T01:00:00Z", importance=None),
        _query("what does Klaus study?", "2023-01-02T00:00:00Z", ["a"], "single-hop")])
    chat = ScriptedChat(default="4")
    embedder = FakeEmbedder()
    for run in range(2):
        cache = ModelCache(tmp_path / "cache.sqlite")
        report = await evaluate(read_eval(path), config=StreamConfig(), embedder=CachedEmbedder(embedder, cache, "m"),
                                chat=CachedChat(chat, cache), rater_model="r", profiles=["spec"])
        cache.close()
        assert report["spec"]["overall"]["queries"] == 1
        if run == 0:
            calls, ratings = len(embedder.calls), len(chat.calls)
            assert ratings == 2 and calls >= 2
    assert (len(embedder.calls), len(chat.calls)) == (calls, ratings)


def test_bad_eval_files_name_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.jsonl", [
        _observation("a", "x", "2023-01-01T00:00:00Z"),
        {"type": "query", "text": "q", "at": "2023-01-01T00:00:00Z", "expect": []},
        _query("q", "2023-01-01T00:00:00Z", ["missing"], "l"),
        {"type": "remember", "text": "t", "at": "2023-01-01T00:00:00Z"},
    ])
    with pytest.raises(ConfigError) as caught:
        read_eval(path)
    text = str(caught.value)
    assert "bad.jsonl:2" in text and "bad.jsonl:4" in text and "missing" in text


async def test_touch_marks_the_persona_k_whatever_cut_offs_are_reported(tmp_path: Path) -> None:
    # Query 1 ranks A, B first and C..J next. Touching its top 10 (the largest cut-off) instead of the persona's
    # k (2) would give C..J the recency that makes them beat K, L in query 2: hit@2 must not depend on ks.
    early = "2023-03-01T00:00:00Z"
    names = ["A", "B", *"CDEFGHIJ", "K", "L"]
    lines = [_observation(n, f"memory {n}", early) for n in names]  # ties go to the higher id: K, L
    lines += [_query("question one", "2023-03-10T00:00:00Z", ["A", "B"], "one"),
              _query("question two", "2023-03-10T01:00:00Z", ["K", "L"], "two")]
    path = _write(tmp_path / "eval.jsonl", lines)
    vectors = {"memory A": e0(), "memory B": e0(), "memory K": cosine_vector(0.0, axis=2),
               "memory L": cosine_vector(0.0, axis=2), "question one": e0(), "question two": cosine_vector(0.0, axis=2)}
    vectors.update({f"memory {n}": cosine_vector(0.8, axis=2) for n in "CDEFGHIJ"})

    async def run(ks: tuple[int, ...]) -> dict[str, float]:
        report = await evaluate(read_eval(path), config=StreamConfig(k=2), embedder=FakeEmbedder(dim=3, fixed=vectors),
                                chat=ScriptedChat(), rater_model="r", profiles=["spec"], ks=ks)
        return dict(report["spec"]["labels"]["two"])

    alone, with_ten = await run((2,)), await run((2, 10))
    assert alone["hit@2"] == 1.0  # the persona's own k touched only A and B
    assert with_ten["hit@2"] == alone["hit@2"] and with_ten["recall@2"] == alone["recall@2"]


def test_an_observation_carries_its_source_as_the_import_reads_it(tmp_path: Path) -> None:
    line = {**_observation("a", "Bob said: hi", "2023-01-01T00:00:00Z"), "author": "Bob", "author_id": "42",
            "channel": "general", "channel_id": "7"}
    bare = {**_observation("b", "no source", "2023-01-01T00:01:00Z"), "reply_to": "a"}
    [first, second] = read_eval(_write(tmp_path / "eval.jsonl", [line, bare]))
    assert first.source == Source(author="Bob", author_id="42", channel="general", channel_id="7", message_id="eval:a")
    assert second.source == Source(message_id="eval:b", reply_to="eval:a")  # a key of the file, as a message id
    wrong = {**_observation("c", "x", "2023-01-01T00:00:00Z"), "author_id": 42}
    with pytest.raises(ConfigError, match=r'bad\.jsonl:1: "author_id" must be a string'):
        read_eval(_write(tmp_path / "bad.jsonl", [wrong]))
