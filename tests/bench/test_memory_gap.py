"""The memory-gap probe finds memory the meter cannot see, at the statement that holds it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import timerl as tl

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import memory_gap  # noqa: E402

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/statm"), reason="reads the resident memory from /proc"
)
MiB = 1 << 20


def test_an_array_a_sink_holds_is_a_move_at_that_sink():
    held: list[np.ndarray] = []
    ctx = tl.Context(dims=("i",))
    (i,), (I,) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.RecurrentTensor.placeholder((), dtype="float64", domain=(i,), name="w")
        w[0] = 1.0
        w[i + 1] = w * 0.5
        big = (tl.zeros((1000,), dtype="float64") + w).named("big")
        # 16 MiB the program does not own, kept from the third point on: mapped apart and
        # written, so resident at once
        tl.sink(big, lambda v, p: held.append(np.ones(2 * MiB)) if p["i"] == 2 else None)
        tl.sink(big.sum().named("total"), lambda v, p: None)
    prog = ctx.compile(bounds={I: 4})
    with memory_gap.watching(jump=8 * MiB) as watch:
        prog.run()
    report = watch.report
    assert len(held) == 1
    (move,) = report.moves
    assert 15 * MiB < move.delta < 18 * MiB
    assert "sink(big)" in move.source
    assert report.high > 15 * MiB
    assert report.meter_at_high < MiB  # the program's own arrays: 8 KB rows
    assert report.gap_at_high == report.high - report.meter_at_high


def test_a_bench_configuration_is_watched_from_its_second_iteration(capsys):
    assert memory_gap.main(["--config", "synthetic-e16", "--iterations", "2"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert head.startswith("synthetic-e16: resident high") and "iteration 1 line" in head
