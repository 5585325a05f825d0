"""`python -m bench [--quick]`: every case, a table on stdout, bench/results/latest.json and a plot."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

from bench import cost, ingest, opening, peers, reflection, reply, retrieval, servers, servers_table, soak
from bench.data import store_file
from bench.persona import build
from bench.report import plot, table

ROOT = Path(__file__).resolve().parent
FULL = {"retrieval": [(10_000, 384, 41, 5, 3), (100_000, 384, 21, 3, 0), (1_000_000, 384, 9, 2, 0),
                      (100_000, 1536, 15, 3, 1)],
        "opening": (1_000_000, 384), "ingest": [(2000, None), (2000, 8), (2000, 32)], "reply": (100_000, 60),
        "reflection": (60, 60), "cost": (1000, 50), "peers": [(100_000, 384, 15), (1_000_000, 384, 10)],
        "soak": 10.0, "servers": servers.Plan()}
QUICK = {"retrieval": [(10_000, 384, 15, 2, 1), (100_000, 384, 9, 2, 0)],
         "opening": (100_000, 384), "ingest": [(500, None)], "reply": (100_000, 20), "reflection": (20, 30),
         "cost": (1000, 50), "peers": [(10_000, 384, 10), (100_000, 384, 10)], "soak": 0.5,
         "servers": servers.Plan(**servers.QUICK)}
CASES = ("retrieval", "opening", "ingest", "reply", "reflection", "cost", "peers")  # the default run
# run when named (--cases soak,servers): the soak 10 minutes, or 30 s with --quick; servers (bench/servers.py)
# 10M memories in 1000 streams for 10 minutes (the file built once: about 6 minutes, 20 GB), or 300k for 1.5
ASKED_ONLY = ("soak", "servers")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    blas = [{k: info.get(k) for k in ("internal_api", "version", "num_threads")} for info in threadpool_info()]
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "blas": blas, "load_average_start": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions (about a minute)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {', '.join(CASES + ASKED_ONLY)} "
                             "(default: all but soak and servers)")
    parser.add_argument("--soak-minutes", type=float, default=None,
                        help="how long the soak's faults last (default 10, or 0.5 with --quick)")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    cases = set(args.cases.split(","))
    if not cases <= set(CASES + ASKED_ONLY):
        parser.error(f"--cases: no case {', '.join(sorted(cases - set(CASES + ASKED_ONLY)))} "
                     f"(cases: {', '.join(CASES + ASKED_ONLY)})")
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick, "started": time.time()}
    previous = args.out / "latest.json"
    if cases != set(CASES) and previous.exists():
        # A partial run updates its cases in the last full results and keeps the others.
        kept = json.loads(previous.read_text())
        if kept.get("quick") == args.quick:
            results = {**kept, "machine": results["machine"], "started": results["started"]}
    # Ingestion first: it measures latency-bound work, which the large allocations of the other cases
    # (gigabytes freed just before) slowed by up to a third on this VM.
    if "ingest" in cases:
        results["ingest"] = [asyncio.run(ingest.run(n, 0.05, concurrency)) for n, concurrency in plan["ingest"]]
        print("ingest done", flush=True)
    if "retrieval" in cases:
        results["retrieval"] = []
        for n, dim, reps, sql_reps, loop_reps in plan["retrieval"]:
            store_file(n, dim)  # built (and cached) before anything is timed
            results["retrieval"].append(retrieval.run_case(n, dim, reps, [1, 2], sql_reps, loop_reps))
            print(f"retrieval {n}x{dim} done", flush=True)
    if "opening" in cases:
        path = store_file(*plan["opening"])
        results["opening"] = opening.run(path)
        print("opening done", flush=True)
    if "reply" in cases:
        n, mentions = plan["reply"]
        results["reply"] = asyncio.run(reply.run(n, 384, mentions))
        print("reply done", flush=True)
    if "reflection" in cases:
        results["reflection"] = asyncio.run(reflection.run(*plan["reflection"]))
    if "cost" in cases:
        messages, mentions_every = plan["cost"]
        results["cost"] = asyncio.run(cost.run(messages, mentions_every))
        print("cost done", flush=True)
    if "peers" in cases:
        results["peers"] = []
        for n, dim, reps in plan["peers"]:
            results["peers"].append(peers.run_case(n, dim, reps))
            print(f"peers {n}x{dim} done", flush=True)
    failed: list[str] = []
    if "soak" in cases:
        report = asyncio.run(soak.run_soak(soak.Plan(minutes=args.soak_minutes or plan["soak"])))
        print("\n".join(report.lines()), flush=True)
        failed = report.failures()
        results["soak"] = {**{k: v for k, v in vars(report).items() if k != "plan"}, "plan": vars(report.plan),
                           "failures": failed}
    if "servers" in cases:
        server_plan = plan["servers"]
        path = build(server_plan.streams, server_plan.memories, server_plan.dim, server_plan.seed,
                     layout=server_plan.layout)
        results["servers"] = asyncio.run(servers.serve(server_plan, path))
        print(servers_table.table(results["servers"]), flush=True)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["seconds"] = time.time() - results["started"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    if "retrieval" in results:
        image = plot(results, args.out / "latency.png")
        if not args.quick:
            docs = ROOT.parent / "docs"
            docs.mkdir(exist_ok=True)
            shutil.copy(image, docs / "bench.png")
    print(f"\nwritten: {args.out / 'latest.json'} ({results['seconds']:.0f} s)")
    if failed:
        raise SystemExit("soak FAILED: " + "; ".join(failed))


if __name__ == "__main__":
    main()
