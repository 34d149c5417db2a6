"""Merge `timerl graphopt eval --out` record files of one split and seed, and summarise them.

Searches with the same seed are deterministic, so the uniform BRKGA and portfolio runs of a
seed can be computed once and compared with several weights files evaluated later (each with
``--methods learned --weights W``). Each group ``LABEL=FILE[,FILE...]`` is one seed's records;
the methods of every file of a group are merged per graph (a method in two files of a group
must agree). A method can be renamed per file with ``FILE:old=new`` (e.g. to compare two
weights files, both evaluated as ``learned``).

Prints, per group, the eval table (markdown) and one line per method: mean and median % vs
uniform BRKGA, wins/ties/losses, the range per graph, and how many graphs end worse than the
portfolio. ``--by-group`` adds, per method, the graphs whose memory limit can be met and
those whose limit no schedule meets, per group and for every group's runs pooled by kind of
graph (each graph once per group).

Run: ``python bench/graphopt_runtime.py s0=base-s0.json,learned-s0.json s1=...``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from timerl.graphopt.evaluate import GraphRecord, summarise, to_markdown


def load_records(spec: str) -> list[GraphRecord]:
    """The records of ``FILE[:old=new,...]`` with methods renamed as asked."""
    path, _, renames = spec.partition(":")
    rename = dict(r.split("=", 1) for r in renames.split(";") if r)
    recs = []
    for raw in json.loads(Path(path).read_text()):
        rec = GraphRecord(**raw)
        for key in ("values", "seconds", "feasible"):
            setattr(rec, key, {rename.get(m, m): v for m, v in getattr(rec, key).items()})
        recs.append(rec)
    return recs


def merge(specs: list[str]) -> list[GraphRecord]:
    """One record per graph with every file's methods (the files must cover the same graphs)."""
    merged: dict[str, GraphRecord] | None = None
    for spec in specs:
        recs = {r.name: r for r in load_records(spec)}
        if merged is None:
            merged = recs
            continue
        if set(recs) != set(merged):
            raise SystemExit(f"{spec}: other graphs than the first file of its group")
        for name, rec in recs.items():
            into = merged[name]
            for m, v in rec.values.items():
                if m in into.values and into.values[m] != v:
                    raise SystemExit(f"{spec}: {name} {m} = {v}, another file has {into.values[m]}")
                into.values[m] = v
                into.seconds[m] = rec.seconds.get(m, 0.0)
                if m in rec.feasible:
                    into.feasible[m] = rec.feasible[m]
    assert merged is not None
    for rec in merged.values():
        rec.best_known = min(rec.values.values())
    return list(merged.values())


#: subsets of graphs ``--by-group`` reports: reachability of the memory limit, kind of graph
SUBSETS: dict[str, Any] = {
    "limit reachable": lambda r: not r.limit_unreachable,
    "limit unreachable": lambda r: r.limit_unreachable,
    "training graphs": lambda r: r.kind == "training",
    "timerl loop bodies": lambda r: r.kind == "program",
    "series-parallel": lambda r: r.kind == "synthetic",
    "model inference": lambda r: r.kind == "model",
}


def compare(records: list[GraphRecord], method: str) -> dict[str, Any]:
    """Per-graph % below uniform BRKGA of ``method``, W/T/L and graphs worse than the portfolio."""
    pct = [
        100.0 * (r.values["brkga"] - r.values[method]) / r.values["brkga"]
        for r in records
        if r.values["brkga"] > 0
    ]
    if not pct:
        return {"method": method, "graphs": len(records), "mean": float("nan")}
    return {
        "method": method,
        "graphs": len(records),
        "mean": statistics.fmean(pct),
        "median": statistics.median(pct),
        "min": min(pct),
        "max": max(pct),
        "wtl": "/".join(
            str(sum(op(r.values[method], r.values["brkga"]) for r in records))
            for op in (float.__lt__, float.__eq__, float.__gt__)
        ),
        "worse_than_portfolio": sum(
            r.values[method] > r.values["portfolio"] for r in records if "portfolio" in r.values
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the merged table and the comparison lines of every group."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("groups", nargs="+", help="LABEL=FILE[,FILE...] (FILE may be FILE:old=new)")
    ap.add_argument("--tables", action="store_true", help="also print each group's eval table")
    ap.add_argument(
        "--by-group", action="store_true", help="also split by memory-limit reachability and kind"
    )
    args = ap.parse_args(argv)
    means: dict[str, list[float]] = {}
    pooled: dict[str, list[GraphRecord]] = {}
    for group in args.groups:
        label, _, files = group.partition("=")
        records = merge(files.split(","))
        methods = [m for m in records[0].values if all(m in r.values for r in records)]
        if args.tables:
            print(f"\n{label}\n")
            print(to_markdown(summarise(records, methods)))
        for m in methods:
            if m in ("brkga", "program", "portfolio", "local", "exact"):
                continue
            c = compare(records, m)
            means.setdefault(m, []).append(c["mean"])
            print(
                f"{label} {m}: {c['mean']:+.2f}% vs uniform (median {c['median']:+.2f}, "
                f"{c['min']:+.1f} to {c['max']:+.1f}), W/T/L {c['wtl']}, "
                f"{c['worse_than_portfolio']} of {c['graphs']} worse than the portfolio"
            )
            pooled.setdefault(m, []).extend(records)
            if args.by_group:
                print_subsets(f"{label} {m}", records, m)
    for m, xs in means.items():
        if len(xs) > 1:
            print(f"{m}: mean over {len(xs)} groups {statistics.fmean(xs):+.2f}%")
            if args.by_group:
                print_subsets(f"all groups pooled, {m}", pooled[m], m)
    return 0


def print_subsets(label: str, records: list[GraphRecord], method: str) -> None:
    """One line per non-empty subset of ``SUBSETS``: runs, mean and median %, W/T/L."""
    for name, keep in SUBSETS.items():
        sub = [r for r in records if keep(r)]
        if not sub:
            continue
        c = compare(sub, method)
        if c["mean"] != c["mean"]:  # nan: no graph with a positive uniform value
            continue
        print(
            f"  {label}, {name}: {len(sub)} runs, {c['mean']:+.2f}% vs uniform "
            f"(median {c['median']:+.2f}), W/T/L {c['wtl']}"
        )


if __name__ == "__main__":
    sys.exit(main())
