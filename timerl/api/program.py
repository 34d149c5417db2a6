"""Program: a compiled context (pipeline → schedule → memory statements) and its executor."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from timerl.api.tensor import RecurrentTensor
from timerl.compiler.budget import (
    PlannedPeak,
    format_bytes,
    planned_peak,
    repeated_array_bytes,
)
from timerl.compiler.donation import describe as describe_donations
from timerl.compiler.pipeline import Compiled, CompileReport
from timerl.compiler.spec import VALIDATION_SIZE  # noqa: F401 (re-exported)
from timerl.errors import ProgramError
from timerl.ir.graph import Op
from timerl.ir.render import to_dot
from timerl.runtime.backend import Backend
from timerl.runtime.executor import Executor, RunStats
from timerl.runtime.heap import MMAP_THRESHOLD, REUSED_ARRAYS
from timerl.schedule.program import Schedule

# the most of a planned peak a run lets the heap keep for a loop's repeated arrays: 1 / this
REUSE_SHARE = 16


class Program:
    """A compiled program: the compiler's value (graph, schedule, report) and a backend.

    Built by ``ctx.compile``; it only runs and reports, all decisions are in ``compiled``.
    """

    def __init__(
        self,
        compiled: Compiled,
        backend: Backend,
        seed: int = 0,
        memory_budget: int | None = None,
        optimize: bool = True,
        output_ids: Mapping[int, int] | None = None,
        started: float | None = None,
        planned: PlannedPeak | None = None,
    ) -> None:
        self.compiled = compiled
        self.backend = backend
        self.seed = seed
        self.memory_budget = memory_budget
        self._planned = planned
        self.optimize = optimize
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

        ``compiled=False`` runs the schedule's own statements each on its own (no fused call,
        no value kept in a local; ``runtime/statements.py``): the reference the optimised
        code is tested against. By default an optimised program runs the optimised code and
        an unoptimised one (``optimize=False``) the reference.
        """
        self._last = self._new_executor(self.optimize if compiled is None else compiled)
        return self._last

    def _new_executor(self, compiled: bool) -> Executor:
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
            keep_freed_pages=self._keeps_freed_pages(),
            reuse_up_to=self._reuse_up_to(),
            heap_reserve=self._heap_reserve() if compiled else 0,
            huge_page_advice=not (compiled and self._maps_arrays_apart()),
            spare_blocks=self._spare_blocks() if compiled else (),
            trim_before=self._trim_before(),
            fused=self.compiled.fused,
        )

    def _keeps_freed_pages(self) -> bool:
        # The heap keeps freed arrays' pages for the next iteration's (runtime/heap.py), but
        # not under a budget, and not where arrays mapped apart hold most of the peak (a
        # rollout of images). There the heap serves a small share of the peak and its faults
        # a small share of an iteration, while the holes its freed arrays leave stay resident:
        # memory-e8 reached its resident high at the update's Adam step with 13 MiB free in
        # the heap, 7 MiB over the plan's peak (3 MiB with glibc's thresholds, at the same
        # iteration time).
        if self.memory_budget is not None:
            return False
        if not self.backend.heap_arrays:
            return True
        plan = self.planned_peak()
        return 2 * plan.peak_small_bytes >= (plan.peak_bytes or 0)

    def _reuse_up_to(self) -> int:
        # A heap that keeps no freed pages still reuses them for the arrays a loop allocates
        # at every point (an env's step: its observations and the env's own temporaries of
        # that size), without a budget. Under one they are mapped apart too, which costs
        # faults, not memory: reused, their pages stay resident beside the meter (memory-e8
        # under its budget: 1.64-1.69 s an iteration instead of 2.28-2.85, but run data
        # 18.2 MiB, not 17.2-17.3, for a 16 MiB meter; memory-e32 37.8, not 34.0, for 32.6).
        if self.memory_budget is not None or self._keeps_freed_pages():
            return 0
        size = repeated_array_bytes(self.schedule, self.static)
        # the heap keeps up to ``REUSED_ARRAYS`` of them: not where that is more than a
        # sixteenth of the peak (a loop of large arrays, as a budget would have it: faulted)
        if REUSED_ARRAYS * size * REUSE_SHARE > (self.planned_peak().peak_bytes or 0):
            return 0
        return size

    def _heap_reserve(self) -> int:
        # The heap's pages the run's arrays need, faulted in at setup (runtime/heap.reserve),
        # where the heap keeps them (memory-e8's rollout: 30 of 405 MiB on the heap, whose
        # own faults are most of the first iteration's; a reserve would only hold memory early)
        if not self.backend.heap_arrays or not self._keeps_freed_pages():
            return 0
        return self.planned_peak().peak_small_bytes

    def _trim_before(self) -> frozenset[int]:
        # a heap that keeps no freed pages still leaves its holes resident until trimmed:
        # given back right before the statement where the plan peaks
        if not self.backend.heap_arrays or self._keeps_freed_pages():
            return frozenset()
        op = self.planned_peak().peak_op
        return frozenset() if op is None else frozenset({op})

    def _spare_blocks(self) -> frozenset[int]:
        # blocks mapped apart whose rows the run keeps from one allocation to the next
        # (runtime/stores.BlockStore.keep_spare): not under a budget, whose plan counts on
        # freed memory going back
        if self.memory_budget is not None or not self.backend.heap_arrays:
            return frozenset()
        return self.planned_peak().spare_blocks

    def _maps_arrays_apart(self) -> bool:
        # arrays above glibc's mmap threshold are mapped afresh at each allocation: numpy's
        # huge-page advice would make their first touch wait for the kernel to compact memory
        # (runtime/heap.numpy_huge_pages)
        if not self.backend.heap_arrays:
            return False
        plan = self.planned_peak()
        return (plan.peak_bytes or 0) > plan.peak_small_bytes

    def planned_peak(self) -> PlannedPeak:
        """The peak of live bytes the schedule reaches, known before running (see
        ``compiler/budget.py``), and the tensors holding the most bytes then."""
        if self._planned is None:
            spec = self.compiled.spec
            storage = self.compiled.storage if self.backend.name != "jax" else {}
            donations = self.backend.donations(self.compiled.donations, self.ops)
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

    def fingerprint(self) -> str:
        """A hash of the program's structure: equal for programs built the same way."""
        import hashlib

        text = "\n".join(
            f"{op.prim}|{[d.name for d in op.domain]}|{op.shape}|{op.dtype}|"
            f"{[(e.src.prim, str(e.index)) for e in op.inputs]}"
            for op in self.ops
        )
        text += "\n" + repr(sorted((b.name, v) for b, v in self.static.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

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
        fused = self.compiled.fused
        if fused is not None and fused.fuses_loops:
            lines += self._loop_lines(full)
        if full:
            lines += ["schedule:", self.schedule.dump()]
            if self.optimize and fused is not None and fused.body != self.schedule.body:
                lines += ["as the backend runs it (compiler/fusion.py):", fused.dump()]
        else:
            lines += ["schedule (summary; explain(full=True) lists every statement):"]
            lines += ["  " + line for line in self.schedule.summary().splitlines()]
        return "\n".join(lines)

    def _loop_lines(self, full: bool) -> list[str]:
        """Which loops run as one compiled loop and why the others do not, as the fusion pass
        decided (``compiler/fusion.py``); with ``full``, where a run with iteration hooks
        (training, resuming) runs the outer loop otherwise."""
        fused = self.compiled.fused
        assert fused is not None
        if not fused.loops or not self.optimize:
            return ["loops: all run in Python (the reference fuses none)"]
        lines = ["loops (one XLA loop each, or why not):"]
        lines += [f"  {loop} -> {what}" for loop, what in fused.loops.items()]
        if fused.kernels:
            lines.append("regions run as numpy kernels (a jitted call would cost more):")
            lines += [f"  {region}: {why}" for region, why in fused.kernels.items()]
        draws = fused.draws
        if draws:
            lines.append("random draws made by numpy's generator (a jax draw is a dozen calls):")
            lines += [f"  {draw}: {why}" for draw, why in draws.items()]
        if full and fused.hooked_loops:
            lines.append("with iteration hooks (training, resuming), the outer loop instead:")
            lines += [f"  {loop} -> {what}" for loop, what in fused.hooked_loops.items()]
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
        spares = self._spare_blocks()
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
