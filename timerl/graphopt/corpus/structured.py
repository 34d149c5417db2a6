"""Seeded generators of structured dataflow graphs: the families where ordering has room.

Each is the shape of a network family written directly as a graph (no framework): random
wirings (RandWire's Watts-Strogatz, Barabasi-Albert and Erdos-Renyi graphs), pipelines of many
parallel chains, NASNet-style cells, mixture-of-experts layers, U-Nets with dense skips and
multi-branch blocks. Buffer sizes are heterogeneous (each unit draws its width), which is what
makes the order matter: with equal sizes most orders tie. ``with_backward`` turns any of
them into a training graph: the forward pass, a backward pass that reads the saved
activations, weight gradients and an in-place optimizer update per weight.

Node lists are in program order: forward, then the backward in reverse, as an autodiff tool
writes them. Every generator takes a target node count ``n`` and a ``seed`` and returns a
graph dict of about ``n`` nodes (the family's units are whole, so counts vary a little).
"""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from timerl.errors import GraphError

MiB = 2**20


class _Builder:
    """Accumulates nodes (program order) and edges; sizes in bytes, multiples of 4."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[dict] = []
        self.edges: list[tuple[int, int]] = []
        self.preds: list[list[int]] = []

    def add(
        self,
        op: str,
        nbytes: float,
        preds: list[int] = (),  # type: ignore[assignment]
        *,
        flops: float = 0.0,
        alias: int | None = None,
        output: bool = False,
    ) -> int:
        v = len(self.nodes)
        size = max(4, int(nbytes) // 4 * 4)
        read = sum(self.nodes[u]["bytes"] for u in preds)
        cost = 0.0 if op == "input" else max(flops / 1e12, (read + size) / 1e12) + 1e-6
        node: dict = {"op": op, "bytes": size, "cost": cost}
        if alias is not None:
            node.update(bytes=self.nodes[alias]["bytes"], cost=1e-7, alias=alias)
        if output:
            node["output"] = True
        self.nodes.append(node)
        ps = sorted(set(preds))
        self.preds.append(ps)
        self.edges.extend((u, v) for u in ps)
        return v

    def graph(self) -> dict:
        if len(self.nodes) < 2:
            raise GraphError(f"structured graph {self.name!r}: fewer than 2 nodes")
        has_succ = np.zeros(len(self.nodes), dtype=bool)
        for u, _ in self.edges:
            has_succ[u] = True
        nodes = []
        for v, nd in enumerate(self.nodes):
            out = {"id": f"n{v}", "op": nd["op"], "bytes": nd["bytes"], "cost": nd["cost"]}
            if "alias" in nd:
                out["alias_of"] = f"n{nd['alias']}"
            if nd.get("output") or not has_succ[v]:
                out["output"] = True  # every sink is an output: no dead work
            nodes.append(out)
        return {
            "name": self.name,
            "nodes": nodes,
            "edges": [[f"n{u}", f"n{v}"] for u, v in sorted(set(self.edges))],
        }


def _width(rng: np.random.Generator, base: float, sigma: float) -> float:
    return base * math.exp(rng.normal(0.0, sigma))


# ------------------------------------------------------------------------------ RandWire
def wiring(kind: str, nodes: int, seed: int) -> nx.Graph:
    """RandWire's generators at the paper's settings: WS(k=4, p=0.75), BA(m=5), ER(p=0.2);
    connected (a few redraws for ER)."""
    if kind == "ws":
        return nx.connected_watts_strogatz_graph(nodes, 4, 0.75, seed=seed)
    if kind == "ba":
        return nx.barabasi_albert_graph(nodes, min(5, nodes - 1), seed=seed)
    if kind == "er":
        for attempt in range(200):
            g = nx.erdos_renyi_graph(nodes, 0.2, seed=seed * 1000 + attempt)
            if nx.is_connected(g):
                return g
        raise GraphError(f"no connected ER({nodes}, 0.2) graph in 200 draws (seed {seed})")
    raise GraphError(f"unknown wiring {kind!r} (choose ws, ba or er)")


def randwire(
    n: int, *, kind: str = "ws", nodes: int = 32, seed: int = 0, name: str | None = None
) -> dict:
    """Stages of a RandWire network: each a random graph over ``nodes`` units, edges from
    lower to higher index; a unit sums its inputs (``add``), then ReLU, separable conv
    (depthwise then pointwise) and BN, each a node; sources read the stage input, sinks are
    averaged. Units draw their widths (log-normal), stages halve the resolution and double
    the base width. Stages are added until about ``n`` nodes."""
    name = name or f"randwire_{kind}-n{n}-s{seed}"
    rng = np.random.default_rng([seed, n, 11])
    b = _Builder(name)
    x = b.add("input", 3 * MiB)
    base, stage = 2.0 * MiB, 0
    while len(b.nodes) < n - 5 * nodes // 2 or stage == 0:
        g = wiring(kind, nodes, seed * 100 + stage)
        x = b.add("conv", base, [x], flops=base * 50)
        outs: list[int] = []
        preds = [sorted(u for u in g.neighbors(v) if u < v) for v in range(nodes)]
        used = {u for p in preds for u in p}
        for v in range(nodes):
            size = _width(rng, base, 0.6)
            ins = [outs[u] for u in preds[v]] or [x]
            s = ins[0] if len(ins) == 1 else b.add("add", size, ins)
            r = b.add("relu", b.nodes[s]["bytes"], [s])
            d = b.add("dwconv", b.nodes[s]["bytes"], [r], flops=9 * b.nodes[s]["bytes"])
            p = b.add("conv", size, [d], flops=size * 40)
            outs.append(b.add("bn", size, [p]))
        sinks = [outs[v] for v in range(nodes) if v not in used]
        x = b.add("mean", base, sinks) if len(sinks) > 1 else sinks[0]
        base, stage = base / 2, stage + 1
    b.add("linear", 4096, [x], output=True)
    return b.graph()


# ------------------------------------------------------------------------------ chains
def parallel_chains(
    n: int, *, chains: int = 16, seed: int = 0, cross: float = 0.03, name: str | None = None
) -> dict:
    """A pipeline of stages, each a fan-out of the stage input into ``chains`` chains of
    unequal lengths and size profiles (growing, shrinking or bulging), joined by a balanced
    tree of adds. A share ``cross`` of chain nodes also reads a node of an earlier chain of
    the stage. Program order: stage by stage, chain by chain."""
    name = name or f"chains-n{n}-k{chains}-s{seed}"
    rng = np.random.default_rng([seed, n, 12])
    b = _Builder(name)
    x = b.add("input", MiB)
    mean_len = 6
    stages = max(1, round(n / (chains * (mean_len + 1) + 1)))
    for _ in range(stages):
        base = _width(rng, MiB, 0.5)
        ends, members = [], []
        for _k in range(chains):
            length = int(rng.integers(2, 2 * mean_len - 1))
            start, end = _width(rng, base, 0.6), _width(rng, base, 0.6)
            bulge = math.exp(abs(rng.normal(0.0, 0.6)))
            prev, chain = x, []
            for j in range(length):
                t = (j + 1) / length
                size = (start * (1 - t) + end * t) * (bulge if 0 < j < length - 1 else 1.0)
                preds = [prev]
                if members and rng.random() < cross:
                    other = members[int(rng.integers(len(members)))]
                    preds.append(other[int(rng.integers(len(other)))])
                op = "matmul" if j == 0 else ("relu", "norm", "matmul")[int(rng.integers(3))]
                prev = b.add(op, size * math.exp(rng.normal(0, 0.15)), preds, flops=size * 30)
                chain.append(prev)
            members.append(chain)
            ends.append(prev)
        while len(ends) > 1:
            nxt = [
                b.add(
                    "add",
                    max(b.nodes[ends[i]]["bytes"], b.nodes[ends[i + 1]]["bytes"]),
                    [ends[i], ends[i + 1]],
                )
                for i in range(0, len(ends) - 1, 2)
            ]
            ends = nxt + ([ends[-1]] if len(ends) % 2 else [])
        x = ends[0]
    b.nodes[x]["output"] = True
    return b.graph()


# ------------------------------------------------------------------------------ NAS cells
_NAS_OPS = ("sep3", "sep5", "avg", "max", "identity", "dil3")


def nas_cells(n: int, *, blocks: int = 5, seed: int = 0, name: str | None = None) -> dict:
    """NASNet-style cells of one random normal and one random reduction cell: a block applies
    two ops to two earlier states of the cell (the two previous cells' outputs, or earlier
    blocks) and adds them; separable convs are two (ReLU, depthwise, pointwise, BN) rounds;
    the unused block outputs are concatenated. A reduction cell after every ``cells`` normal
    cells halves the resolution. Cells are added until about ``n`` nodes."""
    name = name or f"nas-n{n}-s{seed}"
    rng = np.random.default_rng([seed, n, 13])

    def draw_cell() -> list[tuple[int, str, int, str]]:
        return [
            (
                int(rng.integers(0, 2 + k)),
                _NAS_OPS[int(rng.integers(len(_NAS_OPS)))],
                int(rng.integers(0, 2 + k)),
                _NAS_OPS[int(rng.integers(len(_NAS_OPS)))],
            )
            for k in range(blocks)
        ]

    normal, reduction = draw_cell(), draw_cell()
    cells_per_stage = int(rng.integers(2, 5))
    b = _Builder(name)
    s0 = s1 = b.add("input", 2 * MiB)
    c = 1.0 * MiB
    count = 0

    def op_nodes(kind: str, x: int, size: float) -> int:
        if kind in ("sep3", "sep5", "dil3"):
            for _ in range(2 if kind != "dil3" else 1):
                r = b.add("relu", b.nodes[x]["bytes"], [x])
                d = b.add("dwconv", b.nodes[x]["bytes"], [r], flops=25 * size)
                p = b.add("conv", size, [d], flops=40 * size)
                x = b.add("bn", size, [p])
            return x
        if kind in ("avg", "max"):
            return b.add(f"{kind}pool", size, [x])
        return x

    while len(b.nodes) < n:
        reduce = count > 0 and count % (cells_per_stage + 1) == 0
        if reduce:
            c *= 0.5
        cell = reduction if reduce else normal
        states = [
            b.add("conv", _width(rng, c, 0.3), [s0], flops=c * 20),
            b.add("conv", _width(rng, c, 0.3), [s1], flops=c * 20),
        ]
        for a, op_a, bb, op_b in cell:
            size = _width(rng, c, 0.4)
            ya, yb = op_nodes(op_a, states[a], size), op_nodes(op_b, states[bb], size)
            states.append(b.add("add", size, [ya, yb]) if ya != yb else ya)
        used = {i for a, _, bb, _ in cell for i in (a, bb)}
        loose = [states[2 + k] for k in range(len(cell)) if 2 + k not in used]
        out = sum(b.nodes[v]["bytes"] for v in loose)
        s0, s1 = s1, b.add("concat", out, loose) if len(loose) > 1 else loose[0]
        count += 1
    b.add("linear", 4096, [s1], output=True)
    return b.graph()


# ------------------------------------------------------------------------------ MoE
def moe_layers(n: int, *, experts: int = 8, seed: int = 0, name: str | None = None) -> dict:
    """Transformer layers whose MLP is a mixture of experts: attention (q, k, v projections,
    scores of seq x seq per head, softmax, weighted sum, output projection, residual), then a
    router, and per expert a dispatch (gather of the tokens routed to it: a share drawn per
    expert and layer), up projection, activation, gate product and down projection; the
    combine adds each expert's rows into the residual in turn (a chain
    of ``index_add``, the experts in a drawn order), so an expert's output waits for its
    turn. Layers are added until about ``n`` nodes."""
    name = name or f"moe-n{n}-e{experts}-s{seed}"
    rng = np.random.default_rng([seed, n, 14])
    b = _Builder(name)
    d = 1.0 * MiB  # one activation of tokens x model width
    x = b.add("input", d)
    while len(b.nodes) < n:
        h = b.add("norm", d, [x])
        q, k, v = (b.add("matmul", d, [h], flops=d * 256) for _ in range(3))
        s = b.add("bmm", d / 2, [q, k], flops=d * 256)
        p = b.add("softmax", d / 2, [s])
        a = b.add("bmm", d, [p, v], flops=d * 256)
        o = b.add("matmul", d, [a], flops=d * 256)
        x = b.add("add", d, [x, o])
        h = b.add("norm", d, [x])
        route = b.add("router", d / 64, [h], flops=d * 8)
        share = rng.dirichlet(np.full(experts, 0.7)) * 2.0  # top-2 routing: shares sum to 2
        downs = []
        for e in range(experts):
            t = d * max(share[e], 0.02)
            hidden = t * float(rng.choice([2.0, 3.0, 4.0]))
            g = b.add("gather", t, [h, route])
            up = b.add("matmul", hidden, [g], flops=hidden * 256)
            gate = b.add("matmul", hidden, [g], flops=hidden * 256)
            act = b.add("silu", hidden, [gate])
            prod = b.add("mul", hidden, [up, act])
            downs.append(b.add("matmul", t, [prod], flops=hidden * 256))
        for e in rng.permutation(experts).tolist():  # index_add each expert's rows in turn
            x = b.add("index_add", d, [x, downs[e], route])
    b.add("linear", d / 4, [x], output=True)
    return b.graph()


# ------------------------------------------------------------------------------ branches
def _branch_block(b: _Builder, x: int, rng: np.random.Generator, base: float) -> int:
    """An inception-like block: 3 to 12 branches, each a bottleneck of its own width (1 x 1
    expansion, 1 to 4 ops at the expanded width, projection back: large inside, small at its
    end), some splitting into 2 or 3 sub-branches; the branch ends are concatenated and
    projected."""

    def path(src: int, size: float) -> int:
        wide = _width(rng, base, 0.6)
        y = b.add("conv", wide, [src], flops=wide * 30)
        for _ in range(int(rng.integers(1, 5))):
            w = _width(rng, wide, 0.2)
            y = b.add(("conv", "bn_relu", "dwconv")[int(rng.integers(3))], w, [y], flops=w * 60)
        return b.add("conv", _width(rng, size, 0.4), [y], flops=wide * 30)

    ends = []
    for _ in range(int(rng.integers(3, 13))):
        size = _width(rng, base / 16, 0.5)
        mid = path(x, size)
        if rng.random() < 0.3:
            subs = [path(mid, size) for _ in range(int(rng.integers(2, 4)))]
            ends.append(b.add("concat", sum(b.nodes[s]["bytes"] for s in subs), subs))
        else:
            ends.append(mid)
    cat = b.add("concat", sum(b.nodes[e]["bytes"] for e in ends), ends)
    return b.add("conv", _width(rng, base, 0.2), [cat], flops=base * 100)


def branches(n: int, *, seed: int = 0, name: str | None = None) -> dict:
    """Multi-branch blocks (``_branch_block``) in sequence, with a residual add around every
    block, until about ``n`` nodes."""
    name = name or f"branches-n{n}-s{seed}"
    rng = np.random.default_rng([seed, n, 16])
    b = _Builder(name)
    x = b.add("input", MiB)
    while len(b.nodes) < n:
        y = _branch_block(b, x, rng, MiB)
        x = b.add("add", MiB, [x, y])
    b.nodes[x]["output"] = True
    return b.graph()


# ------------------------------------------------------------------------------ U-Net
def unet_skips(n: int, *, seed: int = 0, name: str | None = None) -> dict:
    """U-Nets whose levels are multi-branch blocks (``_branch_block``), with additive skips
    from each encoder level to its decoder level and dense ones (UNet++-like: one resample
    node per skip) from every shallower level, so large early activations stay alive while
    the deeper levels' branches run. Stacked (as hourglasses) until about ``n`` nodes."""
    name = name or f"unet-n{n}-s{seed}"
    rng = np.random.default_rng([seed, n, 15])
    b = _Builder(name)
    x = b.add("input", 2 * MiB)
    depth = int(rng.integers(3, 5))
    while len(b.nodes) < n:
        skips: list[int] = []
        size = 2.0 * MiB
        for _level in range(depth):
            x = _branch_block(b, x, rng, size)
            skips.append(x)
            x = b.add("maxpool", size / 2, [x])
            size /= 2
        for level in reversed(range(depth)):
            size *= 2
            x = b.add("upconv", size, [x], flops=size * 50)
            extra = [b.add("resample", size, [s]) for s in skips[:level]]
            x = b.add("add", size, [x, skips[level], *extra])
            x = _branch_block(b, x, rng, size)
    b.nodes[x]["output"] = True
    return b.graph()


GENERATORS = {
    "randwire_ws": lambda n, seed, name=None: randwire(
        n, kind="ws", nodes=(64, 96)[seed % 2], seed=seed, name=name
    ),
    "randwire_ba": lambda n, seed, name=None: randwire(
        n, kind="ba", nodes=(64, 96)[seed % 2], seed=seed, name=name
    ),
    "randwire_er": lambda n, seed, name=None: randwire(
        n, kind="er", nodes=(64, 96)[seed % 2], seed=seed, name=name
    ),
    "chains": lambda n, seed, name=None: parallel_chains(
        n, chains=(32, 64, 96)[seed % 3], seed=seed, name=name
    ),
    "nas": lambda n, seed, name=None: nas_cells(n, seed=seed, name=name),
    "moe": lambda n, seed, name=None: moe_layers(
        n, experts=(16, 32, 64)[seed % 3], seed=seed, name=name
    ),
    "unet": lambda n, seed, name=None: unet_skips(n, seed=seed, name=name),
    "branches": lambda n, seed, name=None: branches(n, seed=seed, name=name),
}


# ------------------------------------------------------------------------------ training
#: ops with a weight: their input gradient reads only the output gradient, and they get a
#: weight gradient (reading the saved input) and an optimizer update
WEIGHTED = {"matmul", "conv", "linear", "upconv", "dwconv", "router"}
#: ops whose backward reads their own output (saved), not their inputs
SAVES_OUTPUT = {"relu", "bn_relu", "silu", "softmax"}
#: ops whose input gradient needs only the output gradient (sums, copies, reshapes)
STRUCTURAL = {"add", "concat", "mean", "maxpool", "avgpool", "pool", "resample", "loss"}


def _saved(op: str, inputs: list[int], wrt: int, out: int) -> list[int]:
    """The forward values the input gradient of ``op`` with respect to ``wrt`` reads."""
    if op in WEIGHTED or op in STRUCTURAL:
        return []
    if op in SAVES_OUTPUT:
        return [out]
    if op in ("bmm", "mul"):
        return [u for u in inputs if u != wrt]
    return list(inputs)  # norms, gathers and the like: the inputs


def with_backward(graph: dict, *, seed: int = 0, weight_share: float = 0.5) -> dict:
    """The training graph of a forward graph dict: forward, backward, optimizer.

    For every forward node ``v`` with inputs (reverse program order) the backward computes
    the gradient of its output (``grad``: the sum over its readers of their input
    gradients, one node) and one input gradient per input edge (``vjp``, reading that
    gradient and what the op saved: ``_saved``); ops with a weight also get a weight gradient
    (reading the saved input; size drawn around ``weight_share`` of the output's) followed by
    an in-place optimizer ``update`` (4 bytes: weights and moments are resident). The loss
    reads the forward outputs; no gradient flows into the graph's inputs."""
    rng = np.random.default_rng([seed, len(graph["nodes"]), 17])
    fwd = graph["nodes"]
    index = {nd["id"]: i for i, nd in enumerate(fwd)}
    b = _Builder(graph["name"] + "-train")
    preds: list[list[int]] = [[] for _ in fwd]
    for s, t in graph["edges"]:
        preds[index[t]].append(index[s])
    for i, nd in enumerate(fwd):
        b.add(nd["op"], nd["bytes"], preds[i])
        b.nodes[-1]["cost"] = nd["cost"]
    outs = [i for i, nd in enumerate(fwd) if nd.get("output")]
    loss = b.add("loss", 4, outs)
    incoming: list[list[int]] = [[] for _ in fwd]  # input gradients each output receives
    for v in outs:
        incoming[v].append(loss)
    for v in reversed(range(len(fwd))):
        if not preds[v] or not incoming[v]:
            continue
        op, size = fwd[v]["op"], fwd[v]["bytes"]
        g = incoming[v][0] if len(incoming[v]) == 1 else b.add("grad", size, incoming[v])
        for u in preds[v]:
            if preds[u]:  # no gradient for the graph's inputs
                saved = _saved(op, preds[v], u, v)
                flops = fwd[v]["cost"] * 1e12
                incoming[u].append(b.add("vjp", fwd[u]["bytes"], [g, *saved], flops=flops))
        if op in WEIGHTED:
            share = weight_share * math.exp(rng.normal(0, 0.5))
            w = b.add("wgrad", size * share, [g, *preds[v]], flops=fwd[v]["cost"] * 1e12)
            b.add("update", 0, [w], output=True)
    return b.graph()
