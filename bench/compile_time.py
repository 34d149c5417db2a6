"""How long ``ctx.compile`` takes on PPO: CartPole-v1 and memory-e8's image program.

Each program is built afresh and compiled ``--compiles`` times in this process; the median
seconds of each are printed on one line, with the slowest passes of the last compile
(``prog.report.timings``). Comparing two commits means running this in a checkout of each,
alternated over several processes (these machines vary 20-45% from run to run):

    python -m bench.compile_time
    python -m bench.compile_time --compiles 5 --passes 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

PROGRAMS: dict[str, dict[str, Any]] = {
    "cartpole": {"env_id": "CartPole-v1", "num_envs": 8, "num_steps": 128},
    "memory-e8": {
        "env_id": "Synthetic-v0",
        "env_kwargs": {"obs_shape": (3, 64, 64), "episode_length": 1000, "action_dim": 2},
        "num_envs": 8,
        "num_steps": 1000,
    },
}


def compile_once(config: dict[str, Any]) -> tuple[float, list[tuple[str, float]]]:
    """Seconds of one compile of PPO built from ``config``, and its passes' timings."""
    from timerl.rl.train import build

    program = build("ppo", config)
    start = time.perf_counter()
    prog = program.ctx.compile(
        bounds={"I": 2, **program.bounds}, outputs=list(program.metrics.values())
    )
    return time.perf_counter() - start, list(prog.report.timings)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compiles", type=int, default=3, help="compiles of each program")
    ap.add_argument("--passes", type=int, default=0, help="slowest passes to list (0: none)")
    args = ap.parse_args(argv)
    medians, slowest = [], {}
    for name, config in PROGRAMS.items():
        runs = [compile_once(config) for _ in range(max(1, args.compiles))]
        medians.append(f"{name} {statistics.median(s for s, _ in runs):.3f} s")
        slowest[name] = sorted(runs[-1][1], key=lambda t: -t[1])[: args.passes]
    print(f"PPO compile, median of {args.compiles}: " + ", ".join(medians))
    for name, passes in slowest.items():
        if passes:
            print(f"  {name}: " + ", ".join(f"{p} {s * 1000:.0f} ms" for p, s in passes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
