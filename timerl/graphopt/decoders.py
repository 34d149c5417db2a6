"""Decoders: random keys -> a valid schedule, and the Problem that scores schedules.

A chromosome holds, per node, a scheduling priority; when placing over K > 1 devices also a
device key, and with a host tier a swap key. List scheduling (run the highest-priority ready
op) turns any priorities into a topological order, so every decoded individual is valid and
search never has to repair anything.
"""

from __future__ import annotations

import copy
import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.errors import GraphError
from timerl.graphopt import kernels
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import Cluster, PeakMemory, Simulator

OBJECTIVES = ("peak-memory", "runtime")
#: A buffer is swapped when its swap key is above this (uniform keys: 20% of buffers).
SWAP_THRESHOLD = 0.8


def decode_order(graph: Graph, priority: np.ndarray, compiled: bool = False) -> np.ndarray:
    """List scheduling: repeatedly run the ready op with the highest priority (ties: index).
    ``compiled``: with numba's kernel when it is installed (:mod:`kernels`).

    The heap holds integer ranks of the priorities rather than (key, node) tuples: ints
    compare faster and nothing is allocated per push.
    """
    n = graph.n
    key = np.asarray(priority, dtype=np.float64)[:n]
    if compiled and (kernel := kernels.get("list_schedule")) is not None:
        return kernel(graph.succ_ptr, graph.succ_idx, graph.pred_ptr, key)
    node_at = np.argsort(-key, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[node_at] = np.arange(n)
    rk, node = rank.tolist(), node_at.tolist()
    succs = graph.succs
    indeg = graph.indegree.copy()
    heap = [rk[v] for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    order = []
    push, pop, emit = heapq.heappush, heapq.heappop, order.append
    while heap:
        v = node[pop(heap)]
        emit(v)
        for w in succs[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                push(heap, rk[w])
    return np.array(order, dtype=np.int64)


def decode_postorder(graph: Graph, priority: np.ndarray, compiled: bool = False) -> np.ndarray:
    """Post-order DFS from the sinks (highest priority first) over predecessors (highest
    priority first): each node runs right after the last of its inputs' sub-computations, so
    a subtree runs to its end before its sibling starts, which is how memory-optimal orders
    of trees look (and which list scheduling reaches only through many keys at once)."""
    n = graph.n
    key = np.asarray(priority, dtype=np.float64)[:n]
    ptr = graph.pred_ptr
    idx = graph.pred_idx
    if compiled and (kernel := kernels.get("post_order")) is not None:
        return kernel(ptr, idx, key, graph.sinks)
    preds = idx[np.lexsort((-key[idx], graph.pred_owner))].tolist()
    roots = graph.sinks[np.argsort(-key[graph.sinks], kind="stable")].tolist()
    starts = ptr.tolist()
    done = [False] * n
    nxt = starts[:-1]  # per node, the next of its (sorted) predecessors to visit
    order: list[int] = []
    emit = order.append
    for s in roots:
        stack = [s]
        push, pop = stack.append, stack.pop
        while stack:
            v = stack[-1]
            i, end = nxt[v], starts[v + 1]
            while i < end and done[preds[i]]:
                i += 1
            if i < end:
                nxt[v] = i + 1
                push(preds[i])
            else:
                pop()
                if not done[v]:
                    done[v] = True
                    emit(v)
    return np.array(order, dtype=np.int64)


#: Decoders the learned search's extra key chooses between: below 0.5 list scheduling,
#: otherwise the post-order decoder.
DECODERS = ("list", "postorder")


def order_keys(order: np.ndarray) -> np.ndarray:
    """Priorities that decode back to exactly ``order`` (earlier = higher, in (0, 1])."""
    n = len(order)
    keys = np.empty(n, dtype=np.float64)
    keys[np.asarray(order)] = 1.0 - np.arange(n) / max(n, 1)
    return keys


@dataclass
class Solution:
    """A schedule: an order, and for multi-device problems a placement and swap set."""

    order: np.ndarray
    placement: np.ndarray | None = None
    swap: np.ndarray | None = None

    def to_json(self, graph: Graph, cluster: Cluster | None = None) -> dict[str, Any]:
        ids = graph.ids
        out: dict[str, Any] = {"order": [ids[v] for v in self.order.tolist()]}
        if self.placement is not None and cluster is not None:
            out["placement"] = {ids[v]: cluster.devices[d] for v, d in enumerate(self.placement)}
        else:
            out["placement"] = {}
        swap = [] if self.swap is None else np.nonzero(self.swap)[0].tolist()
        out["swap"] = [ids[v] for v in swap]
        return out


class Problem:
    """What to optimise on a graph: objective, optional cluster, and the key layout.

    Peak memory on a single device (no cluster, or one device without host) uses the fast
    step evaluator; everything else goes through the event simulator.
    """

    def __init__(
        self, graph: Graph, objective: str = "peak-memory", cluster: Cluster | None = None
    ) -> None:
        if objective not in OBJECTIVES:
            raise GraphError(f"unknown objective {objective!r} (choose from {OBJECTIVES})")
        self.graph = graph
        self.objective = objective
        if cluster is None and objective == "runtime":
            cluster = Cluster.make(1)
        self.cluster = cluster
        self.n = graph.n
        self.place = cluster is not None and cluster.k > 1
        self.swaps = cluster is not None and cluster.host
        self.single = cluster is None or (
            not self.place and not self.swaps and objective == "peak-memory"
        )
        self.num_keys = self.n * (1 + int(self.place) + int(self.swaps))
        # the order's decoder (``DECODERS``), or "gene": one more key, after all the others,
        # picks it per chromosome
        self.decoder = "list"
        self.decoder_gene = False
        self.peak = PeakMemory(graph)
        self.sim = Simulator(graph, cluster) if cluster is not None else None
        # the predecessor whose output is largest: a node "follows" it unless told otherwise
        self.root = graph.root.tolist()
        self.anchor = np.full(self.n, -1, dtype=np.int64)
        for v in range(self.n):
            if graph.preds[v]:
                self.anchor[v] = max(graph.preds[v], key=lambda u: (graph.nbytes[u], -u))
        self.evaluations = 0
        # decode with numba's kernels: set by a search large enough to gain (kernels.worth_it)
        self.compiled = False

    def with_decoder_gene(self) -> Problem:
        """The same problem (sharing its evaluators) whose chromosomes carry one more key,
        the last, choosing the order's decoder (``DECODERS``): below 0.5 list scheduling,
        else :func:`decode_postorder`. Any schedule still encodes exactly (list decoder)."""
        return self.with_decoder("gene")

    def with_decoder(self, decoder: str) -> Problem:
        """The same problem (sharing its evaluators) decoding orders with ``decoder``: one of
        ``DECODERS``, or "gene" (:meth:`with_decoder_gene`). Under "postorder" an encoded
        schedule decodes to a post-order of its keys, not always to itself."""
        if decoder not in (*DECODERS, "gene"):
            raise GraphError(f"unknown decoder {decoder!r} (choose from {DECODERS} or 'gene')")
        twin = copy.copy(self)
        base = self.num_keys - int(self.decoder_gene)
        twin.decoder = decoder
        twin.decoder_gene = decoder == "gene"
        twin.num_keys = base + int(twin.decoder_gene)
        return twin

    # ---------------------------------------------------------------- keys <-> schedules
    def decode(self, keys: np.ndarray) -> Solution:
        n = self.n
        post = keys[-1] >= 0.5 if self.decoder_gene else self.decoder == "postorder"
        if post:
            order = decode_postorder(self.graph, keys[:n], self.compiled)
        else:
            order = decode_order(self.graph, keys[:n], self.compiled)
        if self.single:
            return Solution(order)
        at = n
        placement = np.zeros(n, dtype=np.int64)
        if self.place:
            placement = self._decode_devices(keys[at : at + n])
            at += n
        swap = None
        if self.swaps:
            swap = keys[at : at + n] > SWAP_THRESHOLD
        assert self.sim is not None
        return Solution(order, self.sim.normalise(placement), swap)

    def encode(self, sol: Solution) -> np.ndarray:
        """Keys that decode to ``sol`` (used to seed search with heuristic schedules)."""
        parts = [order_keys(sol.order)]
        if self.place:
            pl = sol.placement if sol.placement is not None else np.zeros(self.n, np.int64)
            parts.append(self._encode_devices(pl))
        if self.swaps:
            sw = sol.swap if sol.swap is not None else np.zeros(self.n, bool)
            parts.append(np.where(sw, 0.9, 0.4))
        if self.decoder_gene:
            parts.append(np.array([0.25]))  # the list decoder reproduces any order
        return np.concatenate(parts)

    def complete(self, order: np.ndarray) -> Solution:
        """A solution from an order alone: everything on the first device, no swaps."""
        if self.single:
            return Solution(np.asarray(order, dtype=np.int64))
        assert self.sim is not None
        pl = self.sim.normalise(np.zeros(self.n, dtype=np.int64))
        return Solution(np.asarray(order, dtype=np.int64), pl, np.zeros(self.n, dtype=bool))

    def _decode_devices(self, keys: np.ndarray) -> np.ndarray:
        """Key < 0.5: the device of the anchor (the largest input), which saves its transfer;
        otherwise device ``floor((key - 0.5) * 2K)``. Co-location is the common good choice, so
        it gets half of the key range (a node without inputs maps the whole range to devices).
        Pins and views (on their base's device) take precedence."""
        assert self.sim is not None
        k = self.sim.cluster.k
        frac = np.where(keys >= 0.5, (keys - 0.5) * 2.0, keys * 2.0)
        own = np.minimum((frac * k).astype(np.int64), k - 1).tolist()
        follow = ((keys < 0.5) & (self.anchor >= 0)).tolist()
        anchor, pins, root = self.anchor.tolist(), self.sim.pins.tolist(), self.root
        dev = [0] * self.n
        for v in self.graph.program_order:
            if pins[v] >= 0:
                dev[v] = pins[v]
            elif root[v] != v:
                dev[v] = dev[root[v]]
            else:
                dev[v] = dev[anchor[v]] if follow[v] else own[v]
        return np.array(dev, dtype=np.int64)

    def _encode_devices(self, placement: np.ndarray) -> np.ndarray:
        k = self.cluster.k  # type: ignore[union-attr]
        own = 0.5 + (placement + 0.5) / (2 * k)
        same = (self.anchor >= 0) & (placement == placement[np.maximum(self.anchor, 0)])
        return np.where(same, 0.25, own)

    # ---------------------------------------------------------------- scoring
    def evaluate(self, sol: Solution) -> float:
        self.evaluations += 1
        if self.single:
            return float(self.peak.peak(sol.order))
        assert self.sim is not None
        pl = sol.placement if sol.placement is not None else np.zeros(self.n, np.int64)
        res = self.sim.run(sol.order, pl, sol.swap)
        return self.sim.objective(res, self.objective)

    def fitness(self, keys: np.ndarray) -> tuple[float, Solution]:
        sol = self.decode(keys)
        return self.evaluate(sol), sol
