"""Shared brute force for graphopt tests: every topological order of a small graph."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from timerl.graphopt.graph import Graph


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
