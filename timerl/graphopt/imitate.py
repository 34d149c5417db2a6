"""Warm start by imitation: teach the policy's mean priorities to decode to the best known order.

Policy gradients learn slowly here (a reward of about 1% of the peak, buried in the search's
noise), while every training graph has a good order that costs only a search to find. So the
network first learns to reproduce such orders: per training graph (peak memory on one device),
the best order of the learned search with uniform proposals (``best_order``: seeded with the
portfolio, so never worse) is the *target*, and the network's priority mean (``sigmoid`` of output column 0, which the decoder runs highest first)
is fitted to the target's ranks:

- a pairwise logistic loss on nodes a few positions apart in the target order (the decoder only
  compares ops that are ready together, so local order is what decides the schedule), and
- a cross-entropy of the mean against the rank key ``1 - position / n`` (so the keys of nodes
  far apart also fall in order);
- the log concentration (column 1) is pulled to a fixed value and the crossover bias logit
  (column 6) to 0, so the proposals keep BRKGA's diversity around the imitated order; the
  policy-gradient phase that follows is free to move them;
- optionally (``imitate_moves``), the move logits (column 8) are pulled to +1 on the nodes
  whose position differs between the best portfolio order and the target, -1 elsewhere: the
  nodes the local search had to move.

Rank keys drive the means toward 0 and 1, where Beta samples hardly move, so BRKGA's first
population and its mutants would all be near copies of the imitated order. ``imitate_scale``
multiplies the priority logits when the phase ends (``train.scale_priorities``): the mean
order is unchanged, the samples spread again.

The targets are written to a ``.npz`` of plain arrays (names as JSON bytes) and reused by a
later run with the same problems and search budget, or by ``--resume``.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import CheckpointError
from timerl.graphopt.decoders import Problem, Solution, decode_order, order_keys

TARGETS_FORMAT = "timerl-graphopt-targets"
#: offsets, in positions of the target order, of the node pairs the ranking loss compares
PAIR_OFFSETS = (1, 2, 3, 5, 8, 13, 21)


def best_order(
    shared: tuple[Problem, dict[str, Solution]], budget: int, seed: int
) -> tuple[np.ndarray, float]:
    """A target order and which decoder suits the graph (a pure call, for Ray): BRKGA with
    list scheduling and BRKGA with the post-order decoder, half the budget each and both
    seeded with the portfolio, then the local search from the better one's best; the label
    is 1.0 when the post-order decoder found the lower peak, 0.0 when list scheduling did,
    0.5 on a tie. Never worse than the portfolio."""
    from timerl.graphopt.brkga import brkga
    from timerl.graphopt.localsearch import peak_local_search

    problem, seeds = shared
    half = max(int(budget * 0.4), 1)
    runs = {
        name: brkga(problem.with_decoder(name), budget=half, seeds=list(seeds.values()), seed=seed)
        for name in ("list", "postorder")
    }
    lv, pv = runs["list"].value, runs["postorder"].value
    label = 0.5 if lv == pv else float(pv < lv)
    best = min(runs.values(), key=lambda r: r.value).solution
    start = min([best, *seeds.values()], key=problem.evaluate)
    rest = max(budget - 2 * half, 1)
    polished = peak_local_search(problem, start, budget=rest, seed=seed, segments=0.3)
    return np.asarray(polished.solution.order, dtype=np.int64), label


def moved_nodes(start: np.ndarray, target: np.ndarray, share: float = 0.01) -> np.ndarray:
    """Per node, 1.0 where its position in ``target`` differs from that in ``start`` by more
    than ``share`` of the nodes: the moves a local search from ``start`` had to make."""
    n = len(start)
    ps, pt = np.empty(n), np.empty(n)
    ps[np.asarray(start)] = np.arange(n)
    pt[np.asarray(target)] = np.arange(n)
    return (np.abs(ps - pt) > share * n).astype(np.float32)


def move_loss(torch: Any, action: Any, moved: np.ndarray) -> Any:
    """How far the move logits (``policy.MOVE_COLUMN``) are from +1 on moved nodes and -1 on
    the others (so moved nodes are drawn about e^2 = 7 times as often)."""
    from timerl.graphopt.policy import MOVE_COLUMN

    target = torch.as_tensor(2.0 * moved - 1.0, dtype=torch.float32)
    return (action[:, MOVE_COLUMN] - target).pow(2).mean()


def compute_targets(
    names: Sequence[str],
    calls: Sequence[Any],
    budget: int,
    path: Path,
    run: Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]],
    log: Callable[[str], None] = print,
) -> dict[str, tuple[np.ndarray, float]]:
    """The target order and decoder label (``best_order``) per problem name, read from
    ``path`` when it holds these problems at this budget, else searched (``run`` maps
    ``best_order`` over the calls) and written there."""
    if path.is_file():
        got = load_targets(path)
        if got is not None and got[1] == budget and set(names) <= set(got[0]):
            log(f"imitation targets from {path}")
            return {k: got[0][k] for k in names}
    log(f"searching imitation targets: {len(names)} problems, {budget} evaluations each")
    found = run(best_order, [(c, budget, 0) for c in calls])
    targets = dict(zip(names, found, strict=True))
    save_targets(path, targets, budget)
    return targets


def save_targets(path: Path, targets: dict[str, tuple[np.ndarray, float]], budget: int) -> None:
    """Plain arrays only (no pickle), written atomically."""
    names = list(targets)
    meta = {"format": TARGETS_FORMAT, "budget": budget, "names": names}
    orders = [targets[k][0] for k in names]
    arrays = {
        "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        "lengths": np.array([len(o) for o in orders], dtype=np.int64),
        "orders": (np.concatenate(orders) if names else np.zeros(0, np.int64)),
        "decoders": np.array([targets[k][1] for k in names], dtype=np.float64),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    tmp.replace(path)


def load_targets(path: Path) -> tuple[dict[str, tuple[np.ndarray, float]], int] | None:
    """(targets, budget) from a targets file (order and decoder label per problem; a file
    without labels reads 0.5, no preference); a file that is not one raises naming it."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays["meta"].tobytes().decode())
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise CheckpointError(
            f"imitation targets {path}: not a readable targets file (truncated or corrupt?): "
            f"{err}; delete it to search the targets again"
        ) from err
    if meta.get("format") != TARGETS_FORMAT:
        raise CheckpointError(
            f"imitation targets {path}: format {meta.get('format')!r}, expected {TARGETS_FORMAT!r}"
        )
    lengths = arrays["lengths"].tolist()
    if len(lengths) != len(meta["names"]) or sum(lengths) != len(arrays["orders"]):
        raise CheckpointError(f"imitation targets {path}: its orders and names do not match")
    parts = np.split(arrays["orders"], np.cumsum(lengths)[:-1]) if lengths else []
    labels = arrays.get("decoders", np.full(len(parts), 0.5)).tolist()
    found = dict(zip(meta["names"], zip(parts, labels, strict=True), strict=True))
    return found, int(meta["budget"])


def decoder_loss(torch: Any, action: Any, label: float) -> Any:
    """Cross-entropy of the graph's decoder probability (the sigmoid of the decoder
    column's mean over nodes, ``policy.proposal``) against the target's label."""
    from timerl.graphopt.policy import DECODER_COLUMN

    logit = action[:, DECODER_COLUMN].mean().reshape(1)
    target = torch.tensor([label], dtype=torch.float32)
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, target)


def pair_index(order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(earlier, later) node pairs PAIR_OFFSETS apart in ``order``."""
    n = len(order)
    first, second = [], []
    for d in PAIR_OFFSETS:
        if d < n:
            first.append(order[:-d])
            second.append(order[d:])
    if not first:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(first), np.concatenate(second)


def imitation_loss(torch: Any, action: Any, order: np.ndarray, log_kappa: float) -> Any:
    """How far the action's proposals are from decoding to ``order`` (see the module doc)."""
    logit = action[:, 0]
    first, second = pair_index(order)
    if len(first):
        diff = logit[torch.as_tensor(first)] - logit[torch.as_tensor(second)]
        rank = torch.nn.functional.softplus(-diff).mean()
    else:
        rank = logit.sum() * 0.0
    target = torch.as_tensor(rank_keys(order), dtype=torch.float32)
    calib = torch.nn.functional.binary_cross_entropy_with_logits(logit, target)
    # the cross-entropy's floor (the targets' own entropy) is subtracted so 0 = a perfect fit
    t = target.clamp(1e-6, 1 - 1e-6)
    calib = calib + (t * t.log() + (1 - t) * (1 - t).log()).mean()
    rest = (action[:, 1] - log_kappa).pow(2).mean() + action[:, 6].pow(2).mean()
    return rank + calib + 0.1 * rest


def rank_keys(order: np.ndarray) -> np.ndarray:
    """Per node, the key the calibration term fits its priority mean to: ``1 - position / n``,
    moved half a step inside (0, 1)."""
    return order_keys(order) - 0.5 / max(len(order), 1)


def log_concentration(concentration: float, base: float) -> float:
    """The column-1 output that gives Beta concentration ``concentration`` (a + b)."""
    if concentration <= 0:
        raise ValueError(f"--imitate-concentration {concentration}: must be positive")
    return math.log(concentration / base)


def mean_decode_gap(problem: Problem, logits: np.ndarray, target_value: float) -> float:
    """How much higher (relative) the schedule of the mean priorities is than the target's."""
    order = decode_order(problem.graph, logits)
    value = problem.evaluate(problem.complete(order))
    return 0.0 if target_value <= 0 else (value - target_value) / target_value


__all__ = ["compute_targets", "imitation_loss", "load_targets", "rank_keys", "save_targets"]
