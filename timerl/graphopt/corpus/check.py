"""Structural checks every corpus graph passes before it is written.

Kept independent of the graph IR so the corpus can be validated on its own: a broken importer
must fail at build time with the graph's name, not later inside a search.
"""

from __future__ import annotations

import math

from timerl.errors import GraphError


def check_graph(graph: dict) -> None:
    """Raise ``GraphError`` unless ``graph`` is a well-formed graph dict in program order.

    Checked: unique ids; non-negative integer bytes and finite non-negative costs; every edge
    names known nodes and points forward in the node list (so the list is a topological order);
    ``alias_of`` names a direct predecessor; at least one output.
    """
    name = graph.get("name", "<unnamed>")
    pos: dict[str, int] = {}
    for i, node in enumerate(graph["nodes"]):
        nid = node["id"]
        if nid in pos:
            raise GraphError(f"graph {name!r}: duplicate node id {nid!r}")
        b, c = node["bytes"], node["cost"]
        if not isinstance(b, int) or b < 0:
            raise GraphError(f"graph {name!r}: node {nid!r} has bad bytes {b!r}")
        if not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 0):
            raise GraphError(f"graph {name!r}: node {nid!r} has bad cost {c!r}")
        pos[nid] = i
    preds: dict[str, set[str]] = {nid: set() for nid in pos}
    for src, dst in graph["edges"]:
        if src not in pos or dst not in pos:
            raise GraphError(f"graph {name!r}: edge [{src!r}, {dst!r}] names an unknown node")
        if pos[src] >= pos[dst]:
            raise GraphError(f"graph {name!r}: edge [{src!r}, {dst!r}] goes against program order")
        preds[dst].add(src)
    for node in graph["nodes"]:
        base = node.get("alias_of")
        if base is not None and base not in preds[node["id"]]:
            raise GraphError(
                f"graph {name!r}: node {node['id']!r} aliases {base!r}, which is no predecessor"
            )
    if not any(node.get("output") for node in graph["nodes"]):
        raise GraphError(f"graph {name!r}: no node is marked as output")
