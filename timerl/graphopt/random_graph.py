"""Seeded random DAGs with views and outputs: test inputs and benchmark workloads for search.

(The evaluation corpus has its own generators; this one exists so the model, search and
their tests do not depend on the corpus.)
"""

from __future__ import annotations

import numpy as np

from timerl.graphopt.graph import Graph, Node


def random_graph(
    n: int,
    seed: int = 0,
    *,
    max_preds: int = 3,
    view_prob: float = 0.15,
    output_prob: float = 0.1,
    locality: int = 8,
) -> Graph:
    """A random DAG in file order: each node reads 1..max_preds earlier nodes, mostly recent."""
    rng = np.random.default_rng(seed)
    nodes: list[Node] = []
    edges: list[tuple[str, str]] = []
    sizes = np.array([1, 2, 4, 8, 16, 64, 256]) * 1024
    for i in range(n):
        nid = f"n{i}"
        preds: list[int] = []
        if i > 0:
            k = int(rng.integers(1, max_preds + 1))
            for _ in range(k):
                if rng.random() < 0.7:
                    preds.append(int(rng.integers(max(0, i - locality), i)))
                else:
                    preds.append(int(rng.integers(0, i)))
            preds = sorted(set(preds))
        alias = None
        size = int(rng.choice(sizes))
        if preds and rng.random() < view_prob:
            alias = f"n{int(rng.choice(preds))}"
        nodes.append(
            Node(
                id=nid,
                op="view" if alias else "op",
                bytes=size,
                cost=float(rng.uniform(1e-6, 1e-4)),
                output=bool(rng.random() < output_prob),
                alias_of=alias,
            )
        )
        edges.extend((f"n{p}", nid) for p in preds)
    return Graph(f"random-{n}-{seed}", nodes, edges)
