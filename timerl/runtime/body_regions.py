"""Fused iterations (``schedule/fused.FusedBody``) emitted as one compiled call each.

``compiler/fusion_bodies.py`` decides which loops run each iteration as one call and plans
what the backend traces (``BodyPlan``); here the code generator's source for one iteration is
written (inside the loop's ``for``, which stays in Python so that iteration hooks run between
calls): the values read from stores before the call, the call (``backend.fuse_body``), then in
schedule order what outlives the iteration written to its store, statement counts, the inner
loops' results (``LoopEmitter.emit_results``), the host calls run after the call, and the
frees. Stores, statement counts and live bytes after each iteration equal the Python loop's.
"""

from __future__ import annotations

from typing import Any

from timerl.runtime.loop_regions import bind_steps
from timerl.schedule.fused import FusedBody
from timerl.schedule.program import Compute, Free, Loop, Stmt
from timerl.symbolic import TRUE


class BodyEmitter:
    """Emits fused iterations through a code generator and its ``LoopEmitter``."""

    def __init__(self, loops: Any) -> None:
        self.loops = loops
        self.gen = loops.gen

    def emit(self, body: FusedBody, depth: int) -> None:
        """The statements of one iteration (inside the outer ``for``): the call, then stores,
        counts, deferred host calls and frees in schedule order."""
        gen, loops = self.gen, self.loops
        fill = gen.const(
            "FILL",
            loops.filler([(loops._read_shape(e), e.src.dtype) for _, e, _ in body.inputs]),
        )
        srcs = []
        for kind, e, inner in body.inputs:
            if kind == "closed":
                srcs.append(loops._optional_src(e))
            else:
                assert inner is not None
                extent = int(gen.bounds[inner.dim.bound].value)
                srcs.append(loops.rows_src(e, inner, extent))
        plan = bind_steps(body.plan, gen.ops, gen.backend, gen.seed)
        fused = gen.const("BODY", gen.backend.fuse_body(body.key, plan))
        d = gen.names.of(body.loop.dim)
        gen.emit(depth, f"M[0] += {body.live_bytes}")
        gen.emit(depth, "if M[0] > M[1]: M[1] = M[0]")
        args = "".join(f"{s}, " for s in srcs)
        gen.emit(depth, f"_v, _n = {fused}({fill}(({args})), {d})")
        gen.emit(depth, f"M[0] -= {body.live_bytes}")
        self._after(body, body.loop.body, depth)
        gen.emit(depth, "_v = _n = _f = _h = None")

    def _after(self, body: FusedBody, stmts: list[Stmt], depth: int) -> None:
        gen = self.gen
        position = 0
        for s in stmts:
            if isinstance(s, Compute) and s.op.id in body.deferred:
                gen.compute(s.op, depth)
            elif isinstance(s, Compute):
                op = s.op
                inner = depth
                if op.guard != TRUE:
                    gen.emit(depth, f"if {gen.names.src(op.guard)}:")
                    inner += 1
                if op.id in body.needed:
                    gen.emit(inner, f"v{op.id} = _v[{op.id}]")
                    gen.store(op, f"v{op.id}", inner)
                gen.emit(inner, "C[0] += 1")
            elif isinstance(s, Loop):
                region = body.loops[position]
                gen.emit(depth, f"_f, _h = _n[{position}]")
                self.loops.emit_results(region, depth, keep=set(body.plan.loops[position].keep))
                position += 1
            elif isinstance(s, Free):
                op = s.op
                if op.id in gen.locals and op.id not in body.needed:
                    continue  # computed inside the call only: never counted in
                gen.free(s, depth)
