"""The systems ``bench.rl`` compares and the cases it runs them on.

A system is one implementation of an algorithm (a timerl backend or an eager baseline) with the
packages it needs; a case is one configuration on one experiment's plot axis. ``systems_for``
decides which systems run a case.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bench.common import Config, Result

# --------------------------------------------------------------------------------------------
# systems


@dataclass
class System:
    name: str
    kind: str  # "timerl" or "baseline"
    algo: str  # the algorithm it implements
    run: Callable[[Config, str], Result]
    needs: tuple[str, ...] = ()  # importable modules it cannot run without
    profile: Callable[[Config, str], dict[str, Any]] | None = None

    def unavailable(self) -> str | None:
        missing = [m for m in self.needs if importlib.util.find_spec(m) is None]
        return f"not installed: {', '.join(missing)}" if missing else None


def _on_host(cfg: Config, backend: str) -> Config:
    """The numpy backend runs on the host whatever ``--device`` the other systems use."""
    return replace(cfg, device="cpu") if backend == "numpy" else cfg


def _timerl(backend: str) -> Callable[[Config, str], Result]:
    def run(cfg: Config, algo: str) -> Result:
        from bench import timerl_runner

        return timerl_runner.run(_on_host(cfg, backend), algo=algo, backend=backend)

    return run


def _timerl_profile(backend: str) -> Callable[[Config, str], dict[str, Any]]:
    def profile(cfg: Config, algo: str) -> dict[str, Any]:
        from bench import timerl_runner

        return timerl_runner.profiled(_on_host(cfg, backend), algo=algo, backend=backend)

    return profile


def _baseline(module: str) -> Callable[[Config, str], Result]:
    def run(cfg: Config, algo: str) -> Result:
        import importlib

        return importlib.import_module(f"bench.baselines.{module}").run(cfg)

    return run


def _baseline_profile(module: str) -> Callable[[Config, str], dict[str, Any]]:
    def profile(cfg: Config, algo: str) -> dict[str, Any]:
        from bench import timerl_runner

        return timerl_runner.profiled_baseline(cfg, lambda c: _baseline(module)(c, algo))

    return profile


def default_systems() -> dict[str, System]:
    return {
        s.name: s
        for s in [
            System("timerl_numpy", "timerl", "*", _timerl("numpy"), (), _timerl_profile("numpy")),
            System(
                "timerl_torch",
                "timerl",
                "*",
                _timerl("torch"),
                ("torch",),
                _timerl_profile("torch"),
            ),
            System("timerl_jax", "timerl", "*", _timerl("jax"), ("jax",), _timerl_profile("jax")),
            # numpy under a memory budget of eager PyTorch's data memory (same run) / 16
            System("timerl_budget", "timerl", "*", _timerl("numpy")),
            System(
                "torch_ppo",
                "baseline",
                "ppo",
                _baseline("torch_ppo"),
                ("torch",),
                _baseline_profile("torch_ppo"),
            ),
            System(
                "torch_reinforce",
                "baseline",
                "reinforce",
                _baseline("torch_reinforce"),
                ("torch",),
                _baseline_profile("torch_reinforce"),
            ),
            System(
                "torch_ppo_atari",
                "baseline",
                "ppo",
                _baseline("torch_ppo_atari"),
                ("torch", "envpool"),
                _baseline_profile("torch_ppo_atari"),
            ),
            System("jax_ppo", "baseline", "ppo", _baseline("jax_ppo"), ("jax", "optax")),
            System("sb3_ppo", "baseline", "ppo", _baseline("sb3_ppo"), ("stable_baselines3",)),
        ]
    }


SYSTEMS: dict[str, System] = default_systems()

BUDGETED = "timerl_budget"  # the system compiled under a budget measured in the same run
BUDGET_FRACTION = 16  # its budget: eager PyTorch's data memory / this
EAGER = {"ppo": "torch_ppo", "reinforce": "torch_reinforce"}  # eager PyTorch per algorithm


# --------------------------------------------------------------------------------------------
# configurations


@dataclass
class Case:
    experiment: str
    label: str
    config: Config
    algo: str = "ppo"
    x: Any = None  # this case's value on its experiment's plot axis
    only: tuple[str, ...] = ()  # the systems that run it (empty: every one that fits)

    def describe(self) -> str:
        c = self.config.resolved()
        obs = c.env_kwargs.get("obs_shape")
        env = c.env_id + (f" {'x'.join(map(str, obs))}" if obs else "")
        if "episode_length" in c.env_kwargs:
            env += f" ep{c.env_kwargs['episode_length']}"
        net = (
            "MinAtar CNN"
            if c.policy == "minatar_cnn"
            else f"{c.hidden_layers}x{c.hidden_size} tanh"
        )
        return (
            f"{self.algo} {env}, {c.num_envs} envs x {c.num_steps} steps, "
            f"{net}, epochs={c.epochs} minibatches={c.minibatches}"
            f", {c.iterations} iterations, lr={c.lr}"
        )


EXPERIMENTS: dict[str, tuple[str, str]] = {
    # name: (plot axis, what it measures)
    "synthetic": ("num_envs", "Synthetic-v0, 3x4x4 obs, 250-step episodes: scaling with envs"),
    "depth": ("hidden layers", "CartPole-v1, 16 envs: scaling with network depth"),
    "memory": (
        "num_envs",
        "memory-heavy: Synthetic-v0 3x64x64 obs, 1000-step episodes (memory-eN); or 3x4x4 obs "
        "with 2x256 hidden, whose update holds activations over 64,000 rows (memory-rows-e256)",
    ),
    "reinforce": ("num_envs", "CartPole-v1, REINFORCE with a value baseline"),
    "gym": ("hidden layers", "CartPole-v1 stepped by gymnasium (a host env) on every backend"),
    "atari": (
        "num_envs",
        "Pong-v5 through envpool (uint8 4x84x84 frames), CleanRL's Nature-CNN agent, 8 envs x "
        "128 steps, 4 epochs x 4 minibatches, against eager PyTorch with the same agent",
    ),
    "minatar": (
        "num_envs",
        "gymnax:Breakout-MinAtar (10x10x4 planes) inside the program, the MinAtar CNN, 64 envs "
        "x 128 steps, 4 epochs x 8 minibatches: timerl jax against the jitted JAX PPO",
    ),
}

# baselines written for image observations and the ones that are not (an MLP over pixels)
IMAGE_BASELINES = ("torch_ppo_atari",)


def is_atari(case: Case) -> bool:
    return case.experiment == "atari"


def all_cases(quick: bool = False, iterations: int | None = None, seed: int = 0) -> list[Case]:
    """Every benchmark case; ``quick`` shortens runs (few iterations)."""

    def its(full: int, short: int) -> int:
        return iterations if iterations is not None else (short if quick else full)

    def synth(obs: tuple[int, ...], episode: int) -> dict[str, Any]:
        return {"obs_shape": obs, "episode_length": episode, "action_dim": 2}

    cases: list[Case] = []
    for envs in (16, 64, 256):
        n = its({16: 12, 64: 8, 256: 5}[envs], 3)
        cfg = Config("Synthetic-v0", synth((3, 4, 4), 250), num_envs=envs, iterations=n, seed=seed)
        cases.append(Case("synthetic", f"synthetic-e{envs}", cfg, x=envs))
    for layers in (1, 2, 4):
        cfg = Config("CartPole-v1", num_envs=16, hidden_layers=layers, iterations=its(15, 3))
        cfg.seed = seed
        cases.append(Case("depth", f"cartpole-l{layers}", cfg, x=layers))
    # 4 envs: below the crossover where eager PyTorch's import outweighs a rollout; 8 and 32:
    # a rollout of 375 MiB and 1.5 GiB of observations
    for envs in (4, 8, 32):
        cfg = Config(
            "Synthetic-v0",
            synth((3, 64, 64), 1000),
            num_envs=envs,
            num_steps=1000,
            iterations=its(3, 3),
            seed=seed,
        )
        cases.append(Case("memory", f"memory-e{envs}", cfg, x=envs))
    # small observations, wide layers: the update's activations (64,000 x 256 floats, 62.5
    # MiB each) dominate; under a budget they run in blocks of rows (incrementalisation)
    cfg = Config(
        "Synthetic-v0",
        synth((3, 4, 4), 250),
        num_envs=256,
        hidden_size=256,
        iterations=its(3, 3),
        seed=seed,
    )
    cases.append(Case("memory", "memory-rows-e256", cfg, x=256))
    cfg = Config("CartPole-v1", num_envs=16, iterations=its(15, 5), seed=seed)
    cases.append(Case("reinforce", "reinforce-cartpole", cfg, algo="reinforce", x=16))
    # the env a host call between jitted regions on the jax backend (timerl systems only:
    # jax_ppo always runs its JAX env)
    cfg = Config("CartPole-v1", num_envs=16, iterations=its(15, 3), seed=seed, host_env=True)
    cases.append(Case("gym", "gym-cartpole-l2", cfg, x=2))
    cfg = Config("Pong-v5", epochs=4, minibatches=4, clip_coef=0.1, iterations=its(4, 2))
    cfg.seed = seed
    cases.append(Case("atari", "atari-pong", cfg, x=8))
    cfg = Config(
        "gymnax:Breakout-MinAtar",
        epochs=4,
        minibatches=8,
        iterations=its(12, 3),
        seed=seed,
        policy="minatar_cnn",
    )
    cases.append(Case("minatar", "minatar-breakout", cfg, x=64, only=("timerl_jax", "jax_ppo")))
    return cases


QUICK = ("synthetic-e16", "cartpole-l2")


def select_cases(cases: list[Case], names: str | None, quick: bool) -> list[Case]:
    """By case label or experiment name (comma separated); ``--quick`` defaults to a subset."""
    if not names:
        return [c for c in cases if c.label in QUICK] if quick else cases
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {c.label for c in cases} | {c.experiment for c in cases} | {"all"}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(
            f"unknown configuration(s) {unknown}; choose from {sorted(known - {'all'})}"
        )
    if "all" in wanted:
        return cases
    return [c for c in cases if c.label in wanted or c.experiment in wanted]


# --------------------------------------------------------------------------------------------
# which systems run a case


def systems_for(case: Case, names: list[str], systems: dict[str, System]) -> list[System]:
    """The systems that run ``case`` (a host-env case leaves out jax_ppo, whose env is JAX's)."""
    return [
        systems[n]
        for n in names
        if systems[n].algo in ("*", case.algo)
        and not (case.config.host_env and n == "jax_ppo")
        and (systems[n].kind != "baseline" or (n in IMAGE_BASELINES) == is_atari(case))
        and (not case.only or n in case.only)
    ]
