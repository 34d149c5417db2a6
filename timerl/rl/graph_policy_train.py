"""``timerl graphopt train --engine program``: the graph policy trained by the timerl programs
of ``graph_policy`` through the same driver as every other algorithm (``rl/train.py``:
progress, metrics log, checkpoints, resume, Ctrl-C), then written as a weights file.

With ``--warm-start imitate`` two programs run one after the other, each in a folder of its
own under the run folder: the imitation program (``imitate/``), whose weights, their priority
logits scaled by ``--imitate-scale``, start the search program (``search/``). A resumed run
continues the phase it stopped in and skips a phase already done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import GraphError
from timerl.rl.checkpoint import checkpoint_files, latest_checkpoint, load_checkpoint
from timerl.rl.graph_policy import export_weights
from timerl.rl.train import make_config, train

#: ``graphopt train`` settings the program does not implement, with the value it needs
UNSUPPORTED = {
    "reward": "search",
    "ray_address": None,
    "minutes": None,
}


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
    given: dict[str, Any] | None = None,
) -> Path:
    """Train (``run_dir``, default ``OUT.run``, holds checkpoints and metrics logs) and write
    the final weights to ``out``. ``given`` are the other ``graphopt train`` settings; one the
    program does not implement is refused by name."""
    for name, value in (given or {}).items():
        if name in UNSUPPORTED and value != UNSUPPORTED[name]:
            flag = "--" + name.replace("_", "-")
            raise GraphError(
                f"{flag} {value}: not implemented by --engine program (the torch engine has it)"
            )
    if warm_start not in ("none", "imitate"):
        raise GraphError(f"--warm-start {warm_start!r}: choose none or imitate")
    if warm_start == "imitate" and not 0 < imitate_scale <= 1:
        raise GraphError(f"--imitate-scale {imitate_scale}: must be in (0, 1]")
    run_dir = Path(run_dir) if run_dir is not None else out.with_suffix(".run")
    options = {"checkpoint_every": checkpoint_every, "progress": progress, "resume": resume}
    start: Path | None = None
    if warm_start == "imitate":
        imitate = {
            **settings,
            "phase": "imitate",
            "targets": str(targets if targets is not None else out.with_suffix(".targets.npz")),
        }
        params, cfg = _phase(imitate, imitate_updates, run_dir / "imitate", **options)
        params = _scale_priorities(params, imitate_scale)
        if iterations == 0:
            return export_weights(params, cfg, out)
        start = export_weights(params, cfg, run_dir / "imitated.npz")
    search = {**settings, "phase": "search", "init": str(start) if start else ""}
    folder = run_dir / "search" if warm_start == "imitate" else run_dir
    params, cfg = _phase(search, iterations, folder, **options)
    return export_weights(params, cfg, out)


def _phase(
    settings: dict[str, Any],
    iterations: int,
    folder: Path,
    *,
    checkpoint_every: int,
    progress: bool,
    resume: bool,
) -> tuple[dict[str, np.ndarray], Any]:
    """Run one program for ``iterations`` updates in ``folder`` (continuing it on ``resume``,
    not at all when it is already that far); its last parameters and config."""
    done = resume and bool(checkpoint_files(folder)) and _iterations_done(folder) >= iterations
    if not done:
        train(
            "graph-policy",
            settings,
            iterations=iterations,
            log_dir=folder,
            resume=resume and bool(checkpoint_files(folder)),
            overwrite=not resume,
            checkpoint_every=checkpoint_every,
            progress=progress,
            log_every=0 if progress else 10,
        )
    ckpt = load_checkpoint(latest_checkpoint(folder))
    return ckpt.params, make_config("graph-policy", ckpt.header["config"])


def _iterations_done(folder: Path) -> int:
    return load_checkpoint(latest_checkpoint(folder)).iteration + 1


def _scale_priorities(params: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """``graphopt.train.scale_priorities`` on arrays: the priority logit (output column 0)
    times ``scale``, so the mean order stays and the Beta samples spread again."""
    out = {k: np.array(v, dtype=np.float32, copy=True) for k, v in params.items()}
    out["out.w"][:, 0] *= scale
    out["out.b"][0] *= scale
    return out
