"""BRKGA steered by the graph policy: features -> network -> per-gene proposals -> search.

The search is seeded with every portfolio schedule and with the policy's own most likely
schedule (each key at its Beta mean), so the result is never worse than the portfolio.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from timerl.errors import CheckpointError
from timerl.graphopt.baselines import portfolio_solutions
from timerl.graphopt.brkga import SearchResult, brkga
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.features import RANKED, GraphFeatures, graph_features
from timerl.graphopt.policy import SHIPPED, SHIPPED_RUNTIME, PolicyWeights, key_groups, proposal

_CACHE: dict[tuple[str, float], PolicyWeights] = {}


def shipped_weights(objective: str = "peak-memory") -> Path:
    """The shipped weights file for ``objective``: weights steer only what they learned, so
    each objective has a file trained on it."""
    return SHIPPED_RUNTIME if objective == "runtime" else SHIPPED


def load_policy(path: str | Path | None = None, objective: str = "peak-memory") -> PolicyWeights:
    """The weights at ``path`` (default: the shipped ones for ``objective``), cached per file
    and mtime. A shipped file that never learned its objective is refused (it would silently
    fall back to uniform BRKGA), naming the file."""
    p = Path(path) if path is not None else shipped_weights(objective)
    try:
        key = (str(p.resolve()), p.stat().st_mtime)
    except OSError:
        key = (str(p), -1.0)
    w = _CACHE.get(key)
    if w is None:
        w = PolicyWeights.load(p)
        assert isinstance(w, PolicyWeights)
        _CACHE[key] = w
    if path is None and objective not in w.objectives:
        raise CheckpointError(
            f"policy weights {p}: shipped for the {objective} objective, but trained for "
            f"{', '.join(w.objectives) or 'none'}"
        )
    return w


def problem_features(problem: Problem, seeds: dict[str, Solution]) -> GraphFeatures:
    """Features for the problem's settings, reusing the portfolio orders already computed."""
    orders = {name: seeds[name].order for name in RANKED if name in seeds}
    k = problem.cluster.k if problem.cluster is not None else 1
    host = bool(problem.cluster is not None and problem.cluster.host)
    return graph_features(
        problem.graph,
        objective=problem.objective,
        devices=k,
        host=host,
        orders=orders if len(orders) == len(RANKED) else None,
    )


def mean_keys(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Each gene at its Beta mean: the policy's single most representative chromosome."""
    return alpha / (alpha + beta)


def learned_search(
    problem: Problem,
    weights: PolicyWeights | None,
    *,
    budget: int = 5000,
    seed: int = 0,
    action: np.ndarray | None = None,
    seeds: dict[str, Solution] | None = None,
    jobs: int = 1,
    uniform_share: float | None = None,
    patience: int | None = None,
) -> SearchResult:
    """BRKGA with the policy's proposals (``action``, when given, replaces the network's mean
    action and ``weights`` may be None); uniform proposals where ``weights`` never learned the
    problem's objective (``PolicyWeights.objectives``). ``jobs`` processes score its
    schedules.

    ``uniform_share`` (default: the weights file's ``uniform_share``, else 0) is the share of
    BRKGA's draws that stay uniform (see :func:`~timerl.graphopt.brkga.brkga`), so that the
    file alone says how its proposals are used. ``patience``: as for BRKGA."""
    t0 = time.perf_counter()
    if seeds is None:
        seeds = portfolio_solutions(problem)
    if action is None and weights is not None and problem.objective not in weights.objectives:
        # weights that never learned this objective steer no better than chance (measured on
        # the runtime objective: 3% worse than uniform BRKGA on average), so they do not steer
        res = brkga(
            problem,
            budget=budget,
            seeds=list(seeds.values()),
            seed=seed,
            jobs=jobs,
            patience=patience,
        )
        res.method = "learned (uniform: weights not trained for this objective)"
        res.seconds = time.perf_counter() - t0
        return res
    if action is None:
        if weights is None:
            raise ValueError("learned_search needs the policy's weights or an action")
        action = weights.forward(problem_features(problem, seeds))
    if uniform_share is None:
        uniform_share = weights.uniform_share if weights is not None else 0.0
    alpha, beta, bias = proposal(action, key_groups(problem.place, problem.swaps))
    start = [*seeds.values(), problem.decode(mean_keys(alpha, beta))]
    res = brkga(
        problem,
        budget=budget,
        alpha=alpha,
        beta=beta,
        bias=bias,
        seeds=start,
        seed=seed,
        method="learned",
        jobs=jobs,
        uniform_share=uniform_share,
        patience=patience,
    )
    res.seconds = time.perf_counter() - t0
    return res
