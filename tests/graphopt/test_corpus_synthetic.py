"""Synthetic generators: seeded, the requested size, valid DAGs with skew, aliases and outputs."""

from __future__ import annotations

import json

import pytest

from timerl.errors import GraphError
from timerl.graphopt.corpus import check_graph
from timerl.graphopt.corpus.synthetic import GENERATORS


@pytest.mark.parametrize("family", sorted(GENERATORS))
@pytest.mark.parametrize("n", [2, 37, 400])
def test_valid_dag_of_requested_size(family: str, n: int) -> None:
    g = GENERATORS[family](n, seed=3)
    assert len(g["nodes"]) == n
    check_graph(g)


@pytest.mark.parametrize("family", sorted(GENERATORS))
def test_seeded_and_deterministic(family: str) -> None:
    gen = GENERATORS[family]
    a = json.dumps(gen(300, seed=1))
    assert a == json.dumps(gen(300, seed=1))
    assert a != json.dumps(gen(300, seed=2))


@pytest.mark.parametrize("family", sorted(GENERATORS))
def test_skew_aliases_and_outputs(family: str) -> None:
    g = GENERATORS[family](1000, seed=0, skew=2.0, huge_share=0.05)
    sizes = sorted(n["bytes"] for n in g["nodes"] if "alias_of" not in n)
    median = sizes[len(sizes) // 2]
    assert sizes[-1] > 50 * median  # some huge buffers
    assert sum(1 for n in g["nodes"] if "alias_of" in n) >= 10
    assert sum(1 for n in g["nodes"] if n.get("output")) >= 2
    # Few sources and sinks, as in real programs.
    assert sum(1 for n in g["nodes"] if n["op"] == "input") < 0.1 * len(g["nodes"])
    sources = {s for s, _ in g["edges"]}
    assert sum(1 for n in g["nodes"] if n["id"] not in sources) < 0.1 * len(g["nodes"])


def test_too_small_is_an_error() -> None:
    with pytest.raises(GraphError, match="er-tiny"):
        GENERATORS["erdos_renyi"](1, name="er-tiny")


def test_loads_into_graph_ir() -> None:
    graph_mod = pytest.importorskip("timerl.graphopt.graph")
    for gen in GENERATORS.values():
        graph_mod.Graph.from_json(gen(200, seed=5))
