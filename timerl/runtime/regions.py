"""Regions (``schedule/fused.Region``) emitted as one compiled call, or as numpy kernels.

``compiler/fusion_regions.py`` decides which runs of pure statements are regions; here the
code generator's source for one is written: one call of ``backend.fuse(key, fn)``, where
``fn`` takes the values the run reads from outside (store reads, gathered slices, locals,
per-point indices the lowering accepts traced) and returns the values read after it.

The static argument of the jitted function holds, per guard, whether it holds at this point:
a guarded-off op is neither computed nor are its reads made, and a region retraces once per
combination of guards it meets. A merge's branch is not part of it: every branch's value is
passed (zeros where its point does not exist, say the previous iteration's parameter at
``i == 0``) with the index of the one taken, and selected with ``where`` inside, so a PPO
iteration body traces once, not once for the first iteration and again for the rest. Random
sources are drawn (by ``counter_rng`` in jnp, or numpy's where the region says so) just before
the call and passed in. Frees between a region's statements run after it: only the memory
meter's peak can see the difference (the region's values are live together, as they are
inside the compiled function).

A region run as numpy kernels (``Region.kernels``) is the numpy backend's statements, emitted
by the code generator with that backend; its reads from outside are converted to numpy arrays
(``AsNumpy``), its values stay numpy arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from timerl.errors import UndefinedPointError
from timerl.ir import prims
from timerl.ir.graph import Edge, Op
from timerl.runtime.calls import prepare_call
from timerl.schedule.fused import Region, static_value
from timerl.schedule.program import Free
from timerl.symbolic import TRUE, Const, Slice

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


def optional(thunk: Any) -> Any:
    """A branch's value, or None where its point does not exist (or was freed; a local
    computed only under a guard that did not hold is unbound: a ``NameError`` in the
    closure that reads it). One function for every fused statement: ``RegionEmitter`` puts
    it in the generated code's namespace as ``OPTIONAL`` once, for all of them."""
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


class RegionEmitter:
    """Emits regions through a ``CodeGen`` (duck-typed here, so this module does not import
    it): its ``ops``, ``locals``, ``backend``, ``seed``, ``schedule``, ``names``, ``bounds``
    and its ``emit``, ``read_src``, ``const``, ``key_src``, ``store``, ``compute`` and
    ``free`` methods (``statements.py``)."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen
        gen.ns["OPTIONAL"] = optional  # every fused statement's reads of what may not exist
        self.readers: dict[int, set[int]] = {i: set() for i in gen.ops}
        for op in gen.ops.values():
            for e in op.inputs:
                self.readers[e.src.id].add(op.id)
        self.untils = {lp.until.id for lp in gen.schedule.loops() if lp.until is not None}
        self.traced = getattr(gen.backend, "traced_attrs", {})
        # the numpy backend a region runs on where a jitted call costs more
        self.host_kernels = getattr(gen.backend, "host_kernels", None)
        # the names of the regions run as numpy kernels (``prog.stats()["numpy_regions"]``)
        self.kernel_regions: set[str] = getattr(gen.backend, "kernel_regions", set())

    def _read_shape(self, edge: Edge) -> tuple[int, ...]:
        """The static shape of what ``edge`` reads (a slice's rows first)."""
        bounds = self.gen.bounds
        lead = [
            int(static_value(i.stop - i.start, bounds)[1])
            for i in edge.index
            if isinstance(i, Slice)
        ]
        return (*lead, *(int(v) for v in static_value(tuple(edge.src.shape), bounds)[1]))

    def emit_kernels(self, region: Region, depth: int) -> None:
        """The region's statements in schedule order, each as the numpy backend's kernel (the
        code generator run with that backend, frees where they are), and every value read
        from outside the region converted to a numpy array."""
        gen = self.gen
        self.kernel_regions.add(region.name)
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
                shape = static_value(op.shape, gen.bounds)[1]
                fn: Any = (len(picks) - 1, shape, op.dtype, op.where())
                plan.append((op, fn, guard, refs, {}, {}))
                continue
            call = prepare_call(op, gen.backend, gen.seed)
            traced = self.traced.get(op.prim, ())
            kwargs, dynamic = {}, {}
            for name, value in call.point_attrs:
                fixed, v = static_value(value, gen.bounds)
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
            gen.store(op, f"v{op.id}", body)
            gen.emit(body, "C[0] += 1")
        gen.emit(depth, "_r = None")
        for stmt in region.frees:
            gen.free(stmt, depth)
