"""Vectorisation: an op whose points along a dim do not depend on each other runs once, batched.

``X[.., t] = f(a[.., t], w)`` computed point by point inside the loop over ``t`` becomes
``XB[..] = f_batched(a[.., 0:T], w)``: an op without ``t`` in its domain whose value has a new
leading axis of size ``T``. It runs once, after ``a`` is complete, instead of ``T`` times.

An op X over ``t`` (``t`` the innermost dim of its domain) is vectorised when:

- it is pure (no effect or host call; a random op draws from a key that is a pure function
  of its point, so it batches too, except along the outermost dim) and its primitive has a
  batching rule below that accepts its operands (a user function never has one);
- a piecewise definition batches when its branches' conditions mention only ``t`` and
  static bounds, so that the branch taken at each point is known when compiling, and each
  branch reads its source at ``t + c`` (``c`` a constant) or not along ``t`` at all: the
  range splits into runs of points that take one branch, and the batched value is the
  runs' slices and broadcasts laid end to end (``next_value[t] = v[t + 1]`` for ``t < T -
  1``, ``last`` at ``T - 1`` is ``cat(v[1:T], last)``). More than ``MAX_RUNS`` runs stay in
  the loop: a cat of many small pieces costs more than the loop saves;
- every input is read at ``t`` itself or at an index that does not mention ``t`` (a read at
  ``t - 1`` is a recurrence), with no condition, and no temporal slice before ``t``'s axis;
- its attributes and shape do not change with ``t``, and ``T`` is a static bound (a dim
  ended by ``ctx.until`` has no length before its loop ends);
- it is on no dependence cycle through ``t`` (cycles carried by an outer dim, such as the
  parameters' ``i - 1``, do not count). Then nothing inside the loop that computes its
  inputs needs it before that loop ends, so XB can run between that loop and its readers;
- each reader reads it through the whole range ``X[.., 0:T]`` (and then reads XB directly,
  with no gather of T points), is itself vectorised along ``t`` (and reads XB as a batched
  operand), or reads one point (``X[.., T - 1]``, or ``X[.., t + 1]`` from a later loop such
  as GAE's): it reads a ``select_at`` view of XB, which allocates nothing. A read of part of
  the range (``X[0:t + 1]``) is declined;
- along the program's outermost dim (the training iteration) only whole chains are batched,
  whose batched inputs are batched too: gathering a value that loop computes would split it
  in two, and iteration hooks and resuming need the one loop that carries the training state.

Cost rule: the batch must fit ``MAX_BATCH_BYTES`` (``T`` x the bytes of one point of X). A
point-by-point op keeps one point live at a time where its readers allow; a batch keeps ``T``
at once, so the cap bounds what vectorisation may add to peak memory and leaves the rest of
a memory budget to the program. A larger batch is declined and stays in its loop.

Batching rules are a table keyed by primitive (``ir/prims/batching.py``, one table per
transformation, as in JAX): each gets the op, which operands are batched and their per-point
shapes, and returns the batched primitive and attributes, or declines with a reason.
``prog.explain()`` lists every vectorised op and each op over a dim that was not vectorised,
with the reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import networkx as nx
import numpy as np

from timerl.compiler.ragged import varies_along
from timerl.compiler.spec import ProgramSpec
from timerl.errors import TimerlError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, View, carried, consumers
from timerl.ir.grid import domain_grid
from timerl.ir.prims.batching import Batch, Batched, Decline, Run, Shape, batching
from timerl.ir.prims.core import HIDDEN_ATTRS
from timerl.ir.shapes import static_nbytes
from timerl.ir.validate import exclusive_conditions, validate
from timerl.symbolic import TRUE, Const, Dim, Expr, Slice, vevaluate

MAX_BATCH_BYTES = 64 << 20  # T x bytes of one point of an op: larger batches stay in the loop
MAX_RUNS = 8  # runs of one branch a batched piecewise definition may have


def _offset(op: Op, e: Edge, dim: Dim) -> int | None:
    """How far along ``dim`` a branch reads its source (None: the read does not move)."""
    k = _pos(e.src, dim)
    for j, idx in enumerate(e.index):
        if isinstance(idx, Slice):
            raise Decline(f"it reads {e!r}, a temporal slice")
        if j != k and _mentions(idx, dim):
            raise Decline(f"it reads {e!r}: another dim's index mentions {dim.name}")
    if k is None or not _mentions(e.index[k], dim):
        return None
    terms, const = e.index[k].linear()
    if terms != {dim: 1}:
        raise Decline(f"it reads {e!r}, not at {dim.name} plus a constant")
    if any(_mentions(s, dim) for s in e.src.shape):
        raise Decline(f"the shape of {e.src.label} changes along {dim.name}")
    if View(e.src, e.index).shape != op.shape:
        raise Decline(f"its branch {e.src.label} has another shape (it would need a broadcast)")
    return const


def _runs(op: Op, dim: Dim, size: int, static: dict) -> tuple[Run, ...]:
    """The runs of points along ``dim`` that take one branch each, first to last."""
    conds = exclusive_conditions(op)
    allowed = {dim, *static}
    for cond in conds:
        if not cond.symbols() <= allowed:
            other = sorted(s.name for s in cond.symbols() - allowed)
            raise Decline(f"its branches' conditions depend on {', '.join(other)}")
    env: dict = {**static, dim: np.arange(size)}
    taken = np.full(size, -1)
    for k, cond in reversed(list(enumerate(conds))):
        taken[np.broadcast_to(np.asarray(vevaluate(cond, env), dtype=bool), (size,))] = k
    if (taken < 0).any():
        raise Decline(f"it is undefined at {dim.name} = {int(np.argmax(taken < 0))}")
    starts = [0, *(np.flatnonzero(np.diff(taken)) + 1).tolist()]
    if len(starts) > MAX_RUNS:
        raise Decline(f"its branches alternate in {len(starts)} runs along {dim.name}")
    offsets = {k: _offset(op, op.inputs[k], dim) for k in set(taken.tolist())}
    runs = []
    for lo, hi in zip(starts, [*starts[1:], size], strict=True):
        k = int(taken[lo])
        if offsets[k] is not None and not 0 <= lo + offsets[k] <= hi + offsets[k] <= size:
            raise Decline(f"it reads {op.inputs[k]!r} outside 0..{dim.bound.name}-1")
        runs.append(Run(k, lo, hi, offsets[k]))
    return tuple(runs)


def _merge_runs(op: Op, dim: Dim, size: int, static: dict) -> tuple[Batched, tuple[bool, ...]]:
    """A piecewise definition as its runs laid end to end along a new leading axis."""
    if any(e.src.dtype != op.dtype for e in op.inputs):
        raise Decline("a branch has another dtype")
    runs = _runs(op, dim, size, static)
    offsets = {r.branch: r.offset for r in runs}
    moving = tuple(offsets.get(k) is not None for k in range(len(op.inputs)))
    return Batched("cat", {"axis": 0}, runs=runs), moving


# --- analysis ----------------------------------------------------------------------------------


def _mentions(item: Any, dim: Dim) -> bool:
    if isinstance(item, (Expr, Slice)):
        return dim in item.symbols()
    if isinstance(item, (tuple, list)):
        return any(_mentions(x, dim) for x in item)
    return False


def _pos(op: Op, dim: Dim) -> int | None:
    return op.domain.index(dim) if dim in op.domain else None


def _is_full(index: Any, dim: Dim) -> bool:
    return isinstance(index, Slice) and index.start == Const(0) and index.stop is dim.bound


def _cyclic(ops: Sequence[Op], dim: Dim) -> set[int]:
    """Ops on a dependence cycle through ``dim`` (ops over ``dim``; edges that move along a
    dim outside ``dim``'s loop do not count, those along a dim inside it do)."""
    inside = {op.id for op in ops if dim in op.domain}
    graph = nx.DiGraph()
    graph.add_nodes_from(inside)
    for op in ops:
        if op.id not in inside:
            continue
        for e in op.inputs:
            if e.src.id in inside and not carried(e, dim):
                graph.add_edge(e.src.id, op.id)
    out: set[int] = set()
    for comp in nx.strongly_connected_components(graph):
        if len(comp) > 1:
            out |= comp
    out |= {u for u, v in graph.edges if u == v}
    return out


def _in_range(op: Op, e: Edge, bounds: dict) -> bool:
    """The edge reads inside its source's domain at every point of the op (cheap cases)."""
    for d, idx in zip(e.src.domain, e.index, strict=True):
        if idx is d and d in op.domain or _is_full(idx, d):
            continue
        if any(isinstance(x, Dim) for x in idx.symbols()):
            return False  # depends on the point: leave it to the exact check
        lo, hi = (idx.start, idx.stop - 1) if isinstance(idx, Slice) else (idx, idx)
        try:
            if not 0 <= lo.evaluate(bounds) <= hi.evaluate(bounds) < bounds[d.bound]:
                return False
        except KeyError:
            return False
    return True


def _total(ops: Sequence[Op], bounds: dict) -> set[int]:
    """Ops that can be computed at every point of their domain (every read in range, every
    piecewise op defined), their inputs included. A batched op reads its inputs over the
    whole range although point by point only some points may have been needed (a branch
    that reads ``u[t + 1]`` exists only for ``t < T - 1``): only total inputs are gathered."""
    bad: list[Op] = []
    for op in ops:
        entry = batching(op.prim)
        defined = entry.defined if entry is not None else None
        if defined is not None and not defined(op, bounds):
            bad.append(op)
            continue
        piecewise = prims.get(op.prim).traits.piecewise  # its branches' guards decide
        if not piecewise and all(_in_range(op, e, bounds) for e in op.inputs):
            continue
        try:  # guards are not set yet: this checks every point of the domain
            validate([op], bounds)
        except TimerlError:
            bad.append(op)
    readers = consumers(ops)
    out = {op.id for op in ops}
    while bad:
        op = bad.pop()
        if op.id in out:
            out.discard(op.id)
            # a piecewise op reads a conditional branch only where the condition holds
            # (``h[t + 1] = f(u[t + 1])`` reads f's op at t - 1 for t >= 1, never at T - 1
            # where f reads past the end), so such a read is taken as defined: the branch's
            # condition is what the program wrote to keep the read in range
            bad.extend(r for r, e in readers[op.id] if not _guarded_branch(r, e))
    return out


def _guarded_branch(reader: Op, edge: Edge) -> bool:
    """The edge is a branch of a piecewise op that applies at some points only (the last,
    unconditional branch of ``h[t == 0] = x; h[True] = f(h[t - 1])`` applies at t >= 1)."""
    if not prims.get(reader.prim).traits.piecewise:
        return False
    k = next(j for j, e in enumerate(reader.inputs) if e is edge)
    return exclusive_conditions(reader)[k] != TRUE


def _operands(op: Op, dim: Dim) -> tuple[bool, ...]:
    """Which inputs change along ``dim`` (read at ``dim`` itself); Decline otherwise."""
    batched = []
    for e in op.inputs:
        if e.cond != TRUE:
            raise Decline(f"it reads {e.src.label} under a condition")
        k = _pos(e.src, dim)
        for j, idx in enumerate(e.index):
            if j != k and _mentions(idx, dim):
                raise Decline(f"it reads {e!r}: another dim's index mentions {dim.name}")
        if k is None or not _mentions(e.index[k], dim):
            batched.append(False)
            continue
        if e.index[k] is not dim:
            raise Decline(f"it reads {e!r} (a dependence between points of {dim.name})")
        if any(_mentions(s, dim) for s in e.src.shape):
            raise Decline(f"the shape of {e.src.label} changes along {dim.name}")
        if any(isinstance(i, Slice) for i in e.index[:k]):
            raise Decline(f"it reads {e!r}: a temporal slice before {dim.name}'s axis")
        batched.append(True)
    return tuple(batched)


def _local(op: Op, spec: ProgramSpec, roots: set[int]) -> tuple[Batched, tuple[bool, ...]]:
    """The op's batched form along its innermost dim, or Decline with the reason."""
    dim = op.domain[-1]
    traits = prims.get(op.prim).traits
    if op.id in roots:
        raise Decline("it is an output, effect or stop condition of the program")
    one_branch = traits.piecewise and len(op.inputs) == 1 and op.inputs[0].cond == TRUE
    if op.effect or traits.host or traits.constant:
        kind = "a side effect" if op.effect else ("a user function" if traits.host else None)
        raise Decline(f"it is {kind or 'a constant'}")
    if traits.piecewise and not one_branch and spec.dims and dim is spec.dims[0]:
        raise Decline("it is a piecewise definition along the outermost dim")
    if traits.random and spec.dims and dim is spec.dims[0]:
        raise Decline(
            "it is random along the outermost dim: batched, every iteration's numbers would be "
            "held at once"
        )
    entry = batching(op.prim)
    if entry is None:
        raise Decline(f"primitive {op.prim} has no batching rule")
    if dim.bound not in spec.static:
        raise Decline(f"{dim.bound.name} is known only when its loop ends (ctx.until)")
    if dim in varies_along(op, spec.ragged):
        raise Decline(f"it depends on a length ctx.until sets at each {dim.name}")
    free = entry.dim_attrs
    for name, value in op.attrs.items():
        if name not in HIDDEN_ATTRS and name not in free and _mentions(value, dim):
            raise Decline(f"its attribute {name} changes with {dim.name}")
    if any(_mentions(s, dim) for s in op.shape):
        raise Decline(f"its shape changes with {dim.name}")
    size = spec.static[dim.bound]
    nbytes = static_nbytes(op.shape, op.dtype, spec.check_bounds)
    if nbytes is None:
        raise Decline("its shape is not static")
    if nbytes * size > MAX_BATCH_BYTES:
        raise Decline(f"the batch ({nbytes * size} bytes) exceeds {MAX_BATCH_BYTES} bytes")
    if traits.piecewise and not one_branch:
        return _merge_runs(op, dim, size, dict(spec.static))
    batched = _operands(op, dim)
    shapes = tuple(View(e.src, e.index).shape for e in op.inputs)
    answer = entry.rule(Batch(op, batched, shapes, dim, size))
    if not any(batched) and not answer.from_unbatched:
        raise Decline(f"no input changes along {dim.name}")
    return answer, batched


def _reader_ok(x: Op, reader: Op, edge: Edge, chosen: dict[int, Any], bounds: dict) -> str | None:
    """None when ``reader`` can read X's batched form; else why not."""
    dim = x.domain[-1]
    idx = edge.index[-1]
    if _is_full(idx, dim):
        return None
    if isinstance(idx, Slice):
        return f"{reader.label} reads {edge!r}, a part of the range of {dim.name}"
    if reader.id in chosen and reader.domain[-1] is dim and idx is dim:
        return None
    if any(isinstance(i, Slice) for i in edge.index):
        return f"{reader.label} reads {edge!r}: a point of {dim.name} inside a temporal slice"
    if not _point_in_range(reader, edge, idx, bounds):
        # the view's index is an attribute validation does not see: keep the edge it checks
        return f"{reader.label} reads {edge!r}, which may leave 0..{dim.bound.name}-1"
    return None  # a point: the reader reads a select_at view of the batch


def _point_in_range(reader: Op, edge: Edge, idx: Expr, bounds: dict) -> bool:
    """The point read is inside 0..T-1 wherever the reader's edge applies (every point of the
    reader, under the edge's condition for a piecewise reader)."""
    dim = edge.src.domain[-1]
    env = domain_grid(reader.domain, bounds)
    n = len(env[reader.domain[0]]) if reader.domain else 1
    active = np.ones(n, dtype=bool)
    if prims.get(reader.prim).traits.piecewise:
        k = next(j for j, e in enumerate(reader.inputs) if e is edge)
        active = np.broadcast_to(
            np.asarray(vevaluate(exclusive_conditions(reader)[k], env), dtype=bool), (n,)
        )
    try:
        at = np.broadcast_to(np.asarray(vevaluate(idx, env)), (n,))
    except KeyError:
        return False
    return bool(np.all(((at >= 0) & (at < bounds[dim.bound])) | ~active))


def _gathered_total(x: Op, chosen: dict[int, Any], total: set[int]) -> list[str]:
    dim = x.domain[-1]
    for e, batched in zip(x.inputs, chosen[x.id][1], strict=True):
        whole = e.src.id in chosen and e.src.domain[-1] is dim
        if batched and not whole and e.src.id not in total:
            return [f"{e.src.label} is not defined at every point of the range it would read"]
    return []


def _run_sources(x: Op, chosen: dict[int, Any], total: set[int]) -> list[str]:
    """A run of a batched piecewise definition reads its source along the dim: as a slice of
    the source's points, or of its batched value when that is batched along the same dim.
    Its branches are read wherever the batch is needed, not only where they win, so a
    source must be defined at every point (``p[t == T - 1] = u[i + 1]`` may be read at
    ``i = I - 1`` where the program never took that branch)."""
    dim = x.domain[-1]
    for r in chosen[x.id][0].runs:
        e = x.inputs[r.branch]
        if e.src.id in chosen:
            if r.offset is not None and e.src.domain[-1] is not dim:
                return [f"it reads {e!r}, batched along {e.src.domain[-1].name}"]
        elif e.src.id not in total:
            return [f"{e.src.label} is not defined at every point it would be read"]
    return []


def _whole_chain(x: Op, chosen: dict[int, Any]) -> list[str]:
    """Along the outermost dim only chains that start from values fixed before the loop are
    batched: gathering a value its loop computes would split that loop in two, and iteration
    hooks and resuming need the one loop that carries the training state."""
    dim = x.domain[-1]
    for e, batched in zip(x.inputs, chosen[x.id][1], strict=True):
        if batched and (e.src.id not in chosen or e.src.domain[-1] is not dim):
            return [f"it reads {e!r}, computed in the loop over {dim.name} (the outermost dim)"]
    return []


def plan(spec: ProgramSpec) -> tuple[dict[int, tuple[Batched, tuple[bool, ...]]], list[str]]:
    """The ops to vectorise (id -> batched form) and one note per op considered."""
    roots = {r.id for r in spec.roots}
    readers = consumers(spec.ops)
    ops = [op for op in spec.ops if op.domain]
    cyclic: dict[Dim, set[int]] = {}
    chosen: dict[int, tuple[Batched, tuple[bool, ...]]] = {}
    why: dict[int, str] = {}
    for op in ops:
        dim = op.domain[-1]
        if dim not in cyclic:
            cyclic[dim] = _cyclic(spec.ops, dim)
        try:
            if op.id in cyclic[dim]:
                raise Decline(f"it is on a recurrence over {dim.name}")
            if spec.static.get(dim.bound) == 1:
                # a loop of one iteration: batching adds an axis and saves no call (and a
                # recurrence whose steps the bounds leave out is not one to batch over)
                raise Decline(f"{dim.name} has one point")
            chosen[op.id] = _local(op, spec, roots)
        except Decline as e:
            why[op.id] = str(e)
    outer = spec.dims[0] if spec.dims else None
    bounds = spec.check_bounds
    total = _total(spec.ops, bounds) if chosen else set()
    changed = True
    while changed:  # a reader that is dropped may drop what it reads
        changed = False
        for op in ops:
            if op.id not in chosen:
                continue
            reasons = itertools.chain(
                _gathered_total(op, chosen, total),
                _run_sources(op, chosen, total) if chosen[op.id][0].runs else (),
                (_reader_ok(op, r, e, chosen, bounds) for r, e in readers[op.id]),
            )
            if op.domain[-1] is outer:
                reasons = itertools.chain(_whole_chain(op, chosen), reasons)
            for reason in reasons:
                if reason is not None:
                    del chosen[op.id]
                    why[op.id] = reason
                    changed = True
                    break
    notes = []
    for op in ops:
        dim = op.domain[-1]
        if op.id in chosen:
            runs = chosen[op.id][0].runs
            how = f"{op.prim}: {len(runs)} runs, one branch each" if runs else op.prim
            notes.append(f"vectorised {op.label} over {dim.name} ({how})")
        else:
            notes.append(f"not vectorised {op.label} over {dim.name}: {why[op.id]}")
    return chosen, notes


# --- rewriting ---------------------------------------------------------------------------------


class _Rewriter:
    def __init__(self, spec: ProgramSpec, chosen: dict[int, tuple[Batched, tuple[bool, ...]]]):
        self.spec = spec
        self.chosen = chosen
        self.new: dict[int, Op] = {}
        self.extra: list[Op] = []
        self.views: dict[tuple, Op] = {}  # one select_at view per (op, point) read
        for op in spec.ops:
            if op.id in chosen:
                dim = op.domain[-1]
                batched = chosen[op.id][0]
                size = Const(spec.static[dim.bound])
                self.new[op.id] = Op(
                    prim=batched.prim,
                    domain=op.domain[:-1],
                    shape=(size, *op.shape),
                    dtype=op.dtype,
                    attrs=batched.attrs,
                    name=op.name,
                    site=op.site,
                    id=op.id,
                )
            else:
                self.new[op.id] = op.unwired()

    def _dims(self, index: Sequence[Any]) -> tuple[Dim, ...]:
        used: set[Dim] = set()
        for i in index:
            used.update(s for s in i.symbols() if isinstance(s, Dim))
        return tuple(d for d in self.spec.dims if d in used)

    def edge(self, reader: Op, e: Edge) -> tuple[Edge, bool]:
        """The reader's edge in the rewritten graph, and whether it carries the batch axis."""
        src, index = e.src, e.index
        if src.id in self.chosen:
            sdim = src.domain[-1]
            idx, rest = index[-1], tuple(index[:-1])
            target = self.new[src.id]
            if reader.id in self.chosen and reader.domain[-1] is sdim and idx is sdim:
                return Edge(target, rest, e.cond), True
            key = (src.id, rest, idx)
            if not _is_full(idx, sdim) and key in self.views:
                target, rest = self.views[key], self.views[key].domain
            elif not _is_full(idx, sdim):  # a point that does not move with sdim: a view
                view = Op(
                    prim="select_at",
                    domain=self._dims((*rest, idx)),
                    shape=src.shape,
                    dtype=src.dtype,
                    inputs=[Edge(target, rest)],
                    attrs={"index": idx},
                    name=f"{src.label}@",
                    site=src.site,
                )
                self.extra.append(view)
                self.views[key] = view
                target, rest = view, view.domain
            src_new, index = target, rest
        else:
            src_new = self.new[src.id]
        if reader.id in self.chosen:
            dim = reader.domain[-1]
            k = _pos(src_new, dim)
            if k is not None and index[k] is dim:
                full = Slice(Const(0), dim.bound)
                return self._gather(src_new, (*index[:k], full, *index[k + 1 :]), e.cond), True
        return Edge(src_new, tuple(index), e.cond), False

    def _gather(self, src: Op, index: tuple, cond: Any) -> Edge:
        """A read of ``src`` over the whole range, stacked once however many batched ops read
        it (an identity op: a view of the executor's one gather)."""
        key = (src.id, index)
        if key not in self.views:
            dims = self._dims(index)
            view = View(src, index)
            self.views[key] = Op(
                prim="identity",
                domain=dims,
                shape=view.shape,
                dtype=src.dtype,
                inputs=[Edge(src, index)],
                name=f"stack({src.label})",
                site=src.site,
            )
            self.extra.append(self.views[key])
        gathered = self.views[key]
        return Edge(gathered, gathered.domain, cond)

    def wire(self) -> list[Op]:
        for op in self.spec.ops:
            new = self.new[op.id]
            if op.id not in self.chosen:
                new.inputs = [self.edge(op, e)[0] for e in op.inputs]
                continue
            batched = self.chosen[op.id][0]
            if batched.runs:
                new.inputs = [self._run(new, op, run) for run in batched.runs]
                continue
            rank = batched.operand_rank
            inputs = []
            for e in op.inputs:
                edge, is_batched = self.edge(op, e)
                point = View(e.src, e.index).shape
                if is_batched and rank is not None and len(point) < rank:
                    edge = self._pad(new, edge, point, rank)
                inputs.append(edge)
            new.inputs = inputs
        return [self.new[op.id] for op in self.spec.ops] + self.extra

    def _run(self, reader: Op, op: Op, run: Run) -> Edge:
        """One run of a batched piecewise definition: its branch's points ``lo + offset ..
        hi + offset`` (a view of a batched source, or a slice of the source's points), or
        the branch's one value broadcast over the run."""
        e = op.inputs[run.branch]
        length = run.hi - run.lo
        shape = (Const(length), *op.shape)
        if run.offset is None:
            edge = self.edge(op, e)[0]
            src: Op = Op(
                prim="expand",
                domain=reader.domain,
                shape=shape,
                dtype=op.dtype,
                inputs=[Edge(edge.src, edge.index)],
                attrs={"shape": shape},
                name=f"{e.src.label}+{length}",
            )
        elif e.src.id in self.chosen:
            rest = tuple(e.index[:-1])
            target = self.new[e.src.id]
            if length == self.spec.static[op.domain[-1].bound]:
                return Edge(target, rest)
            src = Op(
                prim="narrow",
                domain=self._dims(rest),
                shape=shape,
                dtype=op.dtype,
                inputs=[Edge(target, rest)],
                attrs={"axis": 0, "start": run.lo + run.offset, "length": length},
                name=f"{e.src.label}[{run.lo + run.offset}:{run.hi + run.offset}]",
            )
        else:
            k = _pos(e.src, op.domain[-1])
            part = Slice(Const(run.lo + run.offset), Const(run.hi + run.offset))
            return Edge(self.new[e.src.id], (*e.index[:k], part, *e.index[k + 1 :]))
        self.extra.append(src)
        return Edge(src, src.domain)

    def _pad(self, reader: Op, edge: Edge, point: Shape, rank: int) -> Edge:
        """A batched operand with singleton axes after the batch axis, up to ``rank``."""
        size = reader.shape[0]
        shape = (size, *([Const(1)] * (rank - len(point))), *point)
        pad = Op(
            prim="reshape",
            domain=reader.domain,
            shape=shape,
            dtype=edge.src.dtype,
            inputs=[edge],
            attrs={"shape": shape},
            name=f"{edge.src.label}+1",
        )
        self.extra.append(pad)
        return Edge(pad, tuple(reader.domain))


def vectorize(spec: ProgramSpec, notes: list[str] | None = None) -> ProgramSpec:
    """The program with each op that qualifies (module docstring) run as one batched op."""
    chosen, lines = plan(spec)
    if notes is not None:
        notes.extend(lines)
    if not chosen:
        return spec
    return spec.with_ops(_Rewriter(spec, chosen).wire())
