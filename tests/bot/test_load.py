"""A short version of bench/load.py: sustained messages across servers and channels with slow models lose
nothing, store nothing twice, and mentions are still answered. (The figures, 50 msg/s for 60 s, are the
benchmark's: `python -m bench.load`.)"""

from __future__ import annotations

from pathlib import Path

from bench.load import Plan, run_load


async def test_a_short_sustained_load_loses_nothing_and_answers_mentions(tmp_path: Path) -> None:
    plan = Plan(rate=25, seconds=3, channels=10, servers=2, latency=0.05, mention_every=1.0, drain_timeout=20)
    report = await run_load(plan, network="thread", directory=tmp_path)
    assert report.sent == 75
    assert (report.stored, report.missing, report.duplicated, report.not_ready) == (75, 0, 0, 0)
    assert report.mentions == report.answered == 3
    assert report.max_lag < 1.0  # a sanity bound only: the event loop was never stuck
