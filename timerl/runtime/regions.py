"""Runs of pure statements in one loop body, compiled by the backend as one function.

On a backend whose every op is a dispatch through a tracing library (jax: 10-50 us per eager
call), a loop body of twenty small ops costs more in dispatch than in arithmetic. For such a
backend (``backend.fuses``) the code generator groups each maximal run of consecutive compute
statements that are pure and static into a ``Region`` and emits one call of
``backend.fuse(key, fn)`` for it: ``fn`` takes the values the run reads from outside
(store reads, slices gathered as usual, locals) and returns the values read after it.

What stays out of a region, and why:

* host ops (a ``udf``, an environment step): user Python on numpy arrays, run between
  regions, never traced;
* ops whose shape changes from point to point (``x[0:t + 1]``), slice reads of a length that
  changes, and attributes that change but the backend cannot take as traced values
  (``backend.traced_attrs``, e.g. a ``select_at`` index can be traced, a shape cannot): each
  new shape would be a new trace;
* ragged ops (a list of differently shaped points).

Shapes in static bounds (``T`` given at compile time) count as fixed. A piecewise merge joins
a region: its branch is picked outside, by the same Python conditions as elsewhere, and passed
as a static argument (one trace per combination of branches the region meets, typically the
first point, the last and the rest); only the taken branch's value is read.

In a loop that runs in Python because it makes a host call at each point, a small region
runs as the numpy backend's kernels instead of one jitted call (``Fusion.kernels_reason``:
a jitted call's dispatch costs more than a few small kernels); its reads from outside are
converted to numpy arrays (``AsNumpy``), its values stay numpy arrays.

Random ops have no array inputs: they are drawn (by ``counter_rng`` in jnp) just before the
region, whose key is a point's Python ints, and read as inputs. Ops with different guards share a region: which guards hold is part of the
static argument, and a guarded-off op is neither computed nor are its reads made. A read of a
region op at a point that may be the one just computed ends the region, so stores are written
before they are read. Frees between a region's statements run after it: they drop values whose
readers all ran before them, so only the memory meter's peak can see the difference (the
region's values are live together, as they are inside the compiled function).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.errors import UndefinedPointError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.runtime.calls import prepare_call
from timerl.schedule.program import Compute, Free, Loop, Stmt
from timerl.symbolic import TRUE, Condition, Const, Expr, Slice

MIN_OPS = 2  # a single op gains nothing from its own compiled function

# When a region runs as numpy kernels instead of one jitted call (``Fusion.kernels_reason``).
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
# ``TIMERL_NUMPY_REGIONS=0`` jits every region (for tests and comparisons)
NUMPY_REGIONS_ENV = "TIMERL_NUMPY_REGIONS"


@dataclass(eq=False)
class Region:
    ops: list[Op] = field(default_factory=list)
    drawn: list[Op] = field(default_factory=list)  # random sources, drawn before the call
    frees: list[Free] = field(default_factory=list)
    stmts: list[Stmt] = field(default_factory=list)  # every statement, in schedule order
    # why it runs as numpy kernels rather than one jitted call (None: jitted)
    kernels: str | None = None
    numpy_draws: bool = False  # random sources drawn by numpy before a jitted region


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


def region_cost(region: Region, shape_of: Any) -> float:
    """The region's arithmetic in elementary operations, from ``prims``' cost estimates over
    its ops' static shapes (``shape_of``: a shape to ints)."""
    total = 0.0
    for op in region.drawn + region.ops:
        out = int(np.prod(shape_of(op.shape), dtype=np.int64))
        ins = [int(np.prod(shape_of(e.src.shape), dtype=np.int64)) for e in op.inputs]
        total += prims.get(op.prim).cost(out, ins, op.attrs)
    return total


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


def _computed_in(loop: Loop) -> Iterator[int]:
    """The ids of the ops ``loop``'s body computes, nested loops included."""
    for s in loop.body:
        if isinstance(s, Compute):
            yield s.op.id
        elif isinstance(s, Loop):
            yield from _computed_in(s)


REMEMBER_ELEMENTS = 1 << 16  # the largest array ``AsNumpy`` keeps alive between reads


class AsNumpy:
    """A value read by a region run as numpy kernels, as a numpy array: a jax array on the
    CPU is read in place (about 4 us a call, so the last one seen is remembered with its
    numpy view: the parameters a rollout reads at every step are converted once; a jax array
    never changes). Only small arrays are remembered, as remembering keeps one alive."""

    __slots__ = ("seen", "view")

    def __init__(self) -> None:
        self.seen: Any = None
        self.view: Any = None

    def __call__(self, x: Any) -> Any:
        if x.__class__ is np.ndarray:
            return x
        if x is self.seen:
            return self.view
        view = np.asarray(x)
        if view.size <= REMEMBER_ELEMENTS:
            self.seen, self.view = x, view
        return view


def _static(value: Any, bounds: dict) -> tuple[bool, Any]:
    """(True, value) if a point attribute is the same at every point (given static bounds)."""
    if isinstance(value, (tuple, list)):
        items = [_static(v, bounds) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if isinstance(value, Expr) and bounds:
        value = value.substitute(bounds)
    if isinstance(value, Const):
        return True, value.value
    if isinstance(value, (Expr, Condition)):
        return False, None
    return True, value


def optional(thunk: Any) -> Any:
    """A branch's value, or None where its point does not exist (or was freed; a local
    computed only under a guard that did not hold is unbound: a ``NameError`` in the
    closure that reads it). One function for every region kind: ``Fusion`` puts it in the
    generated code's namespace as ``OPTIONAL`` once, for all of them."""
    try:
        return thunk()
    except (KeyError, UndefinedPointError, NameError):
        return None


def _picks(picks: tuple, merges: list[str] | None = None) -> Any:
    """The merges' branch choices as one int32 array (one traced argument), or the error
    naming the first merge with no definition at this point."""
    if merges is not None:
        raise UndefinedPointError(f"{merges[picks.index(-1)]} has no definition at this point")
    return np.asarray(picks, dtype=np.int32)


def _zeros_or(backend: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    zeros: list[Any] = []

    def fill(value: Any) -> Any:
        if value is not None:
            return value
        if not zeros:
            zeros.append(backend.zeros(shape, dtype))
        return zeros[0]

    return fill


def _same_point(edge: Edge) -> bool:
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


class Fusion:
    """Groups a loop body's statements into regions and emits them through a ``CodeGen``.

    ``gen`` is the code generator (duck-typed here, so this module does not import it): its
    ``ops``, ``locals``, ``backend``, ``seed``, ``schedule``, ``names`` and its ``emit``,
    ``read_src``, ``const``, ``key_src``, ``alloc``, ``compute`` and ``free`` methods.
    """

    def __init__(self, gen: Any) -> None:
        self.gen = gen
        gen.ns["OPTIONAL"] = optional  # every region kind's reads of what may not exist
        self.readers: dict[int, set[int]] = {i: set() for i in gen.ops}
        for op in gen.ops.values():
            for e in op.inputs:
                self.readers[e.src.id].add(op.id)
        self.untils = {lp.until.id for lp in gen.schedule.loops() if lp.until is not None}
        self.traced = getattr(gen.backend, "traced_attrs", {})
        self.bounds: dict = {}
        # the numpy backend a region runs on where a jitted call costs more (None: never)
        self.host_kernels = getattr(gen.backend, "host_kernels", None)
        # regions run as numpy kernels, as ``explain()`` names them, and why
        self.notes: dict[str, str] = getattr(gen.backend, "kernel_notes", {})
        # random draws made by numpy's generator before a jitted region, and why
        self.draw_notes: dict[str, str] = getattr(gen.backend, "draw_notes", {})

    def set_bounds(self, static: dict) -> None:
        """The static bounds: shapes written in them are fixed for the program's life."""
        self.bounds = {b: Const(int(v)) for b, v in static.items()}

    def _fixed(self, shape: tuple) -> bool:
        return all(_static(s, self.bounds)[0] for s in shape)

    def _static_value(self, value: Any) -> tuple[bool, Any]:
        return _static(value, self.bounds)

    def _read_shape(self, edge: Edge) -> tuple[int, ...]:
        """The static shape of what ``edge`` reads (a slice's rows first)."""
        lead = [
            int(self._static_value(i.stop - i.start)[1]) for i in edge.index if isinstance(i, Slice)
        ]
        return (*lead, *self._static_shape(edge.src.shape))

    def _static_shape(self, shape: tuple) -> tuple[int, ...]:
        return tuple(int(v) for v in _static(tuple(shape), self.bounds)[1])

    # --- which statements ----------------------------------------------------------------------
    def eligible(self, op: Op) -> bool:
        traits = prims.get(op.prim).traits
        if op.prim == "tuple_get" and prims.get(op.inputs[0].src.prim).traits.host:
            return False  # an item of a host call's tuple: indexing it costs no dispatch
        return not traits.random and self.why_not_traced(op) is None

    def why_not_traced(self, op: Op) -> str | None:
        """Why ``op`` cannot be traced into a compiled function (None: it can); a random op
        can (its key's coordinates may be traced)."""
        rule = prims.get(op.prim)
        if rule.traits.host:
            return f"{op.label} ({op.prim}) is a host call"
        if rule.extra.get("ragged"):
            return f"{op.label} ({op.prim}) is ragged"
        if not self._fixed(op.shape):
            return f"the shape of {op.label} changes from point to point"
        traced = self.traced.get(op.prim, ())
        for n in rule.point_attrs:
            if rule.traits.random and n == "key_at":
                continue  # a random key's coordinates are evaluated on the traced indices
            if n in op.attrs and n not in traced and not _static(op.attrs[n], self.bounds)[0]:
                return f"attribute {n} of {op.label} ({op.prim}) changes from point to point"
        for e in op.inputs:
            if not self._fixed(e.src.shape):
                return f"{op.label} reads {e.src.label}, whose shape changes from point to point"
            for idx in e.index:
                if isinstance(idx, Slice) and not _static(idx.stop - idx.start, self.bounds)[0]:
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
                if not prims.get(s.op.prim).traits.random or not self._fixed(s.op.shape):
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
                    compiled.update(_computed_in(s))
                out.append(s)
                continue
            region.stmts.append(s)
        close()
        return out

    def _numpy_allowed(self) -> bool:
        """Whether anything may run as numpy kernels: on the CPU, unless switched off."""
        return self.host_kernels is not None and os.environ.get(NUMPY_REGIONS_ENV, "1") != "0"

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
        if not self._numpy_allowed():
            return None
        if compiled and self._computes_on(region, compiled):
            return None
        n = kernel_ops(region.ops + region.drawn)
        cost = region_cost(region, self._static_shape)
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
        self.notes[f"{len(ops)} ops in the loop over {loop.dim.name} ({what})"] = why
        return why

    @staticmethod
    def _computes_on(region: Region, compiled: set[int]) -> bool:
        """Whether a kernel of ``region`` reads a value of ``compiled``, directly or through
        the region's views and merges (which only pass it on)."""
        passed = set(compiled)
        for op in region.ops:
            reads = any(e.src.id in passed for e in op.inputs)
            if reads and launches_kernel(op):
                return True
            if reads:
                passed.add(op.id)
        return False

    def draws_reason(self, region: Region, loop: Loop, host: Op) -> bool:
        """Whether the random draws before a jitted region in a loop stepping the host are
        drawn by numpy's generator (the same bits): eagerly on jax the generator is a dozen
        dispatches (measured: 1.7 ms a draw of 16x2 uniforms in PPO's iteration, numpy
        0.3 ms), and the region takes a numpy array as it is."""
        if not self._numpy_allowed():
            return False
        drawn = Region(ops=list(region.drawn))
        if region_cost(drawn, self._static_shape) >= MAX_NUMPY_COST:
            return False
        what = ", ".join(o.label for o in region.drawn[:3])
        key = f"{len(region.drawn)} in the loop over {loop.dim.name} ({what})"
        self.draw_notes[key] = (
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
            e.src.id in members and not _same_point(e) and not _other_point(e) for e in op.inputs
        )

    # --- emitting ------------------------------------------------------------------------------
    def emit_kernels(self, region: Region, depth: int) -> None:
        """The region's statements in schedule order, each as the numpy backend's kernel (the
        code generator run with that backend, frees where they are), and every value read
        from outside the region converted to a numpy array."""
        gen = self.gen
        members = {m.id for m in region.ops} | {m.id for m in region.drawn}

        def through(edge: Edge, src: str) -> str:
            if edge.src.id in members:
                return src
            return f"{gen.const('ASNP', AsNumpy())}({src})"

        backend, gen.backend, gen.read_through = gen.backend, self.host_kernels, through
        try:
            for s in region.stmts:
                if isinstance(s, Free):
                    gen.free(s, depth)
                else:
                    gen.compute(s.op, depth)
        finally:
            gen.backend, gen.read_through = backend, None

    def emit(self, region: Region, depth: int) -> None:
        if region.kernels is not None:
            self.emit_kernels(region, depth)
            return
        gen = self.gen
        backend = gen.backend
        if region.numpy_draws:
            gen.backend = self.host_kernels
        try:
            for op in region.drawn:
                gen.compute(op, depth)
        finally:
            gen.backend = backend
        members = {m.id for m in region.ops}
        args: list[str] = []
        arg_keys: list[tuple] = []
        # the static argument: per guard whether it holds at this point; a guarded-off op is
        # not computed (nor its reads made). The traced one: per merge the index of the branch
        # taken, every branch passed (zeros where its point does not exist) and selected
        # inside, so the first iteration and the rest share one trace.
        selectors: list[str] = []
        picks: list[str] = []
        guards: dict[str, int] = {}
        merge_ids: list[int] = []

        def arg(src: str, key: tuple) -> int:
            if src not in args:
                args.append(src)
                arg_keys.append(key)
            return args.index(src)

        plan: list[tuple[Op, Any, int, list[tuple[bool, int]], dict, dict]] = []
        done: set[int] = set()
        for op in region.ops:
            guard = -1
            cond = ""
            if op.guard != TRUE:
                cond = gen.names.src(op.guard)
                if cond not in guards:
                    guards[cond] = len(selectors)
                    selectors.append(f"bool({cond})")
                guard = guards[cond]
            merge = prims.get(op.prim).traits.piecewise
            if merge:
                merge_ids.append(op.id)
                conds = [gen.names.src(e.cond) for e in op.inputs]
                picked = "-1"
                for k in reversed(range(len(conds))):
                    picked = f"({k} if {conds[k]} else {picked})"
                picks.append(picked)
            refs: list[tuple[bool, int]] = []
            for e in op.inputs:
                # a region op computed before this one, at this point; a later one (read at an
                # earlier point, a recurrence) is read from its store like any other value
                if e.src.id in done and _same_point(e):
                    refs.append((False, e.src.id))
                    continue
                src = gen.read_src(e)
                if merge:  # every branch, zeros where its point does not exist
                    fill = gen.const(
                        "ZEROS_OR", _zeros_or(gen.backend, self._read_shape(e), e.src.dtype)
                    )
                    src = f"{fill}(OPTIONAL(lambda: {src}))"
                # read only what is used here: a guarded-off op's points may not exist
                if guard >= 0:
                    src = f"({src} if _sel[{guard}] else None)"
                refs.append((True, arg(src, (e.src.id, tuple(str(i) for i in e.index), merge))))
            done.add(op.id)
            if merge:
                shape = _static(op.shape, self.bounds)[1]
                fn: Any = (len(picks) - 1, shape, op.dtype, op.where())
                plan.append((op, fn, guard, refs, {}, {}))
                continue
            call = prepare_call(op, gen.backend, gen.seed)
            traced = self.traced.get(op.prim, ())
            kwargs, dynamic = {}, {}
            for name, value in call.point_attrs:
                fixed, v = _static(value, self.bounds)
                if fixed:
                    kwargs[name] = v
                else:  # a traced argument: the backend's lowering takes it as an array
                    assert name in traced
                    dynamic[name] = arg(gen._attr_src(value), ("attr", op.id, name))
            plan.append((op, call.fn, guard, refs, kwargs, dynamic))
        # returned: what is stored or read after the region, and values whose byte count the
        # generated code takes from the array (a shape in static bounds is not inlined)
        outs = {
            m.id
            for m in region.ops
            if m.id not in gen.locals
            or m.id in self.untils
            or self.readers[m.id] - members
            or not all(isinstance(x, Const) for x in m.shape)
        }
        broadcast, select = gen.backend.broadcast, gen.backend.select

        def run(sel: tuple, picked: Any, *xs: Any) -> dict:
            vals: dict[int, Any] = {}
            for op, fn, guard, refs, kwargs, dynamic in plan:
                if guard >= 0 and not sel[guard]:
                    continue
                if isinstance(fn, tuple):  # a merge: the branch picked outside, selected here
                    which, shape, dtype, _ = fn
                    out = None
                    for k in reversed(range(len(refs))):
                        is_arg, j = refs[k]
                        value = xs[j] if is_arg else vals.get(j)
                        if value is None:  # guarded off here, so never the branch taken
                            continue
                        value = broadcast(value, shape, dtype)
                        out = value if out is None else select(picked[which] == k, value, out)
                    if out is None:
                        raise UndefinedPointError(f"{fn[3]} has no definition at this point")
                    vals[op.id] = out
                    continue
                ins = [xs[k] if is_arg else vals[k] for is_arg, k in refs]
                extra = {name: xs[k] for name, k in dynamic.items()}
                vals[op.id] = fn(*ins, **kwargs, **extra)
            return {i: v for i, v in vals.items() if i in outs}

        key = (tuple(m.id for m in region.ops), tuple(arg_keys), tuple(sorted(outs)))
        fused = gen.const("REGION", gen.backend.fuse(key, run))
        gen.emit(depth, f"_sel = ({''.join(f'{s}, ' for s in selectors)})")
        picks_src = "None"
        if picks:
            gen.ns.setdefault("PICKS", _picks)
            gen.emit(depth, f"_pk = ({''.join(f'{p}, ' for p in picks)})")
            merges = gen.const("MERGES", [op.where() for op in region.ops if op.id in merge_ids])
            gen.emit(depth, f"if -1 in _pk: PICKS(_pk, {merges})")
            picks_src = "PICKS(_pk)"
        gen.emit(depth, f"_r = {fused}(_sel, {picks_src}, {', '.join(args)})")
        for op in region.ops:
            body = depth
            if op.guard != TRUE:
                gen.emit(depth, f"if _sel[{guards[gen.names.src(op.guard)]}]:")
                body += 1
            if op.id in outs:
                gen.emit(body, f"v{op.id} = _r[{op.id}]")
            if op.id not in gen.locals:
                point = gen.key_src([gen.names.of(d) for d in op.domain])
                gen.emit(body, f"S{op.id}[{point}] = v{op.id}")
            gen.alloc(op, body, f"v{op.id}")
            gen.drop_stored(op, body, f"v{op.id}")
            gen.emit(body, "C[0] += 1")
        gen.emit(depth, "_r = None")
        for stmt in region.frees:
            gen.free(stmt, depth)
