"""Does the learned policy steer BRKGA better than uniform proposals? The ablation, per graph.

On every graph of a split (peak memory on one device), at each ``--budgets`` evaluation
budget and the same seed: uniform BRKGA, the network with its untrained (random) parameters,
and BRKGA steered by each ``--weights NAME=PATH`` file; every one seeded with the portfolio.
Reported per kind of graph: the mean and median % lower peak than uniform BRKGA, wins / ties /
losses against it, the share of uniform's gap to the best known order that the method closes
(best known: the best of these runs and of ``--headroom``'s records, the long runs and CP-SAT
of ``bench/graphopt_headroom.py``), and the graphs worse than the portfolio (none, by
construction: the portfolio seeds every search).

``--merge`` summarises stored records without running anything: this script's, or those of
``timerl graphopt eval --out`` at one budget (``brkga`` is uniform; ``FILE@SEED:learned=NAME``
names a weights file's runs), e.g. a seed's ``--methods portfolio brkga`` run beside
``--methods learned --weights W`` runs of several files.

Run: ``python bench/graphopt_ablation.py --corpus corpus --weights shipped=timerl/graphopt/data/policy.npz``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from timerl.graphopt.baselines import portfolio_solutions
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem
from timerl.graphopt.evaluate import load_index
from timerl.graphopt.graph import Graph
from timerl.graphopt.learned import learned_search, load_policy
from timerl.graphopt.policy import PolicyWeights


def run_graph(
    entry: dict[str, Any],
    corpus: Path,
    policies: dict[str, PolicyWeights],
    budgets: list[int],
    seed: int,
    uniform: bool = True,
) -> dict[str, Any]:
    """Every method's peak on one graph at every budget."""
    problem = Problem(Graph.load(corpus / entry["path"]))
    seeds = portfolio_solutions(problem)
    rec: dict[str, Any] = {
        "name": entry["name"],
        "kind": entry["kind"],
        "nodes": entry["nodes"],
        "seed": seed,
        "portfolio": min(problem.evaluate(s) for s in seeds.values()),
        "values": {},
    }
    for budget in budgets:
        vals = {}
        if uniform:
            vals["uniform"] = brkga(problem, budget=budget, seeds=list(seeds.values()), seed=seed)
        for name, w in policies.items():
            vals[name] = learned_search(problem, w, budget=budget, seed=seed, seeds=seeds)
        rec["values"][str(budget)] = {k: r.value for k, r in vals.items()}
    return rec


def from_eval(record: dict[str, Any], budget: int | None, rename: dict[str, str]) -> dict[str, Any]:
    """One record of ``timerl graphopt eval --out`` (values per method, at one budget that the
    file does not hold) as this script's: ``brkga`` is ``uniform``, ``portfolio`` the record's
    portfolio, the other methods renamed as asked (e.g. ``learned=u50``)."""
    if budget is None:
        raise SystemExit("eval records hold no budget: give exactly one of --budgets")
    vals = {rename.get(m, m): v for m, v in record["values"].items() if m != "program"}
    portfolio = vals.pop("portfolio", None)
    if "brkga" in vals:
        vals["uniform"] = vals.pop("brkga")
    rec = {k: record[k] for k in ("name", "kind", "nodes")}
    rec["values"] = {str(budget): vals}
    if portfolio is not None:
        rec["portfolio"] = portfolio
    return rec


def merge(files: list[Path], budget: int | None = None) -> list[dict[str, Any]]:
    """Records of several runs over the same graphs (e.g. one policy each), values combined
    per graph and seed (``FILE@SEED`` gives the seed of records written without one).

    A file may also hold ``timerl graphopt eval --out`` records (one budget, ``budget``; the
    seed from ``@SEED``), with methods renamed by ``FILE@SEED:old=new;...``; the portfolio's
    value is taken from whichever file of a graph and seed has it."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for f in files:
        spec, _, renames = str(f).partition(":")
        path, _, given = spec.partition("@")
        rename = dict(r.split("=", 1) for r in renames.split(";") if r)
        for r in json.loads(Path(path).read_text()):
            if r["values"] and not isinstance(next(iter(r["values"].values())), dict):
                r = from_eval(r, budget, rename)
            seed = int(r.get("seed", given or 0))
            into = merged.setdefault((r["name"], seed), {**r, "seed": seed, "values": {}})
            if "portfolio" in r:
                into["portfolio"] = r["portfolio"]
            for b, vals in r["values"].items():
                into["values"].setdefault(b, {}).update(vals)
    for (name, seed), r in merged.items():
        if "portfolio" not in r:
            raise SystemExit(f"{name} (seed {seed}): no file gives the portfolio's value")
    return list(merged.values())


def across_seeds(records: list[dict[str, Any]], budget: int, best: dict[str, float]) -> str:
    """Per method, each seed's mean % below uniform BRKGA (same seed) and share of uniform's gap
    closed, their mean over the seeds, and the share pooled over all runs (gaps closed summed
    over every seed's graphs, over the gaps summed). The best known order of a graph is the best of
    ``best`` and of every run of every seed, so every seed's share has the same reference."""
    key = str(budget)
    records = [r for r in records if key in r["values"] and "uniform" in r["values"][key]]
    best = dict(best)
    for r in records:
        best[r["name"]] = min(best.get(r["name"], np.inf), *r["values"][key].values())
    seeds = sorted({r["seed"] for r in records})
    methods = sorted({m for r in records for m in r["values"][key]} - {"uniform"})
    lines = [
        "| method | seeds | graphs per seed | % vs uniform, per seed | mean | uniform's gap "
        "closed %, per seed | mean | all runs pooled | W/T/L vs uniform (all runs) | "
        "worse than portfolio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        gains, shares, counts = [], [], []
        w = t = loss = worse = 0
        pooled = [0.0, 0.0]  # closed and room summed over every seed's graphs
        for s in seeds:
            rs = [r for r in records if r["seed"] == s and m in r["values"][key]]
            if not rs:
                continue
            gain, closed, room = [], 0.0, 0.0
            for r in rs:
                u, x, b = r["values"][key]["uniform"], r["values"][key][m], best[r["name"]]
                rel = (u - x) / u if u > 0 else 0.0
                gain.append(100.0 * rel)
                closed += rel
                room += (u - b) / u if u > 0 else 0.0
                w, t, loss = w + (rel > 1e-9), t + (abs(rel) <= 1e-9), loss + (rel < -1e-9)
                worse += x > r["portfolio"]
            pooled[0] += closed
            pooled[1] += room
            gains.append(statistics.mean(gain))
            shares.append(100.0 * closed / room if room > 0 else 0.0)
            counts.append(len(rs))
        if not gains:
            continue
        lines.append(
            f"| {m} | {len(gains)} | {min(counts)}-{max(counts)} | "
            f"{' / '.join(f'{g:+.3f}' for g in gains)} | {statistics.mean(gains):+.3f} | "
            f"{' / '.join(f'{x:.1f}' for x in shares)} | {statistics.mean(shares):.1f} | "
            f"{100.0 * pooled[0] / pooled[1] if pooled[1] > 0 else 0.0:.1f} | "
            f"{w}/{t}/{loss} | {worse} |"
        )
    return "\n".join(lines)


def summary(records: list[dict[str, Any]], budget: int, best: dict[str, float]) -> str:
    """Markdown rows per kind of graph and method, against uniform BRKGA at ``budget``."""
    methods = list(records[0]["values"][str(budget)])
    records = [r for r in records if set(r["values"].get(str(budget), {})) >= set(methods)]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["kind"], []).append(r)
    groups["all"] = records
    lines = [
        "| group | method | graphs | % vs uniform (mean) | (median) | W/T/L vs uniform | "
        "gap to best known % (mean) | uniform's gap closed % | worse than portfolio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gname, rs in groups.items():
        for m in methods:
            gain, gap, closed, room = [], [], 0.0, 0.0
            w = t = loss = worse = 0
            for r in rs:
                v = r["values"][str(budget)]
                u, x = v["uniform"], v[m]
                b = min(best.get(r["name"], x), *v.values())
                gain.append(100.0 * (u - x) / u if u > 0 else 0.0)
                gap.append(100.0 * (x - b) / b if b > 0 else 0.0)
                if u > 0:
                    closed += (u - x) / u
                    room += (u - b) / u
                rel = (u - x) / u if u > 0 else 0.0
                w, t, loss = w + (rel > 1e-9), t + (abs(rel) <= 1e-9), loss + (rel < -1e-9)
                worse += x > r["portfolio"]
            share = f"{100.0 * closed / room:.1f}" if room > 0 else "-"
            lines.append(
                f"| {gname} | {m} | {len(rs)} | {statistics.mean(gain):+.3f} | "
                f"{statistics.median(gain):+.3f} | {w}/{t}/{loss} | {statistics.mean(gap):.3f} | "
                f"{share} | {worse} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=Path("corpus"))
    ap.add_argument("--split", default="test")
    ap.add_argument("--budgets", type=int, nargs="+", default=[500, 5000])
    ap.add_argument(
        "--weights", nargs="+", default=[], metavar="NAME=PATH", help="policies to compare"
    )
    ap.add_argument("--headroom", type=Path, default=None, help="graphopt_headroom.py records")
    ap.add_argument("--max-nodes", type=int, default=None, help="skip larger graphs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="records JSON, after every graph")
    ap.add_argument(
        "--only-weights", action="store_true", help="run no uniform and no untrained search"
    )
    ap.add_argument("--no-untrained", action="store_true", help="run uniform and --weights only")
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE[@SEED][:OLD=NEW;...]",
        help="summarise these records (this script's, or `graphopt eval --out`'s at the one "
        "--budgets), per seed when they hold several; run nothing",
    )
    ap.add_argument(
        "--kind", default=None, help="with --merge: only the graphs of this kind (e.g. program)"
    )
    args = ap.parse_args(argv)
    best: dict[str, float] = {}
    if args.headroom is not None:
        best = {r["name"]: r["best"] for r in json.loads(args.headroom.read_text())}
    if args.merge is not None:
        records = merge(args.merge, args.budgets[0] if len(args.budgets) == 1 else None)
        if args.kind is not None:
            records = [r for r in records if r["kind"] == args.kind]
            if not records:
                raise SystemExit(f"no graphs of kind {args.kind!r} in the merged records")
        seeds = sorted({r["seed"] for r in records})
        for budget in args.budgets:
            if len(seeds) > 1:
                print(f"\nbudget {budget}, seeds {seeds}, {len(args.merge)} files:\n")
                print(across_seeds(records, budget, best))
                continue
            print(f"\nbudget {budget}, {len(records)} graphs merged from {len(args.merge)} runs:\n")
            print(summary(records, budget, best))
        return 0
    policies: dict[str, PolicyWeights] = {}
    for spec in args.weights:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"--weights {spec!r}: expected NAME=PATH")
        policies[name] = load_policy(path)
    first = next(iter(policies.values()), None)
    hidden, rounds = (first.hidden, first.rounds) if first is not None else (32, 3)
    if not args.only_weights and not args.no_untrained:
        untrained = PolicyWeights.random(hidden, rounds, seed=args.seed)
        policies = {"untrained": untrained, **policies}
    entries = load_index(args.corpus, args.split)
    if args.max_nodes is not None:
        entries = [e for e in entries if e["nodes"] <= args.max_nodes]
    if not entries:
        print(f"{args.corpus}: no graphs in split {args.split!r}", file=sys.stderr)
        return 1
    print(
        f"# graphopt ablation: {' '.join(sys.argv)}\n"
        f"# split {args.split}, {len(entries)} graphs, peak memory on one device, budgets "
        f"{args.budgets}, seed {args.seed}, methods uniform + {list(policies)}\n"
        f"# {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()}",
        flush=True,
    )
    records = []
    for e in entries:
        rec = run_graph(
            e, args.corpus, policies, args.budgets, args.seed, uniform=not args.only_weights
        )
        records.append(rec)
        print(f"{rec['name']}: {json.dumps(rec['values'])}", flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(records, indent=1))
    if not args.only_weights:
        for budget in args.budgets:
            print(f"\nbudget {budget}:\n")
            print(summary(records, budget, best))
    print(f"\n# load at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
