import json

import numpy as np
import pytest

from timerl.errors import GraphError
from timerl.graphopt.graph import Graph
from timerl.graphopt.random_graph import random_graph


def doc(nodes, edges, name="g"):
    return {"name": name, "nodes": nodes, "edges": edges}


def nd(i, b=1, **kw):
    return {"id": i, "op": "op", "bytes": b, "cost": 1.0, **kw}


def test_round_trip_json(tmp_path):
    g = random_graph(40, seed=3)
    path = tmp_path / "g.json"
    g.save(path)
    h = Graph.load(path)
    assert h.to_json() == g.to_json()
    assert json.loads(path.read_text())["name"] == g.name
    assert np.array_equal(h.root, g.root)


def test_csr_and_root():
    g = Graph.from_json(
        doc(
            [nd("a", 8), nd("v", 8, alias_of="a"), nd("w", 8, alias_of="v"), nd("c")],
            [["a", "v"], ["v", "w"], ["w", "c"], ["a", "c"], ["a", "c"]],
        )
    )
    assert g.num_edges() == 4  # duplicate edge dropped
    assert g.preds[g.index["c"]] == [0, 2]
    assert g.root.tolist() == [0, 0, 0, 3]
    assert g.program_order == [0, 1, 2, 3]


def test_program_order_follows_file_order_when_possible():
    g = Graph.from_json(doc([nd("b"), nd("a"), nd("c")], [["a", "b"]]))
    assert [g.nodes[v].id for v in g.program_order] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("nodes", "edges", "needle"),
    [
        ([nd("a"), nd("b")], [["a", "zz"]], "'zz'"),
        ([nd("a"), nd("a")], [], "duplicate node id 'a'"),
        ([nd("a", -1)], [], "'a' has negative bytes"),
        ([nd("a"), {"id": "b", "op": "x", "bytes": 1, "cost": -2.0}], [], "'b' has negative"),
        ([nd("a"), nd("b"), nd("c")], [["a", "b"], ["b", "c"], ["c", "b"]], "cycle through node"),
        ([nd("a")], [["a", "a"]], "cycle through node 'a'"),
        ([nd("a"), nd("b", alias_of="a")], [], "'b' is alias_of 'a'"),
        ([nd("a"), nd("b", alias_of="q")], [["a", "b"]], "'b' is alias_of unknown node 'q'"),
        ([{"id": "a", "op": "x", "cost": 1.0}], [], "node 'a' has a missing"),
    ],
)
def test_validation_errors_name_the_node(nodes, edges, needle):
    with pytest.raises(GraphError, match=needle.replace("(", r"\(")):
        Graph.from_json(doc(nodes, edges))


def test_cycle_error_names_a_node_on_the_cycle():
    nodes = [nd(x) for x in "abcde"]
    edges = [["a", "b"], ["b", "c"], ["c", "d"], ["d", "b"], ["d", "e"]]
    with pytest.raises(GraphError) as err:
        Graph.from_json(doc(nodes, edges))
    assert any(f"'{x}'" in str(err.value) for x in "bcd")
    assert "'a'" not in str(err.value) and "'e'" not in str(err.value)


def test_unreadable_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(GraphError, match="bad.json"):
        Graph.load(bad)


def test_extra_top_level_fields_survive_a_round_trip():
    data = doc([nd("a"), nd("b")], [["a", "b"]])
    data["param_bytes"] = 1234
    g = Graph.from_json(data)
    assert g.meta == {"param_bytes": 1234}
    assert Graph.from_json(g.to_json()).meta == {"param_bytes": 1234}
