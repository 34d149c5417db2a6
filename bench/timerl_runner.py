"""timerl's own PPO/REINFORCE programs, run with a :class:`bench.common.Config` and measured the
way the baselines measure themselves, so that their :class:`bench.common.Result` rows compare.

The config maps field for field onto timerl's ``PPOConfig``/``ReinforceConfig``: the same env
(and env kwargs), batch shape, network (``hidden_layers`` x ``hidden_size``), epochs,
minibatches, constant learning rate (no annealing, as in every baseline), coefficients and seed.

Timings come from the training driver's per-iteration records (wall time since the run began),
so they cover exactly what the baselines' loops cover: the rollout, returns, the update and the
metrics of one iteration. ``setup_s`` is everything before the first iteration starts: building
the program (env creation included), compiling it, and the program's prologue before its loop
(the initial parameters, the env's reset), which the eager baselines also run before theirs.

:func:`profiled` runs the same program with timers around the environment's ``step``/``reset``
and around every primitive kernel the backend hands to the executor, and splits the run time
into environment, kernels and executor overhead (the rest).

    python -m bench.timerl_runner --env Synthetic-v0 --num-envs 64 --iterations 10 --backend torch
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from bench.common import (
    Config,
    Result,
    build_parser,
    config_from_args,
    current_rss_bytes,
    high_water_rss_bytes,
    peak_rss_bytes,
    pin_threads,
    reset_high_water_rss,
)

BACKENDS = ("numpy", "torch")


def system_name(algo: str, backend: str) -> str:
    """One name per backend; the algorithm is part of the benchmark case, not the system."""
    return f"timerl_{backend}"


def env_backend(env_id: str, backend: str) -> str:
    """On the jax backend, an env with a pure JAX version (``rl/envs/jax_envs.py``: Synthetic-v0,
    CartPole-v1, gymnax's ids) runs inside the program (``env_backend="jax"``), as the JAX
    baseline's does; every other run steps the host env."""
    from timerl.rl.envs.jax_envs import GYMNAX_PREFIX, JAX_ENV_IDS

    jax_env = env_id in JAX_ENV_IDS or env_id.startswith(GYMNAX_PREFIX)
    return "jax" if backend == "jax" and jax_env else "gymnasium"


def envpool_atari(env_id: str) -> bool:
    from timerl.rl.envs.vector import envpool_atari as is_atari

    return is_atari(env_id)


def timerl_config(config: Config, algo: str = "ppo", backend: str = "numpy") -> dict[str, Any]:
    """The timerl hyper-parameter dict equivalent to a resolved baseline config."""
    cfg = config.resolved()
    out: dict[str, Any] = {
        "env_id": cfg.env_id,
        "env_backend": "gymnasium" if cfg.host_env else env_backend(cfg.env_id, backend),
        "num_envs": cfg.num_envs,
        "num_steps": cfg.num_steps,
        "lr": cfg.lr,
        "anneal_lr": False,  # the baselines keep the learning rate constant
        "gamma": cfg.gamma,
        "hidden": (cfg.hidden_size,) * cfg.hidden_layers,
        "max_grad_norm": cfg.max_grad_norm,
        "seed": cfg.seed,
        "env_kwargs": dict(cfg.env_kwargs or {}),
        "ent_coef": cfg.ent_coef,
        "vf_coef": cfg.vf_coef,
    }
    if algo == "ppo" and envpool_atari(cfg.env_id):  # CleanRL's agent on envpool
        out |= {"env_backend": "envpool", "policy": "cnn"}
    if cfg.policy == "minatar_cnn":  # timerl's CNN policy on small images is the MinAtar CNN
        out["policy"] = "cnn"
    if algo == "ppo":
        out |= {
            "gae_lambda": cfg.gae_lambda,
            "epochs": cfg.epochs,
            "minibatches": cfg.minibatches,
            "clip": cfg.clip_coef,
            "norm_adv": cfg.norm_adv,
        }
    elif algo == "reinforce":
        out["baseline"] = cfg.value_baseline
    else:
        raise ValueError(f"unknown algorithm {algo!r}; choose ppo or reinforce")
    return out


def _setup_threads(cfg: Config, backend: str) -> None:
    pin_threads(cfg.threads)
    if backend == "torch":
        import torch

        torch.set_num_threads(cfg.threads)


def _train(config: Config, algo: str, backend: str) -> tuple[Config, Any, list, float]:
    """Run timerl's driver; ``(resolved config, TrainResult, [(wall, record)], start)``."""
    from timerl.rl.train import train

    cfg = config.resolved()
    _setup_threads(cfg, backend)
    records: list[tuple[float, dict[str, Any]]] = []
    import timerl.rl.train  # noqa: F401 (imports count as the framework's, not data)
    from timerl.errors import MemoryBudgetError

    base_rss = current_rss_bytes()
    start = time.perf_counter()
    budget, within = cfg.memory_budget, None
    marks: dict[str, int] = {}

    def started() -> None:
        # compiling's transient peak is kept aside; the run's own peak starts from here (its
        # base: the resident memory before the run's pages were faulted in at setup)
        marks["setup_peak"] = high_water_rss_bytes()
        marks["run_base"] = marks.get("compiled", current_rss_bytes())
        marks["reset"] = int(reset_high_water_rss())

    from timerl.runtime.executor import Executor

    reserve = Executor.reserve_memory

    def reserve_memory(self: Executor, reserving: bool) -> None:
        marks.setdefault("compiled", current_rss_bytes())
        reserve(self, reserving)

    def go(memory_budget: int | None) -> Any:
        return train(
            algo,
            timerl_config(cfg, algo, backend),
            iterations=cfg.iterations,
            backend=backend,
            device=cfg.device,
            progress=False,
            memory_budget=memory_budget,
            threads=cfg.threads,  # the baselines' count: side by side on the same cores
            on_iteration=lambda rec: records.append((time.perf_counter(), dict(rec))),
            on_start=started,
        )

    Executor.reserve_memory = reserve_memory  # type: ignore[method-assign]
    try:
        out = go(budget)
        within = True if budget is not None else None
    except MemoryBudgetError as err:
        if err.smallest is None:
            raise
        # over the budget even streamed: run at the smallest budget that fits, and say so
        marks.pop("compiled", None)
        out, within = go(err.smallest), False
    finally:
        Executor.reserve_memory = reserve  # type: ignore[method-assign]
    out.base_rss_bytes = base_rss
    run_peak = high_water_rss_bytes()
    out.run_base_rss_bytes = marks.get("run_base", 0) if marks.get("reset") else 0
    out.run_peak_rss_bytes = run_peak if marks.get("reset") else 0
    # the whole process's peak: the run's or compiling's, whichever was higher
    out.peak_rss_bytes = max(run_peak, marks.get("setup_peak", 0), peak_rss_bytes())
    out.memory_budget_bytes = int(budget or 0)
    out.within_budget = within
    return cfg, out, records, start


def run(config: Config, algo: str = "ppo", backend: str = "numpy") -> Result:
    """Train timerl's ``algo`` program on ``backend`` and measure it like a baseline."""
    cfg, out, records, start = _train(config, algo, backend)
    return _result(cfg, out, records, start, algo, backend)


def _result(cfg: Config, out: Any, records: list, start: float, algo: str, backend: str) -> Result:
    if not records:
        raise RuntimeError("timerl ran no iteration")
    cumulative = [rec["seconds"] for _, rec in records]
    prologue = float(getattr(out, "prologue_seconds", 0.0))
    iter_seconds = [b - a for a, b in zip([prologue, *cumulative[:-1]], cumulative, strict=True)]
    wall0, rec0 = records[0]
    # build + compile + executor creation + the prologue
    setup_s = (wall0 - rec0["seconds"]) - start + prologue
    returns = [
        float(rec["episodic_return"]) if rec.get("episodes", 1) else math.nan for _, rec in records
    ]
    measured = Result.measured(
        system_name(algo, backend),
        cfg,
        iter_seconds,
        returns,
        start=start,
        setup_s=setup_s,
        # on an accelerator its allocator's peak, as the baselines report; else timerl's meter
        framework_peak_bytes=int(out.device_peak_bytes or out.peak_bytes),
        base_rss_bytes=int(getattr(out, "base_rss_bytes", 0)),
    )
    return dataclasses.replace(
        measured,
        total_env_steps=cfg.batch_size * len(records),  # the iterations it ran
        peak_rss_bytes=int(getattr(out, "peak_rss_bytes", 0) or measured.peak_rss_bytes),
        memory_budget_bytes=int(getattr(out, "memory_budget_bytes", 0)),
        planned_peak_bytes=int(getattr(out, "planned_peak_bytes", 0) or 0),
        within_budget=getattr(out, "within_budget", None),
        run_base_rss_bytes=int(getattr(out, "run_base_rss_bytes", 0)),
        run_peak_rss_bytes=int(getattr(out, "run_peak_rss_bytes", 0)),
    )


class _Timers:
    def __init__(self) -> None:
        self.env = 0.0
        self.env_calls = 0
        # host calls' own time outside the env's ``step``/``reset``: their Python, the
        # conversions of their arguments and results, and other host functions (metrics)
        self.host = 0.0
        self.host_calls = 0
        self.kernel: dict[str, float] = defaultdict(float)
        self.kernel_calls: dict[str, int] = defaultdict(int)
        # what timing one kernel adds, per call (``_calibrate``): inside the timed interval
        # (counted as kernel time) and outside it (counted as the executor's)
        self.inside = 0.0
        self.outside = 0.0


def _calibrate(timers: _Timers, wrap: Any, calls: int = 20_000) -> None:
    """Measure the kernel timer's own cost on a kernel that does nothing.

    Two clock reads, a closure call and two dict updates per kernel are small, but a PPO
    iteration runs thousands of kernels: uncorrected, they showed up as executor time. The
    probe is called as most kernels are, with two operands and a keyword (``K(x, w,
    out=row)``): passing them on through the timer's ``*args, **kwargs`` costs about half as
    much again as a call without arguments (360 against 240 ns on this machine).
    """

    def noop(*_args: Any, **_kwargs: Any) -> None:
        return None

    timed = wrap(lambda _self, _prim: noop)(None, "_probe")
    x, w, row = object(), object(), object()
    best_plain = best_timed = math.inf
    for _ in range(3):  # best of three: the least disturbed
        t0 = time.perf_counter()
        for _ in range(calls):
            noop(x, w, out=row)
        best_plain = min(best_plain, time.perf_counter() - t0)
        before = timers.kernel["_probe"]
        t0 = time.perf_counter()
        for _ in range(calls):
            timed(x, w, out=row)
        elapsed = time.perf_counter() - t0
        if elapsed < best_timed:
            best_timed, inside = elapsed, timers.kernel["_probe"] - before
    timers.kernel.pop("_probe")
    timers.kernel_calls.pop("_probe")
    plain = best_plain / calls
    timers.inside = max(inside / calls - plain, 0.0)
    timers.outside = max((best_timed - best_plain) / calls - timers.inside, 0.0)


@contextlib.contextmanager
def instrumented(kernels: bool = True) -> Iterator[_Timers]:
    """Time the vector envs' ``step``/``reset`` and (optionally) every backend kernel.

    Patches classes for the duration only: the envs' base class (every env's udf calls
    ``vec.step``/``vec.reset``), the backends' ``lowering`` and ``specialisations``, whose
    returned kernels are wrapped, and ``host_call``, whose host functions are (their time
    outside the env's is ``host``).
    """
    from timerl.errors import BackendError
    from timerl.rl.envs import VectorEnv
    from timerl.runtime import calls, statements
    from timerl.runtime.backend import BACKENDS, Backend, backend_class

    timers = _Timers()
    saved: list[tuple[Any, str, Any]] = []

    def patch(cls: type, name: str, make: Any) -> None:
        original = cls.__dict__[name]
        saved.append((cls, name, original))
        setattr(cls, name, make(original))

    def patch_module(module: Any, name: str, make: Any) -> None:
        original = getattr(module, name)
        saved.append((module, name, original))
        setattr(module, name, make(original))

    def timed_env(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                timers.env += time.perf_counter() - t0
                timers.env_calls += 1

        return wrapper

    def timed_host_call(original: Any) -> Any:
        # every host op's callable comes from ``calls.host_call``; the env's own time inside
        # it is the env's, the rest is the host call's
        def make(*args: Any, **kwargs: Any) -> Any:
            fn = original(*args, **kwargs)

            def timed_host(*xs: Any) -> Any:
                env_before = timers.env
                t0 = time.perf_counter()
                try:
                    return fn(*xs)
                finally:
                    timers.host += time.perf_counter() - t0 - (timers.env - env_before)
                    timers.host_calls += 1

            return timed_host

        return make

    def timed_lowering(original: Any) -> Any:
        def lowering(self: Any, prim: str) -> Any:
            kernel = original(self, prim)

            def timed_kernel(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return kernel(*args, **kwargs)
                finally:
                    timers.kernel[prim] += time.perf_counter() - t0
                    timers.kernel_calls[prim] += 1

            return timed_kernel

        return lowering

    def timed_donating(original: Any) -> Any:
        # kernels that write into a dead input's buffer (``out=``) come from this table
        def lowering(self: Any, prim: str) -> Any:
            kernel = original(self, prim)
            return None if kernel is None else timed_lowering(lambda _s, _p: kernel)(self, prim)

        return lowering

    def timed_specialisations(original: Any) -> Any:
        # kernels chosen per op (``Backend.specialisations``) bypass ``lowering``
        def timed(prim: str, choose: Any) -> Any:
            def special(op: Any) -> Any:
                kernel = choose(op)
                return None if kernel is None else timed_lowering(lambda _s, _p: kernel)(op, prim)

            return special

        return {prim: timed(prim, choose) for prim, choose in original.items()}

    patch(VectorEnv, "step", timed_env)
    patch(VectorEnv, "reset", timed_env)
    # the modules that build host calls hold their own name for the function
    for module in (calls, statements):
        patch_module(module, "host_call", timed_host_call)
    if kernels:
        _calibrate(timers, timed_lowering)
        # the base class's table lookup (what the torch and jax backends use), and every
        # backend's own where it overrides it
        patch(Backend, "lowering", timed_lowering)
        for name in BACKENDS:
            try:
                cls = backend_class(name)
            except BackendError:  # not installed: nothing of it runs
                continue
            if "lowering" in cls.__dict__:
                patch(cls, "lowering", timed_lowering)
            if "specialisations" in cls.__dict__:
                patch(cls, "specialisations", timed_specialisations)
        patch(Backend, "donating_lowering", timed_donating)
    try:
        yield timers
    finally:
        for cls, name, original in reversed(saved):
            setattr(cls, name, original)


def profiled(config: Config, algo: str = "ppo", backend: str = "numpy") -> dict[str, Any]:
    """Cost breakdown of a timerl run: compile, environment, kernels, host calls, executor.

    Seconds are totals over all iterations (``run_s`` is the driver's run time, first
    iteration included). ``host_s`` is the host calls' own time outside the env's step and
    reset: converting an env's actions and results, the env wrapper's Python, metrics sinks.
    The kernel timers' own cost, measured on a kernel that does nothing, is taken out of the
    kernels' and the executor's shares and reported as ``timers_s``
    (``executor_uncorrected_s`` keeps the plain remainder, host calls included).
    """
    with instrumented() as timers:
        cfg, out, records, start = _train(config, algo, backend)
    result = _result(cfg, out, records, start, algo, backend)
    run_s = float(out.run_seconds)
    calls = sum(timers.kernel_calls.values())
    measured = sum(timers.kernel.values())
    kernels = max(measured - calls * timers.inside, 0.0)
    remainder = max(run_s - timers.env - measured, 0.0)
    top = sorted(timers.kernel.items(), key=lambda kv: -kv[1])[:8]
    return {
        "system": result.baseline,
        "compile_s": float(out.compile_seconds),
        "setup_s": result.setup_s,
        "run_s": run_s,
        "env_s": timers.env,
        "env_calls": timers.env_calls,
        "kernels_s": kernels,
        "kernel_calls": calls,
        "host_s": timers.host,
        "host_calls": timers.host_calls,
        "executor_s": max(remainder - calls * timers.outside - timers.host, 0.0),
        "executor_uncorrected_s": remainder,
        "timers_s": calls * (timers.inside + timers.outside),
        "top_kernels": [(p, s, timers.kernel_calls[p]) for p, s in top],
        "iterations": len(records),
        "result": asdict(result),
    }


def profiled_baseline(config: Config, run_fn: Any) -> dict[str, Any]:
    """Environment share of a baseline's run (its framework's time is everything else)."""
    with instrumented(kernels=False) as timers:
        result = run_fn(config)
    run_s = result.total_s - result.setup_s
    return {
        "system": result.baseline,
        "compile_s": None,
        "setup_s": result.setup_s,
        "run_s": run_s,
        "env_s": timers.env,
        "env_calls": timers.env_calls,
        "kernels_s": None,
        "kernel_calls": None,
        "executor_s": max(run_s - timers.env, 0.0),
        "top_kernels": [],
        "iterations": len(result.returns),
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["ppo", "reinforce"], default="ppo")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    result = run(config_from_args(args), algo=args.algo, backend=args.backend)
    print(result.to_json() if args.json else result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
