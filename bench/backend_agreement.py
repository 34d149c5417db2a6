"""How far a numpy run and a jax run of one PPO program from one seed agree, iteration by
iteration, and where they part.

Both backends draw the same random bits (the counter-based generator is a function of seed,
stream and point on every backend) and step the same pure JAX env, so what differs is float
rounding: XLA fuses and reorders float32 arithmetic (sums, products, tanh) where numpy runs
one kernel per op. The differences start at the last bits and grow through training; once a
sampled action or an episode end flips (an action probability on the other side of its
uniform draw), the two trajectories part. Prints, per iteration, the largest relative
difference of the metrics and both runs' mean episodic return.

    python -m bench.backend_agreement                     # CartPole-v1, 40 iterations
    python -m bench.backend_agreement --env Synthetic-v0 --iterations 20
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

# metrics that are not results of the program
SKIP = ("seconds", "steps_per_second", "time", "iteration", "env_steps")


def _run(backend: str, env: str, iterations: int, seed: int) -> list[dict[str, Any]]:
    from timerl.rl.train import train

    records: list[dict[str, Any]] = []
    train(
        "ppo",
        {"env_id": env, "env_backend": "jax", "seed": seed, "num_envs": 8, "num_steps": 64},
        iterations=iterations,
        backend=backend,
        progress=False,
        on_iteration=lambda rec: records.append(dict(rec)),
    )
    return records


def _relative(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    runs = {b: _run(b, args.env, args.iterations, args.seed) for b in ("numpy", "jax")}
    keys = [
        k
        for k, v in runs["numpy"][0].items()
        if isinstance(v, float) and not any(s in k for s in SKIP)
    ]
    print(f"PPO {args.env} (jax env), 8 envs x 64 steps, seed {args.seed}: numpy vs jax")
    print("iteration | largest relative difference (metric) | episodic return numpy / jax")
    for i, (a, b) in enumerate(zip(runs["numpy"], runs["jax"], strict=True)):
        diffs = {k: _relative(float(a[k]), float(b[k])) for k in keys if np.isfinite(a[k])}
        worst = max(diffs, key=diffs.get)
        ret = (a.get("episodic_return", float("nan")), b.get("episodic_return", float("nan")))
        print(f"{i + 1:9d} | {diffs[worst]:.2e} ({worst}) | {ret[0]:.2f} / {ret[1]:.2f}")


if __name__ == "__main__":
    main()
