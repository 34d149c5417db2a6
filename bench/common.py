"""What every baseline shares: one config, one result, one set of per-env defaults.

The benchmark compares implementations, not tunings, so every baseline reads its network shape
and hyper-parameters from here and reports the same measurements. Conventions every baseline
follows (and timerl's own PPO program must follow to be comparable):

- separate actor and critic MLPs, ``hidden_layers`` x ``hidden_size`` tanh units each,
  orthogonal init (gain sqrt(2) hidden, 0.01 policy head, 1.0 value head), zero biases;
- discrete actions: Categorical over logits; continuous: Normal with a state-independent,
  learned log-std starting at 0, sampled actions sent unclipped (the env clips them);
- ``done`` ends the return and GAE recursion whether the episode terminated or was truncated;
- PPO: clipped surrogate, unclipped squared-error value loss, advantages normalised per
  minibatch, gradients clipped to global norm ``max_grad_norm``, constant learning rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class BaselineUnavailable(RuntimeError):
    """A baseline cannot run here (a package is missing); harnesses report it as skipped."""


# Per-env defaults; anything not listed falls back to BASE_DEFAULTS. CartPole's higher learning
# rate matters most for the full-batch, one-update-per-iteration configuration.
BASE_DEFAULTS: dict[str, Any] = {"lr": 3e-4, "num_envs": 16, "num_steps": 128, "env_kwargs": {}}
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"lr": 2.5e-3, "num_envs": 16, "num_steps": 128},
    "Acrobot-v1": {"lr": 2.5e-3, "num_envs": 16, "num_steps": 128},
    "Pendulum-v1": {"lr": 1e-3, "num_envs": 16, "num_steps": 200},
    # CleanRL's ppo_atari_envpool: 8 envs x 128 steps, lr 2.5e-4, 4 epochs x 4 minibatches
    # (Case sets those two), clip 0.1, lost lives end episodes, rewards clipped to their sign
    "Pong-v5": {
        "lr": 2.5e-4,
        "num_envs": 8,
        "num_steps": 128,
        "env_kwargs": {"episodic_life": True, "reward_clip": True},
    },
    # the jitted-JAX MinAtar PPO recipe: 64 envs x 128 steps, lr 5e-4, 4 epochs x 8 minibatches
    "gymnax:Breakout-MinAtar": {"lr": 5e-4, "num_envs": 64, "num_steps": 128},
    "Synthetic-v0": {
        "lr": 3e-4,
        "num_envs": 16,
        "num_steps": 250,
        "env_kwargs": {"obs_shape": (3, 4, 4), "episode_length": 250, "action_dim": 2},
    },
}


@dataclass
class Config:
    """One training run. ``None`` fields take the env's default from :data:`ENV_DEFAULTS`."""

    env_id: str = "CartPole-v1"
    env_kwargs: dict[str, Any] | None = None
    num_envs: int | None = None
    num_steps: int | None = None
    iterations: int = 50
    hidden_layers: int = 2
    hidden_size: int = 64
    epochs: int = 1
    minibatches: int = 1
    lr: float | None = None
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float | None = None  # 0.01 for discrete actions, 0.0 for continuous
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    value_baseline: bool = True  # REINFORCE only: subtract a learned value
    seed: int = 0
    device: str = "cpu"
    threads: int = 1  # torch intra-op threads (the benchmark pins one)
    memory_budget: int | None = None  # timerl only: ctx.compile(memory_budget=...) in bytes
    host_env: bool = False  # timerl only: step the gymnasium env even where a JAX env exists
    # "minatar_cnn": the MinAtar paper's CNN over (H, W, C) images, a trunk shared by linear
    # heads, instead of the MLPs (timerl and jax_ppo only)
    policy: str = "mlp"

    def resolved(self) -> Config:
        """A copy with every ``None`` default filled in for this env."""
        defaults = {**BASE_DEFAULTS, **ENV_DEFAULTS.get(self.env_id, {})}
        out = Config(**asdict(self))
        for name in ("lr", "num_envs", "num_steps", "env_kwargs"):
            if getattr(out, name) is None:
                value = defaults[name]
                setattr(out, name, dict(value) if isinstance(value, dict) else value)
        if out.hidden_layers < 1 or out.hidden_size < 1:
            raise ValueError("hidden_layers and hidden_size must be at least 1")
        batch = out.num_envs * out.num_steps
        if out.minibatches < 1 or batch % out.minibatches:
            raise ValueError(f"minibatches={out.minibatches} must divide the batch of {batch}")
        return out

    def entropy_coef(self, discrete: bool) -> float:
        """The entropy bonus: exploration help for discrete actions, none for Gaussian ones."""
        if self.ent_coef is not None:
            return self.ent_coef
        return 0.01 if discrete else 0.0

    @property
    def batch_size(self) -> int:
        return int(self.num_envs) * int(self.num_steps)


@dataclass
class Result:
    """Measurements of one run, comparable across baselines."""

    baseline: str
    config: dict[str, Any]
    env_steps_per_s: float  # over iterations 2.. (the first pays for warm-up/compilation)
    seconds_per_iteration: float  # mean, iterations 2..
    first_iteration_s: float
    setup_s: float  # env and network creation (and jit tracing where it happens up front)
    total_s: float
    total_env_steps: int
    peak_rss_bytes: int
    framework_peak_bytes: int | None  # accelerator allocator peak where the framework reports it
    returns: list[float] = field(default_factory=list)  # per iteration; NaN if none completed
    # RSS after imports, before the env, network and buffers exist: peak minus this is the
    # run's data memory (0: not measured)
    base_rss_bytes: int = 0
    # timerl under a memory budget: the budget asked for, the planned peak it compiled to and
    # whether that fits (else it ran with the smallest budget that fits)
    memory_budget_bytes: int = 0
    planned_peak_bytes: int = 0
    within_budget: bool | None = None
    # timerl: RSS once imported, compiled and its code generated, and the peak RSS of the run
    # from there (compiling's own transient peak excluded): what the program's meter and
    # ``planned_peak`` count should agree with (0: not measured)
    run_base_rss_bytes: int = 0
    run_peak_rss_bytes: int = 0

    @classmethod
    def measured(
        cls,
        baseline: str,
        cfg: Config,
        iteration_seconds: list[float],
        returns: list[float],
        *,
        start: float,
        setup_s: float,
        framework_peak_bytes: int | None = None,
        base_rss_bytes: int = 0,
    ) -> Result:
        """A baseline's run, timed per iteration from ``start`` (its ``perf_counter``), its
        peak RSS read now: every baseline derives the same figures the same way."""
        steps_per_s, per_iter, first = timing_summary(iteration_seconds, cfg.batch_size)
        return cls(
            baseline=baseline,
            config=vars(cfg).copy(),
            env_steps_per_s=steps_per_s,
            seconds_per_iteration=per_iter,
            first_iteration_s=first,
            setup_s=setup_s,
            total_s=time.perf_counter() - start,
            total_env_steps=cfg.batch_size * cfg.iterations,
            peak_rss_bytes=peak_rss_bytes(),
            framework_peak_bytes=framework_peak_bytes,
            returns=returns,
            base_rss_bytes=base_rss_bytes,
        )

    def iterations_to(self, target: float) -> int | None:
        """First iteration (1-based) whose mean completed return reached ``target``."""
        for k, value in enumerate(self.returns, start=1):
            if not math.isnan(value) and value >= target:
                return k
        return None

    def summary(self) -> str:
        """One human-readable paragraph."""
        c = self.config
        tail = [r for r in self.returns[-5:] if not math.isnan(r)]
        last = f"{sum(tail) / len(tail):.1f}" if tail else "n/a"
        fw_peak = self.framework_peak_bytes
        fw = "n/a" if fw_peak is None else f"{fw_peak / 2**20:.1f}"
        return (
            f"{self.baseline} on {c['env_id']} ({c['num_envs']} envs x {c['num_steps']} steps, "
            f"{c['iterations']} iterations, epochs={c['epochs']} minibatches={c['minibatches']}, "
            f"hidden {c['hidden_layers']}x{c['hidden_size']}, lr={c['lr']})\n"
            f"  env steps/s: {self.env_steps_per_s:,.0f}   s/iteration: "
            f"{self.seconds_per_iteration:.4f}   first iteration: {self.first_iteration_s:.3f}s   "
            f"setup: {self.setup_s:.3f}s\n"
            f"  peak RSS: {self.peak_rss_bytes / 2**20:.1f} MiB   framework peak: {fw} MiB   "
            f"mean return (last 5 iterations): {last}"
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)


def timing_summary(iteration_seconds: list[float], batch_size: int) -> tuple[float, float, float]:
    """``(steps_per_s, seconds_per_iteration, first_iteration_s)``, leaving the first out."""
    if not iteration_seconds:
        return 0.0, 0.0, 0.0
    first = iteration_seconds[0]
    steady = iteration_seconds[1:] or iteration_seconds
    per_iter = sum(steady) / len(steady)
    return (batch_size / per_iter if per_iter > 0 else float("inf")), per_iter, first


def peak_rss_bytes() -> int:
    """This process's peak resident set size (psutil's if installed, else getrusage's)."""
    try:
        import psutil

        info = psutil.Process().memory_info()
        peak = getattr(info, "peak_wset", None) or getattr(info, "peak_rss", None)
        if peak:
            return int(peak)
    except ImportError:
        pass
    kib_or_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib_or_bytes if sys.platform == "darwin" else kib_or_bytes * 1024)


def high_water_rss_bytes() -> int:
    """The kernel's resident high-water mark (``VmHWM``; resettable), else the peak RSS."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return peak_rss_bytes()


def reset_high_water_rss() -> bool:
    """Start the high-water mark again from the current RSS (Linux); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def current_rss_bytes() -> int:
    """This process's resident set size now (0 where neither psutil nor /proc tells)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        pass
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def mean_or_nan(values: Any) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else float("nan")


def pin_threads(threads: int) -> None:
    """Pin BLAS/OpenMP pools before torch or numpy spin them up (no effect once they have)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))


def build_parser(description: str) -> argparse.ArgumentParser:
    """The command line every baseline module accepts (``python -m bench.baselines.X``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--env", dest="env_id", default="CartPole-v1")
    p.add_argument("--env-kwargs", type=json.loads, default=None, help="JSON, e.g. '{\"x\": 1}'")
    p.add_argument("--obs-shape", type=lambda s: tuple(int(d) for d in s.split("x")), default=None,
                   help="Synthetic-v0 observation shape, e.g. 3x64x64")  # fmt: skip
    p.add_argument("--num-envs", type=int, default=None)
    p.add_argument("--num-steps", type=int, default=None)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--hidden-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--minibatches", type=int, default=1)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--ent-coef", type=float, default=None)
    p.add_argument("--no-value-baseline", dest="value_baseline", action="store_false")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--policy", choices=("mlp", "minatar_cnn"), default="mlp", help="the network (jax_ppo)"
    )
    p.add_argument("--target", type=float, default=None, help="report iterations to this return")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    names = {f.name for f in fields(Config)}
    cfg = Config(**{k: v for k, v in vars(args).items() if k in names})
    if args.obs_shape is not None:
        base = ENV_DEFAULTS.get(cfg.env_id, {}).get("env_kwargs", {})
        cfg.env_kwargs = {**base, **(cfg.env_kwargs or {}), "obs_shape": args.obs_shape}
    return cfg


def main_for(run: Any, description: str, argv: list[str] | None = None) -> int:
    """Parse the command line, run one baseline, print its result."""
    args = build_parser(description).parse_args(argv)
    pin_threads(args.threads)
    try:
        result = run(config_from_args(args))
    except BaselineUnavailable as err:
        print(f"skipped: {err}", file=sys.stderr)
        return 3
    print(result.to_json() if args.json else result.summary())
    if args.target is not None:
        k = result.iterations_to(args.target)
        steps = None if k is None else k * result.config["num_envs"] * result.config["num_steps"]
        print(f"  reached mean return {args.target} at iteration {k} (env steps: {steps})")
    return 0
