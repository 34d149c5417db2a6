"""Classical schedulers (the portfolio an XLA-style compiler picks from) and local search."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from timerl.graphopt.brkga import SearchResult
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.graph import Graph


def program_order(graph: Graph) -> np.ndarray:
    """The order of the file (made topological, preferring file order, if it is not)."""
    return np.array(graph.program_order, dtype=np.int64)


def memory_greedy_order(graph: Graph) -> np.ndarray:
    """List scheduling that runs the ready op with the smallest net memory increase.

    Net increase = bytes it allocates minus bytes it frees (input buffers whose last user it
    is, and its own output if nobody reads it); ties go to the op freeing more, then to file
    order. Greedy, so it can be fooled, but it is what memory-aware compilers do by default.
    """
    n = graph.n
    root = graph.root.tolist()
    nbytes = graph.nbytes.tolist()
    alias = graph.alias.tolist()
    users: list[set[int]] = [set() for _ in range(n)]
    for u in range(n):
        users[root[u]].update(graph.succs[u])
    keep = [False] * n
    for v in np.nonzero(graph.is_output)[0].tolist():
        keep[root[v]] = True
    remaining = [len(s) for s in users]
    in_bufs = [sorted({root[u] for u in graph.preds[v]}) for v in range(n)]
    rank = [0] * n
    for i, v in enumerate(graph.program_order):
        rank[v] = i
    indeg = [len(p) for p in graph.preds]
    ready = {v for v in range(n) if indeg[v] == 0}
    order: list[int] = []
    while ready:
        best, best_key = -1, None
        for v in ready:
            alloc = nbytes[v] if alias[v] < 0 else 0
            freed = sum(nbytes[b] for b in in_bufs[v] if not keep[b] and remaining[b] == 1)
            if alias[v] < 0 and not keep[v] and not users[v]:
                freed += nbytes[v]
            key = (alloc - freed, -freed, rank[v])
            if best_key is None or key < best_key:
                best, best_key = v, key
        ready.remove(best)
        order.append(best)
        for b in in_bufs[best]:
            remaining[b] -= 1
        for w in graph.succs[best]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.add(w)
    return np.array(order, dtype=np.int64)


def dfs_order(graph: Graph) -> np.ndarray:
    """Depth-first list scheduling: always continue with the most recently readied op."""
    indeg = [len(p) for p in graph.preds]
    stack = [v for v in reversed(graph.program_order) if indeg[v] == 0]
    order: list[int] = []
    while stack:
        v = stack.pop()
        order.append(v)
        for w in reversed(graph.succs[v]):
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    return np.array(order, dtype=np.int64)


def postorder(graph: Graph) -> np.ndarray:
    """Post-order DFS from the outputs (then other sinks) over inputs, as XLA's scheduler."""
    n = graph.n
    sinks = [v for v in graph.program_order if not graph.succs[v]]
    starts = [v for v in graph.program_order if graph.is_output[v]] + sinks
    done = [False] * n
    order: list[int] = []
    for s in starts:
        if done[s]:
            continue
        stack = [(s, 0)]
        while stack:
            v, i = stack.pop()
            preds = graph.preds[v]
            while i < len(preds) and done[preds[i]]:
                i += 1
            if i < len(preds):
                stack.append((v, i + 1))
                stack.append((preds[i], 0))
            elif not done[v]:
                done[v] = True
                order.append(v)
    return np.array(order, dtype=np.int64)


PORTFOLIO: dict[str, Callable[[Graph], np.ndarray]] = {
    "program": program_order,
    "memory-greedy": memory_greedy_order,
    "dfs": dfs_order,
    "postorder": postorder,
}


def eft_placement(problem: Problem, order: np.ndarray) -> np.ndarray:
    """Earliest-finish-time placement along an order (transfer time counted, contention not)."""
    g, cl, sim = problem.graph, problem.cluster, problem.sim
    assert cl is not None and sim is not None
    k = cl.k
    dev_free = [0.0] * k
    finish = [0.0] * g.n
    place = [0] * g.n
    pins = sim.pins.tolist()
    root = g.root.tolist()
    for v in order.tolist():
        if root[v] != v:
            choices = [place[root[v]]]
        elif pins[v] >= 0:
            choices = [pins[v]]
        else:
            choices = list(range(k))
        best_d, best_t = choices[0], np.inf
        for d in choices:
            t = dev_free[d]
            for u in g.preds[v]:
                arr = (
                    finish[u]
                    if place[u] == d
                    else finish[u] + cl.latency + g.nbytes[u] / cl.bandwidth
                )
                t = max(t, arr)
            if t + g.cost[v] < best_t:
                best_d, best_t = d, t + g.cost[v]
        place[v] = best_d
        finish[v] = best_t
        dev_free[best_d] = best_t
    return sim.normalise(np.array(place, dtype=np.int64))


def portfolio_solutions(problem: Problem) -> dict[str, Solution]:
    """Each classical scheduler's schedule (with single-device and EFT placements if placing)."""
    out: dict[str, Solution] = {}
    for name, fn in PORTFOLIO.items():
        order = fn(problem.graph)
        base = problem.complete(order)
        out[name] = base
        if problem.place:
            out[f"{name}+eft"] = Solution(order, eft_placement(problem, order), base.swap)
    return out


def best_of_portfolio(problem: Problem) -> SearchResult:
    """Evaluate every portfolio schedule and keep the best (ties: portfolio order)."""
    t0 = time.perf_counter()
    best: tuple[float, str, Solution] | None = None
    cands = portfolio_solutions(problem)
    for name, sol in cands.items():
        val = problem.evaluate(sol)
        if best is None or val < best[0]:
            best = (val, name, sol)
    assert best is not None
    return SearchResult(
        best[2], best[0], len(cands), f"portfolio:{best[1]}", time.perf_counter() - t0, [best[0]]
    )


def program_baseline(problem: Problem) -> SearchResult:
    t0 = time.perf_counter()
    sol = problem.complete(program_order(problem.graph))
    val = problem.evaluate(sol)
    return SearchResult(sol, val, 1, "program", time.perf_counter() - t0, [val])


def local_search(
    problem: Problem, start: Solution, *, budget: int = 5000, seed: int = 0
) -> SearchResult:
    """First-improvement local search: move one op within its dependence window (and, when
    placing, move an op to another device or toggle a swap); equal moves are accepted to walk
    plateaus, which peak-memory landscapes are full of."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    g = problem.graph
    n = g.n
    cur = Solution(
        start.order.copy(),
        None if start.placement is None else start.placement.copy(),
        None if start.swap is None else start.swap.copy(),
    )
    cur_val = problem.evaluate(cur)
    evals = 1
    history = [cur_val]
    movable_dev = []
    if problem.place and problem.sim is not None:
        movable_dev = [v for v in range(n) if g.root[v] == v and problem.sim.pins[v] < 0]
    swappable = [v for v in range(n) if g.root[v] == v] if problem.swaps else []
    kinds = ["order"] + (["device"] if movable_dev else []) + (["swap"] if swappable else [])
    pos = np.empty(n, dtype=np.int64)
    pos[cur.order] = np.arange(n)
    tries = 0
    while evals < budget and tries < 20 * budget and n > 1:
        tries += 1
        kind = kinds[int(rng.integers(len(kinds)))]
        cand = Solution(cur.order, cur.placement, cur.swap)
        if kind == "order":
            v = int(rng.integers(n))
            i = int(pos[v])
            lo = max((int(pos[u]) for u in g.preds[v]), default=-1) + 1
            hi = min((int(pos[w]) for w in g.succs[v]), default=n) - 1
            if hi <= lo:
                continue
            j = int(rng.integers(lo, hi))
            j = j + 1 if j >= i else j
            order = cur.order.tolist()
            order.pop(i)
            order.insert(j, v)
            cand.order = np.array(order, dtype=np.int64)
        elif kind == "device":
            assert problem.cluster is not None and problem.sim is not None
            v = movable_dev[int(rng.integers(len(movable_dev)))]
            pl = cur.placement.copy()  # type: ignore[union-attr]
            pl[v] = (pl[v] + int(rng.integers(1, problem.cluster.k))) % problem.cluster.k
            cand.placement = problem.sim.normalise(pl)
        else:
            v = swappable[int(rng.integers(len(swappable)))]
            sw = cur.swap.copy() if cur.swap is not None else np.zeros(n, dtype=bool)
            sw[v] = not sw[v]
            cand.swap = sw
        val = problem.evaluate(cand)
        evals += 1
        if val <= cur_val:
            if val < cur_val:
                history.append(val)
            cur, cur_val = cand, val
            pos[cur.order] = np.arange(n)
    return SearchResult(cur, cur_val, evals, "local", time.perf_counter() - t0, history)
