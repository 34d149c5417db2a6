"""``timerl graphopt train --engine program``: the graph policy trained by the timerl program
of ``graph_policy`` through the same driver as every other algorithm (``rl/train.py``:
progress, metrics log, checkpoints, resume, Ctrl-C), then written as a weights file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from timerl.errors import GraphError
from timerl.rl.checkpoint import latest_checkpoint, load_checkpoint
from timerl.rl.graph_policy import export_weights
from timerl.rl.train import make_config, train

#: ``graphopt train`` settings the program does not implement, with the value it needs
UNSUPPORTED = {
    "reward": "search",
    "warm_start": "none",
    "workers": 1,
    "ray_address": None,
    "targets": None,
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
    given: dict[str, Any] | None = None,
) -> Path:
    """Train for ``iterations`` updates (``run_dir``, default ``OUT.run``, holds checkpoints
    and the metrics log) and write the final weights to ``out``. ``given`` are the other
    ``graphopt train`` settings; one the program does not implement is refused by name."""
    for name, value in (given or {}).items():
        if name in UNSUPPORTED and value != UNSUPPORTED[name]:
            flag = "--" + name.replace("_", "-")
            raise GraphError(
                f"{flag} {value}: not implemented by --engine program (the torch engine has it)"
            )
    run_dir = Path(run_dir) if run_dir is not None else out.with_suffix(".run")
    train(
        "graph-policy",
        settings,
        iterations=iterations,
        log_dir=run_dir,
        resume=resume,
        overwrite=not resume,
        checkpoint_every=checkpoint_every,
        progress=progress,
        log_every=0 if progress else 10,
    )
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    cfg = make_config("graph-policy", ckpt.header["config"])
    return export_weights(ckpt.params, cfg, out)  # type: ignore[arg-type]
