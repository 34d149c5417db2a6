"""Node features of a graph for the learned policy, in numpy (no torch needed to compute them).

The policy must transfer across graph families and sizes, so every feature is either local
(op type, bytes, cost, degrees, view/output/pin flags), relative to the graph (log bytes minus
the graph's largest, depth over the longest path, the memory resident at the node's step of
the memory-greedy order over that order's peak), or a setting of the problem (objective,
devices, host). It also sees where each classical scheduler runs the node (rank / n): the
network then learns which of these orders to trust on which kind of node, which is the cheap
structural signal a few rounds of message passing cannot recover on their own.

``FEATURE_VERSION`` names this layout; weights trained on another layout are refused.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from timerl.graphopt.baselines import PORTFOLIO
from timerl.graphopt.graph import Graph
from timerl.graphopt.perfmodel import PeakMemory

FEATURE_VERSION = 2
OP_BUCKETS = 32
#: Portfolio members whose ranks are features, in this order.
RANKED = ("program", "memory-greedy", "dfs", "postorder")
NUM_SCALAR = 22
NUM_FEATURES = OP_BUCKETS + NUM_SCALAR


@dataclass
class GraphFeatures:
    """Everything the policy reads: node features and the edge list (both directions)."""

    x: np.ndarray  # (n, NUM_FEATURES) float32
    src: np.ndarray  # (e,) int64, edge sources (predecessors)
    dst: np.ndarray  # (e,) int64
    orders: dict[str, np.ndarray]  # the portfolio orders computed on the way (seeds for search)


def op_bucket(op: str) -> int:
    """A stable hash of the op name: exporters name ops differently, so no fixed vocabulary."""
    return zlib.crc32(op.encode()) % OP_BUCKETS


def depth_height(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Longest path (in edges) from any source to each node, and from each node to any sink."""
    n = graph.n
    depth = [0] * n
    height = [0] * n
    order = graph.program_order
    for v in order:
        for u in graph.preds[v]:
            if depth[u] + 1 > depth[v]:
                depth[v] = depth[u] + 1
    for v in reversed(order):
        for w in graph.succs[v]:
            if height[w] + 1 > height[v]:
                height[v] = height[w] + 1
    return np.array(depth, dtype=np.float64), np.array(height, dtype=np.float64)


def graph_features(
    graph: Graph,
    *,
    objective: str = "peak-memory",
    devices: int = 1,
    host: bool = False,
    orders: dict[str, np.ndarray] | None = None,
) -> GraphFeatures:
    """Features of every node of ``graph`` for a problem with the given settings."""
    n = graph.n
    if orders is None:
        orders = {name: PORTFOLIO[name](graph) for name in RANKED}
    x = np.zeros((n, NUM_FEATURES), dtype=np.float32)
    if n == 0:
        return GraphFeatures(x, np.zeros(0, np.int64), np.zeros(0, np.int64), orders)
    buckets = np.array([op_bucket(nd.op) for nd in graph.nodes], dtype=np.int64)
    x[np.arange(n), buckets] = 1.0
    s = x[:, OP_BUCKETS:]
    nbytes = graph.nbytes.astype(np.float64)
    lb = np.log2(nbytes + 1.0)
    s[:, 0] = lb / 40.0
    s[:, 1] = (lb - lb.max()) / 40.0
    s[:, 2] = nbytes / max(nbytes.max(), 1.0)
    lc = np.log10(graph.cost + 1e-12)
    s[:, 3] = (lc + 12.0) / 12.0
    s[:, 4] = graph.cost / max(graph.cost.max(), 1e-12)
    indeg = np.diff(graph.pred_ptr).astype(np.float64)
    outdeg = np.diff(graph.succ_ptr).astype(np.float64)
    s[:, 5] = np.log1p(indeg) / 3.0
    s[:, 6] = np.log1p(outdeg) / 3.0
    depth, height = depth_height(graph)
    longest = max(depth.max(), 1.0)
    s[:, 7] = depth / longest
    s[:, 8] = height / longest
    s[:, 9] = graph.alias >= 0
    s[:, 10] = graph.is_output
    s[:, 11] = np.array([nd.device is not None for nd in graph.nodes], dtype=np.float32)
    # bytes of all the buffers this node reads, relative to its own output: how much its
    # running can free
    root = graph.root
    read = np.zeros(n)
    if graph.num_edges():
        np.add.at(read, graph.edges[:, 1], nbytes[root[graph.edges[:, 0]]])
    s[:, 12] = np.log2(read + 1.0) / 40.0
    for k, name in enumerate(RANKED):
        pos = np.empty(n, dtype=np.float64)
        pos[np.asarray(orders[name])] = np.arange(n)
        s[:, 13 + k] = pos / max(n - 1, 1)
    s[:, 17] = objective == "runtime"
    s[:, 18] = np.log2(max(devices, 1)) / 3.0
    s[:, 19] = host
    # where memory is tight: under the memory-greedy order, the bytes resident while the node
    # runs (over that order's peak) and how long the node's buffer stays (over n)
    pm = PeakMemory(graph)
    greedy = np.asarray(orders["memory-greedy"])
    pos = np.empty(n, dtype=np.int64)
    pos[greedy] = np.arange(n)
    alloc, last = pm.lifetimes(pos)
    prof = pm.profile_of(alloc, last)
    s[:, 20] = prof[pos] / max(prof.max(), 1.0)
    span = np.zeros(n)
    span[pm.buffers] = (last - alloc) / max(n - 1, 1)
    s[:, 21] = span[root]
    src = graph.edges[:, 0].astype(np.int64)
    dst = graph.edges[:, 1].astype(np.int64)
    return GraphFeatures(x, src, dst, orders)
