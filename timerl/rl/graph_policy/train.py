"""``timerl graphopt train --engine program``: the graph policy trained by the timerl programs
of ``graph_policy`` through the same driver as every other algorithm (``rl/train/driver.py``:
progress, metrics log, checkpoints, resume, Ctrl-C), then written as a weights file.

With ``--warm-start imitate`` two programs run one after the other, each in a folder of its
own under the run folder: the imitation program (``imitate/``), whose weights, their priority
logits scaled by ``--imitate-scale``, start the reward program (``search/``, or ``decode/``
with ``--reward decode``). A resumed run continues the phase it stopped in and skips a phase
already done."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import GraphError
from timerl.rl.graph_policy.policy import export_weights
from timerl.rl.train.checkpoint import checkpoint_files, latest_checkpoint, load_checkpoint
from timerl.rl.train.driver import make_config, train

#: ``graphopt train`` settings the program does not implement, with the value it needs
UNSUPPORTED = {
    "ray_address": None,
}
REWARDS = ("search", "decode")  # graphopt.train's rewards, each the program phase of its name


def train_program(
    settings: dict[str, Any],
    *,
    iterations: int,
    out: Path,
    run_dir: Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 10,
    progress: bool = True,
    warm_start: str = "none",
    imitate_updates: int = 300,
    imitate_scale: float = 1.0,
    targets: Path | None = None,
    minutes: float | None = None,
    given: dict[str, Any] | None = None,
    reward: str = "search",
) -> Path:
    """Train (``run_dir``, default ``OUT.run``, holds checkpoints and metrics logs) and write
    the final weights to ``out``. ``given`` are the other ``graphopt train`` settings; one the
    program does not implement is refused by name. ``minutes`` bounds both phases together:
    the phase running at the limit stops with a checkpoint, the next does not start, and the
    weights it reached are written (``--resume`` continues)."""
    for name, value in (given or {}).items():
        if name in UNSUPPORTED and value != UNSUPPORTED[name]:
            flag = "--" + name.replace("_", "-")
            raise GraphError(
                f"{flag} {value}: not implemented by --engine program (the torch engine has it)"
            )
    if reward not in REWARDS:
        raise GraphError(f"--reward {reward!r}: choose from {', '.join(REWARDS)}")
    if warm_start not in ("none", "imitate"):
        raise GraphError(f"--warm-start {warm_start!r}: choose none or imitate")
    if warm_start == "imitate" and not 0 < imitate_scale <= 1:
        raise GraphError(f"--imitate-scale {imitate_scale}: must be in (0, 1]")
    run_dir = Path(run_dir) if run_dir is not None else out.with_suffix(".run")
    deadline = time.monotonic() + 60.0 * minutes if minutes is not None else None
    options = {
        "checkpoint_every": checkpoint_every,
        "progress": progress,
        "resume": resume,
        "deadline": deadline,
    }
    start: Path | None = None
    if warm_start == "imitate":
        imitate = {
            **settings,
            "phase": "imitate",
            "targets": str(targets if targets is not None else out.with_suffix(".targets.npz")),
        }
        params, cfg, done = _phase(imitate, imitate_updates, run_dir / "imitate", **options)
        if not done:  # stopped at the time limit: the weights so far, unscaled
            return export_weights(params, cfg, out)
        params = _scale_priorities(params, imitate_scale)
        if iterations == 0:
            return export_weights(params, cfg, out)
        start = export_weights(params, cfg, run_dir / "imitated.npz")
    rewarded = {**settings, "phase": reward, "init": str(start) if start else ""}
    folder = run_dir / reward if warm_start == "imitate" else run_dir
    params, cfg, _ = _phase(rewarded, iterations, folder, **options)
    return export_weights(params, cfg, out)


def _phase(
    settings: dict[str, Any],
    iterations: int,
    folder: Path,
    *,
    checkpoint_every: int,
    progress: bool,
    resume: bool,
    deadline: float | None,
) -> tuple[dict[str, np.ndarray], Any, bool]:
    """Run one program for ``iterations`` updates in ``folder`` (continuing it on ``resume``,
    not at all when it is already that far) until ``deadline``; its last parameters, its
    config and whether it got there."""
    saved = checkpoint_files(folder) if resume else []  # (iteration, path), oldest first
    if not (saved and saved[-1][0] + 1 >= iterations):
        # at least one update, even when the time is up as the phase starts
        left = None if deadline is None else max((deadline - time.monotonic()) / 60.0, 1e-3)
        train(
            "graph-policy",
            settings,
            iterations=iterations,
            log_dir=folder,
            resume=bool(saved),
            overwrite=not resume,
            checkpoint_every=checkpoint_every,
            progress=progress,
            log_every=0 if progress else 10,
            minutes=left,
        )
    ckpt = load_checkpoint(latest_checkpoint(folder))
    reached = ckpt.iteration + 1 >= iterations
    return ckpt.params, make_config("graph-policy", ckpt.header["config"]), reached


def _scale_priorities(params: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """``graphopt.train.scale_priorities`` on arrays: the priority logit (output column 0)
    times ``scale``, so the mean order stays and the Beta samples spread again."""
    out = {k: np.array(v, dtype=np.float32, copy=True) for k, v in params.items()}
    out["out.w"][:, 0] *= scale
    out["out.b"][0] *= scale
    return out
