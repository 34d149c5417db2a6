"""The fusion pass (``compiler/fusion.py``): its decisions are statements of the compiled
schedule, made from the backend's capabilities, and mean exactly the statements they wrap."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import timerl as tl
from timerl.compiler.fusion import plan_fusion
from timerl.ir.build import apply
from timerl.memory.plan import Capabilities
from timerl.schedule.fused import FusedBody, FusedLoop, Region, unfused
from timerl.schedule.program import Loop, Schedule

JAX_LIKE = Capabilities(
    mutable_arrays=False, fuses_regions=True, fuses_loops=True, fuses_bodies=True
)


def _recurrence(host: bool = False):
    """``x[t + 1] = tanh(x[t] * 0.9) + 0.1`` over ``t`` (with ``host``, through a udf)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder(shape=(3,), domain=(t,))
        x[0] = tl.from_numpy(np.array([0.5, -1.0, 2.0], dtype=np.float32))
        y = (x[t] * 0.9).tanh() + 0.1
        if host:
            y = tl.RecurrentTensor(
                apply("udf", y.view, fn=lambda a: a, shape=(3,), dtype=np.dtype("float32")),
                ctx,
            )
        x[t + 1] = y * 1.0 + 0.0
    return ctx, x, T


def _kinds(body) -> list[str]:
    return [type(s).__name__ for s in body]


def test_a_loop_whose_body_traces_is_one_fused_loop_and_one_call_per_iteration_with_hooks():
    ctx, x, T = _recurrence()
    prog = ctx.compile(bounds={T: 8}, outputs=[x])  # numpy: the compiled schedule only
    sched, static = prog.compiled.schedule, prog.compiled.spec.static
    fused = plan_fusion(sched, static, {}, JAX_LIKE)
    (loop,) = [s for s in fused.body if isinstance(s, FusedLoop)]
    assert loop.plan.extent == 8 and loop.plan.note() == "one XLA loop"
    # hooks run between the outer loop's iterations: there it is one call per iteration
    assert isinstance(fused.outer, FusedBody) and fused.outer.loop is loop.loop
    assert fused.outer in fused.hooked and loop not in fused.hooked
    assert list(fused.loops.values()) == ["one XLA loop"]
    assert list(fused.hooked_loops.values()) == ["one XLA program per iteration"]
    assert fused.dump().splitlines() == [
        line for line in fused.dump().splitlines() if not line.startswith("  ")
    ]  # nothing nested: the loop is one statement
    assert "for t in 0 .. T-1: one XLA loop (" in fused.dump()
    # each decision means the statements it wraps: the schedule is unchanged under them
    for body in (fused.body, fused.hooked):
        assert Schedule(unfused(body)).dump() == sched.dump()


def test_without_the_capabilities_nothing_is_fused():
    ctx, x, T = _recurrence()
    sched = ctx.compile(bounds={T: 8}, outputs=[x]).compiled.schedule
    static = {T: 8}
    plain = plan_fusion(sched, static, {}, Capabilities())
    assert plain.body == sched.body and plain.hooked == sched.body
    assert plain.outer is sched.body[[type(s) for s in sched.body].index(Loop)]
    assert not plain.loops and not plain.fuses_loops
    # regions only: the loop runs in Python, its body's pure statements one region
    regions = plan_fusion(sched, static, {}, Capabilities(fuses_regions=True))
    (loop,) = [s for s in regions.body if isinstance(s, Loop)]
    assert "Region" in _kinds(loop.body) and not regions.loops
    assert Schedule(unfused(regions.body)).dump() == sched.dump()
    # a loop whose bound is not static runs in Python, and explain's note says why
    dynamic = plan_fusion(sched, {}, {}, JAX_LIKE)
    assert not any(isinstance(s, FusedLoop) for s in dynamic.body)
    assert "its bound T is not static" in " ".join(dynamic.loops.values())


def test_a_loop_calling_the_host_keeps_its_iterations_in_python_around_regions():
    ctx, x, T = _recurrence(host=True)
    sched = ctx.compile(bounds={T: 5}, outputs=[x]).compiled.schedule
    fused = plan_fusion(sched, {T: 5}, {}, JAX_LIKE)
    (loop,) = [s for s in fused.body if isinstance(s, Loop)]
    regions = [s for s in loop.body if isinstance(s, Region)]
    assert regions and all(r.kernels is None for r in regions)  # no numpy kernels asked
    (why,) = fused.loops.values()
    assert why.startswith("runs in Python") and "is a host call" in why
    # where the backend offers numpy kernels, a small region in such a loop runs as them
    kernels = plan_fusion(
        sched, {T: 5}, {}, dataclasses.replace(JAX_LIKE, mutable_arrays=True, numpy_regions=True)
    )
    (loop,) = [s for s in kernels.body if isinstance(s, Loop)]
    small = [s for s in loop.body if isinstance(s, Region) and s.kernels is not None]
    assert small and set(kernels.kernels) == {r.name for r in small}


def test_capabilities_are_asked_of_the_backend_object():
    from timerl.runtime.backend import Backend
    from timerl.runtime.numpy_backend import NumpyBackend

    class Fuses(NumpyBackend):
        name = "fuses"
        fuses = True
        fuses_loops = True
        traced_attrs = {"select_at": ("index",)}
        numpy_regions = True
        mutable_arrays = False

    caps = Fuses().capabilities
    assert (caps.fuses_regions, caps.fuses_loops, caps.fuses_bodies) == (True, True, False)
    assert caps.traced_attrs == {"select_at": ("index",)} and caps.numpy_regions
    assert caps.planned_storage({1: "block"}) == {}  # immutable arrays keep point stores
    plain = NumpyBackend().capabilities
    assert not (plain.fuses_regions or plain.fuses_loops or plain.fuses_bodies)
    assert Backend.traced_attrs == {} and not Backend.numpy_regions


def test_a_program_carries_its_fused_schedule_and_explain_reads_it():
    jax = pytest.importorskip("jax")  # noqa: F841
    ctx, x, T = _recurrence()
    prog = ctx.compile(bounds={T: 8}, outputs=[x], backend="jax")
    fused = prog.compiled.fused
    assert any(isinstance(s, FusedLoop) for s in fused.body)
    assert "fusion" in [name for name, _ in prog.report.timings]
    # decided at compile time: explain() says so before the program ever ran
    assert "-> one XLA loop" in prog.explain()
    assert "with iteration hooks" in prog.explain(full=True)
    assert "as the backend runs it" in prog.explain(full=True)
    assert prog.stats()["jit_loops"] == 0  # nothing was traced to say it


def test_the_runtime_reads_the_decisions_and_imports_no_planner():
    """No runtime module imports the fusion planners: what to fuse is the schedule's."""
    runtime = Path(tl.__file__).parent / "runtime"
    found = []
    for path in runtime.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "timerl.compiler.fusion"
            ):
                found.append(f"{path.name}: {node.module}")
    assert not found
