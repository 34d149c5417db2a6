"""Running methods by name, and evaluating them over a corpus split.

Every method sees the same Problem and the same evaluation budget; the numbers reported are
relative to program order and to uniform BRKGA, plus the gap to the best known optimum (the
exact solver's, where it proved one).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import GraphError
from timerl.graphopt.baselines import (
    best_of_portfolio,
    local_search,
    portfolio_solutions,
    program_baseline,
)
from timerl.graphopt.brkga import SearchResult, brkga
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.exact import exact_peak_memory, peak_lower_bound
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import max_working_set

METHODS = ("program", "portfolio", "local", "brkga", "learned", "exact")
#: Methods eval also knows but does not run by default (ablations): the policy's network,
#: untrained; the learned search with uniform proposals and move weights (no policy); the
#: peak-directed local search alone, from the best portfolio schedule.
EXTRA_METHODS = ("untrained", "hybrid", "peak-local")
KINDS = ("synthetic", "model", "training", "program")


def run_method(
    name: str,
    problem: Problem,
    *,
    budget: int = 5000,
    seed: int = 0,
    time_limit: float = 10.0,
    start: Solution | None = None,
    weights: str | Path | None = None,
    jobs: int = 1,
    seeded: bool = True,
) -> SearchResult:
    """Run one method; ``start`` (a known good schedule) seeds the exact solver's bound;
    ``jobs`` processes score the schedules of a BRKGA search (the same result as one).

    ``learned`` reads the policy weights at ``weights`` (default: the shipped file for the
    problem's objective); ``untrained`` is the same network with random parameters (an
    ablation). ``seeded=False`` starts the BRKGA searches from no portfolio schedule (the
    learned ones keep the policy's mean schedule): REGAL's setting, where what is compared is
    the proposals alone."""
    t0 = time.perf_counter()
    if name == "program":
        res = program_baseline(problem)
    elif name == "portfolio":
        res = best_of_portfolio(problem)
    elif name == "local":
        pf = best_of_portfolio(problem)
        res = local_search(problem, pf.solution, budget=max(budget - pf.evaluations, 1), seed=seed)
        res.evaluations += pf.evaluations
    elif name == "brkga":
        seeds = list(portfolio_solutions(problem).values()) if seeded else []
        res = brkga(problem, budget=budget, seeds=seeds, seed=seed, jobs=jobs)
    elif name in ("learned", "untrained"):
        from timerl.graphopt.learned import learned_search, load_policy
        from timerl.graphopt.policy import PolicyWeights

        policy = load_policy(weights, problem.objective)
        if name == "untrained":
            policy = PolicyWeights.random(policy.hidden, policy.rounds, seed=seed)
        res = learned_search(
            problem, policy, budget=budget, seed=seed, jobs=jobs, seeds=None if seeded else {}
        )
        if name == "untrained":
            res.method = name
    elif name == "hybrid":
        from timerl.graphopt.learned import learned_search
        from timerl.graphopt.policy import OUTPUTS

        zero = np.zeros((problem.n, OUTPUTS), dtype=np.float32)
        seeds = None if seeded else {}
        res = learned_search(
            problem, None, budget=budget, seed=seed, jobs=jobs, action=zero, seeds=seeds
        )
        res.method = name
    elif name == "peak-local":
        from timerl.graphopt.localsearch import peak_local_search

        pf = best_of_portfolio(problem)
        if not problem.single:
            raise GraphError("method 'peak-local' searches peak memory on one device only")
        res = peak_local_search(
            problem, pf.solution, budget=max(budget - pf.evaluations, 1), seed=seed
        )
        res.evaluations += pf.evaluations
    elif name == "exact":
        if not problem.single:
            raise GraphError("method 'exact' solves peak memory on one device only")
        res = exact_peak_memory(problem, time_limit=time_limit, start=start, seed=seed)
    else:
        known = ", ".join(METHODS + EXTRA_METHODS)
        raise GraphError(f"unknown method {name!r} (choose from {known})")
    res.seconds = time.perf_counter() - t0
    return res


def optimize(
    graph: Graph,
    problem: Problem,
    method: str,
    *,
    budget: int = 5000,
    seed: int = 0,
    time_limit: float = 10.0,
    weights: str | Path | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """The result document of ``timerl graphopt optimize``."""
    res = run_method(
        method,
        problem,
        budget=budget,
        seed=seed,
        time_limit=time_limit,
        weights=weights,
        jobs=jobs,
    )
    prog = program_baseline(problem).value
    out = res.solution.to_json(graph, problem.cluster)
    out.update(
        objective=res.value,
        objective_name=problem.objective,
        program_order_value=prog,
        method=method,
        detail=res.method,
        evaluations=res.evaluations,
        seconds=res.seconds,
    )
    if res.bound is not None:
        out["bound"] = res.bound
    return out


# ---------------------------------------------------------------------- corpus evaluation
@dataclass
class GraphRecord:
    """Per-graph results of one evaluation run."""

    name: str
    kind: str
    nodes: int
    family: str = ""
    values: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    feasible: dict[str, bool] = field(default_factory=dict)  # under the memory limit, if any
    optimum: float | None = None  # proven optimum (exact, or best known meets the bound)
    best_known: float = float("inf")
    lower_bound: float = 0.0  # dependence bound, raised by the exact solver's where it ran
    limit_unreachable: bool = False  # one op alone needs more than the memory limit


def load_index(corpus: Path, split: str) -> list[dict[str, Any]]:
    index = Path(corpus) / "index.json"
    try:
        entries = json.loads(index.read_text())["graphs"]
    except (OSError, ValueError, KeyError) as err:
        raise GraphError(f"{index}: cannot read corpus index: {err}") from err
    return [e for e in entries if e.get("split") == split]


def evaluate_corpus(
    corpus: Path,
    split: str = "test",
    *,
    methods: Sequence[str] = METHODS,
    budget: int = 5000,
    seed: int = 0,
    limit: int | None = None,
    exact_nodes: int = 60,
    exact_time: float = 10.0,
    on_graph: Callable[[str], None] | None = None,
    make_problem: Callable[[Graph], Problem] = Problem,
    weights: str | Path | None = None,
    workers: int = 1,
    ray_address: str | None = None,
    seeded: bool = True,
) -> list[GraphRecord]:
    """Run every method on every graph of the split.

    ``make_problem`` sets the objective and cluster per graph (default: peak memory on one
    device); the exact solver and the lower bound apply to single-device peak memory only.
    ``seeded``: as for :func:`run_method`.
    ``workers > 1`` evaluates that many graphs at a time, in local processes or as Ray tasks
    on the cluster at ``ray_address`` (:class:`~timerl.graphopt.parallel.TaskPool`); the
    records are the same, in the same order (only the
    seconds differ, and the exact solver's result where it stops at its time limit).
    """
    from timerl.graphopt.parallel import TaskPool

    for m in methods:
        if m not in METHODS + EXTRA_METHODS:
            known = ", ".join(METHODS + EXTRA_METHODS)
            raise GraphError(f"unknown method {m!r} (choose from {known})")
    entries = load_index(corpus, split)
    if limit is not None:
        entries = entries[:limit]
    if any(m in ("learned", "untrained") for m in methods):
        from timerl.graphopt.learned import load_policy

        # a bad weights file fails before any graph is searched (without --weights: the
        # shipped file of the objective make_problem poses, seen on the split's first graph)
        objective = "peak-memory"
        if entries:
            objective = make_problem(Graph.load(Path(corpus) / entries[0]["path"])).objective
        load_policy(weights, objective)
    settings = (
        str(corpus),
        tuple(methods),
        budget,
        seed,
        exact_nodes,
        exact_time,
        make_problem,
        weights,
        seeded,
    )

    def done(i: int, rec: GraphRecord) -> None:
        if on_graph is not None:
            on_graph(rec.name)

    with TaskPool(workers, ray_address) as pool:
        shared = pool.put(settings)
        sizes = [float(e.get("nodes", 0)) for e in entries]
        return pool.map(evaluate_graph, [(e, shared) for e in entries], on_done=done, sizes=sizes)


def evaluate_graph(entry: dict[str, Any], settings: tuple[Any, ...]) -> GraphRecord:
    """Every method on the graph of one index entry (one task of :func:`evaluate_corpus`)."""
    corpus, methods, budget, seed, exact_nodes, exact_time, make_problem, weights, seeded = settings
    e = entry
    graph = Graph.load(Path(corpus) / e["path"])
    rec = GraphRecord(
        e.get("name", graph.name), e.get("kind", "synthetic"), graph.n, e.get("family", "")
    )
    best: tuple[float, Solution] | None = None
    for m in methods:
        problem = make_problem(graph)
        if m == "exact" and (graph.n > exact_nodes or not problem.single):
            continue
        start = best[1] if best else None
        res = run_method(
            m,
            problem,
            budget=budget,
            seed=seed,
            time_limit=exact_time,
            start=start,
            weights=weights,
            seeded=seeded,
        )
        rec.values[m] = res.value
        rec.seconds[m] = res.seconds
        limit = problem.cluster.memory_limit if problem.cluster is not None else None
        if limit and problem.sim is not None:
            sol = res.solution
            sim = problem.sim.run(sol.order, sol.placement, sol.swap)  # type: ignore[arg-type]
            rec.feasible[m] = bool((sim.peaks <= limit).all())
        if best is None or res.value < best[0]:
            best = (res.value, res.solution)
        if m == "exact" and res.bound is not None:
            rec.lower_bound = max(rec.lower_bound, res.bound)
    rec.best_known = min(rec.values.values()) if rec.values else float("inf")
    last = make_problem(graph)
    if last.cluster is not None and last.cluster.memory_limit:
        rec.limit_unreachable = max_working_set(graph) > last.cluster.memory_limit
    if graph.n <= 20_000 and make_problem(graph).single:
        rec.lower_bound = max(rec.lower_bound, float(peak_lower_bound(graph)))
    if rec.best_known <= rec.lower_bound:
        rec.optimum = rec.best_known
    return rec


def _pct(base: float, val: float) -> float:
    return 0.0 if base <= 0 else 100.0 * (base - val) / base


def summarise(records: Sequence[GraphRecord], methods: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (graph group, method): reductions, W/T/L vs BRKGA, gap, seconds."""
    rows = []
    groups = [(k, [r for r in records if r.kind == k]) for k in KINDS]
    groups.append(("all", list(records)))
    for kind, recs in groups:
        if not recs:
            continue
        for m in methods:
            have = [r for r in recs if m in r.values]
            if not have:
                continue
            vs_prog = [
                _pct(r.values["program"], r.values[m]) for r in have if "program" in r.values
            ]
            vs_brkga = [_pct(r.values["brkga"], r.values[m]) for r in have if "brkga" in r.values]
            wins = sum(r.values[m] < r.values["brkga"] for r in have if "brkga" in r.values)
            ties = sum(r.values[m] == r.values["brkga"] for r in have if "brkga" in r.values)
            losses = sum(r.values[m] > r.values["brkga"] for r in have if "brkga" in r.values)
            gaps = [-_pct(r.best_known, r.values[m]) for r in have]
            bound_gaps = [-_pct(r.lower_bound, r.values[m]) for r in have if r.lower_bound > 0]
            headroom = [
                (r.values["program"] - r.values[m]) / (r.values["program"] - r.best_known)
                for r in have
                if "program" in r.values and r.values["program"] > r.best_known
            ]
            rows.append(
                {
                    "kind": kind,
                    "method": m,
                    "graphs": len(have),
                    "vs_program_mean": _mean(vs_prog),
                    "vs_program_median": _median(vs_prog),
                    "vs_brkga_mean": _mean(vs_brkga),
                    "vs_brkga_median": _median(vs_brkga),
                    "wtl": f"{wins}/{ties}/{losses}" if vs_brkga else "-",
                    "gap_mean": _mean(gaps),
                    "bound_gap_mean": _mean(bound_gaps),
                    "optimal": sum(r.optimum is not None for r in have),
                    "headroom_captured": _mean([100 * h for h in headroom]),
                    "seconds": _mean([r.seconds[m] for r in have]),
                    "feasible": (
                        f"{sum(r.feasible[m] for r in have)}/{len(have)} "
                        f"({sum(r.limit_unreachable for r in have)} unreachable)"
                        if all(m in r.feasible for r in have)
                        else "-"
                    ),
                }
            )
    return rows


def headroom_by_family(records: Sequence[GraphRecord]) -> list[dict[str, Any]]:
    """Where ordering matters: per family, how far the best known order is below program order."""
    fams = sorted({(r.kind, r.family) for r in records})
    rows = []
    for kind, fam in fams:
        recs = [r for r in records if (r.kind, r.family) == (kind, fam) and "program" in r.values]
        if not recs:
            continue
        red = [_pct(r.values["program"], r.best_known) for r in recs]
        rows.append(
            {
                "kind": kind,
                "family": fam,
                "graphs": len(recs),
                "nodes": _mean([float(r.nodes) for r in recs]),
                "headroom_mean": _mean(red),
                "headroom_max": max(red),
                "no_headroom": sum(x <= 0 for x in red),
                "proven_none": sum(r.values["program"] <= r.lower_bound for r in recs),
            }
        )
    return rows


FAMILY_COLUMNS = (
    ("kind", "group"),
    ("family", "family"),
    ("graphs", "graphs"),
    ("nodes", "nodes (mean)"),
    ("headroom_mean", "best known vs program % (mean)"),
    ("headroom_max", "(max)"),
    ("no_headroom", "graphs with no headroom found"),
    ("proven_none", "program order proven optimal"),
)


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


COLUMNS = (
    ("kind", "group"),
    ("method", "method"),
    ("graphs", "graphs"),
    ("vs_program_mean", "% vs program (mean)"),
    ("vs_program_median", "% vs program (median)"),
    ("vs_brkga_mean", "% vs BRKGA (mean)"),
    ("vs_brkga_median", "% vs BRKGA (median)"),
    ("wtl", "W/T/L vs BRKGA"),
    ("gap_mean", "gap to best known %"),
    ("bound_gap_mean", "gap to lower bound %"),
    ("optimal", "graphs with proven optimum"),
    ("headroom_captured", "headroom captured %"),
    ("feasible", "under memory limit"),
    ("seconds", "s / graph"),
)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def to_markdown(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]] = COLUMNS
) -> str:
    head = "| " + " | ".join(t for _, t in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r[k]) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])
