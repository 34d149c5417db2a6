"""Shared by graphopt tests: every topological order of a small graph (brute force), and a
corpus of three small random training graphs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from timerl.graphopt.graph import Graph
from timerl.graphopt.random_graph import random_graph


def topological_orders(graph: Graph) -> Iterator[list[int]]:
    indeg = [len(p) for p in graph.preds]
    order: list[int] = []

    def rec() -> Iterator[list[int]]:
        if len(order) == graph.n:
            yield list(order)
            return
        for v in range(graph.n):
            if indeg[v] == 0 and v not in order:
                order.append(v)
                for w in graph.succs[v]:
                    indeg[w] -= 1
                yield from rec()
                for w in graph.succs[v]:
                    indeg[w] += 1
                order.pop()

    yield from rec()


@pytest.fixture
def all_orders() -> Callable[[Graph], Iterator[list[int]]]:
    return topological_orders


@pytest.fixture
def tiny_corpus(tmp_path):
    root = tmp_path / "corpus"
    entries = []
    for k in range(3):
        g = random_graph(20 + 10 * k, seed=k, view_prob=0.2)
        rel = f"train/rand/g{k}.json"
        (root / "train" / "rand").mkdir(parents=True, exist_ok=True)
        g.save(root / rel)
        entries.append(
            {
                "name": f"g{k}",
                "family": "rand",
                "kind": "synthetic",
                "split": "train",
                "nodes": g.n,
                "path": rel,
            }
        )
    (root / "index.json").write_text(json.dumps({"graphs": entries}))
    return root
