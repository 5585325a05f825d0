"""The soak's property, short (bench/soak.py runs it for 10 minutes): the real bot under a model server failing
20% of its calls at random (500, 429, garbage, absurd usage, wrong-sized vectors) stores every message once (its
edits applied, its deletions forgotten), answers every mention or says it could not, and leaves nothing pending
once the server is healthy."""

from __future__ import annotations

from pathlib import Path

from bench.soak import Plan, run_soak


async def test_the_bot_under_a_model_server_failing_at_random_loses_nothing(tmp_path: Path) -> None:
    report = await run_soak(Plan(minutes=0.4, fault_rate=0.2, rate=5.0, mention_every=2.0, seed=1), tmp_path)
    assert report.failures() == [], "\n".join(report.lines())
    assert report.sent >= 100 and report.mentions >= 6 and report.edits >= 5 and report.deletions >= 2
    assert set(report.faults) == {"500", "429", "malformed", "absurd_usage", "wrong_dim"}
    assert report.pending_at_end > 0  # the faults did leave work to finish
