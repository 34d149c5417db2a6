"""Biased random-key genetic algorithm over a Problem's keys.

Proposal distributions are per gene Beta(a, b) (uniform by default) and crossover bias is per
gene too: these arrays are the hook through which a learned policy steers the search. A share
of the proposals can stay uniform (``uniform_share``): proposals that collapsed onto one rule
then still leave the search some of uniform BRKGA's diversity.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from timerl.graphopt import kernels
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.scoring import Scorer


@dataclass
class SearchResult:
    """Best schedule found, its objective value, and how the search got there."""

    solution: Solution
    value: float
    evaluations: int
    method: str
    seconds: float = 0.0
    history: list[float] = field(default_factory=list)  # best value after each generation
    bound: float | None = None  # a proven lower bound (exact search only)


def _per_gene(x: float | np.ndarray | None, default: float, problem: Problem) -> np.ndarray:
    """Broadcast a scalar, a per-node array (length n) or a per-gene array to all genes."""
    m, n = problem.num_keys, problem.n
    if x is None:
        return np.full(m, default)
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        return np.full(m, float(arr))
    if arr.shape == (m,):
        return arr
    if arr.shape == (n,):
        tiled = np.tile(arr, m // max(n, 1))
        return np.append(tiled, default) if problem.decoder_gene else tiled
    raise ValueError(f"expected a scalar or an array of length {n} or {m}, got {arr.shape}")


def check_uniform_share(share: float) -> float:
    """``share`` as a float in [0, 1], else a ValueError saying what it got."""
    try:
        x = float(share)
    except (TypeError, ValueError):
        raise ValueError(f"uniform_share must be a number in [0, 1], got {share!r}") from None
    if not 0.0 <= x <= 1.0:  # also refuses nan
        raise ValueError(f"uniform_share must be in [0, 1], got {share!r}")
    return x


def brkga(
    problem: Problem,
    *,
    budget: int = 5000,
    population: int | None = None,
    elite: float = 0.2,
    mutant: float = 0.15,
    bias: float | np.ndarray = 0.7,
    alpha: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    seeds: Sequence[Solution] = (),
    seed: int = 0,
    method: str = "brkga",
    jobs: int = 1,
    uniform_share: float = 0.0,
    patience: int | None = None,
) -> SearchResult:
    """Run BRKGA for ``budget`` decodes; seeded schedules enter the first population.

    ``patience``: stop early once that many generations in a row found nothing better (None:
    use the whole budget). The compiler sets it: on PPO's update bodies the search improves
    on its seeds within a few generations or not at all.

    Because elites survive unchanged and seeds are evaluated first, the result is never worse
    than the best seed. ``jobs`` processes score each generation (same result as one).

    ``uniform_share`` (in [0, 1]) is the chance that each drawn chromosome (filling the first
    population, and each generation's mutants) has uniform keys instead of Beta(alpha, beta)
    ones: a hedge for proposals that fit some graphs and not others. At 0 (and whenever alpha
    and beta are None) the random stream is exactly the one without this parameter; at 1
    every draw is uniform, drawn as uniform BRKGA draws them.
    """
    share = check_uniform_share(uniform_share)
    problem.compiled = problem.compiled or kernels.worth_it(problem.n, int(budget))
    with Scorer(problem, jobs) as score:
        t0 = time.perf_counter()
        rng = np.random.default_rng(seed)
        m = problem.num_keys
        budget = max(int(budget), 1)
        pop = population or int(np.clip(budget // 50, 20, 100))
        pop = max(min(pop, budget), 2)
        n_elite = max(1, int(round(elite * pop)))
        n_mut = max(0, min(int(round(mutant * pop)), pop - n_elite))
        a = _per_gene(alpha, 1.0, problem)
        b = _per_gene(beta, 1.0, problem)
        rho = _per_gene(bias, 0.7, problem)
        uniform = alpha is None and beta is None

        def sample(k: int) -> np.ndarray:
            if uniform or share == 1.0:
                return rng.random((k, m))
            if share == 0.0:
                return rng.beta(a, b, size=(k, m))
            flat = rng.random(k) < share  # which chromosomes get uniform keys
            out = np.empty((k, m))
            out[~flat] = rng.beta(a, b, size=(int(k - flat.sum()), m))
            out[flat] = rng.random((int(flat.sum()), m))
            return out

        keys_list: list[np.ndarray] = [problem.encode(s) for s in seeds][:pop]
        if len(keys_list) < pop:
            keys_list.extend(sample(pop - len(keys_list)))
        keys = np.stack(keys_list)
        fit = np.full(pop, np.inf)
        first = score(keys[: min(pop, budget)])
        evals = len(first)
        sols: list[Solution] = [sol for _, sol in first]
        sols.extend([sols[0]] * (pop - evals))  # never chosen: their fitness stays inf
        fit[:evals] = [val for val, _ in first]
        best = int(np.argmin(fit))  # the first of equals, as scoring in order would keep
        best_val, best_sol = float(fit[best]), sols[best]
        history = [best_val]
        stale = 0  # generations in a row without a better schedule
        while evals < budget and (patience is None or stale < patience):
            rank = np.argsort(fit, kind="stable")
            keys, fit = keys[rank], fit[rank]
            sols = [sols[r] for r in rank]
            n_child = pop - n_elite - n_mut
            new = np.empty((n_mut + n_child, m))
            new[:n_mut] = sample(n_mut)
            if n_child:
                pe = rng.integers(0, n_elite, n_child)
                pn = rng.integers(n_elite, pop, n_child) if pop > n_elite else pe
                take = rng.random((n_child, m)) < rho
                new[n_mut:] = np.where(take, keys[pe], keys[pn])
            new = new[: budget - evals]
            stale += 1
            for j, (val, sol) in enumerate(score(new)):
                i = n_elite + j
                keys[i], fit[i], sols[i] = new[j], val, sol
                if val < best_val:
                    best_val, best_sol, stale = val, sol, 0
            evals += len(new)
            history.append(float(best_val))
        assert best_sol is not None
        return SearchResult(
            best_sol, float(best_val), evals, method, time.perf_counter() - t0, history
        )
