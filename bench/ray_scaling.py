"""How env stepping scales over Ray workers: env steps/s without Ray, with 1 and with N workers.

The env is ``Synthetic-v0`` with ``step_cost_us`` of busy CPU work per env step (a stand-in
for a real simulator); the driver sends the same actions every step, so the figure is the
environment's throughput as a training program sees it through ``env.step``. Ray starts (and
the actors are created and warmed up) before the clock runs.

    python -m bench.ray_scaling                      # 64 envs, 200 us per env step
    python -m bench.ray_scaling --seconds 10 --repeats 3 --check

``--check`` exits 1 unless N workers reach ``--bar-workers`` x (default 1.7) the steps/s of
1 worker and ``--bar-plain`` x (default 1.5) the steps/s without Ray. Needs the ray extra
(``pip install "timerl[ray]"``). On a machine with other load the figures are indicative only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from typing import Any

import numpy as np


def measure(env: Any, seconds: float, warmup: int = 20) -> float:
    """Env steps per second of ``env`` over about ``seconds`` of stepping."""
    actions = np.zeros((env.num_envs, *env.action_shape), dtype=np.float32)
    env.reset()
    for _ in range(warmup):
        env.step(actions)
    steps = 0
    t0 = time.perf_counter()
    while True:
        env.step(actions)
        steps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return steps * env.num_envs / elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from timerl.rl.envs import make_env
    from timerl.rl.envs.ray_env import RayVectorEnv

    kwargs = {"step_cost_us": args.step_cost_us, "obs_shape": [args.obs_size]}
    started = not ray.is_initialized()
    if started and args.ray_address:
        ray.init(address=args.ray_address, logging_level=logging.WARNING)
    elif started:
        cpus = max(args.workers, os.cpu_count() or 1)
        ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    settings = [("no Ray", 0), ("1 worker", 1), (f"{args.workers} workers", args.workers)]
    results: dict[str, list[float]] = {name: [] for name, _ in settings}
    try:
        for _ in range(args.repeats):
            for name, workers in settings:
                if workers == 0:
                    env = make_env("Synthetic-v0", num_envs=args.envs, seed=0, **kwargs)
                else:
                    env = RayVectorEnv(
                        "Synthetic-v0", num_envs=args.envs, seed=0, workers=workers, **kwargs
                    )
                try:
                    results[name].append(measure(env, args.seconds))
                finally:
                    env.close()
    finally:
        if started:
            ray.shutdown()
    med = {name: statistics.median(v) for name, v in results.items()}
    many = f"{args.workers} workers"
    return {
        "config": vars(args),
        "cores": os.cpu_count(),
        "steps_per_second": med,
        "runs": results,
        "ratio_workers_vs_1": med[many] / med["1 worker"],
        "ratio_workers_vs_plain": med[many] / med["no Ray"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", type=int, default=64, help="envs in the batch")
    p.add_argument("--step-cost-us", type=float, default=200.0, help="busy work per env step")
    p.add_argument("--obs-size", type=int, default=16, help="floats per observation")
    p.add_argument("--workers", type=int, default=2, help="the N of the N-worker setting")
    p.add_argument("--seconds", type=float, default=3.0, help="stepping time per measurement")
    p.add_argument("--repeats", type=int, default=1, help="measurements per setting (median)")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (default: local)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--check", action="store_true", help="exit 1 below the bars")
    p.add_argument("--bar-workers", type=float, default=1.7)
    p.add_argument("--bar-plain", type=float, default=1.5)
    args = p.parse_args(argv)
    if args.workers < 2:
        p.error("--workers must be at least 2 (the comparison is N workers against 1)")
    out = run(args)
    print(
        f"Synthetic-v0, {args.envs} envs, {args.step_cost_us:g} us per env step, "
        f"{out['cores']} cores, median of {args.repeats} x {args.seconds:g} s"
    )
    for name, sps in out["steps_per_second"].items():
        print(f"  {name:>10}: {sps:>10,.0f} env steps/s")
    many = f"{args.workers} workers"
    print(f"  {many} / 1 worker: {out['ratio_workers_vs_1']:.2f}x  (bar {args.bar_workers:g}x)")
    print(f"  {many} / no Ray:   {out['ratio_workers_vs_plain']:.2f}x  (bar {args.bar_plain:g}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.check:
        ok = (
            out["ratio_workers_vs_1"] >= args.bar_workers
            and out["ratio_workers_vs_plain"] >= args.bar_plain
        )
        print("bars met" if ok else "below the bars")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
