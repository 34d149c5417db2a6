"""Translate the loop-body blocks of a schedule into graphopt graphs: the one model of a block
that both the compiler (``order.py``) and the graph corpus (its ``timerl`` family) use.

A compiled program's schedule is a tree of loops whose bodies hold compute statements. A run of
consecutive compute statements inside one loop body (a *block*) is a static region: at every
point of its enclosing loops the same ops run once each, in schedule order, with no control
flow in between. That is exactly the problem graphopt solves (order the ops of one static region
to lower its peak memory), so each block becomes one graph (the corpus keeps those with at least ``MIN_OPS`` ops).

Why blocks, not whole bodies: a body may hold nested loops between its compute statements, and
an op after a nested loop may read what that loop computed. The loop is not a node, so a graph
spanning it could order such an op before the loop. Splitting at nested loops keeps every
topological order of a graph a legal order of its block. The top level of the schedule (run
once: parameter initialisation, constants) is not exported: it is not a loop body and nearly all
of its values are read later, so no order changes its peak.

Modelling choices, all at the bounds the program was compiled with:

* **Nodes** are the block's ops in schedule order (program order is file order). Reads of ops
  outside the block (earlier loops, enclosing bodies, parameters, constants) and reads of the
  block's own ops at another point (``x[t - 1]``, ``x[i, 0:T]``) become one ``input`` node per
  source op, placed right before its first reader, with cost 0. Its bytes are what the block
  reads: the sum over the distinct index expressions it is read at, a slice read counting every
  point of the slice (the executor stacks a slice into a fresh buffer).
* **Edges** are the data edges between ops of the block read at the same point. A read of a
  block op at another point that may include the current one (``x[0:t+1]``) adds that edge too,
  so no order can run the reader first. Side-effecting ops (environment calls, sinks) keep their
  relative order through extra edges from each effect to the next one.
* **bytes** of an op: the element count of its shape times the item size of its dtype. Shapes
  that depend on the op's own point (``t + 1`` rows at point ``t``) take their largest value
  over the loops' ranges; a dynamic bound (``ctx.until``) takes its cap, or the size programs
  are validated with when it has none. An op returning a tuple (``env.step``) holds the sum of
  the parts its ``tuple_get`` readers take.
* **cost**: the cost model's count (``ir/prims/cost.py``: matmul ``2 * m * n * k`` times its
  batch, reductions the element count of their input, argsort ``n * ceil(log2 n)``, views 0,
  every other op the element count of its output), each size the largest over the loops'
  points, over a fixed reference rate of ``REFERENCE_FLOPS`` (1 TFLOP/s, the rate the PyTorch
  exporter of this corpus uses). No per-op launch constant is added.
* **Views**: ops whose numpy lowering returns its single input's buffer or a view of it
  (``reshape``, ``permute``, ``expand``, ``identity``, ``detach``, ``select_at``, ``narrow``,
  ``tuple_get``, ``getitem`` with a basic key) are ``alias_of`` that
  input and cost 0. ``merge`` (a piecewise definition) hands back the value of the branch that
  applies at the point. When every branch is read from outside the block (parameters at the
  first update, ``obs[i, t]`` from the reset or the previous step) the merge is a source of the
  graph, like an input node, with its own bytes and cost 0; otherwise several block values may
  be picked and no single one is its base, so it is modelled as a copy.
* **Outputs**: ops read outside the block or at another point (later loops, later timesteps),
  the program's kept outputs and stop conditions, side effects, and ops nobody reads.

Which prims are views, reductions, tuple sources or ordered effects is decided in one place,
``op_traits``, from the registry's traits; what an op costs, by the registry's cost model.

``strict_reads`` (the compiler's setting) also adds an edge for every read of an earlier op of
the block at another point (``x[t - 1]`` read after ``x[t]`` is computed would need both points
alive at once in a ring buffer): a valid order of that graph keeps every such read where the
written order has it relative to its source. ``resident_inputs`` (also the compiler's) gives
input nodes only the bytes of slice reads (stacked into a fresh buffer when read): a plain read
of a value computed outside the block moves no data, and that value is resident whatever the
block's order, so charging it to the block would only hide what the order changes. The
exception is a value computed before the block and freed inside it (the rollout's activations,
freed by the update's backward pass): it is live from the block's start until its last reader
there, so its input node holds its bytes and comes before every other source of the graph, and
an order that reaches its last reader early frees it early.

``state_on_disk`` (the compiler's under a memory budget, ``memory/point_swap.py``) models
carried state as that pass will place it: a merge of values from outside the block is
counted from its own place (the state is read back from disk right before it), and a value
read elsewhere only by such merges (the next update's moment) is not an output (it goes to
disk after its last reader here). The search then runs each optimiser step's moments in turn
instead of holding all of them at once.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.graphopt.graph import Graph, Node
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, View
from timerl.ir.prims.cost import estimate
from timerl.schedule.program import Compute, Free, Loop, Stmt
from timerl.schedule.scheduler import SAME, STRICT_FUTURE, STRICT_PAST, relation
from timerl.symbolic import Bound, Const, Dim, Expr, Slice, vevaluate

REFERENCE_FLOPS = 1e12
MIN_OPS = 8
# carried state of fewer bytes stays in memory under a budget (``memory/point_swap.py``):
# swapping it would not pay for a replay of the whole program each
POINT_SWAP_MIN_BYTES = 1 << 16
_ID_NUMBER = re.compile(r"#\d+")


# ---------------------------------------------------------------------- what a prim is
# The block model's categories of prims, read from the registry's ``Traits``.
_FROM_TRAITS: dict[str, Callable[[prims.Traits], bool]] = {
    "view": lambda t: t.view,  # hands back (a view of) its one input's buffer
    "reduction": lambda t: t.reduction,
    "tuple_source": lambda t: t.host or t.multi_output,  # its tuple_get readers take it apart
    "tuple_part": lambda t: t.tuple_part,  # takes one part of such a tuple
    "picks": lambda t: t.piecewise,  # hands back one of its inputs, chosen per point
    "ordered": lambda t: t.host,  # keeps its place among the effects even if not marked one
}


@functools.cache
def op_traits(prim_name: str) -> frozenset[str]:
    """The categories of a prim that the block model needs (see the comment above); an op
    built outside the registry (a test's) has none."""
    try:
        entry = prims.get(prim_name)
    except KeyError:
        return frozenset()
    return frozenset(name for name, rule in _FROM_TRAITS.items() if rule(entry.traits))


@dataclass
class Block:
    """A run of compute statements of one loop body: ``loops`` enclose it, outer first."""

    loops: tuple[Loop, ...]
    ops: list[Op] = field(default_factory=list)
    # ids of the ops whose memory statements free them among the block's statements: a value
    # computed before the block and freed in it is live from the block's start to its last
    # reader there, so the block's order decides how long it is held
    freed: set[int] = field(default_factory=set)

    @property
    def dims(self) -> tuple[Dim, ...]:
        return tuple(loop.dim for loop in self.loops)


def loop_blocks(body: Sequence[Stmt], loops: tuple[Loop, ...] = ()) -> list[Block]:
    """Every block of the loop bodies under ``body``, in schedule order (blocks of a body before
    those of the loops nested in it that follow them). Memory statements do not split a block;
    nested loops do."""
    out: list[Block] = []
    current: Block | None = None
    for stmt in body:
        if isinstance(stmt, Loop):
            current = None
            out.extend(loop_blocks(stmt.body, (*loops, stmt)))
        elif isinstance(stmt, Compute) and loops:
            if current is None:
                current = Block(loops)
                out.append(current)
            current.ops.append(stmt.op)
        elif isinstance(stmt, Free) and current is not None:
            current.freed.add(stmt.op.id)
    return out


def block_graph(
    block: Block,
    bounds: Mapping[Bound, int],
    readers: Mapping[int, list[tuple[Op, Edge]]],
    keep: set[int],
    name: str = "block",
    *,
    strict_reads: bool = False,
    resident_inputs: bool = False,
    state_on_disk: bool = False,
) -> tuple[Graph, dict[str, Op]]:
    """The graph of one block, and the op behind each node that is one (not the inputs).

    ``readers`` is ``consumers(ops)`` of the whole program, ``keep`` the ids of the values the
    user keeps; ``bounds`` gives every bound a value (a dynamic one its cap).
    """
    return _BlockExport(
        block, bounds, readers, keep, strict_reads, resident_inputs, state_on_disk
    ).graph(name)


# ---------------------------------------------------------------------- one block
class _BlockExport:
    def __init__(
        self,
        block: Block,
        bounds: Mapping[Bound, int],
        readers: Mapping[int, list[tuple[Op, Edge]]],
        keep: set[int],
        strict_reads: bool = False,
        resident_inputs: bool = False,
        state_on_disk: bool = False,
    ) -> None:
        self.strict_reads = strict_reads
        self.resident_inputs = resident_inputs
        self.state_on_disk = state_on_disk
        self.block = block
        self.bounds = bounds
        self.readers = readers
        self.keep = keep
        self.pos = {op.id: k for k, op in enumerate(block.ops)}

    # --- reads ------------------------------------------------------------------------------
    def _kind(self, edge: Edge) -> str:
        """``"same"``: a block op at the reader's point; ``"near"``: a block op at points that
        may include the reader's; ``"other"``: anything else (an input)."""
        if edge.src.id not in self.pos:
            return "other"
        rels = [relation(idx, d) for idx, d in zip(edge.index, edge.src.domain, strict=True)]
        if all(r == SAME for r in rels):
            return "same"
        if any(r in (STRICT_PAST, STRICT_FUTURE) for r in rels):
            return "other"
        return "near"

    def _read_bytes(self, edge: Edge, reader: Op) -> int:
        """Bytes one read hands its reader (a slice read stacks all its points)."""
        src = edge.src
        lead = [idx.size for idx in edge.index if isinstance(idx, Slice)]
        points = _max_product(lead, self.bounds, reader.domain) if lead else 1
        if _tuple_parts(src, self.readers):
            return points * self._out_bytes(src)
        try:
            shape = View(src, edge.index).shape[len(lead) :]
        except Exception:  # a slice of an op whose shape changes from point to point
            return points * self._out_bytes(src)
        return points * _max_product(shape, self.bounds, reader.domain) * _itemsize(src)

    # --- sizes and costs --------------------------------------------------------------------
    def _numel(self, op: Op) -> int:
        parts = _tuple_parts(op, self.readers)
        if parts:
            return sum(self._numel(p) for p in parts)
        return _max_product(op.shape, self.bounds, op.domain)

    def _out_bytes(self, op: Op) -> int:
        parts = _tuple_parts(op, self.readers)
        if parts:
            return sum(self._out_bytes(p) for p in parts)
        return _max_product(op.shape, self.bounds, op.domain) * _itemsize(op)

    def _flops(self, op: Op) -> float:
        """The op's elementary operations by the registry's cost model (``ir/prims/cost.py``),
        each size the largest over the loops' points."""
        if _is_view(op):
            return 0.0
        return estimate(op.prim, _BlockSizes(self, op), op.attrs)

    def _is_output(self, op: Op) -> bool:
        if op.effect or op.id in self.keep:
            return True
        users = self.readers.get(op.id, [])
        if not users:
            return True
        return any(
            (r.id not in self.pos or self._kind(e) != "same") and not self._swapped_state(r)
            for r, e in users
        )

    def _swapped_state(self, merge: Op) -> bool:
        """Whether ``merge`` picks carried state that a budget swaps to disk between updates
        (``state_on_disk``): read back right before the merge, sent out after its last reader."""
        return (
            self.state_on_disk
            and "picks" in op_traits(merge.prim)
            and self._out_bytes(merge) >= POINT_SWAP_MIN_BYTES
        )

    def _carried(self, merge: Op, index: int) -> dict[str, Any] | None:
        """In the compiler's form, the held input a merge of values from outside the block
        (a parameter or an optimiser's moment carried from the last update) hands on.

        Its branch is live since before the block and the merge returns that buffer, so it is
        live from the block's start whatever the order. Counted from the merge's place
        instead, a late merge looked like a late allocation: the search moved parameter
        merges past the backward pass that in fact held them (memory-e8 planned 407.6 MiB
        after 3,000 decodes, 403.7 after 300)."""
        if not self.resident_inputs or self._swapped_state(merge):
            return None
        return {
            "id": f"{index}:in:{_clean(merge.label)}",
            "op": "input",
            "bytes": self._out_bytes(merge),
            "cost": 0.0,
        }

    # --- the graph --------------------------------------------------------------------------
    def graph(self, name: str) -> tuple[Graph, dict[str, Op]]:
        nodes: list[dict[str, Any]] = []
        edges: list[tuple[str, str]] = []
        node_of: dict[int, str] = {}  # block op id -> its node id
        input_of: dict[int, dict[str, Any]] = {}  # source op id -> its input node
        input_reads: dict[int, dict[str, int]] = {}  # source op id -> index text -> bytes
        held: set[str] = set()  # input nodes of values live at the block's start
        last_effect: str | None = None
        for op in self.block.ops:
            preds: list[str] = []
            reads: list[str] = []  # per input edge, the node holding what it reads
            picks = _picks_outside(op, self._kind)
            if picks and self.strict_reads:
                preds.extend(node_of[e.src.id] for e in op.inputs if e.src.id in node_of)
            for edge in [] if picks else op.inputs:
                kind = self._kind(edge)
                if kind == "same":
                    reads.append(node_of[edge.src.id])
                    continue
                if (kind == "near" or self.strict_reads) and edge.src.id in node_of:
                    preds.append(node_of[edge.src.id])  # may read this very point
                src = edge.src
                entry = input_of.get(src.id)
                if entry is None:
                    entry = {
                        "id": f"{len(nodes)}:in:{_clean(src.label)}",
                        "op": "input",
                        "bytes": 0,
                        "cost": 0.0,
                    }
                    input_of[src.id] = entry
                    input_reads[src.id] = {}
                    nodes.append(entry)
                key = ", ".join(map(str, edge.index))
                stacked = any(isinstance(idx, Slice) for idx in edge.index)
                # computed before the block and freed in it
                freed_here = (
                    self.resident_inputs and src.id in self.block.freed and src.id not in self.pos
                )
                if freed_here:
                    held.add(entry["id"])  # live at the block's start, freed after its reader
                if self.resident_inputs and not stacked and not freed_here:
                    input_reads[src.id][key] = 0  # lives outside the block whatever the order
                else:
                    input_reads[src.id][key] = self._read_bytes(edge, op)
                reads.append(entry["id"])
            preds.extend(reads)
            carried = self._carried(op, len(nodes)) if picks else None
            if carried is not None:
                nodes.append(carried)
                held.add(carried["id"])
                preds.append(carried["id"])
            nid = f"{len(nodes)}:{_clean(op.label)}"
            node: dict[str, Any] = {"id": nid, "op": op.prim, "bytes": self._out_bytes(op)}
            node["cost"] = 0.0 if picks else self._flops(op) / REFERENCE_FLOPS
            if _is_view(op):
                node["alias_of"] = reads[0]
            elif carried is not None:
                node["alias_of"] = carried["id"]
            if self._is_output(op):
                node["output"] = True
            if op.effect or (self.strict_reads and "ordered" in op_traits(op.prim)):
                if last_effect is not None:
                    preds.append(last_effect)
                last_effect = nid
            edges.extend((p, nid) for p in dict.fromkeys(preds))
            node_of[op.id] = nid
            nodes.append(node)
        for src_id, per_index in input_reads.items():
            input_of[src_id]["bytes"] = int(sum(per_index.values()))
        if held:  # held inputs come first: every other source of the graph waits for them
            has_pred = {b for a, b in edges if a not in held}
            roots = [d["id"] for d in nodes if d["id"] not in has_pred and d["id"] not in held]
            edges.extend((h, r) for h in sorted(held) for r in roots)
        op_of = {nid: op for op in self.block.ops for nid in [node_of[op.id]]}
        return Graph(name, [_node(d) for d in nodes], edges), op_of


def _picks_outside(op: Op, kind: Callable[[Edge], str]) -> bool:
    """A merge all of whose branches are read from outside the block holds, at each point, one
    value that lives outside: it is a source of the block (like an input) and moves no data
    (``_BlockExport._carried``: held from the block's start in the compiler's form)."""
    return (
        "picks" in op_traits(op.prim)
        and bool(op.inputs)
        and all(kind(e) == "other" for e in op.inputs)
    )


def _node(d: dict[str, Any]) -> Node:
    return Node(
        id=d["id"],
        op=d["op"],
        bytes=int(d["bytes"]),
        cost=float(d["cost"]),
        output=bool(d.get("output", False)),
        alias_of=d.get("alias_of"),
    )


# ---------------------------------------------------------------------- helpers
def _clean(label: str) -> str:
    """An op's label without op numbers (they depend on what else the process built)."""
    return _ID_NUMBER.sub("", label)


def _itemsize(op: Op) -> int:
    return int(np.dtype(op.dtype).itemsize)


def _tuple_parts(op: Op, readers: Mapping[int, list[tuple[Op, Edge]]]) -> list[Op]:
    """The ``tuple_get`` readers of an op returning a tuple (none for other ops)."""
    if "tuple_source" not in op_traits(op.prim):
        return []
    return [r for r, _ in readers.get(op.id, []) if "tuple_part" in op_traits(r.prim)]


def _is_view(op: Op) -> bool:
    """The op hands back (a view of) its one input's buffer (``Prim.returns_view``)."""
    if len(op.inputs) != 1 or op.prim not in prims.REGISTRY:
        return False
    return prims.get(op.prim).returns_view(op.attrs)


class _BlockSizes:
    """The cost model's ``Sizes`` of one op of a block: each the largest over the points."""

    def __init__(self, export: _BlockExport, op: Op) -> None:
        self.export, self.op = export, op

    def out(self) -> int:
        return self.export._numel(self.op)

    def read(self, k: int) -> int:
        e = self.op.inputs[k]
        return self.export._read_bytes(e, self.op) // max(_itemsize(e.src), 1)

    def axis(self, k: int, axis: int) -> int | None:
        e = self.op.inputs[k]
        try:
            size = View(e.src, e.index).shape[axis]
        except Exception:
            size = e.src.shape[axis]
        return _max_product([size], self.export.bounds, self.op.domain)


def _max_product(sizes: Iterable[Expr], bounds: Mapping[Bound, int], dims: Sequence[Dim]) -> int:
    """The largest product of ``sizes`` over every point of ``dims`` (and of any other dim the
    sizes mention) at these bounds; at least 0."""
    sizes = list(sizes)
    if all(isinstance(s, Const) for s in sizes):
        return max(0, math.prod(s.value for s in sizes))  # type: ignore[attr-defined]
    syms = set().union(*(s.symbols() for s in sizes))
    grid_dims = [d for d in dims if d in syms]
    grid_dims += sorted((s for s in syms if isinstance(s, Dim) and s not in grid_dims), key=str)
    env: dict[Any, Any] = dict(bounds)
    if grid_dims:
        axes = np.meshgrid(*[np.arange(bounds[d.bound]) for d in grid_dims], indexing="ij")
        for d, axis in zip(grid_dims, axes, strict=True):
            env[d] = axis.ravel()
    total: Any = np.int64(1)
    for s in sizes:
        total = total * np.maximum(np.asarray(vevaluate(s, env), dtype=np.int64), 0)
    return int(np.max(total)) if np.size(total) else 0
