"""A long-horizon retrieval benchmark: months of community chat with a few decisive facts.

    python -m bench.longhorizon generate bench/longhorizon.jsonl     # deterministic (seed 7)
    python -m bench.longhorizon run [--model all-MiniLM-L6-v2]        # every profile, a table + JSON

The generator writes the `memstream eval` format: mostly trivial chatter (importance 1-3, a few
miscalibrated ratings), a few decisive facts (6-9) spread over six months, facts that change (the newer
one is expected), and queries asked at the end and along the way whose evidence lies at every age.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memstream.config import StreamConfig
from memstream.data.evaluate import CachedEmbedder, ModelCache, evaluate, read_eval
from memstream.index.profiles import PROFILES
from memstream.models.embed import SentenceTransformerEmbedder
from memstream.testing import ScriptedChat

SEED = 7
START = datetime(2023, 1, 2, 9, 0, tzinfo=UTC)
DAYS = 180
STREAM = "guild:1"
SPEAKERS = ["Klaus", "Maria", "Isabella", "Sam", "Ayesha", "Tom", "Jennifer", "Carlos"]

TRIVIAL = [
    "good morning everyone", "anyone up?", "lol", "that's hilarious", "brb, making coffee",
    "I had toast for breakfast again", "it's raining here today", "so tired this morning",
    "what's everyone playing tonight?", "I finally beat that boss level", "nice meme",
    "pizza or tacos for dinner?", "the weather is lovely today", "back from lunch",
    "watching a movie tonight", "my coffee went cold", "happy friday!", "ugh, mondays",
    "anyone seen the new trailer?", "going for a walk", "this song is stuck in my head",
    "I need more sleep", "the bus was late again", "gg everyone", "see you all tomorrow",
    "I love cats", "dogs are the best", "who wants to play later?", "my internet is so slow",
    "just cleaned my room", "reading a good book", "what a day", "thanks for the help!",
    "haha same", "I made pancakes", "the cafe was busy today", "did anyone water the plants?",
]


@dataclass(frozen=True)
class Fact:
    """A decisive message, when it is said, and how it is asked about later."""

    day: int
    speaker: str
    text: str
    importance: int
    query: str
    label: str
    replaced_by: str | None = None


FACTS = [
    Fact(5, "Klaus", "I got accepted into the sociology PhD program at Oak Hill College!", 9,
         "Which graduate program did Klaus get into?", "old"),
    Fact(9, "Maria", "my cat Pixel has to have surgery next week, I'm really worried", 7,
         "How is Maria's pet doing?", "old"),
    Fact(14, "Ayesha", "my birthday is on March 3rd, just so you all know", 6,
         "When is Ayesha's birthday?", "old"),
    Fact(21, "Sam", "I'm allergic to peanuts, please never bring satay to meetups", 8,
         "Does anyone have a food allergy we should remember?", "old"),
    Fact(30, "Tom", "I started working at the bakery on Main Street", 6,
         "Where does Tom work these days?", "changed", replaced_by="tom-job-2"),
    Fact(34, "Isabella", "the cafe's Valentine's Day party will be on February 14th from 5 to 7 pm", 7,
         "When is the Valentine's party at the cafe?", "old"),
    Fact(41, "Jennifer", "I'm learning to play the cello, lessons every Tuesday", 5,
         "What instrument is Jennifer learning?", "old"),
    Fact(47, "Carlos", "our server's movie night is every Thursday at 8 pm", 6,
         "What day is movie night?", "changed", replaced_by="movie-night-2"),
    Fact(55, "Klaus", "I broke my wrist skiing, typing one-handed for a while", 7,
         "What happened to Klaus's arm?", "mid"),
    Fact(63, "Maria", "I'm going to stream my physics study sessions on Twitch every Sunday", 5,
         "What does Maria stream online?", "mid"),
    Fact(70, "Sam", "I'm moving to Seattle in June for a new job", 8,
         "Which city is Sam moving to?", "mid"),
    Fact(78, "Ayesha", "I adopted a greyhound named Biscuit from the shelter", 7,
         "What is the name of Ayesha's dog?", "mid"),
    Fact(88, "Isabella", "the cafe will be closed for renovations the whole of April", 7,
         "Is the cafe open in April?", "mid"),
    Fact(96, "Jennifer", "my sister Anna is getting married in Lisbon in the summer", 7,
         "Where is the wedding Jennifer is going to?", "mid"),
    Fact(104, "Carlos", "I passed my driving test on the third try!", 6,
         "Did Carlos get his driver's license?", "mid"),
    Fact(112, "Tom", "I quit the bakery, I work at the public library now", 6,
         "Where does Tom work these days?", "changed"),
    Fact(120, "Carlos", "movie night moves to Saturdays from now on", 6,
         "What day is movie night?", "changed"),
    Fact(131, "Klaus", "my thesis topic is gentrification in Smallville", 7,
         "What is Klaus researching?", "recent"),
    Fact(144, "Maria", "I'm vegetarian now, no more burgers for me", 6,
         "Does Maria eat meat?", "recent"),
    Fact(158, "Ayesha", "I got engaged to Omar last night!", 9,
         "Who is Ayesha engaged to?", "recent"),
    Fact(170, "Isabella", "we're hosting a charity bake sale at the cafe on July 1st", 7,
         "What event is the cafe planning for July?", "recent"),
    Fact(176, "Sam", "the Seattle apartment fell through, I'm staying here after all", 8,
         "Is Sam still moving away?", "recent"),
]


def generate(seed: int = SEED) -> list[dict[str, Any]]:
    """The benchmark's lines, in time order."""
    rng = random.Random(seed)
    lines: list[dict[str, Any]] = []
    facts_by_day: dict[int, list[int]] = {}
    for index, fact in enumerate(FACTS):
        facts_by_day.setdefault(fact.day, []).append(index)
    counter = 0
    for day in range(DAYS):
        base = START + timedelta(days=day)
        count = rng.randint(15, 45)
        moments = sorted(base + timedelta(minutes=rng.randint(0, 14 * 60)) for _ in range(count))
        fact_slots = {rng.randrange(count): i for i in facts_by_day.get(day, [])}
        for n, moment in enumerate(moments):
            speaker = rng.choice(SPEAKERS)
            if n in fact_slots:
                fact = FACTS[fact_slots[n]]
                key = f"fact-{fact_slots[n]}"
                # A few decisive facts are under-rated, as real raters do.
                importance = fact.importance if rng.random() > 0.15 else rng.randint(3, 5)
                text = f"{fact.speaker} in #general: {fact.text}"
            else:
                counter += 1
                key = f"chat-{counter}"
                importance = rng.choice([1, 1, 1, 2, 2, 3]) if rng.random() > 0.05 else rng.randint(4, 6)
                text = f"{speaker} in #general: {rng.choice(TRIVIAL)}"
            lines.append({"type": "observation", "key": key, "text": text, "at": _iso(moment),
                          "stream": STREAM, "importance": importance})
        lines.extend(_midway_queries(day, base, rng))
    end = START + timedelta(days=DAYS, hours=10)
    for index, fact in enumerate(FACTS):
        if fact.label == "changed" and fact.replaced_by is not None:
            continue  # asked once, expecting the newer fact
        lines.append({"type": "query", "text": fact.query, "at": _iso(end), "stream": STREAM,
                      "expect": [f"fact-{index}"], "label": _age_label(fact, DAYS)})
    return lines


def _midway_queries(day: int, base: datetime, rng: random.Random) -> list[dict[str, Any]]:
    """Along the way, every 15 days, ask about facts said in the last two weeks (recent at that time)."""
    if day % 15 != 14:
        return []
    out = []
    for index, fact in enumerate(FACTS):
        if day - 14 <= fact.day <= day:  # at that time it is the current version, even of a fact that changes
            out.append({"type": "query", "text": fact.query, "at": _iso(base + timedelta(hours=15)),
                        "stream": STREAM, "expect": [f"fact-{index}"], "label": "recent"})
    rng.shuffle(out)
    return out


def _age_label(fact: Fact, now_day: int) -> str:
    if fact.label == "changed":
        return "changed"
    age = now_day - fact.day
    return "recent" if age <= 30 else "mid" if age <= 100 else "old"


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


async def run(path: Path, model: str) -> dict[str, Any]:
    """Every profile on the benchmark with a real local embedding model."""
    import torch  # the `local` extra: only this command needs it

    torch.set_num_threads(1)
    lines = read_eval(path)
    cache = ModelCache(path.with_suffix(".cache.sqlite"))
    embedder = CachedEmbedder(SentenceTransformerEmbedder.load(model), cache, f"local:{model}")
    report: dict[str, Any] = {"model": model, "lines": len(lines)}
    configs = {"spec": StreamConfig(), "hybrid": StreamConfig.for_profile("hybrid"),
               "spec+created": StreamConfig(recency_from="both")}
    assert set(PROFILES) <= set(configs)
    runs = [(name, config, True) for name, config in configs.items()] + [("spec (no touch)", configs["spec"], False)]
    for name, config, touch in runs:
        result = await evaluate(lines, config=config, embedder=embedder, chat=ScriptedChat(default="5"),
                                rater_model="none", profiles=[config.profile], touch=touch)
        report[name] = result[config.profile]
    cache.close()
    return report


def main(argv: list[str] | None = None) -> int:
    """Generate or run the benchmark."""
    parser = argparse.ArgumentParser(prog="python -m bench.longhorizon")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("out", type=Path, nargs="?", default=Path("bench/longhorizon.jsonl"))
    g.add_argument("--seed", type=int, default=SEED)
    r = sub.add_parser("run")
    r.add_argument("file", type=Path, nargs="?", default=Path("bench/longhorizon.jsonl"))
    r.add_argument("--model", default="all-MiniLM-L6-v2")
    r.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.command == "generate":
        lines = generate(args.seed)
        args.out.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        queries = sum(1 for line in lines if line["type"] == "query")
        print(f"wrote {len(lines)} lines ({len(lines) - queries} observations, {queries} queries) to {args.out}")
        return 0
    report = asyncio.run(run(args.file, args.model))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"{'profile':<22} {'label':<10} {'n':>3} {'hit@5':>7} {'rec@5':>7} {'hit@10':>7} {'rec@10':>7}")
    for name, result in report.items():
        if not isinstance(result, dict):
            continue
        for label, row in [("overall", result["overall"]), *result["labels"].items()]:
            print(f"{name:<22} {label:<10} {row['queries']:>3} {row['hit@5']:>7.3f} {row['recall@5']:>7.3f} "
                  f"{row['hit@10']:>7.3f} {row['recall@10']:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
