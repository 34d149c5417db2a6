"""Performance model: peak memory of an order on one device, and a multi-device simulator.

Single device (the definition docs/graphopt.md uses): running node k allocates its output (a
view allocates nothing and keeps its root buffer alive); a buffer is freed right after the last
consumer of it and of all its views has run (with no consumer, right after its own step);
outputs are never freed; the peak is the largest resident sum while any node runs.

The fast evaluator precomputes, once per graph, which nodes use each buffer; an order is then
evaluated with a handful of numpy calls (last use per buffer by ``maximum.reduceat``, resident
bytes per step by a difference array and ``cumsum``), so search can afford thousands of orders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from timerl.errors import GraphError
from timerl.graphopt.graph import Graph

#: Runtime objective: an over-limit schedule costs this many serial runtimes per 100% excess.
INFEASIBLE_FACTOR = 10.0


def as_order(graph: Graph, order: Sequence[int] | Sequence[str] | np.ndarray) -> np.ndarray:
    """Turn node ids or indices into a validated index array (a topological permutation)."""
    if len(order) and isinstance(order[0], str):
        try:
            order = [graph.index[v] for v in order]  # type: ignore[index]
        except KeyError as err:
            raise GraphError(f"graph {graph.name!r}: order names unknown node {err}") from err
    arr = np.asarray(order, dtype=np.int64)
    validate_order(graph, arr)
    return arr


def validate_order(graph: Graph, order: np.ndarray) -> None:
    """Raise GraphError unless ``order`` runs every node once, after all its predecessors."""
    n = graph.n
    if order.shape != (n,):
        raise GraphError(f"graph {graph.name!r}: order has {order.size} entries, graph has {n}")
    if n == 0:
        return
    if order.min() < 0 or order.max() >= n or np.unique(order).size != n:
        raise GraphError(f"graph {graph.name!r}: order is not a permutation of the nodes")
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    if graph.num_edges():
        src, dst = graph.edges[:, 0], graph.edges[:, 1]
        bad = np.nonzero(pos[src] >= pos[dst])[0]
        if bad.size:
            s, d = graph.edges[bad[0]]
            raise GraphError(
                f"graph {graph.name!r}: order runs node {graph.nodes[d].id!r} "
                f"before its input {graph.nodes[s].id!r}"
            )


class PeakMemory:
    """Fast single-device peak-memory evaluator for one graph (precomputes buffer users)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        n = graph.n
        self.n = n
        bufs = np.nonzero((graph.alias < 0) & (graph.nbytes > 0))[0]
        self.buffers = bufs
        slot = np.full(n, -1, dtype=np.int64)
        slot[bufs] = np.arange(bufs.size)
        # (buffer slot, user) pairs: every consumer of a node living in the buffer, and the
        # buffer's producer itself (so a buffer with no consumer dies after its own step).
        e_src = graph.edges[:, 0] if graph.num_edges() else np.zeros(0, dtype=np.int64)
        e_dst = graph.edges[:, 1] if graph.num_edges() else np.zeros(0, dtype=np.int64)
        b_of_edge = slot[graph.root[e_src]]
        keep = b_of_edge >= 0
        b_all = np.concatenate([np.arange(bufs.size), b_of_edge[keep]])
        u_all = np.concatenate([bufs, e_dst[keep]])
        srt = np.lexsort((u_all, b_all))
        self.users = u_all[srt]
        b_sorted = b_all[srt]
        self.starts = np.searchsorted(b_sorted, np.arange(bufs.size)) if bufs.size else b_sorted
        out_slots = slot[graph.root[graph.is_output]]
        self.keep_to_end = np.zeros(bufs.size, dtype=bool)
        self.keep_to_end[out_slots[out_slots >= 0]] = True
        self.sizes = graph.nbytes[bufs].astype(np.float64)

    def __call__(self, order: np.ndarray) -> int:
        return self.peak(order)

    def peak(self, order: np.ndarray) -> int:
        """Peak resident bytes of a topological order (not checked here: see validate_order)."""
        return int(self.profile(order).max()) if self.n else 0

    def profile(self, order: np.ndarray) -> np.ndarray:
        """Resident bytes while each step of the order runs (int64, length n)."""
        n = self.n
        if self.buffers.size == 0:
            return np.zeros(n, dtype=np.int64)
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        last = np.maximum.reduceat(pos[self.users], self.starts)
        last[self.keep_to_end] = n - 1
        alloc = pos[self.buffers]
        diff = np.bincount(alloc, weights=self.sizes, minlength=n + 1)
        diff -= np.bincount(last + 1, weights=self.sizes, minlength=n + 1)
        return np.rint(np.cumsum(diff[:n])).astype(np.int64)

    def lifetimes(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per buffer, the step that allocates it and the last step it is resident, given
        every node's position (the inverse of an order)."""
        if self.buffers.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        last = np.maximum.reduceat(pos[self.users], self.starts)
        last[self.keep_to_end] = self.n - 1
        return pos[self.buffers], last

    def profile_of(self, alloc: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Resident bytes per step from :meth:`lifetimes` (float64, length n)."""
        n = self.n
        if alloc.size == 0:
            return np.zeros(n)
        diff = np.bincount(alloc, weights=self.sizes, minlength=n + 1)
        diff -= np.bincount(last + 1, weights=self.sizes, minlength=n + 1)
        return np.cumsum(diff[:n])

    def peak_batch(self, orders: np.ndarray) -> np.ndarray:
        """Peaks of many orders at once (shape ``(P, n)`` in, ``(P,)`` out)."""
        p, n = orders.shape
        if self.buffers.size == 0 or n == 0:
            return np.zeros(p, dtype=np.int64)
        pos = np.empty_like(orders)
        np.put_along_axis(pos, orders, np.broadcast_to(np.arange(n), orders.shape), axis=1)
        last = np.maximum.reduceat(pos[:, self.users], self.starts, axis=1)
        last[:, self.keep_to_end] = n - 1
        alloc = pos[:, self.buffers]
        off = (np.arange(p) * (n + 1))[:, None]
        w = np.broadcast_to(self.sizes, alloc.shape).ravel()
        diff = np.bincount((alloc + off).ravel(), weights=w, minlength=p * (n + 1))
        diff -= np.bincount((last + 1 + off).ravel(), weights=w, minlength=p * (n + 1))
        res = np.cumsum(diff.reshape(p, n + 1)[:, :n], axis=1)
        return np.rint(res.max(axis=1)).astype(np.int64)


def peak_memory(graph: Graph, order: Sequence[int] | Sequence[str] | np.ndarray) -> int:
    """Validated one-off evaluation (builds the evaluator; reuse PeakMemory in loops)."""
    return PeakMemory(graph).peak(as_order(graph, order))


def peak_memory_reference(graph: Graph, order: Sequence[int]) -> int:
    """Slow evaluator written step by step from the definition; the fast one is tested on it."""

    def root(v: int) -> int:
        while graph.nodes[v].alias_of is not None:
            v = graph.index[graph.nodes[v].alias_of]
        return v

    group = {b: [u for u in range(graph.n) if root(u) == b] for b in range(graph.n)}
    done: set[int] = set()
    resident: dict[int, int] = {}
    peak = 0
    for v in order:
        if graph.nodes[v].alias_of is None:
            resident[v] = graph.nodes[v].bytes
        peak = max(peak, sum(resident.values()))
        done.add(v)
        for b in list(resident):
            if any(graph.nodes[u].output for u in group[b]):
                continue
            users = {c for u in group[b] for c in graph.succs[u]}
            if users <= done:
                del resident[b]
    return peak


def max_working_set(graph: Graph) -> int:
    """Largest inputs-plus-output footprint of a single op (root buffers, each once).

    Every schedule on every device holds at least this much while that op runs, so a memory
    limit below it cannot be met by any order, placement or swap.
    """
    best = 0
    nbytes, root = graph.nbytes, graph.root
    for v in range(graph.n):
        bufs = {int(root[u]) for u in graph.preds[v]} | {int(root[v])}
        best = max(best, int(sum(int(nbytes[b]) for b in bufs)))
    return best


# ---------------------------------------------------------------------- multi-device model
@dataclass(frozen=True)
class Cluster:
    """K accelerators joined by links, optionally next to a host tier used for swapping.

    ``memory_limit`` applies to every accelerator; the host is unlimited. Nodes whose
    ``device`` field names one of ``devices`` are pinned there.
    """

    devices: tuple[str, ...] = ("d0",)
    memory_limit: int | None = None
    bandwidth: float = 25e9
    latency: float = 5e-6
    host: bool = False
    host_bandwidth: float = 12e9
    host_latency: float = 10e-6

    @classmethod
    def make(cls, k: int, memory_limit: int | None = None, host: bool = False) -> Cluster:
        return cls(tuple(f"d{i}" for i in range(k)), memory_limit=memory_limit, host=host)

    @property
    def k(self) -> int:
        return len(self.devices)

    def pins(self, graph: Graph) -> np.ndarray:
        """Device index each node is pinned to, or -1."""
        where = {d: i for i, d in enumerate(self.devices)}
        return np.array([where.get(nd.device, -1) for nd in graph.nodes], dtype=np.int64)


@dataclass
class SimResult:
    makespan: float
    peaks: np.ndarray  # peak bytes per accelerator
    start: np.ndarray = field(repr=False)
    finish: np.ndarray = field(repr=False)
    swapped: np.ndarray = field(repr=False)  # buffers actually swapped (valid decisions)


class Simulator:
    """Event simulation of an order + placement (+ swaps) on a Cluster.

    Each device runs its ops in the global order; an op starts when its device is free and
    its inputs are there. A cross-device input is sent once per (tensor, device) over the
    producer device's outgoing link (FIFO, ``latency + bytes/bandwidth``), overlapping compute;
    the copy occupies the receiver from the start of the transfer until its last use there,
    and keeps the sender's buffer alive until sent. A swapped buffer leaves the device across
    the longest gap between its uses: it is copied to host after the use before the gap
    (freed when the copy ends) and copied back starting when the op just before the next use
    starts (allocated from then on); that use waits for it. Swaps of outputs, and of buffers
    used on other devices, are ignored.
    """

    def __init__(self, graph: Graph, cluster: Cluster) -> None:
        self.graph = graph
        self.cluster = cluster
        self.pins = cluster.pins(graph)
        n = graph.n
        self.group_users: list[list[int]] = [[] for _ in range(n)]
        for v in range(n):
            r = int(graph.root[v])
            self.group_users[r].extend(graph.succs[v])
        self.group_out = np.zeros(n, dtype=bool)
        for v in np.nonzero(graph.is_output)[0]:
            self.group_out[graph.root[v]] = True
        self.serial = float(graph.cost.sum()) + 1e-9

    def normalise(self, placement: np.ndarray) -> np.ndarray:
        """Apply pins and put every view on its root buffer's device."""
        dev = np.where(self.pins >= 0, self.pins, placement).astype(np.int64)
        return dev[self.graph.root]

    def run(self, order: np.ndarray, placement: np.ndarray, swap: np.ndarray | None) -> SimResult:
        g, cl = self.graph, self.cluster
        n, k = g.n, cl.k
        dev = self.normalise(placement).tolist()
        nbytes = g.nbytes.tolist()
        cost = g.cost.tolist()
        root = g.root.tolist()
        alias = g.alias.tolist()
        order_l = order.tolist()
        pos = [0] * n
        for i, v in enumerate(order_l):
            pos[v] = i
        # swap plans: buffer -> (use before gap, op before next use, next use)
        out_after: dict[int, list[int]] = {}
        trig_at: dict[int, list[int]] = {}
        wait_at: dict[int, list[int]] = {}
        swapped = np.zeros(n, dtype=bool)
        if swap is not None and cl.host and swap.any():
            local_pos = [0] * n
            counters = [0] * k
            local_seq: list[list[int]] = [[] for _ in range(k)]
            for v in order_l:
                local_pos[v] = counters[dev[v]]
                counters[dev[v]] += 1
                local_seq[dev[v]].append(v)
            for b in np.nonzero(swap)[0].tolist():
                if alias[b] >= 0 or self.group_out[b] or not self.group_users[b]:
                    continue
                d = dev[b]
                users = set(self.group_users[b])
                if any(dev[u] != d for u in users):
                    continue
                uses = sorted({b, *users}, key=lambda u: local_pos[u])
                gaps = [local_pos[uses[i + 1]] - local_pos[uses[i]] for i in range(len(uses) - 1)]
                i = int(np.argmax(gaps))
                if gaps[i] < 2:
                    continue
                before, nxt = uses[i], uses[i + 1]
                trig = local_seq[d][local_pos[nxt] - 1]
                out_after.setdefault(before, []).append(b)
                trig_at.setdefault(trig, []).append(b)
                wait_at.setdefault(nxt, []).append(b)
                swapped[b] = True
        start = [0.0] * n
        finish = [0.0] * n
        dev_free = [0.0] * k
        link_free = [0.0] * k
        d2h_free = [0.0] * k
        h2d_free = [0.0] * k
        arrival: dict[tuple[int, int], float] = {}
        out_end: dict[int, float] = {}
        in_start: dict[int, float] = {}
        in_end: dict[int, float] = {}
        sent_until = [0.0] * n  # per root buffer: when its last outgoing transfer ends
        bw, lat = cl.bandwidth, cl.latency
        hbw, hlat = cl.host_bandwidth, cl.host_latency
        # memory events: (device, time, key, phase, delta)
        ev_dev: list[int] = []
        ev_t: list[float] = []
        ev_key: list[float] = []
        ev_ph: list[int] = []
        ev_d: list[int] = []

        def event(d: int, t: float, key: float, ph: int, delta: int) -> None:
            ev_dev.append(d)
            ev_t.append(t)
            ev_key.append(key)
            ev_ph.append(ph)
            ev_d.append(delta)

        for v in order_l:
            d = dev[v]
            ready = dev_free[d]
            for u in g.preds[v]:
                t = finish[u] if dev[u] == d else arrival[(u, d)]
                if t > ready:
                    ready = t
            if v in trig_at:  # prefetch starts with the op before the waiting use
                for b in trig_at[v]:
                    ts = max(ready, out_end[b], h2d_free[d])
                    te = ts + hlat + nbytes[b] / hbw
                    h2d_free[d] = te
                    in_start[b], in_end[b] = ts, te
                    event(d, ts, pos[v], 0, nbytes[b])
            if v in wait_at:
                for b in wait_at[v]:
                    ready = max(ready, in_end[b])
            start[v] = ready
            finish[v] = ready + cost[v]
            dev_free[d] = finish[v]
            if alias[v] < 0 and nbytes[v]:
                event(d, ready, pos[v], 0, nbytes[v])
            sent: set[int] = set()
            for w in g.succs[v]:
                dw = dev[w]
                if dw != d and dw not in sent:
                    sent.add(dw)
                    ts = max(finish[v], link_free[d])
                    te = ts + lat + nbytes[v] / bw
                    link_free[d] = te
                    arrival[(v, dw)] = te
                    r = root[v]
                    sent_until[r] = max(sent_until[r], te)
                    if nbytes[v]:
                        event(dw, ts, pos[v] + 0.5, 0, nbytes[v])
                        last = max((x for x in g.succs[v] if dev[x] == dw), key=pos.__getitem__)
                        event(dw, -1.0, pos[last], 1, -nbytes[v])  # time filled in below
            if v in out_after:
                for b in out_after[v]:
                    ts = max(finish[v], d2h_free[d])
                    te = ts + hlat + nbytes[b] / hbw
                    d2h_free[d] = te
                    out_end[b] = te
                    event(d, te, float(n), 1, -nbytes[b])
        # frees of each device-resident buffer after its last local use
        for b in range(n):
            if alias[b] >= 0 or not nbytes[b] or self.group_out[b]:
                continue
            d = dev[b]
            local = [u for u in self.group_users[b] if dev[u] == d]
            last = max(local, key=pos.__getitem__) if local else b
            t_free = finish[last]
            if sent_until[b] > t_free:
                event(d, sent_until[b], float(n), 1, -nbytes[b])
            else:
                event(d, t_free, pos[last], 1, -nbytes[b])
        t_arr = np.array(ev_t)
        key_arr = np.array(ev_key)
        ph_arr = np.array(ev_ph, dtype=np.int64)
        unset = t_arr < 0  # receiver-side frees: time of that consumer's finish
        if unset.any():
            at = np.asarray(order_l, dtype=np.int64)[key_arr[unset].astype(np.int64)]
            t_arr[unset] = np.asarray(finish)[at]
        peaks = np.zeros(k, dtype=np.int64)
        if ev_t:
            dv = np.array(ev_dev, dtype=np.int64)
            srt = np.lexsort((ph_arr, key_arr, t_arr, dv))
            dv, delta = dv[srt], np.array(ev_d, dtype=np.int64)[srt]
            run = np.cumsum(delta)
            first = np.searchsorted(dv, np.arange(k))
            base = np.where(first > 0, run[np.maximum(first - 1, 0)], 0)
            level = run - base[dv]
            np.maximum.at(peaks, dv, level)
        return SimResult(
            makespan=max(finish) if n else 0.0,
            peaks=peaks,
            start=np.array(start),
            finish=np.array(finish),
            swapped=swapped,
        )

    def objective(self, sim: SimResult, objective: str) -> float:
        """``peak-memory``: largest device peak; ``runtime``: makespan, penalised over limit."""
        if objective == "peak-memory":
            return float(sim.peaks.max()) if sim.peaks.size else 0.0
        value = sim.makespan
        limit = self.cluster.memory_limit
        if limit:
            excess = float(np.maximum(sim.peaks - limit, 0).sum())
            value += INFEASIBLE_FACTOR * self.serial * excess / limit
        return value
