"""Training driver: compile an algorithm program, run it with progress, metrics and checkpoints.

The whole training run is one program whose outer loop is the iteration dim. After every
iteration the executor's stores hold exactly the state the next iteration reads (parameters,
optimiser moments, the last observation: liveness has freed the rest), so a checkpoint is that
snapshot plus the environments' state. The program is compiled for one iteration more than it
runs, so even after the last iteration that state is still live (and checkpointed): nothing
reads past the bound, and liveness would otherwise free the trained weights.

Resuming rebuilds the same program, restores both and starts the loop at the next iteration;
random numbers are a pure function of (seed, stream, point), so the resumed run is bit-for-bit
the uninterrupted one. Resuming to more env steps than the run was started with continues it:
the program is the same apart from its iteration bound (a learning-rate schedule that reads
the bound then anneals over the new length).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from timerl.api.context import CompileOptions, collector_paused  # compile's options
from timerl.api.functional import sink
from timerl.api.tensor import stack
from timerl.errors import CheckpointError, NumericalError, ProgramError
from timerl.rl.algos.naming import arg_ref, config_ref
from timerl.rl.algos.policy_gradient import (
    AlgoConfig,
    AlgoProgram,
    default_backend,
    default_config,
)
from timerl.rl.envs.ids import env_id_of, env_record, restore_env
from timerl.rl.envs.ray_env import env_workers
from timerl.rl.train.checkpoint import (
    DIRNAME,
    Checkpoint,
    CheckpointKeeper,
    latest_checkpoint,
    load_checkpoint,
    load_latest,
    write_atomically,
)
from timerl.rl.train.evaluation import format_return
from timerl.rl.train.registry import ALGOS
from timerl.rl.train.tblog import ScalarWriter, tensorboard_available

METRICS = "metrics.csv"
CONFIG = "config.json"
TENSORBOARD = "tb"
# what a run writes into its --log-dir (and --overwrite removes)
RUN_FILES = (METRICS, CONFIG, TENSORBOARD, DIRNAME, "checkpoint.pkl")

__all__ = [
    "CONFIG",
    "METRICS",
    "TrainResult",
    "TrainingInterrupted",
    "build",
    "latest_checkpoint",
    "load_checkpoint",
    "make_config",
    "train",
]


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training: the running iteration finished and was checkpointed."""


class _Done(Exception):
    """Raised after the last iteration: the program runs one bound past it (see the module doc)."""


@dataclass
class TrainResult:
    algo: str
    env_id: str
    iterations: int
    env_steps: int
    mean_return_last10: float
    returns: list[float] = field(default_factory=list)
    steps_per_second: float = 0.0
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    # of ``run_seconds``, before the first iteration began: the initial parameters, the env's
    # reset and the constants the loop reads (what an eager loop does before it starts)
    prologue_seconds: float = 0.0
    peak_bytes: int = 0
    planned_peak_bytes: int | None = None  # under a memory budget: the compiler's plan
    swapped_bytes: int = 0  # bytes moved to the next tier (disk, or host memory) and back
    device_peak_bytes: int | None = None  # on an accelerator: its allocator's own peak
    log_dir: str | None = None
    steps_this_run: int = 0
    first_iteration: int = 0
    checkpoint: str | None = None
    best_checkpoint: str | None = None
    tensorboard: bool = False

    def summary(self) -> str:
        resumed = (
            f" (resumed at iteration {self.first_iteration}: {self.steps_this_run:,} steps now)"
            if self.first_iteration
            else ""
        )
        lines = [
            f"{self.algo} on {self.env_id}: {self.iterations} iterations, "
            f"{self.env_steps:,} env steps{resumed}",
            f"  mean return (last 10 iterations): {format_return(self.mean_return_last10)}",
            f"  env steps/s: {self.steps_per_second:,.0f}   compile: {self.compile_seconds:.2f} s"
            f"   run: {self.run_seconds:.1f} s   peak memory: {_size(self.peak_bytes)}",
        ]
        if self.log_dir is not None:
            logs = str(Path(self.log_dir) / METRICS)
            if self.tensorboard:
                logs += f" and TensorBoard {Path(self.log_dir) / TENSORBOARD}"
            lines.append(f"  metrics: {logs}")
            if self.checkpoint:
                best = f" (best: {self.best_checkpoint})" if self.best_checkpoint else ""
                lines.append(f"  checkpoint: {self.checkpoint}{best}")
        return "\n".join(lines)


def _size(n: int) -> str:
    """Bytes for people: small programs peak at a few KiB, which "0.0 MiB" would hide."""
    if n < 2**20:
        return f"{n / 2**10:.1f} KiB"
    return f"{n / 2**20:.1f} MiB"


def make_config(algo: str, config: dict[str, Any]) -> AlgoConfig:
    """The full configuration: the algorithm's per-environment defaults overridden by ``config``."""
    if algo not in ALGOS:
        raise ProgramError(f"unknown algorithm {algo!r}; choose one of {sorted(ALGOS)}")
    _, cls = ALGOS[algo]
    if "env_id" in config:  # a class or factory from Python is known by "module:qualname"
        config = {**config, "env_id": env_id_of(config["env_id"], config_ref("env_id"))}
    config = {**default_config(algo, config.get("env_id", cls.env_id)), **config}
    names = {f.name for f in fields(cls)}
    unknown = set(config) - names
    if unknown:
        raise ProgramError(f"{algo}: unknown hyper-parameters {sorted(unknown)}")
    return cls(
        **{k: (tuple(v) if k == "hidden" and isinstance(v, list) else v) for k, v in config.items()}
    )


def build(algo: str, config: dict[str, Any]) -> AlgoProgram:
    cfg = make_config(algo, config)
    return ALGOS[algo][0](cfg)


def _normal(value: Any) -> Any:
    """Settings as JSON stores them (tuples as lists) so a resumed config compares equal."""
    return json.loads(json.dumps(value))


def _check_same_config(
    algo: str, config: dict[str, Any] | None, saved: dict[str, Any], log_path: Path
) -> None:
    """A resumed run continues the checkpoint's run: any setting the caller gives must match.

    Silently preferring the checkpoint would train something other than what was asked for.
    """
    if not config:
        return
    given = _normal(make_config(algo, {**saved, **config}).to_dict())
    diffs = [
        f"{k}={given[k]!r} (checkpoint: {saved.get(k)!r})"
        for k in config
        if given[k] != saved.get(k)
    ]
    if diffs:
        raise CheckpointError(
            f"cannot resume the run in {log_path} with a different config: {', '.join(diffs)}; "
            f"resume without these settings, or start a new run in another "
            f"{arg_ref('log_dir', '--log-dir')}"
        )


def _prepare_log_dir(log_path: Path, overwrite: bool) -> None:
    """A new run never silently replaces another one's metrics and checkpoints."""
    if not log_path.exists():
        return
    what = arg_ref("log_dir", "--log-dir")
    if not log_path.is_dir():
        raise CheckpointError(f"{what} {log_path} exists and is not a directory")
    ours = [log_path / name for name in RUN_FILES if (log_path / name).exists()]
    others = [p for p in log_path.iterdir() if p not in ours]
    if not ours and not others:
        return
    if not overwrite:
        held = ", ".join(sorted(p.name for p in [*ours, *others])[:5])
        raise CheckpointError(
            f"{what} {log_path} is not empty (holds {held}); pass "
            f"{arg_ref('resume=True', '--resume')} to continue that run, "
            f"{arg_ref('overwrite=True', '--overwrite')} to replace it, or choose another "
            f"{what}"
        )
    for p in ours:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def _echo(line: str) -> None:
    print(line, flush=True)


def train(
    algo: str,
    config: dict[str, Any] | None = None,
    *,
    iterations: int | None = None,
    total_steps: int | None = None,
    backend: str | None = None,
    device: str = "cpu",
    memory_budget: int | str | None = None,
    log_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    checkpoint_every: int = 10,
    keep_checkpoints: int = 3,
    progress: bool = True,
    log_every: int = 0,
    echo: Callable[[str], None] = _echo,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[], None] | None = None,
    workers: int = 0,
    ray_address: str | None = None,
    minutes: float | None = None,
    threads: int | None = None,
) -> TrainResult:
    """Train ``algo`` (any entry of ``ALGOS``); see ``timerl train --help`` for the options.

    ``config`` holds only the settings to override; on ``resume`` they must equal the
    checkpoint's. ``iterations`` or ``total_steps`` set the length; on ``resume`` a larger
    value continues the run further. ``log_every``: without a progress bar, print one line
    every that many iterations (0: never). ``workers``: step the envs on that many Ray actors
    (0: in this process), on the cluster at ``ray_address`` or a local Ray; the returns are
    the same, so it is not part of the config (a resume must use the same number, though).
    ``memory_budget``: see ``ctx.compile``; a program over it fails before training starts.
    ``backend``: None takes the checkpoint's on ``resume``, else the env's default
    (``default_backend``: jax for gymnax's MinAtar games, torch for envpool's Atari games,
    numpy otherwise).
    ``on_start()`` is called once the program is compiled and its code generated, right
    before the first iteration (a benchmark's mark between setup and run). ``minutes``: stop
    after the first iteration that ends past this much wall time of running, with a
    checkpoint; ``resume`` continues toward ``iterations``. ``threads``: the math libraries'
    threads (``tl.CompileOptions``; None: every usable core for a program with large kernels,
    such as a CNN policy's, else one).
    """
    if minutes is not None and minutes <= 0:
        raise CheckpointError(f"{arg_ref('minutes', '--minutes')} must be positive, got {minutes}")
    if checkpoint_every < 1:
        raise CheckpointError(
            f"{arg_ref('checkpoint_every', '--checkpoint-every')} must be at least 1, "
            f"got {checkpoint_every}"
        )
    if keep_checkpoints < 1:
        raise CheckpointError(
            f"{arg_ref('keep_checkpoints', '--keep-checkpoints')} must be at least 1, "
            f"got {keep_checkpoints}"
        )
    if config is not None and not isinstance(config, Mapping):
        raise ProgramError(
            f"{algo}: config must be a dict of hyper-parameters (e.g. {{'env_id': "
            f"'CartPole-v1'}}), got {type(config).__name__} {config!r}"
        )
    if iterations is not None and total_steps is not None:
        raise ProgramError(
            f"give the run's length once: iterations={iterations} or total_steps="
            f"{total_steps}, not both"
        )
    for flag, value in (
        (arg_ref("total_steps", "--steps"), total_steps),
        ("iterations", iterations),
        (arg_ref("threads", "--threads"), threads),
    ):
        if value is not None and value < 1:
            raise ProgramError(f"{flag} must be at least 1, got {value}")
    options = CompileOptions(threads=threads)
    if log_every < 0 or workers < 0:
        raise ProgramError(
            f"{arg_ref('log_every', '--log-every')} and {arg_ref('workers', '--workers')} must "
            f"not be negative, got {log_every} and {workers}"
        )
    log_path = Path(log_dir) if log_dir is not None else None
    ckpt: Checkpoint | None = None
    if resume:
        if log_path is None:
            raise CheckpointError(
                f"{arg_ref('resume=True', '--resume')} needs "
                f"{arg_ref('log_dir', '--log-dir')}, the run directory to continue"
            )
        # a damaged newest checkpoint is set aside for the newest intact one, saying so
        ckpt = load_latest(log_path, notice=echo, set_aside=True)
        saved = ckpt.header
        restore_env(saved.get("env"))  # an env of the user's: its module, its registration
        if saved["algo"] != algo:
            raise CheckpointError(f"checkpoint {ckpt.path} is for {saved['algo']!r}, not {algo!r}")
        _check_same_config(algo, config, saved["config"], log_path)
        config = saved["config"]
        sim = ckpt.env_state().get("sim")
        saved_workers = len(sim.get("bounds", [])) if isinstance(sim, dict) else 0
        if saved_workers != workers:
            raise CheckpointError(
                f"checkpoint {ckpt.path} holds the envs' state of {saved_workers} Ray workers; "
                f"resume with {arg_ref('workers=', '--workers ')}{saved_workers} (not {workers})"
            )
    elif log_path is not None:
        _prepare_log_dir(log_path, overwrite)
    # building, like compiling, makes mostly objects that live as long as the program
    with env_workers(workers, ray_address), collector_paused():
        program = build(algo, dict(config or {}))
    cfg: AlgoConfig = program.config
    if backend is None:
        saved_backend = ckpt.header.get("backend") if ckpt is not None else None
        backend = saved_backend or default_backend(algo, cfg.env_id)
    per_iter = program.steps_per_iteration
    # how eval, export and --resume make this env again in another process
    env_spec = saved.get("env") if ckpt is not None else None
    env_spec = env_spec or env_record(cfg.env_id)
    start = 0 if ckpt is None else ckpt.iteration + 1
    if iterations is None:
        if total_steps is not None:
            iterations = max(1, math.ceil(total_steps / per_iter))
        elif ckpt is not None:
            iterations = int(ckpt.header["iterations"])
        else:
            iterations = max(1, math.ceil(100_000 / per_iter))
    if ckpt is not None and iterations <= start:
        raise CheckpointError(
            f"the run in {log_path} already has {start} iterations ({start * per_iter:,} env "
            f"steps); pass a larger {arg_ref('total_steps', '--steps')} (more than "
            f"{start * per_iter:,}) to train further"
        )
    names = list(program.metrics)
    seen: dict[int, np.ndarray] = {}
    with program.ctx:
        row = stack([program.metrics[k].float() for k in names])
        sink(row, lambda value, point: seen.__setitem__(point["i"], value))
    bounds = {"I": iterations + 1, **program.bounds}
    prog = program.ctx.compile(
        bounds=bounds,
        backend=backend,
        device=device,
        seed=cfg.seed,
        memory_budget=memory_budget,
        options=options,
    )
    margin = prog.resume_margin(iterations)
    if margin:  # a checkpoint of the last iteration must hold what a longer run carries
        bounds["I"] += margin
        prog = program.ctx.compile(
            bounds=bounds,
            backend=backend,
            device=device,
            seed=cfg.seed,
            memory_budget=memory_budget,
            options=options,
        )
    ex = prog.executor()
    # without the iteration bound: resuming to more iterations restores into the same structure
    fingerprint = prog.fingerprint(ignore_bounds=("I",))
    history: list[dict[str, Any]] = []
    seconds_before = 0.0
    if ckpt is not None:
        if ckpt.header["fingerprint"] != fingerprint:
            raise CheckpointError(
                f"checkpoint {ckpt.path} was written by a different program "
                "(configuration or timerl version changed)"
            )
        ex.restore(ckpt.snapshot())
        history = list(ckpt.header["history"])
        seconds_before = float(ckpt.header.get("seconds", 0.0))
    keeper = None
    if log_path is not None:
        log_path.mkdir(parents=True, exist_ok=True)
        best = ckpt.header.get("best_score") if ckpt is not None else None
        keeper = CheckpointKeeper(log_path, keep_checkpoints, best)
        if ckpt is None:
            config_doc = {
                "algo": algo,
                "config": cfg.to_dict(),
                "backend": backend,
                "env": env_spec,
            }
            text = (json.dumps(config_doc, indent=1) + "\n").encode()
            write_atomically(log_path / CONFIG, lambda fh: fh.write(text))
    writer = _MetricsLog(
        log_path,
        names,
        resume_at=start if ckpt is not None else None,
        echo=echo,
        steps_per_iteration=per_iter,
    )
    bar = _Progress(iterations * per_iter, enabled=progress, done=start * per_iter)
    last_good: int | None = None if ckpt is None else ckpt.iteration
    saved_path: Path | None = ckpt.path if ckpt is not None else None
    ex.prepare(hooked=True)  # code generation is setup, not part of the first iteration
    begin = time.perf_counter()
    deadline = begin + 60.0 * minutes if minutes is not None else None
    env = program.env
    param_names = [p.name for p in program.params]
    activations = prog.activations()
    warned: list[bool] = []

    def save(i: int) -> None:
        nonlocal last_good, saved_path
        assert keeper is not None and log_path is not None
        snapshot = ex.snapshot()
        named = prog.carried_state(snapshot, i)
        # A parameter the program never updates is not carried from iteration to iteration:
        # resuming does not need it, but eval and export will not find it by name.
        missing = [n for n in param_names if n not in named]
        if missing and not warned:
            warned.append(True)
            echo(
                f"note: parameters {', '.join(missing[:3])} are not carried state and are not "
                "stored by name in checkpoints"
            )
        header = {
            "algo": algo,
            "config": cfg.to_dict(),
            "backend": backend,
            "iterations": iterations,
            "iteration": i,
            "env_steps": (i + 1) * per_iter,
            "fingerprint": fingerprint,
            "timerl_version": _version(),
            "rng": {"seed": cfg.seed, "next_iteration": i + 1},
            "metrics_rows": i + 1,
            "seconds": history[-1]["seconds"] if history else seconds_before,
            "history": list(history),
            "param_names": [n for n in param_names if n in named],
            "activations": activations,
            "obs_norm": program.obs_norm,
            "acting": program.acting,
            "env": env_spec,
        }
        tail = [h["episodic_return"] for h in history[-10:]]
        tail = [r for r in tail if math.isfinite(r)]
        score = float(np.mean(tail)) if tail else None
        saved_path = keeper.save(
            i,
            score,
            header=header,
            params={n: named[n] for n in param_names if n in named},
            state={n: v for n, v in named.items() if n not in param_names},
            snapshot=snapshot,
            env_state=env.state_dict(),
        )
        last_good = i

    def after(i: int) -> None:
        values = seen.pop(i)
        episodes = env.vec.completed_returns()
        metrics = dict(zip(names, (float(v) for v in values), strict=True))
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise NumericalError(
                f"iteration {i}: {', '.join(bad)} is not finite "
                f"({', '.join(f'{k}={metrics[k]}' for k in bad)}); the last good checkpoint "
                + (f"(iteration {last_good}) is kept" if last_good is not None else "was none")
            )
        prev = history[-1]["episodic_return"] if history else float("nan")
        record = {
            "iteration": i,
            "env_steps": (i + 1) * per_iter,
            "episodic_return": float(np.mean(episodes)) if len(episodes) else prev,
            "episodes": len(episodes),
            "seconds": seconds_before + time.perf_counter() - begin,
            **metrics,
        }
        history.append(record)
        writer.write(record)
        bar.update(per_iter, record)
        timed_out = deadline is not None and time.perf_counter() >= deadline
        last = i + 1 == iterations or timed_out
        if timed_out and i + 1 < iterations:
            echo(f"stopping at the time limit ({minutes:.3g} min) after iteration {i}")
        if not progress and log_every and ((i + 1) % log_every == 0 or last):
            ret = record["episodic_return"]
            sps = (i + 1 - start) * per_iter / max(time.perf_counter() - begin, 1e-9)
            echo(
                f"iteration {i} ({i + 1} of {iterations})  env steps {(i + 1) * per_iter:,}  "
                f"return {format_return(ret)}  {sps:,.0f} steps/s"
            )
        due = (i + 1) % checkpoint_every == 0 or last or interrupted
        if keeper is not None and due:
            save(i)
        if interrupted:
            saved = (
                f"checkpoint saved to {saved_path}"
                if keeper is not None
                else "no --log-dir, so nothing was saved"
            )
            raise TrainingInterrupted(f"interrupted after iteration {i}, {saved}")
        if on_iteration is not None:
            on_iteration(record)
        if last:
            raise _Done

    loop_began: list[float] = []

    def before_loop() -> None:
        """The prologue has run (``prologue_seconds``); a resumed run's env gets its state."""
        loop_began.append(time.perf_counter())
        if ckpt is not None:
            env.load_state_dict(ckpt.env_state())

    interrupted = False

    def on_sigint(signum: int, frame: Any) -> None:
        # Finish the running iteration, checkpoint it, then stop; a second Ctrl-C is immediate.
        nonlocal interrupted
        interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.signal(signal.SIGINT, on_sigint)
    if on_start is not None:
        on_start()
    try:
        with bar:
            ex.run(start=start, on_iteration=after, before_outer=before_loop)
    except _Done:
        pass
    finally:
        writer.close()
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        env.close()
    run_seconds = time.perf_counter() - begin
    returns = [h["episodic_return"] for h in history]
    tail = [r for r in returns[-10:] if math.isfinite(r)]
    reached = history[-1]["iteration"] + 1 if history else start  # short of it on a time limit
    done_steps = (reached - start) * per_iter
    stats = prog.stats()
    best_path = keeper.folder / "best.npz" if keeper is not None else None
    return TrainResult(
        algo=algo,
        env_id=cfg.env_id,
        iterations=reached,
        env_steps=reached * per_iter,
        mean_return_last10=float(np.mean(tail)) if tail else float("nan"),
        returns=returns,
        steps_per_second=done_steps / max(run_seconds, 1e-9),
        compile_seconds=prog.compile_seconds,
        run_seconds=run_seconds,
        prologue_seconds=loop_began[0] - begin if loop_began else 0.0,
        peak_bytes=stats["peak_bytes"],
        planned_peak_bytes=stats.get("planned_peak_bytes"),
        swapped_bytes=int(stats.get("swapped_bytes", 0)),
        device_peak_bytes=stats.get("device_peak_bytes"),
        log_dir=str(log_path) if log_path else None,
        steps_this_run=done_steps,
        first_iteration=start,
        checkpoint=str(saved_path) if saved_path is not None else None,
        best_checkpoint=str(best_path) if best_path is not None and best_path.exists() else None,
        tensorboard=writer.tb is not None,
    )


def _version() -> str:
    from timerl.version import __version__

    return __version__


class _MetricsLog:
    """Per-iteration metrics as CSV, and TensorBoard scalars beside it when installed."""

    def __init__(
        self,
        log_dir: Path | None,
        names: list[str],
        resume_at: int | None,
        echo: Callable[[str], None] = _echo,
        steps_per_iteration: int = 1,
    ) -> None:
        """``resume_at``: the first iteration a resumed run computes again; rows from it on
        (written after the checkpoint, before a crash) are dropped so each iteration is logged once.
        """
        self.file = None
        self.tb = None
        if log_dir is None:
            return
        path = log_dir / METRICS
        cols = ["iteration", "env_steps", "episodic_return", "episodes", "seconds", *names]
        kept: list[dict[str, str]] = []
        if resume_at is not None and path.exists():
            with open(path, newline="") as f:
                kept = [r for r in csv.DictReader(f) if int(r["iteration"]) < resume_at]
        tmp = path.with_suffix(".csv.tmp")  # rename: a crash here never loses the kept rows
        with open(tmp, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=cols)
            out.writeheader()
            out.writerows(kept)
        os.replace(tmp, path)
        self.file = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
        self.csv = csv.DictWriter(self.file, fieldnames=cols)
        if not tensorboard_available():
            echo(
                "note: tensorboard is not installed (pip install 'timerl[train]'): "
                f"metrics go to {path} only"
            )
            return
        purge = None if resume_at is None else (resume_at + 1) * steps_per_iteration
        self.tb = ScalarWriter(log_dir / TENSORBOARD, purge_step=purge)

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        self.csv.writerow(record)
        self.file.flush()
        if self.tb is not None:
            scalars = {k: v for k, v in record.items() if k not in ("iteration", "env_steps")}
            self.tb.add_scalars(scalars, record["env_steps"])
            self.tb.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


class _Progress:
    """A rich progress bar over env steps showing the latest return and throughput."""

    def __init__(self, total: int, enabled: bool, done: int = 0) -> None:
        self.enabled = enabled
        self.total, self.done = total, done
        self.progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("return {task.fields[ret]:>8}"),
                TextColumn("{task.fields[sps]:>8} steps/s"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.task = self.progress.add_task(
                "train", total=total, completed=done, ret="-", sps="-"
            )
        self.start = time.perf_counter()
        self.start_done = done

    def __enter__(self) -> _Progress:
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def update(self, steps: int, record: dict[str, Any]) -> None:
        self.done += steps
        if self.progress is None:
            return
        sps = (self.done - self.start_done) / max(time.perf_counter() - self.start, 1e-9)
        ret = record["episodic_return"]
        self.progress.update(
            self.task,
            advance=steps,
            ret=format_return(ret) if math.isfinite(ret) else "-",
            sps=f"{sps:,.0f}",
        )
