"""Throughput of graphopt's performance model and decoder on a 1,000-node random graph.

Side by side: the vectorised peak-memory evaluator against a plain pure-Python evaluator of
the same definition (one pass over the order with precomputed last uses), and the decoder,
multi-device simulator and BRKGA end to end. Run: ``python bench/graphopt_model.py``.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem, decode_order
from timerl.graphopt.graph import Graph
from timerl.graphopt.learned import learned_search, load_policy
from timerl.graphopt.perfmodel import Cluster, PeakMemory, Simulator
from timerl.graphopt.random_graph import random_graph


def python_peak(graph: Graph, order: list[int]) -> int:
    """Straightforward pure-Python evaluator: last use per buffer, then one sweep."""
    n = graph.n
    pos = [0] * n
    for i, v in enumerate(order):
        pos[v] = i
    root = graph.root.tolist()
    nbytes = graph.nbytes.tolist()
    last = list(pos)
    for u in range(n):
        r = root[u]
        for w in graph.succs[u]:
            if pos[w] > last[r]:
                last[r] = pos[w]
    for v in range(n):
        if graph.nodes[v].output:
            last[root[v]] = n - 1
    delta = [0] * (n + 1)
    for b in range(n):
        if root[b] == b:
            delta[pos[b]] += nbytes[b]
            delta[last[b] + 1] -= nbytes[b]
    cur = peak = 0
    for s in range(n):
        cur += delta[s]
        peak = max(peak, cur)
    return peak


def rate(fn: Callable[[], object], min_seconds: float = 1.0) -> float:
    """Calls per second of ``fn`` over at least ``min_seconds``."""
    fn()
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_seconds:
        fn()
        calls += 1
    return calls / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="end-to-end searches per setting")
    ap.add_argument(
        "--fresh",
        type=int,
        default=0,
        help="also run the learned search this many times, each in a new process (imports "
        "and numba's compiling included, as a user's first call pays them)",
    )
    args = ap.parse_args()

    g = random_graph(args.nodes, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    orders = [decode_order(g, rng.random(g.n)) for _ in range(16)]
    pm = PeakMemory(g)
    for o in orders:  # both evaluators agree before we time them
        assert pm.peak(o) == python_peak(g, o.tolist())
    lists = [o.tolist() for o in orders]
    it = iter(range(10**12))

    def pick() -> int:
        return next(it) % len(orders)

    print(
        f"config: graph {g.name} ({g.n} nodes, {g.num_edges()} edges, views "
        f"{int((g.alias >= 0).sum())}, outputs {int(g.is_output.sum())}); python "
        f"{platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
        f"{args.seconds:.1f}s per measurement"
    )
    fast = rate(lambda: pm.peak(orders[pick()]), args.seconds)
    slow = rate(lambda: python_peak(g, lists[pick()]), args.seconds)
    print(f"peak-memory evaluator (numpy):  {fast:10.0f} evals/s  ({1e6 / fast:.1f} us/eval)")
    print(f"peak-memory evaluator (python): {slow:10.0f} evals/s  ({1e6 / slow:.1f} us/eval)")
    print(f"  ratio numpy / python: {fast / slow:.1f}x")
    keys = rng.random(g.n)
    dec = rate(lambda: decode_order(g, keys), args.seconds)
    print(f"decoder (list scheduling):      {dec:10.0f} decodes/s ({1e6 / dec:.1f} us/decode)")
    sim = Simulator(g, Cluster.make(2, memory_limit=10**7, host=True))
    place = rng.integers(0, 2, g.n)
    swap = rng.random(g.n) > 0.8
    sims = rate(lambda: sim.run(orders[pick()], place, swap), args.seconds)
    print(f"simulator (2 devices + host):   {sims:10.0f} runs/s    ({1e3 / sims:.2f} ms/run)")
    t0 = time.perf_counter()
    res = brkga(Problem(g), budget=2000, seed=args.seed)
    dt = time.perf_counter() - t0
    print(
        f"BRKGA peak memory, 2000 evaluations: {dt:.2f}s ({res.evaluations / dt:.0f} evals/s), "
        f"best {res.value:.0f} B vs program order {pm.peak(np.array(g.program_order)):.0f} B"
    )
    # End to end as `timerl graphopt optimize` runs it (features, policy, portfolio, BRKGA at
    # 5,000 evaluations), scored in this process and over two processes, alternated.
    problem = Problem(g)
    policy = load_policy(None)
    times: dict[int, list[float]] = {1: [], 2: []}
    values: dict[int, float] = {}
    for _ in range(args.repeats):
        for jobs in (1, 2):
            t0 = time.perf_counter()
            out = learned_search(problem, policy, budget=5000, seed=args.seed, jobs=jobs)
            times[jobs].append(time.perf_counter() - t0)
            values[jobs] = out.value
    assert values[1] == values[2], values  # the process count never changes the result
    med = {jobs: float(np.median(ts)) for jobs, ts in times.items()}
    print(
        f"learned search end to end, 5000 evaluations, median of {args.repeats}: "
        f"jobs 1 {med[1]:.2f}s, jobs 2 {med[2]:.2f}s ({med[1] / med[2]:.2f}x)"
    )
    if args.fresh:
        search, whole = fresh_process_times(args.nodes, args.seed, args.fresh)
        print(
            f"learned search in a fresh process, median of {args.fresh}: search {search:.2f}s, "
            f"start to exit {whole:.2f}s"
        )


FRESH = """
import time
start = time.perf_counter()
from timerl.graphopt.decoders import Problem
from timerl.graphopt.learned import learned_search, load_policy
from timerl.graphopt.random_graph import random_graph
g = random_graph({nodes}, seed={seed})
t0 = time.perf_counter()
learned_search(Problem(g), load_policy(None), budget=5000, seed={seed})
end = time.perf_counter()
print(end - t0, end - start)
"""


def fresh_process_times(nodes: int, seed: int, runs: int) -> tuple[float, float]:
    """Median seconds of the search and of the whole process (after the interpreter starts)."""
    code = FRESH.format(nodes=nodes, seed=seed)
    search, whole = [], []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        search.append(float(out[0]))
        whole.append(float(out[1]))
    return float(np.median(search)), float(np.median(whole))


if __name__ == "__main__":
    main()
