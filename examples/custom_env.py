"""PPO on an environment of your own (``examples/random_walk.py``), then eval, export and
resume on the run, from Python. The same from the command line, in the folder that holds
``random_walk.py``:

    timerl train ppo --env random_walk:RandomWalk-v0 --steps 16384 --num-envs 4 \
        --num-steps 64 --log-dir runs/walk
    timerl eval runs/walk --episodes 10 --deterministic
    timerl export runs/walk                       # runs/walk/policy.pt2
    timerl train ppo --log-dir runs/walk --resume --steps 24576

Run: python examples/custom_env.py [RUN_DIR]   (about 10 s)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from timerl.rl.train import train
from timerl.rl.train.evaluation import evaluate_run
from timerl.rl.train.export import export_run

# "module:EnvId": the module is imported first (from the current folder, PYTHONPATH, or here
# the examples folder, which python puts on the path when it runs this file)
ENV = "random_walk:RandomWalk-v0"
CONFIG = {"env_id": ENV, "num_envs": 4, "num_steps": 64, "seed": 0}
STEPS = 16_384


def main(run_dir: str | Path = "runs/walk", steps: int = STEPS) -> dict[str, float]:
    """Train, evaluate, export, resume; returns the figures it prints."""
    run_dir = Path(run_dir)
    first = train("ppo", CONFIG, total_steps=steps, log_dir=run_dir, overwrite=True)
    print(first.summary())
    # eval and export rebuild the env from the run's record (config.json): its module is
    # imported again, from the folder it was found in
    report = evaluate_run(run_dir, episodes=10, deterministic=True)
    print(report.summary())
    policy = export_run(run_dir)  # a torch.export program: a batch of observations -> actions
    print(f"policy written to {policy}")
    # training further continues the run from its latest checkpoint
    more = train("ppo", None, total_steps=steps + steps // 2, log_dir=run_dir, resume=True)
    print(more.summary())
    return {
        "first_return": float(np.mean(first.returns[:3])),
        "trained_return": first.mean_return_last10,
        "eval_return": report.mean,
        "resumed_iterations": more.iterations,
    }


if __name__ == "__main__":
    main(*sys.argv[1:2])
