"""``timerl train``, ``eval``, ``export``, ``plot`` and ``show``: the command-line face of the
RL layer.

Each algorithm is a sub-command of ``train`` whose hyper-parameter flags are made from the
fields of its config class in ``ALGOS``, so a new algorithm's settings get flags without
touching this file, and ``timerl train ALGO --help`` lists that algorithm's flags only. They default to
"not given": only what the user types overrides the algorithm's (per-environment) defaults,
and on ``--resume`` only what the user types is compared with the checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import runpy
import sys
from pathlib import Path
from typing import Any

from timerl.api.backends import backend_names
from timerl.errors import ProgramError
from timerl.graphopt.cli import DefaultsHelpFormatter
from timerl.rl.algos.naming import cli_names

# config fields with their own flags (or none: env_kwargs via --env-kwargs)
_SPECIAL = {"env_id", "seed", "hidden", "env_kwargs"}
DEFAULT_ENV = "CartPole-v1"
DEFAULT_STEPS = 500_000


# one line per algorithm in ``timerl train --help``
ALGO_HELP = {
    "a2c": "advantage actor-critic: one synchronous update per rollout",
    "dqn": "deep Q-learning with a replay buffer and a target network (discrete actions)",
    "graph-policy": "graphopt's GNN policy, trained on the graphs of a corpus",
    "ppo": "proximal policy optimisation (clipped surrogate, GAE)",
    "reinforce": "REINFORCE with an optional learned baseline",
    "sac": "soft actor-critic with twin Q-functions (continuous actions)",
}

# what the common config fields mean (a field without an entry still gets its flag)
FIELD_HELP = {
    "num_envs": "parallel environments",
    "num_steps": "rollout steps per environment per iteration",
    "lr": "learning rate",
    "anneal_lr": "decay the learning rate linearly to 0 over the run (true/false)",
    "gamma": "discount factor",
    "max_grad_norm": "clip gradients to this global norm",
    "gae_lambda": "GAE lambda",
    "epochs": "passes over each iteration's batch",
    "minibatches": "minibatches per epoch",
    "clip": "PPO probability-ratio clip",
    "vf_coef": "value-loss weight",
    "ent_coef": "entropy-bonus weight (None: 0.01 for discrete actions, 0 for continuous)",
    "norm_adv": "normalise advantages per minibatch (true/false)",
    "log_std_init": "initial log standard deviation of a Gaussian policy (continuous actions)",
    "baseline": "subtract a learned value baseline (true/false)",
}


def _json_object(text: str) -> dict[str, Any]:
    """``--env-kwargs``: a JSON object (the keyword arguments), nothing else."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object such as '{{\"obs_shape\": [3, 64, 64]}}', got {text!r}"
        )
    return value


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_type(annotation: str) -> Any:
    kinds = {part.strip() for part in str(annotation).split("|")} - {"None"}
    if kinds == {"bool"}:
        return _bool
    if kinds == {"int"}:
        return int
    if kinds <= {"int", "float"}:
        return float
    if kinds == {"str"}:
        return str
    return None  # tuples, dicts: no flag


def hyper_flags() -> dict[str, tuple[Any, dict[str, Any]]]:
    """Config field -> (parser type, {algo: default}) over every algorithm in ALGOS."""
    from timerl.rl.train.registry import ALGOS

    out: dict[str, tuple[Any, dict[str, Any]]] = {}
    for algo, (_, cls) in sorted(ALGOS.items()):
        for f in dataclasses.fields(cls):
            if f.name in _SPECIAL:
                continue
            kind = _parse_type(f.type)
            if kind is None:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            out.setdefault(f.name, (kind, {}))[1][algo] = default
    return out


def _algo_choices() -> list[str]:
    from timerl.rl.train.registry import ALGOS

    return sorted(ALGOS)


def _algo_flags(algo: str) -> dict[str, tuple[Any, Any]]:
    """Config field -> (parser type, default) for one algorithm's own settings."""
    return {
        name: (kind, defaults[algo])
        for name, (kind, defaults) in hyper_flags().items()
        if algo in defaults
    }


def _hidden_default(algo: str) -> str:
    from timerl.rl.train.registry import ALGOS

    (f,) = [f for f in dataclasses.fields(ALGOS[algo][1]) if f.name == "hidden"]
    return ",".join(str(n) for n in f.default)


def _env_default(algo: str) -> str:
    from timerl.rl.train.registry import ALGOS

    if algo == "graph-policy":
        return "the graphs of --corpus"
    return str(ALGOS[algo][1].env_id)


def _env_defaults_for(algo: str) -> str:
    from timerl.rl import algos

    per_env = getattr(algos, "ENV_DEFAULTS", {}).get(algo, {})
    parts = [
        f"{env}: " + ", ".join(f"{k}={v}" for k, v in values.items())
        for env, values in per_env.items()
        if values
    ]
    return " Environments with their own defaults: " + "; ".join(parts) + "." if parts else ""


def register(sub: argparse._SubParsersAction) -> None:
    algos = _algo_choices()
    p = sub.add_parser(
        "train",
        help="train an agent with a DRL algorithm written as recurrent tensors",
        formatter_class=DefaultsHelpFormatter,
        description="Train with one algorithm: `timerl train ALGO --help` lists its flags. "
        "Hyper-parameter flags override the algorithm's (per-environment) defaults. On "
        "--resume, a flag that differs from the checkpoint's setting is an error; --steps may "
        "grow to train further.",
    )
    per_algo = p.add_subparsers(dest="algo", metavar="ALGO", title="algorithms")
    per_algo.required = True
    for algo in algos:
        _register_algo(per_algo, algo)
    _register_tools(sub, algos)


def _register_algo(sub: argparse._SubParsersAction, algo: str) -> None:
    from timerl.rl.train.registry import ALGOS

    builder = ALGOS[algo][0]
    summary = (builder.__doc__ or algo).strip().split("\n\n")[0]
    summary = " ".join(summary.split())
    p = sub.add_parser(
        algo,
        help=ALGO_HELP.get(algo, algo),
        formatter_class=DefaultsHelpFormatter,
        description=f"{summary}{_env_defaults_for(algo)} On --resume, a flag that differs from "
        "the checkpoint's setting is an error; --steps may grow to train further.",
    )
    p.add_argument(
        "--env",
        default=None,
        help="environment: a gymnasium id, or module:EnvId for one of your own (the module is "
        "imported from the current folder or PYTHONPATH and registers EnvId, or defines it as "
        f"a gymnasium.Env class) (default: {_env_default(algo)})",
    )
    p.add_argument(
        "--env-kwargs",
        type=_json_object,
        default=None,
        help="JSON keyword arguments for the environment, e.g. '{\"obs_shape\": [3, 64, 64]}' "
        "(default: none)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"total env steps (default: {DEFAULT_STEPS:,}; on --resume: the run's own)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed (default: 0)")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="stop after the iteration that passes this much wall time, with a checkpoint "
        "(--resume continues; default: no limit)",
    )
    p.add_argument(
        "--backend",
        default=None,
        choices=backend_names(),
        help="array backend (default: jax for gymnax's MinAtar games, whose env runs inside the "
        "program; numpy otherwise; on --resume: the run's own)",
    )
    p.add_argument("--device", default="cpu", help="device for the torch or jax backend")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads the math libraries run the program's kernels on (default: every usable "
        "core for a program with large kernels, such as a CNN policy's; one otherwise)",
    )
    p.add_argument(
        "--memory-budget",
        default=None,
        help="refuse to start when the program's planned peak memory exceeds this "
        "(bytes, or e.g. 256MiB, 2GB); the error names the smallest budget that fits",
    )
    p.add_argument(
        "--log-dir",
        default=None,
        help="run directory: metrics.csv, TensorBoard logs (tb/), config.json, checkpoints/ "
        "(default: none, nothing is written)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="step the envs on this many Ray actor processes (0: in this process; needs "
        "pip install 'timerl[ray]'); the same seed gives the same returns",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="join the Ray cluster at this address with --workers (default: a local Ray)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --log-dir")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --log-dir (without it, a non-empty --log-dir is an error)",
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=10, help="iterations between checkpoints"
    )
    p.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        help="numbered checkpoints kept (the best one is kept as well, as best.npz)",
    )
    p.add_argument(
        "--hidden",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=None,
        help=f"hidden layer sizes, e.g. 64,64 (default: {_hidden_default(algo)})",
    )
    flags = _algo_flags(algo)
    if "anneal_lr" in flags:
        p.add_argument(
            "--no-anneal-lr", action="store_true", help="same as --anneal-lr false (constant lr)"
        )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, even on a terminal (plain lines every --log-every iterations)",
    )
    p.add_argument(
        "--log-every",
        type=int,
        default=10,
        help="without a progress bar (not a terminal, or --no-progress): print a line every "
        "this many iterations; 0 for none",
    )
    for name, (kind, default) in flags.items():
        what = FIELD_HELP.get(name, name.replace("_", " "))
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            default=None,
            help=f"{what} (default: {default})",
        )
    p.set_defaults(func=_train)


def _register_tools(sub: argparse._SubParsersAction, algos: list[str]) -> None:
    """``eval``, ``export``, ``plot`` and ``show``."""
    e = sub.add_parser(
        "eval",
        help="run a trained policy from a run directory and report its return",
        formatter_class=DefaultsHelpFormatter,
    )
    e.add_argument("run_dir", type=Path, help="a --log-dir of timerl train")
    e.add_argument("--episodes", type=int, default=10, help="episodes to run")
    e.add_argument(
        "--deterministic",
        action="store_true",
        help="take the most likely action (argmax / Gaussian mean) instead of sampling",
    )
    e.add_argument(
        "--checkpoint",
        default="latest",
        help="'latest', 'best', or a checkpoint file",
    )
    e.add_argument("--seed", type=int, default=1000, help="seed of the evaluation episodes")
    e.add_argument(
        "--env",
        default=None,
        help="run this environment (an id or module:EnvId) instead of the one the run "
        "records; the run's --env-kwargs still apply (default: the run's own)",
    )
    e.add_argument(
        "--video",
        type=Path,
        default=None,
        help="write the first episode as a GIF (needs Pillow; default: none)",
    )
    e.set_defaults(func=_eval)

    x = sub.add_parser(
        "export",
        help="write a trained policy that runs without timerl (torch or ONNX)",
        formatter_class=DefaultsHelpFormatter,
    )
    x.add_argument("run_dir", type=Path, help="a --log-dir of timerl train")
    x.add_argument(
        "--format", choices=["torch", "onnx"], default="torch", help="file format of the policy"
    )
    x.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output file (default: RUN_DIR/policy.pt2 or RUN_DIR/policy.onnx)",
    )
    x.add_argument("--checkpoint", default="latest", help="'latest', 'best', or a file")
    x.add_argument(
        "--env",
        default=None,
        help="size the policy's input and output by this environment (an id or "
        "module:EnvId) instead of the run's (default: the run's own)",
    )
    x.set_defaults(func=_export)

    pl = sub.add_parser(
        "plot",
        help="PNG learning curves of one or more runs (mean ± std across seeds)",
        formatter_class=DefaultsHelpFormatter,
    )
    pl.add_argument("run_dirs", type=Path, nargs="+", help="--log-dir(s) of timerl train")
    pl.add_argument("--out", type=Path, default=Path("learning_curve.png"), help="PNG file")
    pl.add_argument("--metric", default="episodic_return", help="metrics.csv column on the y axis")
    pl.add_argument(
        "--no-group",
        action="store_true",
        help="one curve per run, even for runs that differ only in their seed",
    )
    pl.set_defaults(func=_plot)

    s = sub.add_parser(
        "show",
        help="print a program's PDG (graphviz dot) and schedule",
        formatter_class=DefaultsHelpFormatter,
    )
    s.add_argument(
        "program",
        help=f"{', '.join(algos)}, or a Python file defining build() -> (ctx, bounds, outputs)",
    )
    s.add_argument("--dot", default=None, help="write the PDG as graphviz dot to this file")
    s.add_argument(
        "--full", action="store_true", help="list every statement of the schedule, not a summary"
    )
    s.set_defaults(func=_show)


def given_config(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the user typed (nothing else): what overrides defaults or must match."""
    from timerl.rl.train.registry import ALGOS

    fields = {f.name for f in dataclasses.fields(ALGOS[args.algo][1])}
    cfg: dict[str, Any] = {}
    if args.env is not None:
        cfg["env_id"] = args.env
    if args.seed is not None:
        cfg["seed"] = args.seed
    if args.env_kwargs:
        cfg["env_kwargs"] = args.env_kwargs
    if args.hidden:
        cfg["hidden"] = args.hidden
    if getattr(args, "no_anneal_lr", False):
        if getattr(args, "anneal_lr", None) is True:
            raise ProgramError("--no-anneal-lr and --anneal-lr true contradict each other")
        args.anneal_lr = False
    for name in hyper_flags():
        value = getattr(args, name, None)
        if value is None:
            continue
        if name not in fields:
            raise ProgramError(f"--{name.replace('_', '-')} does not apply to {args.algo}")
        cfg[name] = value
    return cfg


def _train(args: argparse.Namespace) -> int:
    from timerl.rl.train.registry import ALGOS

    cfg = given_config(args)
    if not args.resume:
        cfg.setdefault("env_id", ALGOS[args.algo][1].env_id)
        cfg.setdefault("seed", 0)
    steps = args.steps if args.steps is not None or args.resume else DEFAULT_STEPS
    with cli_names():
        result = _run_train(args, cfg, steps)
    print(result.summary())
    return 0


def _run_train(args: argparse.Namespace, cfg: dict[str, Any], steps: int | None) -> Any:
    from timerl.rl.train.driver import train

    return train(
        args.algo,
        cfg,
        total_steps=steps,
        backend=args.backend,
        device=args.device,
        memory_budget=args.memory_budget,
        log_dir=args.log_dir,
        resume=args.resume,
        overwrite=args.overwrite,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        progress=not args.no_progress and sys.stderr.isatty(),
        log_every=args.log_every,
        workers=args.workers,
        ray_address=args.ray_address,
        minutes=args.minutes,
        threads=args.threads,
    )


def _eval(args: argparse.Namespace) -> int:
    from timerl.rl.train.evaluation import evaluate_run

    with cli_names():
        report = evaluate_run(
            args.run_dir,
            episodes=args.episodes,
            deterministic=args.deterministic,
            checkpoint=args.checkpoint,
            seed=args.seed,
            video=args.video,
            env=args.env,
        )
    print(report.summary())
    return 0


def _export(args: argparse.Namespace) -> int:
    from timerl.rl.train.export import export_run

    with cli_names():
        path = export_run(
            args.run_dir,
            fmt=args.format,
            out=args.out,
            checkpoint=args.checkpoint,
            env=args.env,
            notice=lambda line: print(line, file=sys.stderr),
        )
    print(f"policy written to {path}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from timerl.rl.train.plotting import plot_runs

    with cli_names():
        path = plot_runs(args.run_dirs, args.out, metric=args.metric, group=not args.no_group)
    print(f"learning curve written to {path}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from timerl.rl.train.registry import ALGOS

    if args.program in ALGOS:
        algo = ALGOS[args.program][0]()
        prog = algo.ctx.compile(bounds={"I": 2, **algo.bounds})
    else:
        path = Path(args.program)
        if not path.exists():
            raise ProgramError(
                f"no such program file: {path} (or an algorithm: {', '.join(sorted(ALGOS))})"
            )
        scope = runpy.run_path(str(path), run_name="timerl_show")
        if "build" not in scope:
            raise ProgramError(f"{path} must define build() -> (ctx, bounds, outputs)")
        ctx, bounds, outputs = scope["build"]()
        prog = ctx.compile(bounds=bounds, outputs=outputs)
    print(prog.explain(full=args.full))
    if args.dot:
        Path(args.dot).write_text(prog.render())
        print(f"PDG written to {args.dot}")
    return 0
