"""Training driver: compile an algorithm program, run it with progress, metrics and checkpoints.

The whole training run is one program whose outer loop is the iteration dim. After every
iteration the executor's stores hold exactly the state the next iteration reads (parameters,
optimiser moments, the last observation: liveness has freed the rest), so a checkpoint is that
snapshot plus the environments' state. Resuming rebuilds the same program, restores both and
starts the loop at the next iteration; random numbers are a pure function of (seed, stream,
point), so the resumed run is bit-for-bit the uninterrupted one.
"""

from __future__ import annotations

import csv
import math
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from timerl.api.functional import sink
from timerl.api.tensor import stack
from timerl.errors import CheckpointError, NumericalError, ProgramError
from timerl.rl.algos import ALGOS, AlgoConfig, AlgoProgram, default_config

CHECKPOINT = "checkpoint.pkl"
METRICS = "metrics.csv"
FORMAT = 1


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
    peak_bytes: int = 0
    log_dir: str | None = None

    def summary(self) -> str:
        return (
            f"{self.algo} on {self.env_id}: {self.iterations} iterations, "
            f"{self.env_steps:,} env steps\n"
            f"  mean return (last 10 iterations): {self.mean_return_last10:.1f}\n"
            f"  env steps/s: {self.steps_per_second:,.0f}   compile: {self.compile_seconds:.2f} s   "
            f"run: {self.run_seconds:.1f} s   peak memory: {self.peak_bytes / 2**20:.1f} MiB"
        )


def make_config(algo: str, config: dict[str, Any]) -> AlgoConfig:
    """The full configuration: the algorithm's per-environment defaults overridden by ``config``."""
    if algo not in ALGOS:
        raise ProgramError(f"unknown algorithm {algo!r}; choose one of {sorted(ALGOS)}")
    _, cls = ALGOS[algo]
    config = {**default_config(algo, config.get("env_id", cls.env_id)), **config}
    names = {f.name for f in fields(cls)}
    unknown = set(config) - names
    if unknown:
        raise ProgramError(f"{algo}: unknown hyper-parameters {sorted(unknown)}")
    return cls(**{k: (tuple(v) if k == "hidden" else v) for k, v in config.items()})


def build(algo: str, config: dict[str, Any]) -> AlgoProgram:
    cfg = make_config(algo, config)
    return ALGOS[algo][0](cfg)


def _check_same_config(
    algo: str,
    config: dict[str, Any] | None,
    iterations: int | None,
    ckpt: dict[str, Any],
    log_path: Path,
) -> None:
    """A resumed run continues the checkpoint's run: any setting the caller gives must match.

    Silently preferring the checkpoint would train something other than what was asked for.
    """
    diffs = []
    if config is not None:
        given = make_config(algo, config).to_dict()
        saved = ckpt["config"]
        diffs = [
            f"{k}={given[k]!r} (checkpoint: {saved.get(k)!r})"
            for k in config
            if given[k] != saved.get(k)
        ]
    if iterations is not None and iterations != ckpt["iterations"]:
        diffs.append(f"iterations={iterations} (checkpoint: {ckpt['iterations']})")
    if diffs:
        raise CheckpointError(
            f"cannot resume the run in {log_path} with a different config: {', '.join(diffs)}; "
            "resume without these settings, or start a new run in another --log-dir"
        )


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write to a temporary file and rename: a crash never leaves a half-written checkpoint."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        with open(path, "rb") as fh:
            data = pickle.load(fh)  # noqa: S301 - our own file format
    except Exception as err:  # any unpickling failure means the file is unusable
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a timerl checkpoint (format {FORMAT})")
    return data


def train(
    algo: str,
    config: dict[str, Any] | None = None,
    *,
    iterations: int | None = None,
    total_steps: int | None = None,
    backend: str = "numpy",
    device: str = "cpu",
    log_dir: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 10,
    progress: bool = True,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
) -> TrainResult:
    """Train ``algo`` ("ppo" or "reinforce"); see ``timerl train --help`` for the options."""
    log_path = Path(log_dir) if log_dir is not None else None
    ckpt = None
    if resume:
        if log_path is None:
            raise CheckpointError("--resume needs the --log-dir of the run to continue")
        ckpt = load_checkpoint(log_path / CHECKPOINT)
        if ckpt["algo"] != algo:
            raise CheckpointError(f"checkpoint in {log_path} is for {ckpt['algo']!r}, not {algo!r}")
        _check_same_config(algo, config, iterations, ckpt, log_path)
        config = ckpt["config"]
        iterations = ckpt["iterations"]
    program = build(algo, dict(config or {}))
    cfg: AlgoConfig = program.config
    per_iter = program.steps_per_iteration
    if iterations is None:
        iterations = max(1, math.ceil((total_steps or 100_000) / per_iter))
    names = list(program.metrics)
    seen: dict[int, np.ndarray] = {}
    with program.ctx:
        row = stack([program.metrics[k].float() for k in names])
        sink(row, lambda value, point: seen.__setitem__(point["i"], value))
    bounds = {"I": iterations, **program.bounds}
    prog = program.ctx.compile(bounds=bounds, backend=backend, device=device, seed=cfg.seed)
    ex = prog.executor()
    fingerprint = prog.fingerprint()
    start = 0
    history: list[dict[str, Any]] = []
    if ckpt is not None:
        if ckpt["fingerprint"] != fingerprint:
            raise CheckpointError(
                f"checkpoint in {log_path} was written by a different program "
                "(configuration or timerl version changed)"
            )
        ex.restore(ckpt["stores"])
        start = ckpt["iteration"] + 1
        history = list(ckpt["history"])
    if log_path is not None:
        log_path.mkdir(parents=True, exist_ok=True)
    writer = _MetricsLog(log_path, names, resume_at=start if ckpt is not None else None)
    bar = _Progress(iterations * per_iter, enabled=progress, done=start * per_iter)
    last_good: dict[str, Any] | None = ckpt
    ex.prepare(hooked=True)  # code generation is setup, not part of the first iteration
    begin = time.perf_counter()
    env = program.env

    def payload(i: int) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "algo": algo,
            "config": cfg.to_dict(),
            "iterations": iterations,
            "iteration": i,
            "fingerprint": fingerprint,
            "stores": ex.snapshot(),
            "env_state": env.state_dict(),
            "history": list(history),
        }

    def after(i: int) -> None:
        nonlocal last_good
        values = seen.pop(i)
        episodes = env.vec.completed_returns()
        metrics = dict(zip(names, (float(v) for v in values), strict=True))
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise NumericalError(
                f"iteration {i}: {', '.join(bad)} is not finite "
                f"({', '.join(f'{k}={metrics[k]}' for k in bad)}); the last good checkpoint "
                + (f"(iteration {last_good['iteration']}) is kept" if last_good else "was none")
            )
        prev = history[-1]["episodic_return"] if history else float("nan")
        record = {
            "iteration": i,
            "env_steps": (i + 1) * per_iter,
            "episodic_return": float(np.mean(episodes)) if len(episodes) else prev,
            "episodes": len(episodes),
            "seconds": time.perf_counter() - begin,
            **metrics,
        }
        history.append(record)
        writer.write(record)
        bar.update(per_iter, record)
        due = (i + 1) % checkpoint_every == 0 or i + 1 == iterations or interrupted
        if log_path is not None and due:
            last_good = payload(i)
            _write_atomic(log_path / CHECKPOINT, last_good)
        if interrupted:
            raise KeyboardInterrupt(f"interrupted after iteration {i}; checkpoint saved")
        if on_iteration is not None:
            on_iteration(record)

    def restore_env() -> None:
        if ckpt is not None:
            env.load_state_dict(ckpt["env_state"])

    interrupted = False

    def on_sigint(signum: int, frame: Any) -> None:
        # Finish the running iteration, checkpoint it, then stop; a second Ctrl-C is immediate.
        nonlocal interrupted
        interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.signal(signal.SIGINT, on_sigint)
    try:
        with bar:
            ex.run(start=start, on_iteration=after, before_outer=restore_env)
    finally:
        writer.close()
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    env.close()
    run_seconds = time.perf_counter() - begin
    returns = [h["episodic_return"] for h in history]
    tail = [r for r in returns[-10:] if math.isfinite(r)]
    done_steps = len(history) * per_iter if ckpt is None else (iterations - start) * per_iter
    stats = prog.stats()
    return TrainResult(
        algo=algo,
        env_id=cfg.env_id,
        iterations=iterations,
        env_steps=iterations * per_iter,
        mean_return_last10=float(np.mean(tail)) if tail else float("nan"),
        returns=returns,
        steps_per_second=done_steps / max(run_seconds, 1e-9),
        compile_seconds=prog.compile_seconds,
        run_seconds=run_seconds,
        peak_bytes=stats["peak_bytes"],
        log_dir=str(log_path) if log_path else None,
    )


class _MetricsLog:
    """Per-iteration metrics as CSV (and TensorBoard scalars when it is installed)."""

    def __init__(self, log_dir: Path | None, names: list[str], resume_at: int | None) -> None:
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
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(log_dir / "tb"))
        except Exception:  # tensorboard is optional
            self.tb = None

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        self.csv.writerow(record)
        self.file.flush()
        if self.tb is not None:
            for k, v in record.items():
                if k not in ("iteration", "env_steps"):
                    self.tb.add_scalar(k, v, record["env_steps"])

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
            ret=f"{ret:.1f}" if math.isfinite(ret) else "-",
            sps=f"{sps:,.0f}",
        )
