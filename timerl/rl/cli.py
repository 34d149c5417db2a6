"""``timerl train`` and ``timerl show``: the command-line face of the RL layer."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path
from typing import Any

from timerl.errors import ProgramError

# flag -> config field; only flags the user gives override the algorithm's defaults
HYPER = {
    "num_envs": int,
    "num_steps": int,
    "lr": float,
    "gamma": float,
    "gae_lambda": float,
    "epochs": int,
    "minibatches": int,
    "clip": float,
    "vf_coef": float,
    "ent_coef": float,
    "max_grad_norm": float,
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train an agent with a DRL algorithm written as recurrent tensors"
    )
    p.add_argument("algo", choices=["ppo", "reinforce", "a2c", "dqn", "sac"])
    p.add_argument(
        "--env", default="CartPole-v1", help="environment id (gymnasium or Synthetic-v0)"
    )
    p.add_argument(
        "--env-kwargs",
        type=json.loads,
        default=None,
        help="JSON, e.g. '{\"obs_shape\": [3, 64, 64]}'",
    )
    p.add_argument(
        "--env-backend",
        default=None,
        choices=["gymnasium", "envpool"],
        help="simulator for gymnasium-style ids (default gymnasium; envpool needs the extra)",
    )
    p.add_argument("--steps", type=int, default=500_000, help="total env steps (default 500k)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="numpy", choices=["numpy", "torch"])
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--log-dir", default=None, help="metrics.csv, TensorBoard logs and checkpoint.pkl"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --log-dir")
    p.add_argument(
        "--checkpoint-every", type=int, default=10, help="iterations between checkpoints"
    )
    p.add_argument(
        "--hidden",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=None,
        help="e.g. 64,64",
    )
    p.add_argument("--no-anneal-lr", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    for name, kind in HYPER.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    p.set_defaults(func=_train)

    s = sub.add_parser("show", help="print a program's PDG (graphviz dot) and schedule")
    s.add_argument(
        "program",
        help="ppo, reinforce, or a Python file defining build() -> (ctx, bounds, outputs)",
    )
    s.add_argument("--dot", default=None, help="write the PDG as graphviz dot to this file")
    s.set_defaults(func=_show)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    cfg: dict[str, Any] = {"env_id": args.env, "seed": args.seed}
    if args.env_kwargs:
        cfg["env_kwargs"] = args.env_kwargs
    if args.env_backend:
        cfg["env_backend"] = args.env_backend
    if args.hidden:
        cfg["hidden"] = args.hidden
    if args.no_anneal_lr:
        cfg["anneal_lr"] = False
    for name in HYPER:
        value = getattr(args, name)
        if value is not None:
            if args.algo == "reinforce" and name in ("gae_lambda", "epochs", "minibatches", "clip"):
                raise ProgramError(f"--{name.replace('_', '-')} does not apply to reinforce")
            cfg[name] = value
    return cfg


def _train(args: argparse.Namespace) -> int:
    from timerl.rl.train import train

    result = train(
        args.algo,
        None if args.resume else _config(args),
        total_steps=args.steps,
        backend=args.backend,
        device=args.device,
        log_dir=args.log_dir,
        resume=args.resume,
        checkpoint_every=args.checkpoint_every,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    print(result.summary())
    return 0


def _show(args: argparse.Namespace) -> int:
    if args.program in ("ppo", "reinforce", "a2c", "dqn", "sac"):
        from timerl.rl.algos import ALGOS

        algo = ALGOS[args.program][0]()
        prog = algo.ctx.compile(bounds={"I": 2, **algo.bounds})
    else:
        path = Path(args.program)
        if not path.exists():
            raise ProgramError(f"no such program file: {path}")
        scope = runpy.run_path(str(path), run_name="timerl_show")
        if "build" not in scope:
            raise ProgramError(f"{path} must define build() -> (ctx, bounds, outputs)")
        ctx, bounds, outputs = scope["build"]()
        prog = ctx.compile(bounds=bounds, outputs=outputs)
    print(prog.explain())
    if args.dot:
        Path(args.dot).write_text(prog.render())
        print(f"PDG written to {args.dot}")
    return 0
