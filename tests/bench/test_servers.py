"""bench/servers.py at a tiny size (issue 29's 10M-memory run is `python -m bench.servers`): the report's
invariants, not its times."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bench.persona import build, sizes_in, zipf_sizes
from bench.servers import Plan, main, serve

SMALL = {"streams": 20, "memories": 40_000, "queries": 60, "warmup": 0.0, "clients": 3, "writes": 5.0,
         "ready_runs": 2}


def test_sizes_follow_the_clipped_zipf_law_and_add_up() -> None:
    sizes = zipf_sizes(1000, 10_000_000)
    assert sizes.sum() == 10_000_000 and sizes.min() >= 2_000 and sizes.max() == 50_000
    assert list(sizes) == sorted(sizes, reverse=True) and sizes[0] > 10 * sizes[-1] // 2
    with pytest.raises(ValueError, match="cannot be 10 streams"):
        zipf_sizes(10, 10_000)


@pytest.mark.parametrize("layout", ["interleaved", "sequential", "grouped"])
def test_the_layouts_write_a_stream_s_rows_in_time_order_together_or_spread(tmp_path: Path, layout: str) -> None:
    path = build(20, 40_000, folder=tmp_path, layout=layout)
    with sqlite3.connect(path) as conn:
        spans = conn.execute("SELECT MAX(id) - MIN(id) + 1, COUNT(*), MAX(number), COUNT(DISTINCT id / 256) "
                             "FROM memories GROUP BY stream").fetchall()
        in_order = conn.execute("SELECT COUNT(*) FROM memories a JOIN memories b ON a.stream = b.stream "
                                "AND b.number = a.number + 1 WHERE b.created_at < a.created_at OR b.id < a.id"
                                ).fetchone()[0]
        top = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memories'").fetchall()
        blocks = conn.execute("SELECT COUNT(*), MAX(stop) - 1 FROM id_blocks").fetchone()
    assert all(count == last == 2_000 for _, count, last, _ in spans) and in_order == 0
    assert all((span == count) == (layout == "grouped") for span, count, _, _ in spans)
    if layout == "interleaved":  # as the store gives ids: the stream's rows in blocks of 256 ids
        assert all(runs <= 2 * (2_000 // 256 + 1) for _, _, _, runs in spans)  # (a block spans two 256s at most)
        assert blocks == (20, top[0][0])  # each stream's open block, the last reserved in the sequence
    else:  # ids in creation order across the persona (sequential: each stream spread over the whole file)
        assert blocks == (0, None) and top == [(40_000,)]
        assert all((runs > 100) == (layout == "sequential") for _, _, _, runs in spans)


async def test_a_tiny_budget_reloads_and_every_query_is_answered(tmp_path: Path) -> None:
    path = build(20, 40_000, folder=tmp_path)
    before = sizes_in(path)
    assert sum(before.values()) == 40_000 and len(before) == 20
    with sqlite3.connect(path) as conn:
        blocks = conn.execute("SELECT * FROM id_blocks ORDER BY stream").fetchall()
        sequence = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memories'").fetchall()
    f = await serve(Plan(**SMALL, budget_mb=1), path)  # every stream is larger than the budget
    assert f["queries"] >= 60 and f["queries"] == f["hot_queries"] + f["cold_queries"]
    assert f["hot"].get("n", 0) == f["hot_queries"] and f["cold"]["n"] == f["cold_queries"]
    assert sum(s.get("n", 0) for s in f["cold_by_size"].values()) == f["cold_queries"]
    assert f["k_results"] == [5]  # every query (with and without the budget) answered with k memories
    assert f["reloads"] > 0 and f["reloads_per_minute"] > 0 and f["cold_queries"] > 0
    assert f["rss_peak_mb"] >= f["vm_hwm_mb"] > f["baseline_rss_mb"] > 0 and f["rss_peak_sampled_mb"] > 0
    assert f["rss_over_budget"] is not None and f["anon_over_budget"] is not None and f["book_peak_mb"] > 0
    # the reader processes' own memory counts against the budget (streams of 4,000 or more are read by them)
    assert (f["reader_processes"] > 0) == (f["readers_anon_peak_mb"] > 0) == (f["sizes"]["largest"] >= 4_000)
    own = f["rss_peak_mb"] - f["baseline_rss_mb"] - f["no_budget_stream_mb"] + f["readers_anon_peak_mb"]
    assert abs(f["rss_over_baseline_mb"] - own) <= 0.2
    # a sampled peak, which need not top the baseline: a 1 MB budget's trims can hand back what the baseline held
    assert f["rss_peak_mb"] >= f["anon_peak_mb"] > 0 and f["baseline_anon_mb"] > 0
    assert f["chosen_hot_budget"]["n"] == f["chosen_hot_no_budget"]["n"]
    assert len(f["ready_runs_ms"]) == 2 and f["ready_ms"] > 0 and f["ready_stream"]["memories"] == 2_000
    assert f["writes"]["n"] >= 1 and f["write_errors"] == 0
    assert sizes_in(path) == before  # what the run wrote is gone from the cached file
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM memories").fetchone() == (40_000,)
        assert conn.execute("SELECT * FROM id_blocks ORDER BY stream").fetchall() == blocks
        assert conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memories'").fetchall() == sequence


async def test_with_no_budget_nothing_is_reloaded_and_the_ratio_is_measured(tmp_path: Path) -> None:
    path = build(20, 40_000, folder=tmp_path)
    f = await serve(Plan(**SMALL, budget_mb=0, profile="spec"), path)
    assert f["reloads"] == 0 and f["drops"] == 0
    assert f["chosen_hot_budget"]["n"] > 0 and f["hot_p99_ratio"] is not None
    assert f["rss_over_budget"] is None and "rss_over_budget: not measured" in f["missed"]
    assert f["k_results"] == [5]


def test_bad_sizes_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--streams", "10", "--memories", "1000"])
    assert "cannot be 10 streams" in capsys.readouterr().err
