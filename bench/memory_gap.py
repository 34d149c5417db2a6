"""Where a run's resident memory goes beyond its meter, line by line of the generated code.

The meter (``prog.stats()``) and ``planned_peak`` count the arrays a program holds. The
process holds more: code pages run for the first time, Python objects, pages the C heap
keeps after an array is freed, an array the heap serves from such pages. ``bench.rl`` reports
the difference at the run's peak only; this says where it comes from. It runs one bench
configuration's timerl program (numpy backend) with a line tracer on the generated run
function, reads the resident memory before each line (``/proc/self/statm``: Linux only), and
prints, from the iteration ``--from-iteration`` on:

- the run's resident high over its memory once compiled, the line there and the meter then,
  and how much of resident minus metered is file pages (code) there;
- each place where resident minus metered, read right before each kernel call (the meter
  lags the kernel that allocates by a few lines), moved by more than ``--jump`` MiB since the
  kernel call before: named by that call, it covers the frees after it too. An array whose
  free gives nothing back shows as a rise there; one served from pages already resident, as
  a fall.

The tracer slows the run a few times, and keeps nothing per line: its own memory stays out
of what it measures.

    python -m bench.memory_gap --config memory-e8
    python -m bench.memory_gap --config memory-e8 --iterations 3 --jump 1
    python -m bench.memory_gap --config memory-e8 --memory-budget 33MiB
"""

from __future__ import annotations

import argparse
import linecache
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from timerl.runtime.codegen import GENERATED_FILE

MiB = 1 << 20
# a line that calls a kernel: the meter there counts every statement before it (the lines
# that update it follow the kernel's), so resident minus metered is compared there only
KERNEL_CALL = re.compile(r"= K\d+\(")
MAX_MOVES = 200


@dataclass
class Move:
    """Resident minus metered memory moved by ``delta`` bytes between the kernel call on
    ``line`` and the next one."""

    iteration: int
    line: int
    delta: int
    gap: int  # resident minus metered after the move
    source: str = ""


@dataclass
class GapReport:
    high: int = 0  # the most resident bytes over the base (the memory once compiled)
    high_iteration: int = -1
    high_line: int = 0
    high_source: str = ""
    meter_at_high: int = 0
    file_at_high: int = 0  # file pages resident then, over the base's
    moves: list[Move] = field(default_factory=list)

    @property
    def gap_at_high(self) -> int:
        return self.high - self.meter_at_high


class GapWatch:
    """A line tracer over generated run functions; ``start`` takes the base and sets it."""

    def __init__(self, jump: int = MiB) -> None:
        self.jump = jump
        self.active = True  # cleared to skip lines (an iteration not watched)
        self.iteration = 0
        self.report = GapReport()
        self.started = False
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._base = self._base_file = 0
        self._meter: list[int] | None = None
        self._lines: list[str] = []
        self._kernels: frozenset[int] = frozenset()  # lines that call a kernel
        self._gap: int | None = None  # resident minus metered at the last kernel line
        self._last = 0
        self._ran = 0  # the line seen last: the one that has run when the next is seen
        self._settling = False  # the meter at the high still to be read (see ``_see``)

    def _statm(self) -> tuple[int, int]:
        fields = os.pread(self._fd, 128, 0).split()
        return int(fields[1]) * self._page, int(fields[2]) * self._page

    def start(self) -> None:
        self._base, self._base_file = self._statm()
        self.started = True
        sys.settrace(self._enter)

    def stop(self) -> None:
        sys.settrace(None)
        for move in self.report.moves:
            move.source = self._source(move.line)
        self.report.high_source = self._source(self.report.high_line)
        os.close(self._fd)

    def _source(self, line: int) -> str:
        return self._lines[line - 1].strip() if 0 < line <= len(self._lines) else ""

    def _enter(self, frame: Any, event: str, arg: Any) -> Callable | None:
        code = frame.f_code
        if not code.co_filename.startswith(GENERATED_FILE) or "M" not in code.co_varnames:
            return None  # not the run function (its module, a kernel)
        if self._meter is None or frame.f_locals.get("M") is not self._meter:
            self._meter = frame.f_locals["M"]  # [live bytes, peak]: read, never copied
            self._lines = linecache.getlines(code.co_filename)
            self._kernels = frozenset(
                n for n, text in enumerate(self._lines, 1) if KERNEL_CALL.search(text)
            )
        return self._line

    def _line(self, frame: Any, event: str, arg: Any) -> Callable:
        if event == "line" and self.active and self._meter is not None:
            self._see(frame.f_lineno)
        return self._line

    def _see(self, line: int) -> None:
        rss, file_pages = self._statm()
        # a merge that hands on its branch's array is counted before the branch's free takes
        # it off, with no peak test between (nothing is allocated): the meter's peak bounds
        # what is really live
        over, metered = rss - self._base, min(self._meter[0], self._meter[1])
        rep = self.report
        if over > rep.high:
            # reached by the line that just ran; its array is metered by the lines after it
            # (before its frees), so the meter there is the most it reads until the next kernel
            rep.high, rep.high_iteration, rep.high_line = over, self.iteration, self._ran
            rep.meter_at_high, rep.file_at_high = metered, file_pages - self._base_file
            self._settling = True
        elif self._settling:
            rep.meter_at_high = max(rep.meter_at_high, metered)
        self._ran = line
        if line not in self._kernels:
            return  # the meter may still lag the statement before
        self._settling = False
        gap = over - metered
        moved = self._gap is not None and abs(gap - self._gap) > self.jump
        if moved and len(rep.moves) < MAX_MOVES:
            rep.moves.append(Move(self.iteration, self._last, gap - self._gap, gap))
        self._gap, self._last = gap, line


@contextmanager
def watching(jump: int = MiB) -> Iterator[GapWatch]:
    """A watch started now and stopped on leaving (also on an error)."""
    watch = GapWatch(jump)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


def watch_bench_run(
    label: str, iterations: int, from_iteration: int, jump: int, memory_budget: str | None = None
) -> GapReport:
    """Train a bench configuration's timerl program on numpy, watched from its compiled
    state; under ``memory_budget`` where given."""
    from bench.rl import all_cases, select_cases
    from bench.timerl_runner import timerl_config
    from timerl.rl.train import train
    from timerl.runtime.executor import Executor

    (case,) = select_cases(all_cases(iterations=iterations), label, quick=False)
    cfg = case.config.resolved()
    watch = GapWatch(jump)
    watch.active = from_iteration <= 0
    reserve = Executor.reserve_memory

    def reserve_then_watch(self: Executor, reserving: bool) -> None:
        # the base is the memory once compiled and its code generated, as bench.rl's run data
        if not watch.started:
            watch.start()
        reserve(self, reserving)

    def next_iteration(record: Any) -> None:
        watch.iteration += 1
        watch.active = watch.iteration >= from_iteration

    Executor.reserve_memory = reserve_then_watch  # type: ignore[method-assign]
    try:
        train(
            case.algo,
            timerl_config(cfg, case.algo, "numpy"),
            iterations=cfg.iterations,
            backend="numpy",
            progress=False,
            memory_budget=memory_budget,
            on_iteration=next_iteration,
        )
    finally:
        Executor.reserve_memory = reserve  # type: ignore[method-assign]
        watch.stop()
    return watch.report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="memory-e8", help="a bench.rl configuration's label")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--from-iteration", type=int, default=1, help="0 watches the first too")
    ap.add_argument("--jump", type=float, default=0.5, help="MiB a move must exceed")
    ap.add_argument("--memory-budget", default=None, help="compile under this budget (33MiB)")
    args = ap.parse_args(argv)
    rep = watch_bench_run(
        args.config, args.iterations, args.from_iteration, int(args.jump * MiB), args.memory_budget
    )
    print(
        f"{args.config}: resident high {rep.high / MiB:.2f} MiB over the compiled program's, "
        f"iteration {rep.high_iteration} line {rep.high_line}, meter {rep.meter_at_high / MiB:.2f}"
        f" MiB: {rep.gap_at_high / MiB:+.2f} MiB unmetered, of it file pages "
        f"{rep.file_at_high / MiB:+.2f} MiB\n  at: {rep.high_source}"
    )
    print(f"moves of resident minus metered over {args.jump} MiB that stayed (and to where):")
    for m in rep.moves:
        print(
            f"  iteration {m.iteration} from line {m.line:5d} {m.delta / MiB:+7.2f} "
            f"(to {m.gap / MiB:+7.2f})  {m.source}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
