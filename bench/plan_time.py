"""How long compiling PPO takes under a memory budget as its rollout grows.

Under a budget the compiler replays the schedule's memory statements to plan the peak, and
fitting a budget replays it more than once. This compiles PPO on CartPole-v1 (4 envs,
2x64) at several rollout lengths, with and without a budget (one that fits, so only the
planning differs), alternated in one process, and prints the median seconds of each and their
ratio: a ratio that stays flat as the rollout grows is planning that does not replay every
step.

    python -m bench.plan_time                            # 1,000 / 10,000 / 100,000 steps
    python -m bench.plan_time --steps 1000 100000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time


def compile_seconds(steps: int, budget: str | None) -> float:
    """Seconds of one ``ctx.compile`` of PPO with ``steps`` steps per rollout."""
    from timerl.rl.train import build

    program = build("ppo", {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": steps})
    bounds = {"I": 2, **program.bounds}
    outputs = list(program.metrics.values())
    start = time.perf_counter()
    program.ctx.compile(bounds=bounds, outputs=outputs, memory_budget=budget)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--rounds", type=int, default=3, help="alternated compiles of each kind")
    ap.add_argument("--budget", default="4GiB", help="a budget the program fits")
    args = ap.parse_args(argv)
    print(f"PPO CartPole-v1, 4 envs, 2x64, I=2; budget {args.budget}; {args.rounds} rounds")
    print(f"{'steps':>9} {'no budget s':>12} {'budget s':>10} {'budget / none':>14}")
    for steps in args.steps:
        times: dict[str, list[float]] = {"none": [], "budget": []}
        for _ in range(args.rounds):
            times["none"].append(compile_seconds(steps, None))
            times["budget"].append(compile_seconds(steps, args.budget))
        none, budget = (statistics.median(times[k]) for k in ("none", "budget"))
        print(f"{steps:>9,} {none:>12.3f} {budget:>10.3f} {budget / none:>13.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
