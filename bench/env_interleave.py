"""How long one env step takes when other kernels run between steps, as in a rollout.

A rollout runs a few small kernels (the policy's layers) between two env steps. The env is
numpy code either way; what runs between its steps differs by backend: numpy ufuncs on the
numpy backend, torch ops on the torch backend. This times the env's ``step`` alone, with
nothing, ten small numpy layers or ten small torch layers run between steps, in one process,
the three alternated, and prints the median microseconds per step of each. It explains why
the same env takes a larger share of a torch run (`--profile`) than of a numpy run.

    python -m bench.env_interleave                        # CartPole-v1, 16 envs
    python -m bench.env_interleave --env Synthetic-v0 --num-envs 64 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np


def _between(kind: str) -> Callable[[], None]:
    """Ten 16x64 tanh layers of ``kind`` (``none``, ``numpy``, ``torch``)."""
    if kind == "none":
        return lambda: None
    if kind == "numpy":
        x, w = np.zeros((16, 4), np.float32), np.zeros((4, 64), np.float32)

        def numpy_layers() -> None:
            for _ in range(10):
                np.tanh(x @ w + 1.0)

        return numpy_layers
    import torch

    xt, wt = torch.zeros(16, 4), torch.zeros(4, 64)

    def torch_layers() -> None:
        for _ in range(10):
            torch.tanh(torch.matmul(xt, wt) + 1.0)

    return torch_layers


def step_us(env_id: str, num_envs: int, kind: str, steps: int) -> float:
    """Mean microseconds of ``env.step`` alone over ``steps`` steps, ``kind`` run between."""
    from timerl.rl.envs import make_env

    env = make_env(env_id, num_envs=num_envs, seed=0)
    env.reset()
    actions = np.zeros((num_envs, *env.action_shape), np.int64 if env.discrete else np.float32)
    between = _between(kind)
    spent = 0.0
    for _ in range(steps):
        between()
        t0 = time.perf_counter()
        env.step(actions)
        spent += time.perf_counter() - t0
    return spent / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    kinds = ("none", "numpy", "torch")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds[r % 3 :] + kinds[: r % 3]:  # alternate which runs first
            times[kind].append(step_us(args.env, args.num_envs, kind, args.steps))
    print(f"{args.env}, {args.num_envs} envs, {args.steps} steps x {args.rounds} rounds")
    base = statistics.median(times["none"])
    for kind in kinds:
        med = statistics.median(times[kind])
        print(f"  between steps: {kind:6}  env step {med:7.1f} us  ({med / base:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
