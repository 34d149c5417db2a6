"""graphopt's methods on the held-out families of the headroom corpus: the results tables.

Runs every ``--methods`` method on every graph of ``--split`` at every ``--budgets`` budget
and ``--seeds`` seed (records appended to ``--out`` as they finish, one JSON line each, so a
stopped run resumes), then prints, per family and over all graphs:

- each method's mean % below uniform BRKGA at the same budget and seed;
- the bars' quantities at each budget: the learned method against the best of portfolio,
  local search and uniform BRKGA per graph, and graphs worse than the portfolio;
- per family, portfolio / local / uniform BRKGA / learned and the best known order, as mean
  % below uniform BRKGA at 5,000 evaluations (the headroom's reference), and the share of
  the headroom the learned method captures.

The best known order of a graph is the lowest peak among this file's runs (every method,
budget and seed: the learned method at 50,000 evaluations included), the filter's
measurements (``--filter-records``: BRKGA at 50,000, the local searches), and CP-SAT where
``--exact-nodes`` allows; a graph is proven optimal when that meets the dependence bound.
Headroom = (uniform BRKGA at 5,000, seed 0 - best known) / uniform BRKGA at 5,000.

Run:  python bench/graphopt_heldout.py --corpus corpus-headroom --split test \\
          --budgets 500 5000 --seeds 0 1 2 --out heldout.jsonl
      python bench/graphopt_heldout.py --corpus corpus-headroom --split test \\
          --budgets 50000 --seeds 0 --methods brkga learned --out heldout.jsonl
      python bench/graphopt_heldout.py --corpus corpus-headroom --split test --report \\
          --out heldout.jsonl
Running time under a memory limit: ``--objective runtime --devices 2 --host
--memory-fraction 0.8`` (the headroom columns then read the runs alone).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from timerl.graphopt.decoders import Problem
from timerl.graphopt.evaluate import load_index, run_method
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import Cluster, PeakMemory

METHODS = ("portfolio", "local", "brkga", "learned", "hybrid", "peak-local")
CLASSICAL = ("portfolio", "local", "brkga")
REFERENCE_BUDGET = 5000


def make_problem(graph: Graph, setting: dict[str, Any]) -> Problem:
    """Peak memory on one device, or running time under a per-device memory limit of
    ``memory_fraction`` times the program-order peak."""
    if setting["objective"] == "peak-memory" and setting["devices"] == 1 and not setting["host"]:
        return Problem(graph)
    limit = None
    if setting.get("memory_fraction") is not None:
        prog = PeakMemory(graph).peak(graph.program_order)
        limit = max(1, int(setting["memory_fraction"] * prog))
    cluster = Cluster.make(setting["devices"], memory_limit=limit, host=setting["host"])
    return Problem(graph, setting["objective"], cluster)


def run_one(task: tuple[str, dict[str, Any], str, int, int, dict[str, Any]]) -> dict[str, Any]:
    """One method on one graph at one budget and seed (a worker's call)."""
    corpus, entry, method, budget, seed, setting = task
    graph = Graph.load(Path(corpus) / entry["path"])
    problem = make_problem(graph, setting)
    t0 = time.perf_counter()
    res = run_method(method, problem, budget=budget, seed=seed, weights=setting.get("weights"))
    rec = {
        "name": entry["name"],
        "family": entry["family"],
        "kind": entry["kind"],
        "nodes": entry["nodes"],
        "kept": bool(entry.get("kept", True)),
        "method": method,
        "budget": budget,
        "seed": seed,
        "value": res.value,
        "evaluations": res.evaluations,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if problem.cluster is not None and problem.cluster.memory_limit and problem.sim is not None:
        sol = res.solution
        sim = problem.sim.run(sol.order, sol.placement, sol.swap)  # type: ignore[arg-type]
        rec["feasible"] = bool((sim.peaks <= problem.cluster.memory_limit).all())
    return rec


def read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(args: argparse.Namespace, setting: dict[str, Any]) -> None:
    entries = load_index(args.corpus, args.split)
    if args.families:
        entries = [e for e in entries if e["family"] in args.families]
    done = {(r["name"], r["method"], r["budget"], r["seed"]) for r in read(args.out)}
    tasks = [
        (str(args.corpus), e, m, b, s, setting)
        for s in args.seeds
        for b in args.budgets
        for e in entries
        for m in args.methods
        if (e["name"], m, b, s) not in done and not (m == "portfolio" and b != args.budgets[0])
    ]
    tasks.sort(key=lambda t: -t[1]["nodes"] * t[3])  # longest first: workers end together
    print(f"{len(tasks)} runs ({len(done)} already in {args.out})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max(1, args.workers), mp_context=ctx) as pool:
        futures = [pool.submit(run_one, t) for t in tasks]
        for k, fut in enumerate(as_completed(futures), 1):
            rec = fut.result()
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(
                f"[{k}/{len(tasks)}] {rec['name']} {rec['method']}@{rec['budget']} "
                f"s{rec['seed']}: {rec['value']:.6g} ({rec['seconds']:.1f}s)",
                flush=True,
            )


# ------------------------------------------------------------------------------ report
def _pct(ref: float, val: float) -> float:
    return 0.0 if ref <= 0 else 100.0 * (ref - val) / ref


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def best_known(
    records: list[dict[str, Any]], filt: dict[str, dict[str, Any]], exact: dict[str, float]
) -> dict[str, float]:
    best: dict[str, float] = {}
    for r in records:
        best[r["name"]] = min(best.get(r["name"], float("inf")), r["value"])
    for name in list(best):
        f = filt.get(name)
        if f is not None:
            best[name] = min(best[name], f["brkga_long"], *f.get("others", {}).values())
        if name in exact:
            best[name] = min(best[name], exact[name])
    return best


def report(args: argparse.Namespace, records: list[dict[str, Any]]) -> str:
    filt: dict[str, dict[str, Any]] = {}
    if args.filter_records and args.filter_records.is_file():
        data = json.loads(args.filter_records.read_text())
        filt = {r["name"]: r for r in data["records"]}
    exact = {}
    if args.exact_nodes:
        exact = run_exact(args, records)
    best = best_known(records, filt, exact)
    val = {(r["name"], r["method"], r["budget"], r["seed"]): r["value"] for r in records}
    fam = {r["name"]: r["family"] for r in records}
    kept = {r["name"] for r in records if r.get("kept", True)}

    def member(group: str, name: str) -> bool:
        """A family, "all" graphs, or those REGAL's filter "kept" (the headroom graphs)."""
        return group == "all" or (group == "kept" and name in kept) or group == fam[name]

    names = sorted(fam)
    seeds = sorted({r["seed"] for r in records})
    budgets = sorted({r["budget"] for r in records if r["method"] != "portfolio"})
    methods = [m for m in METHODS if any(r["method"] == m for r in records)]
    families = sorted(set(fam.values()))
    groups = [*families, "kept", "all"]
    out = [f"graphs: {len(names)}, seeds {seeds}, budgets {budgets}, machine {platform.node()}"]

    def portfolio(name: str) -> float | None:
        ps = [v for (n, m, _, _), v in val.items() if n == name and m == "portfolio"]
        return ps[0] if ps else None

    def get(name: str, m: str, b: int, s: int) -> float | None:
        return portfolio(name) if m == "portfolio" else val.get((name, m, b, s))

    # 1. per budget: mean % below uniform BRKGA (same budget, seed), by family and over all
    for b in budgets:
        out.append(f"\n### {b} evaluations: mean % below uniform BRKGA at {b} (seeds {seeds})\n")
        out.append("| family | graphs | " + " | ".join(methods) + " |")
        out.append("|---|---|" + "---|" * len(methods))
        for group in groups:
            gn = [n for n in names if member(group, n)]
            cells = []
            for m in methods:
                xs = [
                    _pct(get(n, "brkga", b, s), get(n, m, b, s))  # type: ignore[arg-type]
                    for n in gn
                    for s in seeds
                    if get(n, m, b, s) is not None and get(n, "brkga", b, s) is not None
                ]
                cells.append(f"{_mean(xs):+.2f}" if xs else "-")
            out.append(f"| {group} | {len(gn)} | " + " | ".join(cells) + " |")
    # 2. the bars, per budget and seed: learned against each reference
    if "learned" in methods:
        out.append("\n### the learned method per seed\n")
        out.append(
            "| budget | seed | graphs | % below uniform BRKGA | % below best of portfolio, "
            "local, BRKGA | headroom captured % | worse than portfolio | W/T/L vs best classical |"
        )
        out.append("|---|---|---|---|---|---|---|---|")
        for b, s, group in [(b, s, g) for b in budgets for s in seeds for g in ("all", "kept")]:
            gn = [n for n in names if get(n, "learned", b, s) is not None and member(group, n)]
            vs_u, vs_c, cap_num, cap_den, worse, wtl = [], [], [], [], 0, [0, 0, 0]
            for n in gn:
                lv = get(n, "learned", b, s)
                u = get(n, "brkga", b, s)
                classical = [get(n, m, b, s) for m in CLASSICAL]
                classical = [c for c in classical if c is not None]
                if u is not None:
                    vs_u.append(_pct(u, lv))
                if classical:
                    c = min(classical)
                    vs_c.append(_pct(c, lv))
                    wtl[0 if lv < c else (1 if lv == c else 2)] += 1
                ref = get(n, "brkga", REFERENCE_BUDGET, 0)
                if ref is not None and ref > best[n]:
                    cap_num.append(_pct(ref, lv))
                    cap_den.append(_pct(ref, best[n]))
                p = portfolio(n)
                worse += int(p is not None and lv > p)
            cap = 100 * sum(cap_num) / sum(cap_den) if cap_den else float("nan")
            out.append(
                f"| {b} | {s} | {len(gn)} ({group}) | {_mean(vs_u):+.2f} | {_mean(vs_c):+.2f} | "
                f"{cap:.1f} | {worse} | {wtl[0]}/{wtl[1]}/{wtl[2]} |"
            )
    # 3. per family: the methods against uniform BRKGA at 5,000 (seed 0), best known, capture
    out.append(
        f"\n### per family: mean % below uniform BRKGA at {REFERENCE_BUDGET} (seed 0); "
        "learned's share of the headroom\n"
    )
    cols = [(m, b) for b in budgets for m in ("local", "brkga", "learned") if m in methods]
    head = [
        "portfolio",
        *[f"{m}@{b}" for m, b in cols],
        "best known",
        "headroom captured (learned@5000)",
    ]
    out.append("| family | graphs | proven | " + " | ".join(head) + " |")
    out.append("|---|---|---|" + "---|" * len(head))
    for group in groups:
        gn = [
            n
            for n in names
            if member(group, n) and get(n, "brkga", REFERENCE_BUDGET, 0) is not None
        ]
        if not gn:
            continue
        ref = {n: get(n, "brkga", REFERENCE_BUDGET, 0) for n in gn}
        cells = [_mean([_pct(ref[n], portfolio(n)) for n in gn if portfolio(n) is not None])]
        for m, b in cols:
            cells.append(
                _mean([_pct(ref[n], get(n, m, b, 0)) for n in gn if get(n, m, b, 0) is not None])
            )
        room = [_pct(ref[n], best[n]) for n in gn]
        cells.append(_mean(room))
        got = [
            _pct(ref[n], get(n, "learned", REFERENCE_BUDGET, 0))
            for n in gn
            if get(n, "learned", REFERENCE_BUDGET, 0) is not None
        ]
        capture = 100 * sum(got) / sum(room) if sum(room) > 0 and got else float("nan")
        proven = sum(n in exact and exact[n] <= best[n] for n in gn)
        text = " | ".join(f"{c:+.2f}" for c in cells)
        out.append(f"| {group} | {len(gn)} | {proven} | {text} | {capture:.1f} |")
    return "\n".join(out)


def run_exact(args: argparse.Namespace, records: list[dict[str, Any]]) -> dict[str, float]:
    """CP-SAT on the graphs up to ``--exact-nodes`` (cached in ``OUT.exact.json``)."""
    from timerl.graphopt.exact import exact_peak_memory

    cache = args.out.with_suffix(".exact.json")
    got: dict[str, float] = json.loads(cache.read_text()) if cache.is_file() else {}
    entries = {e["name"]: e for e in load_index(args.corpus, args.split)}
    for name in sorted({r["name"] for r in records}):
        e = entries.get(name)
        if e is None or e["nodes"] > args.exact_nodes or name in got:
            continue
        problem = Problem(Graph.load(Path(args.corpus) / e["path"]))
        res = exact_peak_memory(problem, time_limit=args.exact_time)
        got[name] = res.value
        cache.write_text(json.dumps(got, indent=1))
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=Path("corpus-headroom"))
    p.add_argument("--split", default="test")
    p.add_argument("--families", nargs="*", default=None)
    p.add_argument("--methods", nargs="+", default=list(METHODS[:4]))
    p.add_argument("--budgets", nargs="+", type=int, default=[5000])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--weights", default=None, help="policy weights (default: shipped)")
    p.add_argument("--objective", default="peak-memory", choices=("peak-memory", "runtime"))
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--host", action="store_true")
    p.add_argument("--memory-fraction", type=float, default=None)
    p.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    p.add_argument("--out", type=Path, default=Path("heldout.jsonl"))
    p.add_argument("--report", action="store_true", help="print the tables of --out only")
    p.add_argument("--filter-records", type=Path, default=None, help="default: the shipped ones")
    p.add_argument("--exact-nodes", type=int, default=0, help="CP-SAT up to this many nodes")
    p.add_argument("--exact-time", type=float, default=60.0)
    args = p.parse_args(argv)
    if args.filter_records is None and args.objective == "peak-memory":
        from timerl.graphopt.corpus.headroom import SHIPPED_RECORDS

        args.filter_records = SHIPPED_RECORDS
    setting = {
        "objective": args.objective,
        "devices": args.devices,
        "host": args.host,
        "memory_fraction": args.memory_fraction,
        "weights": args.weights,
    }
    if not args.report:
        run(args, setting)
    print(report(args, read(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
