"""The schedule as a fusing backend runs it: the fusion pass's decisions, as statements.

``compiler/fusion.py`` decides, for a backend that compiles several statements into one call
(jax), which statements run that way, and writes its decisions here as statements that wrap
the schedule's own:

* ``Region``: a run of pure compute statements of one loop body (with the frees between them)
  compiled as one call, or run as numpy kernels where a call would cost more;
* ``FusedLoop``: a whole loop as one call (one ``lax.fori_loop``, or one ``vmap``);
* ``FusedBody``: a loop whose every iteration, its inner loops included, is one call.

Each means exactly the statements it wraps, run in order (``unfused`` gives them back): a
fused statement changes how many calls a run makes, never what it computes, stores, frees or
counts. The runtime emits the calls (``runtime/regions.py``, ``loop_regions.py``,
``body_regions.py``) and decides nothing. ``LoopPlan`` and ``BodyPlan`` are what a backend
traces: plain data over op ids, whose kernels the runtime binds for its backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Union

import numpy as np

from timerl.ir.graph import Edge, Op
from timerl.schedule.program import Free, Loop, Schedule, Stmt
from timerl.symbolic import Bound, Condition, Const, Dim, Expr, Symbol


@dataclass(eq=False)
class Region:
    """A run of pure statements of one loop body compiled as one call. ``ops``: its compute
    statements' ops, traced; ``drawn``: random sources drawn just before the call (no array
    inputs); ``frees``: the frees between them, run after the call; ``stmts``: every
    statement, in schedule order (what the region means)."""

    ops: list[Op] = field(default_factory=list)
    drawn: list[Op] = field(default_factory=list)
    frees: list[Free] = field(default_factory=list)
    stmts: list[Stmt] = field(default_factory=list)
    # why it runs as numpy kernels rather than one jitted call (None: jitted)
    kernels: str | None = None
    numpy_draws: bool = False  # random sources drawn by numpy before a jitted region
    name: str = ""  # how ``explain()`` names it where it runs as kernels or draws by numpy


@dataclass(eq=False)
class LoopStep:
    """One op of a traced body. ``refs``: per input, ``("val", op id)`` (this iteration),
    ``("last", op id)`` (the previous iteration's), ``("hist", op id, index)`` (any iteration
    of the loop), ``("closed", k)`` (the k-th closed-over input) or ``("rows", k)`` (the k-th
    per-iteration input, at this iteration); in a ``BodyPlan``, the refs it names."""

    op_id: int
    shape: tuple[int, ...]
    dtype: np.dtype
    refs: list[tuple]
    merge: bool = False  # picks the first branch whose condition holds (``conds``)
    conds: tuple[Condition, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)  # per-point attributes, fixed
    traced: dict[str, Any] = field(default_factory=dict)  # attribute -> index expression(s)
    coords: tuple | None = None  # a random op's key coordinates, evaluated on traced indices
    multi: bool = False  # returns a tuple (``Traits.multi_output``), taken apart by tuple_get
    # bound by the runtime for its backend (``runtime/loop_regions.bind_steps``)
    fn: Callable[..., Any] | None = None
    key: tuple | None = None  # ((seed, stream), coordinates) of a random op


@dataclass(eq=False)
class LoopPlan:
    """What the backend traces: ``fn(closed, rows, symbols) -> (finals, rows_out)``."""

    dim: Dim
    forward: bool
    extent: int
    steps: list[LoopStep]
    symbols: tuple[Symbol, ...]  # the enclosing loops' indices, passed as traced ints
    consts: dict[Symbol, int]  # static bounds
    last: dict[int, tuple[tuple[int, ...], np.dtype]]  # carried: the latest value
    hist: dict[int, tuple[tuple[int, ...], np.dtype]]  # carried: every iteration's value
    finals: tuple[int, ...]  # returned: the last iteration's value
    rows_out: tuple[int, ...]  # returned: every iteration's value, as one array per iteration
    # a value of ``rows_out`` that is a contiguous view (a reshape) of another's point: no
    # history of its own, the other's history reshaped after the loop (op -> (source, shape))
    derived: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def parallel(self) -> bool:
        """No iteration reads another's values (nothing carried, no history read): the
        iterations may run at once, as one batched computation."""
        return all(r[0] not in ("last", "hist") for st in self.steps for r in st.refs)

    def note(self) -> str:
        """How ``explain()`` names the traced loop."""
        many = self.extent > 1 and self.parallel
        return "one vmap (iterations independent)" if many else "one XLA loop"


@dataclass(eq=False)
class FusedLoop:
    """``loop`` run as one call of its ``plan``. ``closed``: inputs read once before the
    call; ``rows``: inputs read at every iteration; ``finals`` / ``rows_out``: what the
    loop's frees leave alive (the last iteration's value; every point, or the ones kept);
    ``outside_frees``: frees of values from outside the loop made in it, replayed after."""

    loop: Loop
    plan: LoopPlan
    ops: list[Op]
    closed: list[Edge]
    rows: list[Edge]
    finals: list[Op]
    rows_out: list[tuple[Op, tuple[int, ...] | None]]  # None: every point; else the ones kept
    outside_frees: list[Free]
    live_bytes: int  # what the meter counts live while the call runs

    def single_rows(self) -> frozenset[int]:
        """The values a one-iteration loop returns stacked that its last value already
        holds: neither returned nor stored stacked (an update loop of one epoch and one
        minibatch)."""
        if self.plan.extent != 1:
            return frozenset()
        dim = self.loop.dim
        return frozenset(
            op.id for op, _ in self.rows_out if op.domain[-1] is dim and op.id in self.plan.finals
        )


@dataclass(eq=False)
class NestedLoop:
    """An inner loop of a fused body: its plan, where its closed and per-iteration inputs come
    from (refs as ``BodyPlan`` reads them) and the ops whose results the call returns."""

    plan: LoopPlan
    closed: list[tuple]
    rows: list[tuple]
    keep: frozenset[int]
    keep_rows: frozenset[int] = frozenset()  # of ``keep``, those returned stacked


@dataclass(eq=False)
class BodyPlan:
    """What the backend traces: ``fn(inputs, index) -> (outs, per nested loop (finals, rows))``.

    ``items``: a ``LoopStep`` (refs: ``("in", k)`` the k-th input, ``("val", id)`` a
    straight-line value, ``("fin", id)`` an inner loop's last value, ``("at", id, index)`` /
    ``("slice", id, start, stop)`` / ``("rows", id)`` its every-iteration array at a point, a
    slice or whole, ``("moving", id, index, dim, n)`` its rows at another loop's index) or the
    position of a ``NestedLoop`` in ``loops``."""

    dim: Dim
    consts: dict
    items: list[LoopStep | int]
    loops: list[NestedLoop]
    outs: tuple[int, ...]
    # (input position, op): inputs the iteration frees, donated to the call
    donate: tuple[tuple[int, int], ...] = ()
    n_inputs: int = 0


@dataclass(eq=False)
class FusedBody:
    """Each iteration of ``loop`` as one call of ``plan``. ``inputs``: what the call reads
    from stores (``("closed", edge, None)`` once, ``("rows", edge, inner loop)`` at every
    iteration of an inner loop); ``loops``: its inner loops, fused; ``top``: its straight-line
    ops; ``deferred``: host calls run after the call; ``needed``: values stored after it."""

    loop: Loop
    plan: BodyPlan
    inputs: list[tuple[str, Edge, Loop | None]]
    loops: list[FusedLoop]
    top: list[Op]
    deferred: set[int]
    needed: set[int]
    live_bytes: int
    key: tuple = field(default_factory=tuple)


FusedStmt = Union[Stmt, Region, FusedLoop, FusedBody]


@dataclass(eq=False)
class FusedSchedule:
    """The schedule's statements as the backend runs them.

    ``body``: for a run of the whole schedule; ``hooked``: the same, but for the outer loop
    as a run with iteration hooks (or resuming) needs it, its iterations in Python
    (``outer``: that statement of ``hooked``; None where the schedule has no one outer loop).
    ``loops``: each loop as ``explain()`` names it, and whether it is one call or why not
    (``hooked_loops``: where a run with hooks does otherwise); ``kernels`` / ``draws``: the
    regions run as numpy kernels and the random draws numpy makes, and why."""

    body: list[FusedStmt]
    hooked: list[FusedStmt]
    outer: FusedStmt | None = None
    fuses_loops: bool = False
    loops: dict[str, str] = field(default_factory=dict)
    hooked_loops: dict[str, str] = field(default_factory=dict)
    kernels: dict[str, str] = field(default_factory=dict)
    draws: dict[str, str] = field(default_factory=dict)

    def dump(self) -> str:
        """``body`` as indented pseudo-code: each fused statement as one line saying what it
        runs as one call, the rest as ``Schedule.dump`` writes it."""
        lines: list[str] = []

        def names(ops: list[Op]) -> str:
            shown = [o.label for o in ops[:3]]
            return ", ".join(shown) + (", ..." if len(ops) > 3 else "")

        def visit(body: list[FusedStmt], depth: int) -> None:
            pad = "  " * depth
            for s in body:
                if isinstance(s, Region):
                    how = "numpy kernels" if s.kernels is not None else "one call"
                    ops = s.drawn + s.ops
                    lines.append(f"{pad}region of {len(ops)} ops ({names(ops)}): {how}")
                elif isinstance(s, FusedLoop):
                    head = Schedule([s.loop]).dump().splitlines()[0]
                    lines.append(f"{pad}{head} {s.plan.note()} ({len(s.ops)} ops)")
                elif isinstance(s, FusedBody):
                    head = Schedule([s.loop]).dump().splitlines()[0]
                    inner = f", {len(s.loops)} inner loops" if s.loops else ""
                    lines.append(f"{pad}{head} one call per iteration ({len(s.top)} ops{inner})")
                elif isinstance(s, Loop):
                    lines.append(f"{pad}{Schedule([replace(s, body=[])]).dump()}")
                    visit(s.body, depth + 1)
                else:
                    lines.append(f"{pad}{Schedule([s]).dump()}")

        visit(self.body, 0)
        return "\n".join(lines)


def unfused(body: list[FusedStmt]) -> list[Stmt]:
    """The schedule's own statements that ``body`` runs, in order: what it means."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Region):
            out.extend(s.stmts)
        elif isinstance(s, (FusedLoop, FusedBody)):
            out.append(s.loop)
        elif isinstance(s, Loop):
            out.append(replace(s, body=unfused(s.body)))
        else:
            out.append(s)
    return out


def describe(loop: Loop, ops: list[Op]) -> str:
    """A loop as ``explain()`` names it: its header and the first of the user's tensors."""
    d = loop.dim
    rng = f"0 .. {d.bound.name}-1" if loop.forward else f"{d.bound.name}-1 .. 0"
    names = [o.name for o in ops if o.name and "#" not in o.name][:3] or [o.label for o in ops[:1]]
    what = f": {', '.join(names)}" if names else ""
    return f"for {d.name} in {rng} ({len(ops)} ops{what})"


def static_value(value: Any, bounds: Mapping[Bound, Const]) -> tuple[bool, Any]:
    """``(True, value)`` where a per-point attribute is the same at every point given the
    static ``bounds``; ``(False, None)`` where it changes with the point."""
    if isinstance(value, (tuple, list)):
        items = [static_value(v, bounds) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if isinstance(value, Expr) and bounds:
        value = value.substitute(bounds)
    if isinstance(value, Const):
        return True, value.value
    if isinstance(value, (Expr, Condition)):
        return False, None
    return True, value


def nbytes_of(shape: tuple[int, ...], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
