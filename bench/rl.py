"""Side-by-side DRL benchmark: timerl's PPO/REINFORCE programs against the eager baselines.

Every system runs the same configuration (env, batch shape, network, update schedule, learning
rate, seed; see :mod:`bench.common`), one measurement per fresh worker process so that peak RSS
belongs to that system alone. Systems are alternated (each repetition rotates their order) and
repeated; the table reports medians and the ratio of each timerl backend's env steps/s over
each baseline's, both measured in this run.

    python -m bench.rl --quick
    python -m bench.rl --configs synthetic,depth --repeats 3 --out runs/bench --profile
    timerl bench rl --quick

Systems that cannot run here (a package is missing) become ``skipped`` rows; a system that
fails on one configuration becomes a ``failed`` row with the error, and the run goes on.

This module runs the benchmark and holds its command line; the systems and cases are in
:mod:`bench.rl_cases`, one measurement and its worker process in :mod:`bench.rl_worker`, the
rows, tables, CSV and plots in :mod:`bench.rl_report`. The names of all three are importable
from here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.rl_cases import (
    BUDGET_FRACTION,
    BUDGETED,
    EAGER,
    EXPERIMENTS,
    IMAGE_BASELINES,
    QUICK,
    SYSTEMS,
    Case,
    System,
    all_cases,
    default_systems,
    is_atari,
    select_cases,
    systems_for,
)
from bench.rl_report import (
    ACCOUNTING_TOLERANCE,
    CSV_FIELDS,
    Row,
    accounting_lines,
    baseline_names,
    budget_lines,
    compute_ratios,
    markdown_table,
    notes,
    plot,
    print_profiles,
    print_table,
    profile_table,
    table_rows,
    to_records,
    write_csv,
)
from bench.rl_worker import MARK, ROOT, _worker, run_isolated, run_one

__all__ = [
    "ACCOUNTING_TOLERANCE",
    "BUDGET_FRACTION",
    "BUDGETED",
    "CSV_FIELDS",
    "EAGER",
    "EXPERIMENTS",
    "IMAGE_BASELINES",
    "MARK",
    "QUICK",
    "ROOT",
    "SYSTEMS",
    "Case",
    "Row",
    "System",
    "accounting_lines",
    "add_arguments",
    "all_cases",
    "baseline_names",
    "budget_for",
    "budget_lines",
    "compute_ratios",
    "default_systems",
    "is_atari",
    "main",
    "markdown_table",
    "notes",
    "plot",
    "print_profiles",
    "print_table",
    "profile_table",
    "run_benchmark",
    "run_from_args",
    "run_isolated",
    "run_one",
    "run_profiles",
    "select_cases",
    "systems_for",
    "table_rows",
    "to_records",
    "write_csv",
]


# --------------------------------------------------------------------------------------------
# the benchmark


def budget_for(case: Case, rows: dict[str, Row]) -> int | None:
    """Eager PyTorch's median data memory on ``case`` so far, / ``BUDGET_FRACTION``."""
    eager = rows.get(EAGER.get(case.algo, ""))
    if eager is None or eager.status != "ok" or math.isnan(eager.data_bytes):
        return None
    return int(eager.data_bytes / BUDGET_FRACTION)


def run_benchmark(
    cases: list[Case],
    system_names: list[str],
    repeats: int,
    isolated: bool = True,
    systems: dict[str, System] | None = None,
    log: Callable[[str], None] = print,
    budget: int | None = None,
) -> list[Row]:
    """Measure every (case, system) ``repeats`` times, rotating the systems' order each time.

    ``budget``: the bytes ``timerl_budget`` compiles under where eager PyTorch is not in the
    run (a budget measured in an earlier one); with eager PyTorch there, its data / 16."""
    systems = systems or SYSTEMS
    rows: list[Row] = []
    for case in cases:
        chosen = systems_for(case, system_names, systems)
        case_rows = {s.name: Row(case, s.name, s.kind) for s in chosen}
        rows.extend(case_rows.values())
        for rep in range(repeats):
            k = rep % max(len(chosen), 1)
            order = chosen[k:] + chosen[:k]
            # the budgeted system runs after eager PyTorch, whose data memory sets its budget
            order = [s for s in order if s.name != BUDGETED] + [
                s for s in order if s.name == BUDGETED
            ]
            for system in order:
                row = case_rows[system.name]
                if row.status != "ok":
                    continue  # skipped or failed once: do not retry
                run_case = case
                if system.name == BUDGETED:
                    budget_here = budget_for(case, case_rows) or budget
                    if budget_here is None:
                        row.status = "skipped"
                        row.reason = (
                            f"needs {EAGER.get(case.algo, 'eager PyTorch')} in the run or --budget"
                        )
                        continue
                    run_case = replace(case, config=replace(case.config, memory_budget=budget_here))
                t0 = time.perf_counter()
                out = run_isolated(system, run_case) if isolated else run_one(system, run_case)
                took = time.perf_counter() - t0
                if out["status"] == "ok":
                    row.results.append(out["result"])
                    sps = out["result"]["env_steps_per_s"]
                    log(f"  {case.label:<20} {system.name:<16} rep {rep + 1}: {sps:>12,.0f} "
                        f"steps/s  ({took:.1f} s)")  # fmt: skip
                else:
                    row.status, row.reason = out["status"], out["reason"]
                    log(f"  {case.label:<20} {system.name:<16} {out['status']}: {out['reason']}")
    compute_ratios(rows)
    return rows


def run_profiles(
    cases: list[Case],
    system_names: list[str],
    isolated: bool = True,
    systems: dict[str, System] | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    systems = systems or SYSTEMS
    out: list[dict[str, Any]] = []
    for case in cases:
        for system in systems_for(case, system_names, systems):
            if system.profile is None:
                continue
            res = run_isolated(system, case, True) if isolated else run_one(system, case, True)
            if res["status"] != "ok":
                log(f"  profile {case.label} {system.name}: {res['status']}: {res['reason']}")
                continue
            out.append({"case": case.label, **res["profile"]})
    return out


# --------------------------------------------------------------------------------------------
# command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="few iterations, a subset of configs")
    p.add_argument(
        "--configs",
        default=None,
        help="comma-separated case labels or experiments (synthetic, depth, memory, "
        "reinforce, all); see --list",
    )
    p.add_argument(
        "--systems",
        default=",".join(n for n in SYSTEMS if n != BUDGETED),
        help="comma-separated systems (default: all but timerl_budget, which compiles under "
        "a budget of eager PyTorch's data memory in the same run / 16; unavailable ones print "
        "as skipped)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MIB",
        help="timerl_budget's budget in MiB where eager PyTorch is not in the run",
    )
    p.add_argument("--repeats", type=int, default=None, help="repetitions (default 3; quick 2)")
    p.add_argument("--iterations", type=int, default=None, help="override every case's count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch/BLAS/XLA threads (default 1)")
    p.add_argument(
        "--device",
        default="cpu",
        help="device of the torch and jax systems and baselines, e.g. cuda (numpy: the host)",
    )
    p.add_argument("--out", default=None, help="directory for results.csv, table.md, PNG plots")
    p.add_argument("--profile", action="store_true", help="cost breakdown of timerl runs")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every measurement in this process (faster, but peak RSS is shared)",
    )
    p.add_argument("--list", action="store_true", help="list the configurations and exit")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker(argv[1])
    parser = argparse.ArgumentParser(prog="timerl bench rl", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def run_from_args(args: argparse.Namespace, systems: dict[str, System] | None = None) -> int:
    systems = systems or SYSTEMS
    cases = all_cases(quick=args.quick, iterations=args.iterations, seed=args.seed)
    for case in cases:
        case.config.threads = args.threads
        case.config.device = args.device
    if args.list:
        for case in cases:
            print(f"{case.label:<20} [{case.experiment}] {case.describe()}")
        return 0
    chosen = select_cases(cases, args.configs, args.quick)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in systems]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {sorted(systems)}")
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    if args.in_process:
        from bench.common import pin_threads

        pin_threads(args.threads)
        if args.threads == 1:
            from bench.baselines.jax_ppo import pin_xla_threads

            pin_xla_threads()
    began = time.perf_counter()
    print(f"timerl bench rl: {len(chosen)} configuration(s) x {len(names)} system(s) "
          f"x {repeats} repeat(s), {args.threads} thread(s), device {args.device}")  # fmt: skip
    for case in chosen:
        print(f"  {case.label:<20} {case.describe()}")
    budget = None if args.budget is None else int(args.budget * 2**20)
    rows = run_benchmark(chosen, names, repeats, not args.in_process, systems, budget=budget)
    title = f"env steps/s, median of {repeats} alternated runs; ÷ X = timerl / X (steps/s)"
    print_table(rows, title)
    profiles: list[dict[str, Any]] = []
    if args.profile:
        timerl_names = [n for n in names if systems[n].profile is not None]
        profiles = run_profiles(chosen, timerl_names, not args.in_process, systems)
        print_profiles(profiles)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, out / "results.csv")
        header, cells = table_rows(rows)
        text = markdown_table(header, cells) + "".join(
            f"\n\n{n}" for n in notes(rows) + budget_lines(rows)
        )
        if profiles:
            ph, pc = profile_table(profiles)
            text += "\n\n" + markdown_table(ph, pc)
            with open(out / "profile.json", "w") as fh:
                json.dump(profiles, fh, indent=1, default=str)
        (out / "table.md").write_text(text + "\n")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            paths = []
            print("note: matplotlib is not installed (pip install 'timerl[train]'): no plots")
        else:
            paths = plot(rows, out)
        print(f"wrote {out / 'results.csv'}, {out / 'table.md'} and {len(paths)} plot(s)")
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
