"""Shared by graphopt tests: every topological order of a small graph (brute force), and
runners comparing workers with one worker (the corpus fixture is in tests/conftest.py)."""

from __future__ import annotations

import json
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


def _eval_records(argv: list[str], workers: int, out) -> list[dict]:
    """`graphopt eval ARGV --workers N`'s records, less their seconds (which differ)."""

    from timerl.cli import main

    assert main([*argv, "--no-progress", "--out", str(out), "--workers", str(workers)]) == 0
    recs = json.loads(out.read_text())
    for r in recs:
        r.pop("seconds")
    return recs


def _trained_params(corpus, workers: int, out) -> dict:
    """The weights of a 2-update `graphopt train` run with ``workers``."""
    from timerl.cli import main
    from timerl.graphopt.policy import PolicyWeights

    argv = ["graphopt", "train", "--corpus", str(corpus), "--out", str(out)]
    argv += ["--iterations", "2", "--budget", "40", "--batch", "3", "--hidden", "8"]
    assert main([*argv, "--rounds", "1", "--workers", str(workers)]) == 0
    return PolicyWeights.load(out).params


@pytest.fixture
def eval_records() -> Callable[..., list[dict]]:
    return _eval_records


@pytest.fixture
def trained_params() -> Callable[..., dict]:
    return _trained_params
