"""The compile-time probe compiles each PPO program and prints its median and slowest passes."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import compile_time  # noqa: E402


def test_each_program_is_compiled_and_its_slowest_passes_named(monkeypatch, capsys):
    small = {"cartpole": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 16}}
    monkeypatch.setattr(compile_time, "PROGRAMS", small)
    assert compile_time.main(["--compiles", "2", "--passes", "3"]) == 0
    head, passes = capsys.readouterr().out.splitlines()
    assert head.startswith("PPO compile, median of 2: cartpole ") and head.endswith(" s")
    assert float(head.split()[-2]) > 0
    listed = [p.rsplit(" ", 2) for p in passes.split(": ", 1)[1].split(", ")]
    assert len(listed) == 3 and all(unit == "ms" for _, _, unit in listed)
    ms = [float(v) for _, v, _ in listed]
    assert ms == sorted(ms, reverse=True)  # the slowest first
    # names of the compiler's own passes, as its report times them
    timed = compile_time.compile_once(small["cartpole"])[1]
    assert {name for name, _, _ in listed} <= {name for name, _ in timed}
