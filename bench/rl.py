"""Side-by-side DRL benchmark: timerl's PPO/REINFORCE programs against the eager baselines.

Every system runs the same configuration (env, batch shape, network, update schedule, learning
rate, seed; see :mod:`bench.common`), one measurement per fresh worker process so that peak RSS
belongs to that system alone. Systems are alternated (each repetition rotates their order) and
repeated; the table reports medians and the ratio of each timerl backend's env steps/s over
each baseline's, both measured in this run.

    python -m bench.rl --quick
    python -m bench.rl --configs synthetic,depth --repeats 3 --out runs/bench --profile
    timerl bench rl --quick

Systems that cannot run here (a package is missing) become ``skipped`` rows; a system that
fails on one configuration becomes a ``failed`` row with the error, and the run goes on.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.common import BaselineUnavailable, Config, Result

ROOT = Path(__file__).resolve().parents[1]
MARK = "@@bench-result "


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
# running one measurement (in a worker process, or in this one)


def _config_to_json(cfg: Config) -> dict[str, Any]:
    return asdict(cfg)


def _config_from_json(data: dict[str, Any]) -> Config:
    cfg = Config(**data)
    if cfg.env_kwargs:
        cfg.env_kwargs = {
            k: tuple(v) if isinstance(v, list) else v for k, v in cfg.env_kwargs.items()
        }
    return cfg


def run_one(system: System, case: Case, profile: bool = False) -> dict[str, Any]:
    """One measurement in this process: ``{"status": "ok"|"skipped"|"failed", ...}``."""
    reason = system.unavailable()
    if reason:
        return {"status": "skipped", "reason": reason}
    try:
        if profile:
            if system.profile is None:
                return {"status": "skipped", "reason": "no profile"}
            return {"status": "ok", "profile": system.profile(case.config, case.algo)}
        result = system.run(case.config, case.algo)
        return {"status": "ok", "result": asdict(result)}
    except (BaselineUnavailable, ImportError) as err:
        return {"status": "skipped", "reason": str(err)}
    except Exception as err:  # a system failing on one case must not end the benchmark
        tb = traceback.format_exc(limit=-3)
        return {"status": "failed", "reason": f"{type(err).__name__}: {err}", "traceback": tb}


def _worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    if threads == 1 and "multi_thread_eigen" not in env.get("XLA_FLAGS", ""):
        extra = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra}".strip()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_isolated(
    system: System, case: Case, profile: bool = False, timeout: float = 1800
) -> dict[str, Any]:
    """One measurement in a fresh Python process (its peak RSS is this system's alone)."""
    reason = system.unavailable()
    if reason:
        return {"status": "skipped", "reason": reason}
    spec = {
        "system": system.name,
        "config": _config_to_json(case.config),
        "algo": case.algo,
        "experiment": case.experiment,
        "label": case.label,
        "profile": profile,
    }
    cmd = [sys.executable, "-m", "bench.rl", "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=_worker_env(case.config.threads),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"status": "failed", "reason": f"worker exited {proc.returncode}: {tail[0]}"}


def _worker(spec_json: str) -> int:
    spec = json.loads(spec_json)
    cfg = _config_from_json(spec["config"])
    if cfg.threads == 1 and spec["system"].startswith("jax"):
        from bench.baselines.jax_ppo import pin_xla_threads

        pin_xla_threads()
    case = Case(spec["experiment"], spec["label"], cfg, algo=spec["algo"])
    out = run_one(SYSTEMS[spec["system"]], case, profile=spec["profile"])
    print(MARK + json.dumps(out, default=str), flush=True)
    return 0


# --------------------------------------------------------------------------------------------
# the benchmark


@dataclass
class Row:
    case: Case
    system: str
    kind: str
    status: str = "ok"
    reason: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)  # baseline -> timerl/baseline

    def median(self, key: str) -> float:
        values = [r[key] for r in self.results if r.get(key) is not None]
        return float(statistics.median(values)) if values else math.nan

    @property
    def data_bytes(self) -> float:
        """Median peak RSS minus RSS after imports: the run's data (NaN if not measured)."""
        values = [
            r["peak_rss_bytes"] - r["base_rss_bytes"]
            for r in self.results
            if r.get("base_rss_bytes") and r.get("peak_rss_bytes")
        ]
        return float(statistics.median(values)) if values else math.nan

    @property
    def run_data_bytes(self) -> float:
        """Median peak RSS of the run minus RSS after imports and compile (timerl only)."""
        values = [
            r["run_peak_rss_bytes"] - r["run_base_rss_bytes"]
            for r in self.results
            if r.get("run_base_rss_bytes") and r.get("run_peak_rss_bytes")
        ]
        return float(statistics.median(values)) if values else math.nan

    @property
    def steps_per_s(self) -> float:
        return self.median("env_steps_per_s")

    @property
    def spread(self) -> float:
        """(max - min) / median of env steps/s over the repetitions."""
        values = [r["env_steps_per_s"] for r in self.results]
        if len(values) < 2:
            return math.nan
        return (max(values) - min(values)) / statistics.median(values)

    @property
    def last_return(self) -> float:
        if not self.results:
            return math.nan
        tail = [r for r in self.results[0]["returns"][-5:] if not math.isnan(r)]
        return sum(tail) / len(tail) if tail else math.nan


BUDGETED = "timerl_budget"  # the system compiled under a budget measured in the same run
BUDGET_FRACTION = 16  # its budget: eager PyTorch's data memory / this
EAGER = {"ppo": "torch_ppo", "reinforce": "torch_reinforce"}  # eager PyTorch per algorithm


def budget_for(case: Case, rows: dict[str, Row]) -> int | None:
    """Eager PyTorch's median data memory on ``case`` so far, / ``BUDGET_FRACTION``."""
    eager = rows.get(EAGER.get(case.algo, ""))
    if eager is None or eager.status != "ok" or math.isnan(eager.data_bytes):
        return None
    return int(eager.data_bytes / BUDGET_FRACTION)


def budget_lines(rows: list[Row]) -> list[str]:
    """Per budgeted run: the budget, whether the data memory stayed within it, the time ratio."""
    out = []
    by_case = {(r.case.label, r.system): r for r in rows}
    for row in rows:
        if row.system != BUDGETED or row.status != "ok" or not row.results:
            continue
        eager = by_case.get((row.case.label, EAGER.get(row.case.algo, "")))
        budget = row.median("memory_budget_bytes")
        data = row.data_bytes
        planned = row.median("planned_peak_bytes")
        compiled = all(r.get("within_budget") for r in row.results)
        ratio = (
            row.median("seconds_per_iteration") / eager.median("seconds_per_iteration")
            if eager is not None and eager.status == "ok"
            else math.nan
        )
        out.append(
            f"{row.system} {row.case.label}: budget {_mib(budget):.1f} MiB "
            + (
                f"(eager data {_mib(eager.data_bytes):.0f} MiB / {BUDGET_FRACTION}); "
                if eager is not None and eager.status == "ok"
                else "(--budget); "
            )
            + f"planned peak {_mib(planned):.1f} MiB ({'fits' if compiled else 'over: ran at the smallest budget that fits'}); "
            f"data {_mib(data):.1f} MiB, within budget: {'yes' if data <= budget else 'no'}; "
            f"iteration time {ratio:.2f}x eager"
        )
    return out + accounting_lines(rows)


ACCOUNTING_TOLERANCE = 0.10  # the meter's peak against the run's measured data memory


def accounting_lines(rows: list[Row]) -> list[str]:
    """Per timerl run measured both ways: its meter's peak (``stats()["peak_bytes"]``) against
    the run's data memory after imports and compile (peak RSS of the run minus RSS then), on
    the memory experiment (a small program's few MiB are below what RSS resolves)."""
    out = []
    for row in rows:
        if row.case.experiment != "memory":
            continue
        if any(r.get("config", {}).get("device", "cpu") != "cpu" for r in row.results):
            continue  # on an accelerator the peak is the device's, not the host's RSS
        run_data = row.run_data_bytes
        metered = row.median("framework_peak_bytes")
        if row.status != "ok" or math.isnan(run_data) or math.isnan(metered) or metered <= 0:
            continue
        off = run_data / metered - 1
        out.append(
            f"{row.system} {row.case.label}: metered peak {_mib(metered):.1f} MiB, run data "
            f"{_mib(run_data):.1f} MiB after imports and compile ({off:+.0%}; within "
            f"{ACCOUNTING_TOLERANCE:.0%}: {'yes' if abs(off) <= ACCOUNTING_TOLERANCE else 'no'}); "
            f"data after imports {_mib(row.data_bytes):.1f} MiB"
        )
    return out


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


def compute_ratios(rows: list[Row]) -> None:
    """Fill each timerl row's ratio over every baseline measured on the same case."""
    by_case: dict[str, list[Row]] = {}
    for row in rows:
        by_case.setdefault(row.case.label, []).append(row)
    for group in by_case.values():
        bases = [r for r in group if r.kind == "baseline" and r.status == "ok"]
        for row in group:
            if row.kind != "timerl" or row.status != "ok":
                continue
            for base in bases:
                if base.steps_per_s > 0:
                    row.ratios[base.system] = row.steps_per_s / base.steps_per_s


def run_benchmark(
    cases: list[Case],
    system_names: list[str],
    repeats: int,
    isolated: bool = True,
    systems: dict[str, System] | None = None,
    log: Callable[[str], None] = print,
    budget: int | None = None,
) -> list[Row]:
    """Measure every (case, system) ``repeats`` times, rotating the systems' order each time.

    ``budget``: the bytes ``timerl_budget`` compiles under where eager PyTorch is not in the
    run (a budget measured in an earlier one); with eager PyTorch there, its data / 16."""
    systems = systems or SYSTEMS
    rows: list[Row] = []
    for case in cases:
        chosen = systems_for(case, system_names, systems)
        case_rows = {s.name: Row(case, s.name, s.kind) for s in chosen}
        rows.extend(case_rows.values())
        for rep in range(repeats):
            k = rep % max(len(chosen), 1)
            order = chosen[k:] + chosen[:k]
            # the budgeted system runs after eager PyTorch, whose data memory sets its budget
            order = [s for s in order if s.name != BUDGETED] + [
                s for s in order if s.name == BUDGETED
            ]
            for system in order:
                row = case_rows[system.name]
                if row.status != "ok":
                    continue  # skipped or failed once: do not retry
                run_case = case
                if system.name == BUDGETED:
                    budget_here = budget_for(case, case_rows) or budget
                    if budget_here is None:
                        row.status = "skipped"
                        row.reason = (
                            f"needs {EAGER.get(case.algo, 'eager PyTorch')} in the run or --budget"
                        )
                        continue
                    run_case = replace(case, config=replace(case.config, memory_budget=budget_here))
                t0 = time.perf_counter()
                out = run_isolated(system, run_case) if isolated else run_one(system, run_case)
                took = time.perf_counter() - t0
                if out["status"] == "ok":
                    row.results.append(out["result"])
                    sps = out["result"]["env_steps_per_s"]
                    log(f"  {case.label:<20} {system.name:<16} rep {rep + 1}: {sps:>12,.0f} "
                        f"steps/s  ({took:.1f} s)")  # fmt: skip
                else:
                    row.status, row.reason = out["status"], out["reason"]
                    log(f"  {case.label:<20} {system.name:<16} {out['status']}: {out['reason']}")
    compute_ratios(rows)
    return rows


def run_profiles(
    cases: list[Case],
    system_names: list[str],
    isolated: bool = True,
    systems: dict[str, System] | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    systems = systems or SYSTEMS
    out: list[dict[str, Any]] = []
    for case in cases:
        for system in systems_for(case, system_names, systems):
            if system.profile is None:
                continue
            res = run_isolated(system, case, True) if isolated else run_one(system, case, True)
            if res["status"] != "ok":
                log(f"  profile {case.label} {system.name}: {res['status']}: {res['reason']}")
                continue
            out.append({"case": case.label, **res["profile"]})
    return out


# --------------------------------------------------------------------------------------------
# output


def baseline_names(rows: list[Row]) -> list[str]:
    seen: list[str] = []
    for row in rows:
        if row.kind == "baseline" and row.status == "ok" and row.system not in seen:
            seen.append(row.system)
    return seen


def _mib(value: float | None) -> float:
    return math.nan if value is None or math.isnan(value) else value / 2**20


CSV_FIELDS = [
    "experiment",
    "config",
    "system",
    "status",
    "reason",
    "repeats",
    "env_steps_per_s",
    "env_steps_per_s_all",
    "spread",
    "seconds_per_iteration",
    "first_iteration_s",
    "setup_s",
    "peak_rss_mib",
    "data_mib",
    "framework_peak_mib",
    "last_return",
    "algo",
    "env_id",
    "obs_shape",
    "num_envs",
    "num_steps",
    "hidden_layers",
    "hidden_size",
    "epochs",
    "minibatches",
    "iterations",
    "lr",
    "threads",
]


def to_records(rows: list[Row]) -> tuple[list[dict[str, Any]], list[str]]:
    bases = baseline_names(rows)
    ratio_fields = [f"ratio_vs_{b}" for b in bases]
    records = []
    for row in rows:
        c = row.case.config.resolved()
        obs = c.env_kwargs.get("obs_shape")
        rec: dict[str, Any] = {
            "experiment": row.case.experiment,
            "config": row.case.label,
            "system": row.system,
            "status": row.status,
            "reason": row.reason,
            "repeats": len(row.results),
            "env_steps_per_s": row.steps_per_s,
            "env_steps_per_s_all": ";".join(f"{r['env_steps_per_s']:.1f}" for r in row.results),
            "spread": row.spread,
            "seconds_per_iteration": row.median("seconds_per_iteration"),
            "first_iteration_s": row.median("first_iteration_s"),
            "setup_s": row.median("setup_s"),
            "peak_rss_mib": _mib(row.median("peak_rss_bytes")),
            "data_mib": _mib(row.data_bytes),
            "framework_peak_mib": _mib(row.median("framework_peak_bytes")),
            "last_return": row.last_return,
            "algo": row.case.algo,
            "env_id": c.env_id,
            "obs_shape": "x".join(map(str, obs)) if obs else "",
            "num_envs": c.num_envs,
            "num_steps": c.num_steps,
            "hidden_layers": c.hidden_layers,
            "hidden_size": c.hidden_size,
            "epochs": c.epochs,
            "minibatches": c.minibatches,
            "iterations": c.iterations,
            "lr": c.lr,
            "threads": c.threads,
        }
        for b in bases:
            rec[f"ratio_vs_{b}"] = row.ratios.get(b, math.nan)
        records.append(rec)
    return records, CSV_FIELDS + ratio_fields


def write_csv(rows: list[Row], path: Path) -> None:
    records, fields_ = to_records(rows)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields_)
        writer.writeheader()
        for rec in records:
            writer.writerow({k: _fmt_csv(v) for k, v in rec.items()})


def _fmt_csv(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def _num(value: float, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt % value


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def table_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the results table (shared by the console and the markdown file)."""
    bases = baseline_names(rows)
    header = [
        "config",
        "system",
        "env steps/s",
        "spread",
        "s/iter",
        "1st iter ÷ steady",
        "setup s",
        "peak RSS MiB",
        "data MiB",
        "fw peak MiB",
        "return",
    ] + [f"÷ {b}" for b in bases]
    cells = []
    for row in rows:
        if row.status != "ok":
            cells.append([row.case.label, row.system, row.status] + [""] * (len(header) - 3))
            continue
        line = [
            row.case.label,
            row.system,
            f"{row.steps_per_s:,.0f}",
            _num(100 * row.spread, "±%.0f%%"),
            f"{row.median('seconds_per_iteration'):.4f}",
            _num(
                _ratio(row.median("first_iteration_s"), row.median("seconds_per_iteration")),
                "%.2fx",
            ),
            f"{row.median('setup_s'):.2f}",
            f"{_mib(row.median('peak_rss_bytes')):.0f}",
            _num(_mib(row.data_bytes), "%.0f"),
            _num(_mib(row.median("framework_peak_bytes")), "%.1f"),
            _num(row.last_return, "%.1f"),
        ]
        line += [_num(row.ratios.get(b, math.nan), "%.2fx") for b in bases]
        cells.append(line)
    return header, cells


def print_table(rows: list[Row], title: str) -> None:
    header, cells = table_rows(rows)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(markdown_table(header, cells))
        print("\n".join(notes(rows) + budget_lines(rows)))
        return
    table = Table(title=title, show_lines=False)
    for k, name in enumerate(header):
        table.add_column(name, justify="left" if k < 2 else "right", no_wrap=k < 2)
    last = None
    for line in cells:
        if last is not None and line[0] != last:
            table.add_section()
        last = line[0]
        style = "dim" if line[2] in ("skipped", "failed") else None
        table.add_row(*line, style=style)
    console = Console(width=max(160, len(header) * 12))
    console.print(table)
    for line in notes(rows) + budget_lines(rows):
        console.print(line, markup=False, highlight=False)


def notes(rows: list[Row]) -> list[str]:
    """One line per system that did not run, with why (and the cases it concerns)."""
    seen: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.status != "ok":
            seen.setdefault((row.system, f"{row.status}: {row.reason}"), []).append(row.case.label)
    return [f"{system} {why} ({', '.join(labels)})" for (system, why), labels in seen.items()]


def markdown_table(header: list[str], cells: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "/") for c in line) + " |" for line in cells]
    return "\n".join(out)


def profile_table(profiles: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = [
        "config",
        "system",
        "compile s",
        "run s",
        "env",
        "kernels",
        "host calls",
        "executor/framework",
        "kernel timers",
        "top kernels (s)",
    ]
    cells = []
    for p in profiles:
        run_s = p["run_s"] or math.nan

        def part(v: float | None, run_s: float = run_s) -> str:
            return "-" if v is None else f"{v:.2f} s ({100 * v / run_s:.0f}%)"

        top = ", ".join(f"{k} {s:.2f}" for k, s, _ in p["top_kernels"][:4])
        cells.append(
            [
                p["case"],
                p["system"],
                _num(p["compile_s"], "%.2f"),
                f"{run_s:.2f}",
                part(p["env_s"]),
                part(p["kernels_s"]),
                part(p.get("host_s")),
                part(p["executor_s"]),
                part(p.get("timers_s")),
                top,
            ]
        )
    return header, cells


def print_profiles(profiles: list[dict[str, Any]]) -> None:
    header, cells = profile_table(profiles)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(markdown_table(header, cells))
        return
    table = Table(title="Where a run's time goes (one instrumented run per system)")
    for k, name in enumerate(header):
        table.add_column(name, justify="left" if k < 2 or k == 8 else "right")
    for line in cells:
        table.add_row(*line)
    Console(width=180).print(table)


def plot(rows: list[Row], out: Path) -> list[Path]:
    """One PNG per experiment: env steps/s and peak RSS per system across its cases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    experiments: dict[str, list[Row]] = {}
    for row in rows:
        experiments.setdefault(row.case.experiment, []).append(row)
    for name, group in experiments.items():
        ok = [r for r in group if r.status == "ok"]
        if not ok:
            continue
        labels = list(dict.fromkeys(r.case.label for r in group))
        xs = {lab: next(r.case.x for r in group if r.case.label == lab) for lab in labels}
        systems = list(dict.fromkeys(r.system for r in ok))
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        width = 0.8 / max(len(systems), 1)
        for k, sys_name in enumerate(systems):
            for ax, key, scale in (
                (axes[0], "env_steps_per_s", 1.0),
                (axes[1], "peak_rss_bytes", 2**-20),
            ):
                heights = []
                for lab in labels:
                    match = [r for r in ok if r.system == sys_name and r.case.label == lab]
                    heights.append(match[0].median(key) * scale if match else 0.0)
                pos = [j + (k - (len(systems) - 1) / 2) * width for j in range(len(labels))]
                ax.bar(pos, heights, width, label=sys_name)
        axis, what = EXPERIMENTS.get(name, (name, name))
        for ax, ylabel in ((axes[0], "env steps/s (median)"), (axes[1], "peak RSS (MiB)")):
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels([f"{axis}={xs[lab]}" for lab in labels])
            ax.set_ylabel(ylabel)
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{what}\n{axis} varies; otherwise as {group[0].case.describe()}", fontsize=9)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------
# command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="few iterations, a subset of configs")
    p.add_argument(
        "--configs",
        default=None,
        help="comma-separated case labels or experiments (synthetic, depth, memory, "
        "reinforce, all); see --list",
    )
    p.add_argument(
        "--systems",
        default=",".join(n for n in SYSTEMS if n != BUDGETED),
        help="comma-separated systems (default: all but timerl_budget, which compiles under "
        "a budget of eager PyTorch's data memory in the same run / 16; unavailable ones print "
        "as skipped)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MIB",
        help="timerl_budget's budget in MiB where eager PyTorch is not in the run",
    )
    p.add_argument("--repeats", type=int, default=None, help="repetitions (default 3; quick 2)")
    p.add_argument("--iterations", type=int, default=None, help="override every case's count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch/BLAS/XLA threads (default 1)")
    p.add_argument(
        "--device",
        default="cpu",
        help="device of the torch and jax systems and baselines, e.g. cuda (numpy: the host)",
    )
    p.add_argument("--out", default=None, help="directory for results.csv, table.md, PNG plots")
    p.add_argument("--profile", action="store_true", help="cost breakdown of timerl runs")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every measurement in this process (faster, but peak RSS is shared)",
    )
    p.add_argument("--list", action="store_true", help="list the configurations and exit")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker(argv[1])
    parser = argparse.ArgumentParser(prog="timerl bench rl", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def run_from_args(args: argparse.Namespace, systems: dict[str, System] | None = None) -> int:
    systems = systems or SYSTEMS
    cases = all_cases(quick=args.quick, iterations=args.iterations, seed=args.seed)
    for case in cases:
        case.config.threads = args.threads
        case.config.device = args.device
    if args.list:
        for case in cases:
            print(f"{case.label:<20} [{case.experiment}] {case.describe()}")
        return 0
    chosen = select_cases(cases, args.configs, args.quick)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in systems]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {sorted(systems)}")
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    if args.in_process:
        from bench.common import pin_threads

        pin_threads(args.threads)
        if args.threads == 1:
            from bench.baselines.jax_ppo import pin_xla_threads

            pin_xla_threads()
    began = time.perf_counter()
    print(f"timerl bench rl: {len(chosen)} configuration(s) x {len(names)} system(s) "
          f"x {repeats} repeat(s), {args.threads} thread(s), device {args.device}")  # fmt: skip
    for case in chosen:
        print(f"  {case.label:<20} {case.describe()}")
    budget = None if args.budget is None else int(args.budget * 2**20)
    rows = run_benchmark(chosen, names, repeats, not args.in_process, systems, budget=budget)
    title = f"env steps/s, median of {repeats} alternated runs; ÷ X = timerl / X (steps/s)"
    print_table(rows, title)
    profiles: list[dict[str, Any]] = []
    if args.profile:
        timerl_names = [n for n in names if systems[n].profile is not None]
        profiles = run_profiles(chosen, timerl_names, not args.in_process, systems)
        print_profiles(profiles)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, out / "results.csv")
        header, cells = table_rows(rows)
        text = markdown_table(header, cells) + "".join(
            f"\n\n{n}" for n in notes(rows) + budget_lines(rows)
        )
        if profiles:
            ph, pc = profile_table(profiles)
            text += "\n\n" + markdown_table(ph, pc)
            with open(out / "profile.json", "w") as fh:
                json.dump(profiles, fh, indent=1, default=str)
        (out / "table.md").write_text(text + "\n")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            paths = []
            print("note: matplotlib is not installed (pip install 'timerl[train]'): no plots")
        else:
            paths = plot(rows, out)
        print(f"wrote {out / 'results.csv'}, {out / 'table.md'} and {len(paths)} plot(s)")
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
