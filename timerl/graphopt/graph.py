"""Graph IR of graphopt: a validated dataflow DAG, indexed by integers for fast search.

Node ids are strings in files and messages; everything the search touches uses integer indices
and numpy arrays (CSR predecessor/successor lists), so evaluating an order is a few vector ops.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import GraphError


@dataclass(frozen=True)
class Node:
    """One op: ``bytes`` is its output size, ``cost`` its compute time in seconds."""

    id: str
    op: str
    bytes: int
    cost: float
    output: bool = False
    alias_of: str | None = None
    device: str | None = None


class Graph:
    """An immutable, validated DAG with integer-indexed adjacency and buffer information.

    Attributes used by the search (all numpy arrays of length ``n`` unless noted):
    ``nbytes``, ``cost``, ``is_output``, ``alias`` (index of the aliased node or -1), ``root``
    (the buffer a node's output lives in: itself, or the root of its alias chain),
    ``pred_ptr/pred_idx`` and ``succ_ptr/succ_idx`` (CSR adjacency, duplicates removed).
    """

    def __init__(
        self,
        name: str,
        nodes: list[Node],
        edges: list[tuple[str, str]],
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        # other top-level fields of the file (e.g. resident parameter bytes), kept verbatim
        self.meta: dict[str, Any] = dict(meta or {})
        self.nodes: list[Node] = list(nodes)
        self.n = len(self.nodes)
        self.index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.id in self.index:
                raise GraphError(f"graph {name!r}: duplicate node id {node.id!r}")
            if node.bytes < 0:
                raise GraphError(f"graph {name!r}: node {node.id!r} has negative bytes")
            if not node.cost >= 0:  # also rejects NaN
                raise GraphError(f"graph {name!r}: node {node.id!r} has negative or NaN cost")
            self.index[node.id] = i
        pairs = set()
        for src, dst in edges:
            for end in (src, dst):
                if end not in self.index:
                    raise GraphError(
                        f"graph {name!r}: edge [{src!r}, {dst!r}] names unknown node {end!r}"
                    )
            if src == dst:
                raise GraphError(f"graph {name!r}: cycle through node {src!r} (self edge)")
            pairs.add((self.index[src], self.index[dst]))
        edge_arr = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
        self.edges = edge_arr
        self.pred_ptr, self.pred_idx = _csr(edge_arr[:, 1], edge_arr[:, 0], self.n)
        self.succ_ptr, self.succ_idx = _csr(edge_arr[:, 0], edge_arr[:, 1], self.n)
        # per entry of pred_idx, the node whose predecessor it is
        self.pred_owner = np.repeat(np.arange(self.n), np.diff(self.pred_ptr))
        self.sinks = np.nonzero(np.diff(self.succ_ptr) == 0)[0]
        self.nbytes = np.array([nd.bytes for nd in self.nodes], dtype=np.int64)
        self.cost = np.array([nd.cost for nd in self.nodes], dtype=np.float64)
        self.is_output = np.array([nd.output for nd in self.nodes], dtype=bool)
        self.preds: list[list[int]] = [
            self.pred_idx[self.pred_ptr[i] : self.pred_ptr[i + 1]].tolist() for i in range(self.n)
        ]
        self.succs: list[list[int]] = [
            self.succ_idx[self.succ_ptr[i] : self.succ_ptr[i + 1]].tolist() for i in range(self.n)
        ]
        self.indegree: list[int] = [len(p) for p in self.preds]
        self.alias = np.full(self.n, -1, dtype=np.int64)
        for i, node in enumerate(self.nodes):
            if node.alias_of is None:
                continue
            base = self.index.get(node.alias_of)
            if base is None:
                raise GraphError(
                    f"graph {name!r}: node {node.id!r} is alias_of unknown node {node.alias_of!r}"
                )
            if base not in self.preds[i]:
                raise GraphError(
                    f"graph {name!r}: node {node.id!r} is alias_of {node.alias_of!r}, "
                    "which is not one of its predecessors"
                )
            self.alias[i] = base
        self.program_order = self._check_acyclic()
        self.root = np.arange(self.n, dtype=np.int64)
        for v in self.program_order:  # topological, so a base's root is known first
            if self.alias[v] >= 0:
                self.root[v] = self.root[self.alias[v]]

    # ------------------------------------------------------------------ structure
    def _check_acyclic(self) -> list[int]:
        """Kahn's algorithm preferring file order: the 'program order' of the graph."""
        indeg = np.diff(self.pred_ptr).tolist()
        heap = [v for v in range(self.n) if indeg[v] == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            v = heapq.heappop(heap)
            order.append(v)
            for w in self.succs[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(heap, w)
        if len(order) < self.n:
            left = {v for v in range(self.n) if indeg[v] > 0}
            v = min(left)
            seen: list[int] = []
            while v not in seen:  # walk backwards inside the leftover set: must revisit
                seen.append(v)
                v = next(u for u in self.preds[v] if u in left)
            raise GraphError(f"graph {self.name!r}: cycle through node {self.nodes[v].id!r}")
        return order

    @property
    def ids(self) -> list[str]:
        return [nd.id for nd in self.nodes]

    def num_edges(self) -> int:
        return int(self.edges.shape[0])

    # ------------------------------------------------------------------ files
    @classmethod
    def from_json(cls, data: dict[str, Any] | str | Path) -> Graph:
        """Build from the JSON exchange format (a dict, or a path to a file)."""
        where = "graph"
        if not isinstance(data, dict):
            where = str(data)
            try:
                data = json.loads(Path(data).read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise GraphError(f"{where}: cannot read graph file: {err}") from err
        if not isinstance(data, dict) or "nodes" not in data or "edges" not in data:
            raise GraphError(f"{where}: expected an object with 'nodes' and 'edges'")
        name = str(data.get("name", where))
        nodes = []
        for k, raw in enumerate(data["nodes"]):
            if not isinstance(raw, dict) or "id" not in raw:
                raise GraphError(f"{where}: node #{k} has no 'id'")
            nid = str(raw["id"])
            try:
                nodes.append(
                    Node(
                        id=nid,
                        op=str(raw.get("op", "op")),
                        bytes=int(raw["bytes"]),
                        cost=float(raw["cost"]),
                        output=bool(raw.get("output", False)),
                        alias_of=None if raw.get("alias_of") is None else str(raw["alias_of"]),
                        device=None if raw.get("device") is None else str(raw["device"]),
                    )
                )
            except (KeyError, TypeError, ValueError) as err:
                msg = f"{where}: node {nid!r} has a missing or bad field: {err}"
                raise GraphError(msg) from err
        edges = []
        for e in data["edges"]:
            if not isinstance(e, (list, tuple)) or len(e) != 2:
                raise GraphError(f"{where}: edge {e!r} is not a [src, dst] pair")
            edges.append((str(e[0]), str(e[1])))
        meta = {k: v for k, v in data.items() if k not in ("name", "nodes", "edges")}
        return cls(name, nodes, edges, meta)

    @classmethod
    def load(cls, path: str | Path) -> Graph:
        return cls.from_json(Path(path))

    def to_json(self) -> dict[str, Any]:
        nodes = []
        for nd in self.nodes:
            d: dict[str, Any] = {"id": nd.id, "op": nd.op, "bytes": nd.bytes, "cost": nd.cost}
            if nd.output:
                d["output"] = True
            if nd.alias_of is not None:
                d["alias_of"] = nd.alias_of
            if nd.device is not None:
                d["device"] = nd.device
            nodes.append(d)
        edges = [[self.nodes[s].id, self.nodes[t].id] for s, t in self.edges.tolist()]
        return {"name": self.name, **self.meta, "nodes": nodes, "edges": edges}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={self.n}, edges={self.num_edges()})"


def _csr(keys: np.ndarray, vals: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Group ``vals`` by ``keys`` into (ptr, idx) arrays; within a group, sorted by value."""
    order = np.lexsort((vals, keys))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, vals[order].astype(np.int64)
