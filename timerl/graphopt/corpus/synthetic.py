"""Seeded generators of synthetic dataflow DAGs in the graph JSON format.

Structure generators follow the graph families REGAL trained on (Erdos-Renyi and stochastic
block model DAGs) plus layered graphs (like unrolled networks) and series-parallel graphs (like
fork-join programs). All of them orient edges along a program order, so the node list is a
topological order. Memory is deliberately skewed: output sizes are log-normal and a small share of
buffers is huge, because skew is what makes the order and swap decisions matter.
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from timerl.errors import GraphError

_COMPUTE_OPS = ("matmul", "conv", "attention")
_MEMORY_OPS = ("add", "mul", "relu", "norm", "reduce", "concat", "softmax")


def _check(name: str, n: int) -> None:
    if n < 2:
        raise GraphError(f"synthetic graph {name!r}: needs at least 2 nodes, got {n}")


def _finish(
    name: str,
    n: int,
    edges: set[tuple[int, int]],
    rng: np.random.Generator,
    *,
    skew: float,
    huge_share: float,
    alias_share: float,
) -> dict:
    """Attach ops, bytes, costs, aliases and outputs to a DAG over ``0..n-1`` (i < j edges)."""
    preds: list[list[int]] = [[] for _ in range(n)]
    has_succ = np.zeros(n, dtype=bool)
    for u, v in sorted(edges):
        preds[v].append(u)
        has_succ[u] = True
    # Log-normal output sizes around 1 MiB; a few buffers 30-300x larger.
    nbytes = np.exp(rng.normal(math.log(2**20), skew, n))
    huge = rng.random(n) < huge_share
    nbytes[huge] *= rng.uniform(30, 300, int(huge.sum()))
    nbytes = np.maximum(4, (nbytes // 4) * 4).astype(np.int64)
    nodes: list[dict] = []
    for v in range(n):
        ident = f"n{v}"
        if not preds[v]:
            nodes.append({"id": ident, "op": "input", "bytes": int(nbytes[v]), "cost": 0.0})
            continue
        node: dict = {"id": ident, "bytes": int(nbytes[v])}
        read = sum(int(nbytes[u]) for u in preds[v])
        if rng.random() < alias_share:
            base = preds[v][int(rng.integers(len(preds[v])))]
            node.update(op="view", bytes=int(nbytes[base]), cost=1e-7, alias_of=f"n{base}")
        elif rng.random() < 0.4:
            op = _COMPUTE_OPS[int(rng.integers(len(_COMPUTE_OPS)))]
            # Arithmetic intensity of 10-1000 FLOPs per output byte.
            flops = float(nbytes[v]) * math.exp(rng.uniform(math.log(10), math.log(1000)))
            node.update(op=op, cost=flops / 1e12 + 1e-6)
        else:
            op = _MEMORY_OPS[int(rng.integers(len(_MEMORY_OPS)))]
            node.update(op=op, cost=(read + float(nbytes[v])) / 1e12 + 1e-6)
        nodes.append(node)
    # Every sink is an output (a dead end would be pointless work); a few inner nodes too.
    for v in range(n):
        if not has_succ[v] or (preds[v] and rng.random() < 0.01):
            nodes[v]["output"] = True
    if sum(1 for nd in nodes if nd.get("output")) < 2:
        nodes[n - 2]["output"] = True
    return {
        "name": name,
        "nodes": nodes,
        "edges": [[f"n{u}", f"n{v}"] for u, v in sorted(edges)],
    }


def _connect_orphans(n: int, edges: set[tuple[int, int]], rng: np.random.Generator) -> None:
    """Give most sources a predecessor and most sinks a successor nearby in program order.

    Random DAGs have many sources and sinks; real programs have few inputs and outputs, and a
    sink would be an output kept to the end.
    """
    has_pred = np.zeros(n, dtype=bool)
    has_succ = np.zeros(n, dtype=bool)
    for u, v in edges:
        has_pred[v] = True
        has_succ[u] = True
    for v in range(1, n):
        if not has_pred[v] and rng.random() < 0.9:
            u = int(rng.integers(max(0, v - 20), v))
            edges.add((u, v))
            has_succ[u] = True
    for u in range(n - 1):
        if not has_succ[u] and rng.random() < 0.97:
            edges.add((u, int(rng.integers(u + 1, min(n, u + 21)))))


def erdos_renyi(
    n: int,
    *,
    degree: float = 2.5,
    seed: int = 0,
    skew: float = 1.5,
    huge_share: float = 0.02,
    alias_share: float = 0.05,
    name: str | None = None,
) -> dict:
    """Erdos-Renyi DAG: each pair i < j is an edge with probability ``degree / n``."""
    name = name or f"er-n{n}-s{seed}"
    _check(name, n)
    rng = np.random.default_rng([seed, n, 1])
    p = min(1.0, degree / n)
    edges: set[tuple[int, int]] = set()
    for v in range(1, n):
        k = int(rng.binomial(v, p))
        for u in rng.choice(v, size=k, replace=False):
            edges.add((int(u), v))
    _connect_orphans(n, edges, rng)
    return _finish(name, n, edges, rng, skew=skew, huge_share=huge_share, alias_share=alias_share)


def stochastic_block(
    n: int,
    *,
    blocks: int = 8,
    p_in: float | None = None,
    p_out: float | None = None,
    seed: int = 0,
    skew: float = 1.5,
    huge_share: float = 0.02,
    alias_share: float = 0.05,
    name: str | None = None,
) -> dict:
    """Stochastic-block-model DAG: contiguous blocks, dense inside, sparse across.

    Defaults give about 3 in-block and 0.5 cross-block predecessors per node.
    """
    name = name or f"sbm-n{n}-b{blocks}-s{seed}"
    _check(name, n)
    rng = np.random.default_rng([seed, n, 2])
    size = max(1, math.ceil(n / blocks))
    p_in = p_in if p_in is not None else min(1.0, 6.0 / size)
    p_out = p_out if p_out is not None else min(1.0, 1.0 / n)
    block = np.arange(n) // size
    edges: set[tuple[int, int]] = set()
    for v in range(1, n):
        start = int(block[v]) * size
        k_in = int(rng.binomial(v - start, p_in)) if v > start else 0
        for u in rng.choice(np.arange(start, v), size=k_in, replace=False) if k_in else []:
            edges.add((int(u), v))
        k_out = int(rng.binomial(start, p_out)) if start else 0
        for u in rng.choice(start, size=k_out, replace=False) if k_out else []:
            edges.add((int(u), v))
    _connect_orphans(n, edges, rng)
    return _finish(name, n, edges, rng, skew=skew, huge_share=huge_share, alias_share=alias_share)


def layered(
    n: int,
    *,
    width: int = 8,
    seed: int = 0,
    skew: float = 1.5,
    huge_share: float = 0.02,
    alias_share: float = 0.05,
    name: str | None = None,
) -> dict:
    """Layered DAG: layers of random width up to ``width``; inputs from the last two layers."""
    name = name or f"layered-n{n}-w{width}-s{seed}"
    _check(name, n)
    rng = np.random.default_rng([seed, n, 3])
    layers: list[list[int]] = []
    v = 0
    while v < n:
        w = min(n - v, int(rng.integers(1, width + 1)))
        layers.append(list(range(v, v + w)))
        v += w
    edges: set[tuple[int, int]] = set()
    for i in range(1, len(layers)):
        pool = layers[i - 1] + (layers[i - 2] if i > 1 else [])
        for v in layers[i]:
            k = min(len(pool), 1 + int(rng.poisson(1.0)))
            # Mostly the previous layer; a long skip now and then.
            srcs = list(rng.choice(layers[i - 1], size=min(k, len(layers[i - 1])), replace=False))
            if i > 2 and rng.random() < 0.05:
                srcs.append(int(rng.integers(0, layers[i - 2][0])))
            edges.update((int(u), v) for u in srcs)
    _connect_orphans(n, edges, rng)
    return _finish(name, n, edges, rng, skew=skew, huge_share=huge_share, alias_share=alias_share)


def series_parallel(
    n: int,
    *,
    parallel: float = 0.5,
    seed: int = 0,
    skew: float = 1.5,
    huge_share: float = 0.02,
    alias_share: float = 0.05,
    name: str | None = None,
) -> dict:
    """Two-terminal series-parallel DAG grown by random series and parallel edge expansions.

    A series step splits an edge ``u->v`` into ``u->w->v``; a parallel step adds a path
    ``u->w->v`` beside it. ``parallel`` is the probability of a parallel step. The node list is a
    seeded random topological order.
    """
    name = name or f"sp-n{n}-s{seed}"
    _check(name, n)
    rng = np.random.default_rng([seed, n, 4])
    edge_list: list[tuple[int, int]] = [(0, 1)]
    for w in range(2, n):
        i = int(rng.integers(len(edge_list)))
        u, v = edge_list[i]
        if rng.random() < parallel:
            edge_list += [(u, w), (w, v)]
        else:
            edge_list[i] = (u, w)
            edge_list.append((w, v))
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edge_list)
    keys = rng.random(n)
    order = list(nx.lexicographical_topological_sort(g, key=lambda x: keys[x]))
    pos = {v: i for i, v in enumerate(order)}
    edges = {(pos[u], pos[v]) for u, v in edge_list}
    return _finish(name, n, edges, rng, skew=skew, huge_share=huge_share, alias_share=alias_share)


GENERATORS = {
    "erdos_renyi": erdos_renyi,
    "sbm": stochastic_block,
    "layered": layered,
    "series_parallel": series_parallel,
}
