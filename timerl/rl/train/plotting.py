"""``timerl plot``: learning curves of training runs as a PNG.

Runs whose ``config.json`` is the same apart from the seed are one curve, the mean across
seeds with a ± one standard deviation band (over the iterations all of them reached); other
runs are curves of their own.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from timerl.errors import CheckpointError, TimerlError


@dataclass
class Curve:
    label: str
    runs: list[Path]
    env_steps: np.ndarray
    mean: np.ndarray
    std: np.ndarray


def _read(run: Path, metric: str) -> tuple[dict, np.ndarray, np.ndarray]:
    metrics = run / "metrics.csv"
    if not metrics.exists():
        raise CheckpointError(f"{run} is not a training run: no {metrics.name}")
    with open(metrics, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if rows and metric not in rows[0]:
        raise CheckpointError(f"{metrics} has no column {metric!r}; it has {', '.join(rows[0])}")
    config_path = run / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    x = np.array([float(r["env_steps"]) for r in rows])
    y = np.array([float(r[metric]) if r[metric] != "" else np.nan for r in rows])
    return config, x, y


def _group_key(config: dict, run: Path, group: bool) -> str:
    if not group or not config:
        return str(run)
    cfg = dict(config.get("config", {}))
    cfg.pop("seed", None)
    return json.dumps({"algo": config.get("algo"), "config": cfg}, sort_keys=True)


def learning_curves(
    run_dirs: list[Path], metric: str = "episodic_return", group: bool = True
) -> list[Curve]:
    """One curve per group of runs that differ only in their seed (or per run)."""
    if not run_dirs:
        raise CheckpointError("timerl plot needs at least one run directory")
    groups: dict[str, list[tuple[Path, dict, np.ndarray, np.ndarray]]] = {}
    for run in run_dirs:
        config, x, y = _read(Path(run), metric)
        groups.setdefault(_group_key(config, Path(run), group), []).append(
            (Path(run), config, x, y)
        )
    curves = []
    for members in groups.values():
        n = min(len(x) for _, _, x, _ in members)
        x = members[0][2][:n]
        ys = np.stack([y[:n] for _, _, _, y in members])
        config = members[0][1]
        cfg = config.get("config", {})
        if config:
            label = f"{config.get('algo', '?')} {cfg.get('env_id', '')}".strip()
        else:
            label = members[0][0].name
        if len(members) > 1:
            label += f" ({len(members)} seeds)"
        elif "seed" in cfg:
            label += f" seed {cfg['seed']}"
        curves.append(Curve(label, [m[0] for m in members], x, np.nanmean(ys, 0), np.nanstd(ys, 0)))
    return curves


def plot_runs(
    run_dirs: list[Path],
    out: Path,
    metric: str = "episodic_return",
    group: bool = True,
) -> Path:
    """Write the learning curves of ``run_dirs`` to the PNG file ``out``."""
    curves = learning_curves(run_dirs, metric, group)
    try:
        import matplotlib
    except ImportError:
        raise TimerlError(
            "timerl plot needs matplotlib, which is not installed: pip install 'timerl[train]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for curve in curves:
        (line,) = ax.plot(curve.env_steps, curve.mean, label=curve.label)
        if len(curve.runs) > 1:
            ax.fill_between(
                curve.env_steps,
                curve.mean - curve.std,
                curve.mean + curve.std,
                color=line.get_color(),
                alpha=0.25,
            )
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
