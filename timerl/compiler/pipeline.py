"""The compiler pipeline over the PDG, readable top to bottom.

Each pass is ``ops -> ops`` (or a check) in its own module; the pipeline records per-pass
timings for ``prog.explain()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from timerl.compiler.cse import merge_duplicates
from timerl.compiler.dce import live_ops
from timerl.compiler.guards import infer_guards
from timerl.ir.graph import Op
from timerl.ir.validate import check_not_empty, validate
from timerl.symbolic import Bound


@dataclass
class CompileReport:
    timings: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def timed(self, name: str, fn: Callable[[], object]) -> object:
        start = time.perf_counter()
        out = fn()
        self.timings.append((name, time.perf_counter() - start))
        return out


def run_pipeline(
    roots: Sequence[Op], check_bounds: Mapping[Bound, int], report: CompileReport
) -> list[Op]:
    ops: list[Op] = report.timed("dead code elimination", lambda: live_ops(roots))  # type: ignore[assignment]
    check_not_empty(ops)
    merged = report.timed("duplicate code elimination", lambda: merge_duplicates(ops, roots))
    if merged:
        ops = live_ops(roots)
        report.notes.append(f"{merged} duplicate ops merged")
    report.timed("domain conditions", lambda: infer_guards(ops, roots))
    report.timed("validate", lambda: validate(ops, check_bounds))
    report.notes.append(f"{len(ops)} ops after dead code elimination")
    return ops
