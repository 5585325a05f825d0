"""bench.servers' figures as a readable table."""

from __future__ import annotations

from typing import Any


def table(f: dict[str, Any]) -> str:
    """The figures, readable."""
    def row(name: str, s: dict[str, Any]) -> str:
        if not s.get("n"):
            return f"  {name:<28} (none)"
        return f"  {name:<28} {s['n']:>6} {s['p50']:>9.1f} {s['p99']:>9.1f} {s['max']:>9.1f}"

    plan = f["plan"]
    lines = [f"{f['streams']} streams, {f['memories']:,} memories ({f['sizes']['smallest']:,}-"
             f"{f['sizes']['largest']:,}, median {f['sizes']['median']:,}; rows {plan['layout']}), "
             f"profile {plan['profile']}, "
             f"budget {f['budget_mb']} MiB, {plan['clients']} clients, {plan['writes']} writes/s, "
             f"{f['minutes']} min measured after {f['warmup_queries']} warm-up queries",
             f"  {'latency (ms)':<28} {'n':>6} {'p50':>9} {'p99':>9} {'max':>9}",
             row("hot", f["hot"]), row("cold", f["cold"])]
    lines += [row(f"cold, {band} memories", s) for band, s in f["cold_by_size"].items()]
    chosen = f["chosen_stream"]
    lines += [row(f"{chosen['stream']} hot, budget", f["chosen_hot_budget"]),
              row(f"{chosen['stream']} hot, no budget", f["chosen_hot_no_budget"]),
              row("observe (write)", f["writes"]),
              f"  reloads {f['reloads']} ({f['reloads_per_minute']}/min), cold queries {f['cold_per_minute']}/min, "
              f"write errors {f['write_errors']}",
              f"  RSS: baseline {f['baseline_rss_mb']:.0f} MiB, VmHWM {f['vm_hwm_mb']:.0f}, sampled peak "
              f"{f['rss_peak_sampled_mb']:.0f}, book peak {f['book_peak_mb']:.0f}, no-budget stream "
              f"{f['no_budget_stream_mb']:.0f}",
              f"  reader processes {f['reader_processes']}, their own memory (RssAnon) at most "
              f"{f['readers_anon_peak_mb']:.0f} MiB in all",
              f"  (peak RSS - baseline - no-budget stream + readers') / budget = {f['rss_over_baseline_mb']:.0f} / "
              f"{f['budget_mb']} = {f['rss_over_budget']}  (target <= 1.2)",
              f"  anonymous memory alone (RssAnon): peak {f['anon_peak_mb']:.0f} MiB, baseline "
              f"{f['baseline_anon_mb']:.0f}: {f['anon_over_budget']} x budget",
              f"  hot p99 with / without budget ({chosen['stream']}, {chosen['memories']:,} memories, "
              f"{chosen['share_of_queries']:.1%} of queries) = {f['hot_p99_ratio']}  (target <= 2)",
              f"  cold {f['ready_stream']['memories']:,}-memory stream ready (drop + query, median of "
              f"{len(f['ready_runs_ms'])}) = {f['ready_ms']} ms  (target < 100)  runs {f['ready_runs_ms']}",
              "  targets: " + ("all met" if not f["missed"] else "MISSED " + "; ".join(f["missed"]))]
    return "\n".join(lines)
