"""The learned search: the graph policy steers a BRKGA over two decoders, then a local search.

features -> network -> per-gene proposals and per-node move weights -> search:

1. BRKGA (``1 - polish`` of the budget) whose chromosomes carry one more gene choosing the
   decoder of the order (list scheduling, or the post-order decoder that runs subtrees to
   their end: ``decoders.DECODERS``), with the policy's Beta proposals per gene, seeded with
   every portfolio schedule and the policy's mean keys under each decoder, so the result is
   never worse than the portfolio;
2. the peak-directed local search (``localsearch``) from BRKGA's best for the rest of the
   budget (single-device peak memory), picking the nodes to move by the policy's move
   weights; for running time the classical local search (order, device and swap moves).

Both phases count their evaluations against the same budget as every other method.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from timerl.errors import CheckpointError
from timerl.graphopt.baselines import local_search, portfolio_solutions
from timerl.graphopt.brkga import SearchResult, brkga
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.features import RANKED, GraphFeatures, graph_features
from timerl.graphopt.localsearch import peak_local_search
from timerl.graphopt.policy import (
    OUTPUTS,
    SHIPPED,
    SHIPPED_RUNTIME,
    PolicyWeights,
    key_groups,
    move_weights,
    proposal,
)

#: the share of the budget the local search spends after BRKGA (a weights file's ``polish``
#: overrides it)
POLISH = 0.2
#: the share of the budget a first local search spends from the best portfolio schedule,
#: whose result seeds BRKGA (peak memory; a weights file's ``warm`` overrides it)
WARM = 0.0
#: the share of the local search's peak-directed moves that move a whole run of nodes
SEGMENTS = 0.3

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
    polish: float | None = None,
    warm: float | None = None,
) -> SearchResult:
    """The search of the module docstring. ``action``, when given, replaces the network's
    mean action and ``weights`` may be None (an all-zero action is the same search with
    uniform proposals and move weights: the ablation of the policy); with weights that never
    learned the problem's objective (``PolicyWeights.objectives``) the proposals are uniform.
    ``jobs`` processes score BRKGA's schedules.

    ``uniform_share`` (default: the weights file's, else 0) is the share of BRKGA's draws
    that stay uniform; ``polish`` (default: the weights file's, else ``POLISH``) the share of
    the budget left to the local search; ``patience``: as for BRKGA."""
    t0 = time.perf_counter()
    if seeds is None:
        seeds = portfolio_solutions(problem)
    tag = "learned"
    if action is None and weights is not None and problem.objective not in weights.objectives:
        # weights that never learned this objective steer no better than chance (measured on
        # the runtime objective: 3% worse than uniform BRKGA on average), so they do not steer
        action = np.zeros((problem.n, OUTPUTS), dtype=np.float32)
        tag = "learned (uniform: weights not trained for this objective)"
    if action is None:
        if weights is None:
            raise ValueError("learned_search needs the policy's weights or an action")
        action = weights.forward(problem_features(problem, seeds))
    if uniform_share is None:
        uniform_share = weights.uniform_share if weights is not None else 0.0
    if polish is None:
        polish = float(weights.meta.get("polish", POLISH)) if weights is not None else POLISH
    if warm is None:
        warm = float(weights.meta.get("warm", WARM)) if weights is not None else WARM
    budget = max(int(budget), 1)
    mixed = problem.with_decoder_gene()
    alpha, beta, bias = proposal(action, key_groups(problem.place, problem.swaps), True)
    mean = mean_keys(alpha, beta)
    start = list(seeds.values())
    for gene in (0.25, 0.75):  # the policy's mean keys under each decoder
        mean[-1] = gene
        start.append(mixed.decode(mean))
    ls_budget = int(round(polish * budget)) if problem.n > 1 else 0
    warm_budget = int(round(warm * budget)) if problem.n > 1 and problem.single else 0
    evals, history = 0, []
    if warm_budget > 0:  # the local search from the best start, as one more seed
        first = min(start[: len(seeds)], key=problem.evaluate)
        warmed = peak_local_search(
            problem,
            first,
            budget=warm_budget,
            seed=seed,
            node_weight=move_weights(action),
            segments=SEGMENTS,
        )
        evals += warmed.evaluations
        start.append(warmed.solution)
    found = brkga(
        mixed,
        budget=max(budget - ls_budget - evals, 1),
        alpha=alpha,
        beta=beta,
        bias=bias,
        seeds=start,
        seed=seed,
        method=tag,
        jobs=jobs,
        uniform_share=uniform_share,
        patience=patience,
    )
    evals += found.evaluations
    history += found.history
    if ls_budget > 0:
        if problem.single:
            polished = peak_local_search(
                problem,
                found.solution,
                budget=ls_budget,
                seed=seed,
                node_weight=move_weights(action),
                segments=SEGMENTS,
            )
        else:
            polished = local_search(problem, found.solution, budget=ls_budget, seed=seed)
        evals += polished.evaluations
        if polished.value < found.value:
            found.solution, found.value = polished.solution, polished.value
            history.append(polished.value)
    return SearchResult(found.solution, found.value, evals, tag, time.perf_counter() - t0, history)
