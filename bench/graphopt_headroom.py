"""How much lower than uniform BRKGA can a graph's peak memory go? The room a policy has.

For every graph of the chosen splits (peak memory on one device), the best order known from:
uniform BRKGA at ``--budget`` evaluations (the reference a learned policy must beat), a long
uniform BRKGA run (``--long`` evaluations, another seed, seeded with the portfolio and with the
reference's result so it can only improve on it), and CP-SAT where the graph is small enough
(``--exact-nodes``); neither runs where the reference already meets the dependence lower
bound, which proves an order optimal.
The headroom is how much lower the best known peak is than the reference's: no policy steering
the same search can beat the reference by more than that on average, unless it finds orders
better than any found here.

Run: ``python bench/graphopt_headroom.py --corpus corpus --splits test`` (records go to
``--out`` after every graph, so a stopped run keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from timerl.graphopt.baselines import portfolio_solutions
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem
from timerl.graphopt.evaluate import load_index
from timerl.graphopt.exact import exact_peak_memory, peak_lower_bound
from timerl.graphopt.graph import Graph


def measure(
    entry: dict[str, Any],
    corpus: Path,
    *,
    budget: int,
    long: int,
    exact_nodes: int,
    exact_time: float,
    seed: int,
) -> dict[str, Any]:
    """One graph's values under every method, its best known order and its headroom."""
    graph = Graph.load(corpus / entry["path"])
    problem = Problem(graph)
    t0 = time.perf_counter()
    seeds = portfolio_solutions(problem)
    portfolio = min(problem.evaluate(s) for s in seeds.values())
    ref = brkga(problem, budget=budget, seeds=list(seeds.values()), seed=seed)
    t_ref = time.perf_counter() - t0
    rec: dict[str, Any] = {
        "name": entry["name"],
        "family": entry["family"],
        "kind": entry["kind"],
        "split": entry["split"],
        "nodes": graph.n,
        "portfolio": portfolio,
        "uniform": ref.value,
        "uniform_seconds": round(t_ref, 2),
    }
    best, best_sol = ref.value, ref.solution
    bound = float(peak_lower_bound(graph))
    if long > 0 and best > bound:  # at the bound the reference is already optimal
        more = brkga(problem, budget=long, seeds=[*seeds.values(), ref.solution], seed=seed + 1)
        rec["long"] = more.value
        if more.value < best:
            best, best_sol = more.value, more.solution
    if graph.n <= exact_nodes and best > bound:
        ex = exact_peak_memory(problem, time_limit=exact_time, start=best_sol, seed=seed)
        rec["exact"] = ex.value
        bound = max(bound, float(ex.bound if ex.bound is not None else 0.0))
        best = min(best, ex.value)
    rec.update(
        bound=bound,
        best=best,
        proven=best <= bound,
        headroom=100.0 * (ref.value - best) / ref.value if ref.value > 0 else 0.0,
        portfolio_gap=100.0 * (portfolio - best) / portfolio if portfolio > 0 else 0.0,
        seconds=round(time.perf_counter() - t0, 2),
    )
    return rec


def _size(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def table(records: list[dict[str, Any]]) -> str:
    """Per-graph markdown table, then the headroom summarised per kind of graph."""
    head = (
        "| graph | split | nodes | portfolio | uniform BRKGA | long BRKGA | exact | best | "
        "lower bound | proven | headroom vs uniform % |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r['name']} | {r['split']} | {r['nodes']} | {_size(r['portfolio'])} | "
        f"{_size(r['uniform'])} | {_size(r.get('long'))} | {_size(r.get('exact'))} | "
        f"{_size(r['best'])} | {_size(r['bound'])} | {'yes' if r['proven'] else 'no'} | "
        f"{r['headroom']:.3f} |"
        for r in records
    ]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(f"{r['split']}/{r['kind']}", []).append(r)
        groups.setdefault(f"{r['split']}/all", []).append(r)
    summary = [
        "| group | graphs | headroom mean % | median % | max % | graphs > 5% | "
        "graphs with none (< 0.01%) | proven optimal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(groups):
        rs = groups[name]
        h = [r["headroom"] for r in rs]
        summary.append(
            f"| {name} | {len(rs)} | {statistics.mean(h):.3f} | {statistics.median(h):.3f} | "
            f"{max(h):.3f} | {sum(x > 5 for x in h)} | {sum(x < 0.01 for x in h)} | "
            f"{sum(r['proven'] for r in rs)} |"
        )
    return head + "\n".join(rows) + "\n\n" + "\n".join(summary) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=Path("corpus"))
    ap.add_argument("--splits", nargs="+", default=["test"])
    ap.add_argument("--budget", type=int, default=5000, help="the reference's evaluations")
    ap.add_argument("--long", type=int, default=20000, help="the long run's evaluations")
    ap.add_argument("--exact-nodes", type=int, default=60)
    ap.add_argument("--exact-time", type=float, default=10.0)
    ap.add_argument("--max-nodes", type=int, default=None, help="skip larger graphs")
    ap.add_argument("--families", nargs="+", default=None, help="only these families")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="records JSON, after every graph")
    args = ap.parse_args(argv)
    entries = [e for s in args.splits for e in load_index(args.corpus, s)]
    if args.families is not None:
        entries = [e for e in entries if e["family"] in args.families]
    if args.max_nodes is not None:
        entries = [e for e in entries if e["nodes"] <= args.max_nodes]
    if not entries:
        print(f"{args.corpus}: no graphs in splits {args.splits}", file=sys.stderr)
        return 1
    print(
        f"# graphopt headroom: {' '.join(sys.argv)}\n"
        f"# corpus {args.corpus}, splits {args.splits}, {len(entries)} graphs, peak memory on "
        f"one device; reference: uniform BRKGA, {args.budget} evaluations, seed {args.seed}; "
        f"long: {args.long} evaluations, seed {args.seed + 1}; CP-SAT up to "
        f"{args.exact_nodes} nodes, {args.exact_time:g} s\n"
        f"# {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()}",
        flush=True,
    )
    records = []
    for e in entries:
        rec = measure(
            e,
            args.corpus,
            budget=args.budget,
            long=args.long,
            exact_nodes=args.exact_nodes,
            exact_time=args.exact_time,
            seed=args.seed,
        )
        records.append(rec)
        print(
            f"{rec['name']}: {rec['nodes']} nodes, headroom {rec['headroom']:.3f}% "
            f"({rec['seconds']:.1f} s)",
            flush=True,
        )
        if args.out is not None:
            args.out.write_text(json.dumps(records, indent=1))
    print()
    print(table(records))
    print(f"# load at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
