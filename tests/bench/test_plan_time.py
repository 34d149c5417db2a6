"""The planning-time probe compiles with and without a budget and prints a row per length."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import plan_time  # noqa: E402


def test_each_length_is_compiled_with_and_without_the_budget(monkeypatch, capsys):
    seen = []
    compile_seconds = plan_time.compile_seconds

    def counting(steps, budget):
        seen.append((steps, budget))
        return compile_seconds(steps, budget)

    monkeypatch.setattr(plan_time, "compile_seconds", counting)
    assert plan_time.main(["--steps", "20", "40", "--rounds", "1", "--budget", "1GiB"]) == 0
    assert seen == [(20, None), (20, "1GiB"), (40, None), (40, "1GiB")]
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["20", "40"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and r[3].endswith("x") for r in rows)
