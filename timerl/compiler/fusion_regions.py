"""Which runs of pure statements of a loop body compile as one call (``schedule/fused.Region``).

On a backend whose every op is a dispatch through a tracing library (jax: 10-50 us per eager
call), a loop body of twenty small ops costs more in dispatch than in arithmetic. For such a
backend each maximal run of consecutive compute statements that are pure and static becomes a
``Region``, which the runtime emits as one call of ``backend.fuse(key, fn)``.

What stays out of a region, and why:

* host ops (a ``udf``, an environment step): user Python on numpy arrays, run between
  regions, never traced;
* ops whose shape changes from point to point (``x[0:t + 1]``), slice reads of a length that
  changes, and attributes that change but the backend cannot take as traced values
  (``traced_attrs``, e.g. a ``select_at`` index can be traced, a shape cannot): each new
  shape would be a new trace;
* ragged ops (a list of differently shaped points).

Shapes in static bounds (``T`` given at compile time) count as fixed. A piecewise merge joins
a region (its branch is picked outside and passed in). Random ops have no array inputs: they
are drawn just before the region and read as its inputs. Ops with different guards share a
region. A read of a region op at a point that may be the one just computed ends the region,
so stores are written before they are read. Frees between a region's statements run after it.

In a loop that runs in Python because it makes a host call at each point, a small region
runs as the numpy backend's kernels instead of one jitted call (``kernels_reason``: a jitted
call's dispatch costs more than a few small kernels), where the backend offers them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.schedule.fused import Region, static_value
from timerl.schedule.program import Compute, Free, Loop, Stmt
from timerl.symbolic import Bound, Const, Slice

MIN_OPS = 2  # a single op gains nothing from its own compiled function

# When a region runs as numpy kernels instead of one jitted call (``kernels_reason``).
# Measured on the CPU (jax 0.10, numpy 2.4, one thread) on PPO's policy step over gymnasium
# CartPole (16 observations, 2x64 tanh, a categorical sample: 12 ops, 150k operations): the
# jitted call took 100-250 us until its action was ready (more under load), the same ops as
# numpy kernels 69 us (1.6-11.5 us each, their arithmetic included) plus about 10 us of the
# generated Python around them. Their arithmetic costs about as much on either side (the
# same BLAS products, elementwise ops on a thousand elements), so what decides is the number
# of calls: a region is cheaper as kernels while the count of its ops that launch a kernel
# (``kernel_ops``: views and merges pick or reshape a buffer, launching none) times
# NUMPY_OP_US stays under JIT_CALL_US (the low end of what a call was measured to cost), and
# only while its arithmetic (``prims`` cost estimates, elementary operations) stays under
# MAX_NUMPY_COST, about a millisecond of numpy, past which what a compiled function saves by
# fusing is worth more than one dispatch.
JIT_CALL_US = 120.0
NUMPY_OP_US = 6.0
MAX_NUMPY_COST = 1_000_000.0


class Shapes:
    """Shapes and per-point attributes under the program's static bounds: fixed for the
    program's life where written in them."""

    def __init__(self, static: Mapping[Bound, int]) -> None:
        self.bounds = {b: Const(int(v)) for b, v in static.items()}

    def fixed(self, shape: tuple) -> bool:
        return all(static_value(s, self.bounds)[0] for s in shape)

    def value(self, value: Any) -> tuple[bool, Any]:
        return static_value(value, self.bounds)

    def shape(self, shape: tuple) -> tuple[int, ...]:
        return tuple(int(v) for v in static_value(tuple(shape), self.bounds)[1])

    def read_shape(self, edge: Edge) -> tuple[int, ...]:
        """The static shape of what ``edge`` reads (a slice's rows first)."""
        lead = [int(self.value(i.stop - i.start)[1]) for i in edge.index if isinstance(i, Slice)]
        return (*lead, *self.shape(edge.src.shape))


def launches_kernel(op: Op) -> bool:
    """Whether ``op`` launches a kernel as numpy's: views and merges pick or reshape a buffer.
    A jitted call costs per buffer too, so a region of PPO's parameters carried from one
    iteration into the next (a merge each, and the Adam moments') cost 1 ms as a call,
    against the microseconds of its few kernels."""
    traits = prims.get(op.prim).traits
    return not (traits.view or traits.piecewise)


def kernel_ops(ops: list[Op]) -> int:
    """How many of ``ops`` launch a kernel (``launches_kernel``)."""
    return sum(1 for op in ops if launches_kernel(op))


def region_cost(ops: list[Op], shapes: Shapes) -> float:
    """The arithmetic of ``ops`` in elementary operations, from ``prims``' cost estimates over
    their static shapes."""
    total = 0.0
    for op in ops:
        out = int(np.prod(shapes.shape(op.shape), dtype=np.int64))
        ins = [int(np.prod(shapes.shape(e.src.shape), dtype=np.int64)) for e in op.inputs]
        total += prims.get(op.prim).cost(out, ins, op.attrs)
    return total


def largest_kernel(ops: Iterable[Op], static: Mapping[Bound, int]) -> float:
    """The most elementary operations one of ``ops`` costs where its shapes are static: what
    sets the threads its program runs on (``runtime/backend.program_threads``)."""
    shapes = Shapes(static)
    fixed = (
        op
        for op in ops
        if shapes.fixed(op.shape) and all(shapes.fixed(e.src.shape) for e in op.inputs)
    )
    return max((region_cost([op], shapes) for op in fixed), default=0.0)


def host_call_in(loop: Loop) -> Op | None:
    """The first host call (an env step, a udf) ``loop``'s body makes at each of its points,
    nested loops included; None if it makes none."""
    for s in loop.body:
        if isinstance(s, Compute) and prims.get(s.op.prim).traits.host:
            return s.op
        if isinstance(s, Loop):
            found = host_call_in(s)
            if found is not None:
                return found
    return None


def computed_in(loop: Loop) -> Iterator[int]:
    """The ids of the ops ``loop``'s body computes, nested loops included."""
    for s in loop.body:
        if isinstance(s, Compute):
            yield s.op.id
        elif isinstance(s, Loop):
            yield from computed_in(s)


def same_point(edge: Edge) -> bool:
    return len(edge.index) == len(edge.src.domain) and all(
        i is d for i, d in zip(edge.index, edge.src.domain, strict=True)
    )


def _other_point(edge: Edge) -> bool:
    """The read is never of the current point: some coordinate is off by a nonzero constant."""
    if len(edge.index) != len(edge.src.domain):
        return False
    for i, d in zip(edge.index, edge.src.domain, strict=True):
        if isinstance(i, Slice):
            continue
        off = i - d
        if isinstance(off, Const) and off.value != 0:
            return True
    return False


class RegionPlanner:
    """Groups loop bodies' statements into regions. ``traced_attrs``: per primitive, the
    per-point attributes the backend takes as traced values; ``numpy_kernels``: whether a
    small region in a loop stepping the host may run as numpy kernels (on the CPU)."""

    def __init__(
        self, shapes: Shapes, traced_attrs: Mapping[str, Any], numpy_kernels: bool
    ) -> None:
        self.shapes = shapes
        self.traced = traced_attrs
        self.numpy_kernels = numpy_kernels
        # regions run as numpy kernels, as ``explain()`` names them, and why
        self.kernel_notes: dict[str, str] = {}
        # random draws made by numpy's generator before a jitted region, and why
        self.draw_notes: dict[str, str] = {}

    # --- which statements ----------------------------------------------------------------------
    def eligible(self, op: Op) -> bool:
        traits = prims.get(op.prim).traits
        if traits.tuple_part and prims.get(op.inputs[0].src.prim).traits.host:
            return False  # an item of a host call's tuple: indexing it costs no dispatch
        return not traits.random and self.why_not_traced(op) is None

    def why_not_traced(self, op: Op) -> str | None:
        """Why ``op`` cannot be traced into a compiled function (None: it can); a random op
        can (its key's coordinates may be traced)."""
        rule = prims.get(op.prim)
        shapes = self.shapes
        if rule.traits.host:
            return f"{op.label} ({op.prim}) is a host call"
        if rule.extra.get("ragged"):
            return f"{op.label} ({op.prim}) is ragged"
        if not shapes.fixed(op.shape):
            return f"the shape of {op.label} changes from point to point"
        traced = self.traced.get(op.prim, ())
        for n in rule.point_attrs:
            if rule.traits.random and n == "key_at":
                continue  # a random key's coordinates are evaluated on the traced indices
            if n in op.attrs and n not in traced and not shapes.value(op.attrs[n])[0]:
                return f"attribute {n} of {op.label} ({op.prim}) changes from point to point"
        for e in op.inputs:
            if not shapes.fixed(e.src.shape):
                return f"{op.label} reads {e.src.label}, whose shape changes from point to point"
            for idx in e.index:
                if isinstance(idx, Slice) and not shapes.value(idx.stop - idx.start)[0]:
                    return f"{op.label} reads a slice of {e.src.label} whose length changes"
        return None

    def group(self, stmts: list[Stmt], loop: Loop | None = None) -> list[Stmt | Region]:
        """The statements, with each run of at least ``MIN_OPS`` fusible ops as one region;
        ``loop``: the loop whose body they are, run in Python (None: the top level)."""
        out: list[Stmt | Region] = []
        region: Region | None = None
        host = host_call_in(loop) if loop is not None else None
        # values this body computes in compiled code (a jitted region, a nested loop that
        # makes no host call): still being computed when the Python after the call runs
        compiled: set[int] = set()

        def close() -> None:
            nonlocal region
            if region is not None:
                # in a loop stepping the host, a single op or random draw may run as a
                # numpy kernel too (an eager jax op or a draw costs a dispatch of its own)
                if host is not None and loop is not None:
                    region.kernels = self.kernels_reason(region, loop, host, compiled)
                    if region.kernels is None and region.drawn:
                        region.numpy_draws = self.draws_reason(region, loop, host)
                if region.kernels is not None or len(region.ops) >= MIN_OPS:
                    out.append(region)
                    if region.kernels is None:
                        compiled.update(op.id for op in region.ops)
                else:
                    out.extend(region.stmts)
            region = None

        for s in stmts:
            if isinstance(s, Compute) and self.eligible(s.op):
                op = s.op
                if region is not None and self._reads_other_point(op, region):
                    close()
                if region is None:
                    region = Region()
                region.ops.append(op)
            elif (
                isinstance(s, Compute)
                and not s.op.inputs
                and (region is not None or host is not None)
            ):
                # a random source, drawn just before the region (in a loop stepping the host,
                # one may begin a region: it may run as a numpy kernel)
                if not prims.get(s.op.prim).traits.random or not self.shapes.fixed(s.op.shape):
                    close()
                    out.append(s)
                    continue
                if region is None:
                    region = Region()
                region.drawn.append(s.op)
            elif region is not None and isinstance(s, Free):
                region.frees.append(s)
            else:
                close()
                if isinstance(s, Loop) and host_call_in(s) is None:
                    compiled.update(computed_in(s))
                out.append(s)
                continue
            region.stmts.append(s)
        close()
        return out

    def kernels_reason(
        self, region: Region, loop: Loop, host: Op, compiled: set[int] | None = None
    ) -> str | None:
        """Why ``region`` runs as numpy kernels (None: as one jitted call). Only in a loop
        that runs in Python because it makes a host call at each point (each point is then
        one call of the region, and the host call takes numpy arrays anyway), on a backend
        whose arrays numpy reads in place (the CPU), and while the cost rule above holds.

        Not where a kernel would compute on a value of ``compiled`` (computed by an earlier
        jitted call of this body): numpy would wait for XLA there, where a jitted call is
        queued behind it and the Python after it runs meanwhile (measured on PPO with
        gymnasium CartPole: the region after the update as kernels made the iteration 2-3 ms
        slower)."""
        if not self.numpy_kernels:
            return None
        if compiled and computes_on(region, compiled):
            return None
        n = kernel_ops(region.ops + region.drawn)
        cost = region_cost(region.drawn + region.ops, self.shapes)
        if n * NUMPY_OP_US >= JIT_CALL_US or cost >= MAX_NUMPY_COST:
            return None
        why = (
            f"{n} kernels x {NUMPY_OP_US:g} us < a {JIT_CALL_US:g} us jitted call, "
            f"{cost:,.0f} operations < {MAX_NUMPY_COST:,.0f}; the loop over {loop.dim.name} "
            f"calls {host.label} at each point"
        )
        ops = region.drawn + region.ops
        names = [o.name for o in ops if o.name and "#" not in o.name][:3]
        what = ", ".join(names or [ops[0].label])
        region.name = f"{len(ops)} ops in the loop over {loop.dim.name} ({what})"
        self.kernel_notes[region.name] = why
        return why

    def draws_reason(self, region: Region, loop: Loop, host: Op) -> bool:
        """Whether the random draws before a jitted region in a loop stepping the host are
        drawn by numpy's generator (the same bits): eagerly on jax the generator is a dozen
        dispatches (measured: 1.7 ms a draw of 16x2 uniforms in PPO's iteration, numpy
        0.3 ms), and the region takes a numpy array as it is."""
        if not self.numpy_kernels:
            return False
        if region_cost(region.drawn, self.shapes) >= MAX_NUMPY_COST:
            return False
        what = ", ".join(o.label for o in region.drawn[:3])
        region.name = f"{len(region.drawn)} in the loop over {loop.dim.name} ({what})"
        self.draw_notes[region.name] = (
            f"before a jitted region; the loop over {loop.dim.name} calls {host.label} at "
            "each point"
        )
        return True

    def _reads_other_point(self, op: Op, region: Region) -> bool:
        """Whether ``op`` reads a region op at a point that may be the one the region is
        computing (it would read the store before the region writes it). A read at a constant
        offset along some dim (``x[t - 1]``, ``x[u + 1]``) is of another point: it was stored
        by an earlier iteration and is read from the store before the call."""
        members = {m.id for m in region.ops}
        return any(
            e.src.id in members and not same_point(e) and not _other_point(e) for e in op.inputs
        )


def computes_on(region: Region, compiled: set[int]) -> bool:
    """Whether a kernel of ``region`` reads a value of ``compiled``, directly or through the
    region's views and merges (which only pass it on)."""
    passed = set(compiled)
    for op in region.ops:
        reads = any(e.src.id in passed for e in op.inputs)
        if reads and launches_kernel(op):
            return True
        if reads:
            passed.add(op.id)
    return False
