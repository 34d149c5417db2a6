"""Program: a compiled context (pipeline → schedule → memory statements) and its executor."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from timerl.api import state
from timerl.api.roles import Declarations, ParameterInfo
from timerl.api.tensor import RecurrentTensor
from timerl.compiler.pipeline import Compiled, CompileReport
from timerl.compiler.spec import VALIDATION_SIZE  # noqa: F401 (re-exported)
from timerl.errors import ProgramError
from timerl.ir.graph import Op
from timerl.ir.render import to_dot
from timerl.memory.donation import describe as describe_donations
from timerl.memory.heap_policy import MMAP_THRESHOLD, HeapPolicy, heap_policy
from timerl.memory.replay import (
    PlannedPeak,
    format_bytes,
    planned_peak,
)
from timerl.runtime.backend import Backend
from timerl.runtime.executor import Executor, RunStats
from timerl.schedule.program import Schedule


class Program:
    """A compiled program: the compiler's value (graph, schedule, report) and a backend.

    Built by ``ctx.compile``; it only runs and reports, all decisions are in ``compiled``.
    """

    def __init__(
        self,
        compiled: Compiled,
        backend: Backend,
        seed: int = 0,
        output_ids: Mapping[int, int] | None = None,
        started: float | None = None,
        declared: Declarations | None = None,
    ) -> None:
        self.compiled = compiled
        self.declared = declared or Declarations()
        self.backend = backend
        self.seed = seed
        self.memory_budget = compiled.options.memory_budget
        self._planned = compiled.planned
        self.optimize = compiled.options.optimize
        self.static = dict(compiled.spec.static)
        self.dynamic = dict(compiled.spec.dynamic)
        self._out_by_view = dict(output_ids or {})
        self.compile_seconds = time.perf_counter() - started if started else 0.0
        self._last: Executor | None = None

    # the compiled value, under the names the executor and tools use
    @property
    def ops(self) -> list[Op]:
        return list(self.compiled.spec.ops)

    @property
    def outputs(self) -> list[Op]:
        return list(self.compiled.spec.outputs)

    @property
    def schedule(self) -> Schedule:
        return self.compiled.schedule

    @property
    def report(self) -> CompileReport:
        return self.compiled.report

    @property
    def keep(self) -> set[int]:
        return self.compiled.spec.keep

    # --- running ------------------------------------------------------------------------------
    def run(self, compiled: bool | None = None) -> Program:
        """Execute the whole schedule once (sinks fire, outputs are kept)."""
        self.executor(compiled).run()
        return self

    def executor(self, compiled: bool | None = None) -> Executor:
        """A fresh executor for this program (for iteration hooks, snapshots and resuming).

        ``compiled=False`` interprets the schedule statement by statement: the reference the
        generated code is tested against. By default an optimised program runs generated code
        and an unoptimised one (``optimize=False``) is interpreted.
        """
        self._last = self._new_executor(self.optimize if compiled is None else compiled)
        return self._last

    def _new_executor(self, compiled: bool) -> Executor:
        heap = self.heap_policy(compiled)
        return Executor(
            self.schedule,
            self.ops,
            self.backend,
            self.static,
            self.dynamic,
            self.seed,
            keep=self.keep,
            compiled=compiled,
            storage=self.compiled.storage,
            donations=self.compiled.donations,
            keep_freed_pages=heap.keep_freed_pages,
            reuse_up_to=heap.reuse_up_to,
            heap_reserve=heap.reserve,
            huge_page_advice=heap.huge_page_advice,
            spare_blocks=heap.spare_blocks,
            trim_before=heap.trim_before,
        )

    def heap_policy(self, compiled: bool = True) -> HeapPolicy:
        """How a run (of generated code, or interpreted) uses the C heap its arrays come
        from: decided from the memory plan (``memory/heap_policy.py``)."""
        return heap_policy(
            self.planned_peak,
            self.schedule,
            self.static,
            self.memory_budget,
            self.backend.heap_arrays,
            compiled,
        )

    def planned_peak(self) -> PlannedPeak:
        """The peak of live bytes the schedule reaches, known before running (see
        ``memory/budget.py``), and the tensors holding the most bytes then."""
        if self._planned is None:
            spec = self.compiled.spec
            caps = self.backend.capabilities
            storage = caps.planned_storage(self.compiled.storage)
            donations = caps.donations(self.compiled.donations, self.ops)
            self._planned = planned_peak(
                self.schedule,
                self.ops,
                storage,
                spec.static,
                spec.dynamic,
                donations,
                small=MMAP_THRESHOLD,
            )
        return self._planned

    def fingerprint(self, ignore_bounds: Sequence[str] = ()) -> str:
        """A hash of the program's structure: equal for programs built the same way.

        ``ignore_bounds``: names of bounds whose values do not count, so that a run compiled
        for more iterations (``("I",)``) has the fingerprint of a shorter one and may resume
        from its checkpoints."""
        import hashlib

        text = "\n".join(
            f"{op.prim}|{[d.name for d in op.domain]}|{op.shape}|{op.dtype}|"
            f"{[(e.src.prim, str(e.index)) for e in op.inputs]}"
            for op in self.ops
        )
        static = sorted((b.name, v) for b, v in self.static.items() if b.name not in ignore_bounds)
        text += "\n" + repr(static)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # --- what the program holds, by role and name ----------------------------------------------
    def parameters(self, role: str | None = None) -> list[ParameterInfo]:
        """The trained parameters this program holds (placeholders made with
        ``requires_grad=True``, such as ``tl.nn``'s), with their declared roles; with
        ``role``, those declared with it."""
        wanted = set(self.declared.parameters)
        roles = self.declared.roles
        out = [
            ParameterInfo(
                op.label,
                roles.get(op.id),
                tuple(d.name for d in op.domain),
                tuple(_size(s) for s in op.shape),
                op.dtype,
            )
            for op in self.ops
            if op.id in wanted
        ]
        return [p for p in out if p.role == role] if role is not None else out

    def activations(self) -> dict[str, str]:
        """Each network this program applies (``tl.nn.MLP``), by name: its activation between
        layers (``"tanh"``, ``"relu"``, ``"sigmoid"``)."""
        held = {op.id for op in self.ops}
        return {
            net.name: net.activation for net in self.declared.networks.values() if net.reads & held
        }

    def carried_state(
        self, snapshot: Mapping[int, Mapping[tuple, Any]], iteration: int
    ) -> dict[str, np.ndarray]:
        """Every named tensor defined over the outer (iteration) dim alone, the parameters,
        optimiser moments and running statistics a training program carries: its value after
        ``iteration``, read from an executor's ``snapshot()`` taken right after it."""
        return state.carried_state(self.ops, self.static, snapshot, iteration)

    def resume_margin(self, iterations: int) -> int:
        """How many iterations beyond ``iterations + 1`` the outer bound must reach for a
        snapshot after iteration ``iterations - 1`` to hold all the state a longer run carries
        on with (see ``api/state.py``); compile for that many more to checkpoint the end."""
        return state.resume_margin(self.ops, self.static, iterations)

    def _executor(self) -> Executor:
        if self._last is None:
            raise ProgramError("the program has not run yet: call prog.run() first")
        return self._last

    def value(self, tensor: RecurrentTensor) -> Any:
        """An output's values as numpy: domain dims leading; a nested list where ragged."""
        op_id = self._out_by_view.get(id(tensor.view))
        if op_id is None:
            raise ProgramError(
                f"{tensor.name} is not an output of this program: pass outputs=[...]"
            )
        op = next(o for o in self.outputs if o.id == op_id)
        return _assemble(op, self._executor(), self.backend)

    def stats(self) -> dict[str, Any]:
        """Peak bytes, compile/run seconds and sizes of the last run."""
        run: RunStats = self._last.stats if self._last is not None else RunStats()
        out = {
            "peak_bytes": run.memory.peak,
            "live_bytes_at_end": run.memory.live,
            "compile_seconds": self.compile_seconds,
            "run_seconds": run.seconds,
            "statements_executed": run.statements,
            "ops": len(self.ops),
            "loops": len(self.schedule.loops()),
            "backend": self.backend.name,
            "device": self.backend.device,
        }
        if self.memory_budget is not None:
            out["memory_budget"] = self.memory_budget
            out["planned_peak_bytes"] = self.planned_peak().peak_bytes
        if self._last is not None:
            out["swapped_bytes"] = self._last.swapped_bytes()
            out["swap_tier"] = self.backend.swap_tier  # "disk", or "host" from an accelerator
            # the most bytes swapped and streamed blocks held there at once
            out["swap_tier_peak_bytes"] = run.tier.peak
            reads = self._last.read_stats()
            if reads is not None:
                out.update(reads)
        regions = self.backend.region_stats()
        if regions is not None:
            out.update(regions)
        device_peak = self.backend.device_peak_bytes()
        if device_peak is not None:
            out["device_peak_bytes"] = device_peak
        return out

    def explain(self, full: bool = False) -> str:
        """The pipeline's decisions: pass timings, notes and the schedule.

        By default the schedule is summarised (loops, and per run of statements the user's
        tensors computed there); ``full=True`` lists every statement and memory statement.
        """
        lines = ["compile passes:"]
        lines += [f"  {name:<28} {sec * 1e3:8.2f} ms" for name, sec in self.report.timings]
        lines += [f"  {note}" for note in _notes(self.report.notes, full)]
        lines += self._storage_lines(full)
        lines += self._donation_lines(full)
        lines += self._peak_lines()
        regions = self.backend.region_stats()
        if regions is not None:
            lines.append(
                f"{self.backend.name} regions (built when the program runs): "
                f"{regions['jit_regions']} jitted, {regions['jit_traces']} traces, "
                f"{regions['jit_trace_compile_seconds']:.2f} s tracing and compiling"
            )
        if getattr(self.backend, "fuses_loops", False):
            lines += self._loop_lines()
        if full:
            lines += ["schedule:", self.schedule.dump()]
        else:
            lines += ["schedule (summary; explain(full=True) lists every statement):"]
            lines += ["  " + line for line in self.schedule.summary().splitlines()]
        return "\n".join(lines)

    def _loop_lines(self) -> list[str]:
        """Which loops run as one compiled loop and why the others do not; decided when code
        is generated (static bounds known), so generated now if the program has not run."""
        notes = self.backend.loop_notes
        if not notes and self.optimize:
            self._new_executor(compiled=True).prepare(hooked=False)
        if not notes:
            return ["loops: all run in Python (the interpreter does not fuse them)"]
        lines = ["loops (one XLA loop each, or why not):"]
        lines += [f"  {loop} -> {what}" for loop, what in notes.items()]
        kernels = getattr(self.backend, "kernel_notes", {})
        if kernels:
            lines.append("regions run as numpy kernels (a jitted call would cost more):")
            lines += [f"  {region}: {why}" for region, why in kernels.items()]
        draws = getattr(self.backend, "draw_notes", {})
        if draws:
            lines.append("random draws made by numpy's generator (a jax draw is a dozen calls):")
            lines += [f"  {draw}: {why}" for draw, why in draws.items()]
        return lines

    def _storage_lines(self, full: bool) -> list[str]:
        """Each tensor's storage and why: blocks and views always, point stores if ``full``
        (else counted), since a training program has hundreds."""
        table = self.compiled.storage
        if not table:
            return ["storage: point stores only (optimize=False keeps the reference's)"]
        lines = ["storage:"]
        points = 0
        for op in self.ops:
            st = table.get(op.id)
            if st is None:
                continue
            if st.kind == "point" and not full:
                points += 1
                continue
            lines.append(f"  {op.label}: {st.kind} ({st.why})")
        if points:
            lines.append(f"  {points} other tensors: point stores (explain(full=True) says why)")
        return lines

    def _peak_lines(self, shown: int = 5) -> list[str]:
        """The planned peak, the op whose statement reaches it and the largest tensors live
        then: where to look to lower it (or to choose a memory budget)."""
        plan = self.planned_peak()
        if plan.peak_bytes is None:
            return [f"planned peak: not known before the run ({plan.note})"]
        where = f", reached computing {plan.peak_at}" if plan.peak_at else ""
        lines = [f"planned peak: {format_bytes(plan.peak_bytes)}{where}; largest live then:"]
        lines += [f"  {name}: {format_bytes(n)}" for name, n in plan.holders[:shown]]
        spares = self.heap_policy(compiled=True).spare_blocks
        kept = sorted(op.label for op in self.ops if op.id in spares)
        if kept:
            lines.append(
                f"  kept between iterations (blocks mapped apart, within the peak): {', '.join(kept)}"
            )
        return lines

    def _donation_lines(self, full: bool, shown: int = 10) -> list[str]:
        """The ops that write into a dead input's buffer on this backend (all if ``full``)."""
        donated = describe_donations(
            self.backend.donations(self.compiled.donations, self.ops), self.ops
        )
        if not donated:
            return []
        lines = [f"donations: {len(donated)} ops write into an input that dies at them"]
        lines += [f"  {line}" for line in (donated if full else donated[:shown])]
        if not full and len(donated) > shown:
            lines.append(f"  ... {len(donated) - shown} more (explain(full=True) lists them)")
        return lines

    def render(self) -> str:
        """The PDG as graphviz dot source."""
        return to_dot(self.ops)


def _assemble(op: Op, ex: Executor, backend) -> Any:
    store = ex.stores[op.id]
    dims = op.domain

    def extent(k: int, prefix: tuple) -> int:
        bound = dims[k].bound
        if bound in ex.dynamic_values:
            outer = tuple(p for d, p in zip(dims[:k], prefix, strict=False) if d is not dims[k])
            values = ex.dynamic_values[bound]
            if outer in values:
                return values[outer]
            # tensor lacks the outer dims the stop condition has: take the only value
            if len(values) == 1:
                return next(iter(values.values()))
            raise ProgramError(f"{op.label}: {bound.name} differs between iterations here")
        return ex.bounds[bound]

    def rec(prefix: tuple, k: int) -> Any:
        if k == len(dims):
            return backend.to_numpy(store[prefix])
        items = [rec(prefix + (p,), k + 1) for p in range(extent(k, prefix))]
        if items and all(isinstance(x, np.ndarray) for x in items):
            shapes = {x.shape for x in items}
            if len(shapes) == 1:
                return np.stack(items)
        return items

    return rec((), 0)


def _notes(notes: list[str], full: bool) -> list[str]:
    """The compiler's notes; unless ``full``, declined vectorisations are counted per reason
    (a training program has hundreds) instead of listed one by one."""
    if full:
        return list(notes)
    out: list[str] = []
    declined: dict[str, int] = {}
    for note in notes:
        if note.startswith("not vectorised "):
            reason = note.split(": ", 1)[1] if ": " in note else "?"
            declined[reason] = declined.get(reason, 0) + 1
        else:
            out.append(note)
    for reason, count in sorted(declined.items(), key=lambda kv: -kv[1]):
        out.append(f"not vectorised: {count} ops ({reason})")
    return out


def _size(s: Any) -> Any:
    """A constant size as an int; a symbolic one as it is."""
    return int(s.evaluate({})) if getattr(s, "is_const", False) else s
