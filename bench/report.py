"""The benchmark's table (text) and plot (PNG)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.peers import lines as peer_lines


def _n(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def table(results: dict[str, Any]) -> str:
    """Every case as aligned text, with each target's verdict."""
    lines: list[str] = []
    for case in results.get("retrieval", []):
        if not lines:
            lines += ["1. Exact retrieval, top 5, median ms (ratio = rank / floor, same threads; target <= 1.3)",
                      f"{'N x dim':>12} {'thr':>3} {'floor':>8} {'rank':>8} {'ratio':>6} {'numpy':>8} {'GB/s':>6} "
                      f"{'SQL':>9} {'py loop':>14} agree"]
        loop = (f"{case['loop_ms']:.0f} @{_n(case['loop_n'])}" if "loop_ms" in case else "-")
        agree = ("yes" if case["sql_agrees"] and case.get("loop_agrees", True) and case.get("numpy_agrees", True)
                 else "NO")
        for t, row in case["threads"].items():
            lines.append(f"{_n(case['n']) + ' x ' + str(case['dim']):>12} {t:>3} {row['floor_ms']:8.2f} "
                         f"{row['rank_ms']:8.2f} {row['ratio']:6.2f} {row.get('rank_numpy_ms', math.nan):8.2f} "
                         f"{row['floor_gb_s']:6.1f} "
                         f"{case['sql_ms']:9.1f} {loop:>14} {agree}")
    opening = results.get("opening")
    if isinstance(opening, dict):
        lines += ["", "2. Opening a store (fresh process; target: ready <= 5 s, peak RSS <= 1.3 x raw embeddings)",
                  f"{'N x dim':>12} {'cache':>5} {'procs':>5} {'load s':>7} {'ready s':>7} {'raw MB':>7} "
                  f"{'peak MB':>8} {'ratio':>5} {'workers MB':>10}"]
        for run in opening["runs"]:
            lines.append(f"{_n(run['n']) + ' x ' + str(run['dim']):>12} {'cold' if run['cold'] else 'warm':>5} "
                         f"{run['processes']:5d} {run['load_s']:7.2f} {run['ready_s']:7.2f} {run['raw_mb']:7.0f} "
                         f"{run['peak_rss_mb']:8.0f} {run['peak_ratio']:5.2f} {run['workers_peak_rss_mb']:10.0f}")
        lines.append(f"   warm median ready {opening['ready_s']:.2f} s; "
                     f"in one process {opening['ready_single_s']:.2f} s "
                     f"({opening['speedup']:.2f}x); reading the file's bytes {opening['file_read_s']:.2f} s "
                     f"(ready = {opening['ready_over_read']:.1f}x that)")
    for run in results.get("ingest", []):
        if not any(line.startswith("3.") for line in lines):
            lines += ["", "3. Ingestion, fake server +50 ms per call (target >= 200/s, 1 rating each, "
                          "<= 1 embeddings call per 32)",
                      f"{'burst':>6} {'conc':>4} {'obs/s':>6} {'rating':>6} {'embed':>5} {'texts':>5} "
                      f"{'in flight':>9} {'ready':>5} {'pending':>7}"]
        lines.append(f"{run['n']:6d} {run['max_concurrency']:4d} {run['per_second']:6.0f} {run['rating_calls']:6d} "
                     f"{run['embedding_calls']:5d} {run['embedded_texts']:5d} {run['most_in_flight']:9d} "
                     f"{run['ready']:5d} {run['pending']:7d}")
    if "ingest" in results:
        usage = results["ingest"][0]["usage"]
        lines.append("   usage recorded for the burst: " + ", ".join(
            f"{role} {row['calls']} calls / {row['prompt_tokens']} prompt tokens" for role, row in usage.items()))
    if "reply" in results:
        r = results["reply"]
        lines += ["", "4. Reply overhead (respond() with instant models; target median <= 30 ms)",
                  f"   {_n(r['n'])} x {r['dim']}: median {r['median_ms']:.1f} ms, p90 {r['p90_ms']:.1f} ms "
                  f"(explain alone {r['explain_median_ms']:.1f} ms), {r['mentions']} mentions"]
    if "reflection" in results:
        lines += _reflection(results["reflection"])
    if "cost" in results:
        lines += ["", *cost_lines(results["cost"])]
    if results.get("peers"):
        lines += ["", "7. Peers: what a user would pick instead, same run, same embeddings (`python -m bench.peers`)",
                  *peer_lines(results["peers"])]
    return "\n".join(lines)


def _reflection(result: dict[str, Any]) -> list[str]:
    """Case 5's lines (bench/reflection.py)."""
    off = result["stream_grown_without_guard"]
    lines = ["", f"5. Runaway reflection: depth >= 2 reflections in the top 5 ({result['days']} days, "
                 f"{result['queries']} questions about facts and {result['open_questions']} open ones; "
                 f"guard = grounding_weight, default {result['default_weight']})",
             f"   replay with the guard off: {off['reflections']} reflections, {off['depth_2_or_more']} of depth >= 2, "
             f"deepest {off['deepest']}",
             f"   {'grounding_weight':>16} {'deep share':>10} {'hit@5':>6}"]
    for row in result["same_stream"]:
        label = f"{row['grounding_weight']:g}" + (" (off)" if row["grounding_weight"] == 0 else "")
        lines.append(f"   {label:>16} {row['deep_share']:10.1%} {row['hit_at_5']:6.1%}")
    on = result["stream_grown_with_guard"]
    lines.append(f"   replay with the guard on ({on['grounding_weight']:g}): {on['reflections']} reflections, "
                 f"{on['depth_2_or_more']} of depth >= 2; deep share {on['deep_share']:.1%}, "
                 f"hit@5 {on['hit_at_5']:.1%}")
    return lines


def cost_lines(result: dict[str, Any]) -> list[str]:
    """The table: calls and tokens per role for the messages fed."""
    n = result["messages"]
    declined = (f" ({result['declined']} declined: budget spent)" if result.get("declined") else "")
    pending = f", {result['pending']} waiting pending for the budget" if result.get("pending") else ""
    out = [f"6. Cost of {n:,} channel messages: {result['mentions']} mentions, {result['replies']} answered{declined}, "
           f"{result['reflections']} reflections ({result['insights']} insights), {result['observations']} "
           f"observations stored (the replies too{pending}); tokens are the fake server's words",
           f"{'role':>10} {'calls':>7} {'prompt tok':>11} {'compl. tok':>11} {'tokens/call':>12}"]
    total_calls = total_tokens = 0
    for role in ("rater", "embedding", "agent", "reflector"):
        use = result["roles"].get(role, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0})
        tokens = use["prompt_tokens"] + use["completion_tokens"]
        total_calls, total_tokens = total_calls + use["calls"], total_tokens + tokens
        per = tokens / use["calls"] if use["calls"] else 0
        out.append(f"{role:>10} {use['calls']:7,} {use['prompt_tokens']:11,} {use['completion_tokens']:11,} "
                   f"{per:12.0f}")
    out.append(f"{'total':>10} {total_calls:7,} {total_tokens:>23,}   (the product's counts "
               f"{'match' if result['agrees'] else 'DO NOT match'} the requests the server received)")
    return out



def plot(results: dict[str, Any], path: Path) -> Path:
    """Median latency against N for each approach (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["retrieval"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=90)
    for dim, marker in ((384, "o"), (1536, "s")):
        rows = sorted((c for c in cases if c["dim"] == dim), key=lambda c: c["n"])
        if not rows:
            continue
        ns = [c["n"] for c in rows]
        fill = "full" if dim == 384 else "none"
        series = [("floor (plain pass), 2 threads", [c["threads"]["2"]["floor_ms"] for c in rows], "0.5", "--"),
                  ("memstream rank, 1 thread", [c["threads"]["1"]["rank_ms"] for c in rows], "C0", "-"),
                  ("memstream rank, 2 threads", [c["threads"]["2"]["rank_ms"] for c in rows], "C2", "-"),
                  ("rank on its numpy path, 1 thread",
                   [c["threads"]["1"].get("rank_numpy_ms", math.nan) for c in rows], "C4", "-."),
                  ("SQL vec_distance_cosine", [c["sql_ms"] for c in rows], "C3", "-")]
        for label, ys, color, style in series:
            ax.plot(ns, ys, marker=marker, fillstyle=fill, color=color, linestyle=style if dim == 384 else ":",
                    label=f"{label}" if dim == 384 else None)
        loops = [c for c in rows if "loop_ms" in c]
        ax.plot([c["loop_n"] for c in loops], [c["loop_ms"] for c in loops], marker=marker, fillstyle=fill,
                color="C1", linestyle="none", label="per-memory Python loop (10k only)" if dim == 384 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("memories in the stream (filled: 384 dims, hollow: 1536 dims)")
    ax.set_ylabel("median latency per query (ms)")
    ax.set_title("Exact top-5 retrieval on 2 cores", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
