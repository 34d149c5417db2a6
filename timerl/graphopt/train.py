"""Training the graph policy with policy gradients over a corpus split (needs torch).

One step: for a few training problems (a graph and an objective: peak memory on one device,
or running time on two devices and a host under a memory limit), sample an action around the
network's mean action (a Gaussian per output, learned log-std), run BRKGA steered by it at a
fixed evaluation budget, and score it by the relative improvement over uniform BRKGA with the
same budget, seeds and random seed (cached per problem and seed). The advantage is that minus
a per-problem running mean of past rewards.

Past (problem, action, reward, log-probability) tuples stay in a replay buffer; each update
mixes the fresh samples with a draw from it, weighting each by the importance ratio of the
current policy over the one that sampled it, clipped as in PPO. The log-probability of an
action is the mean over the genes it sets, so the ratio is a per-gene geometric mean and stays
usable on graphs of thousands of nodes (a product over all genes would be 0 or infinity).

That reward costs two BRKGA runs per sample and is noisy (the two runs' random streams part
after the first draw), so it buys few updates. The ``decode`` reward is cheaper: keys drawn
from the policy's own Beta proposals are decoded straight into schedules and scored, a decode
per sample, and the samples of one problem are each other's baseline. It teaches the policy
where good keys lie, which is what BRKGA's initial population and mutants are drawn from.

Checkpoints are ``.npz`` files (weights plus optimiser state, replay buffer and reward
baselines, all plain arrays; the rest as JSON bytes), written atomically; ``resume`` continues
from one exactly where it stopped.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import CheckpointError, GraphError
from timerl.graphopt.baselines import portfolio_solutions
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem, Solution
from timerl.graphopt.features import GraphFeatures
from timerl.graphopt.graph import Graph
from timerl.graphopt.imitate import (
    compute_targets,
    decoder_loss,
    imitation_loss,
    log_concentration,
    mean_decode_gap,
    move_loss,
    moved_nodes,
)
from timerl.graphopt.learned import learned_search, problem_features
from timerl.graphopt.parallel import TaskPool
from timerl.graphopt.perfmodel import Cluster, PeakMemory
from timerl.graphopt.policy import (
    BASE_KAPPA,
    DECODER_COLUMN,
    OUTPUTS,
    PolicyWeights,
    beta_from_outputs,
    key_columns,
    key_groups,
    network,
    trained_objectives,
    used_columns,
)

LOG_STD_RANGE = (-3.0, 0.5)
REWARDS = ("search", "decode")
WARM_STARTS = ("none", "imitate")


@dataclass
class TrainConfig:
    """Settings of a training run (stored in every checkpoint; resume checks they match)."""

    corpus: str = "corpus"
    split: str = "train"
    max_nodes: int = 600  # training problems: graphs up to this size
    runtime_max_nodes: int = 250  # ... and, for the runtime objective, up to this size
    runtime_share: float = 0.3  # share of sampled problems using the runtime objective
    memory_fraction: float = 0.8  # runtime problems: per-device limit x program-order peak
    budget: int = 400  # BRKGA evaluations per sampled proposal
    batch: int = 4  # fresh samples per update
    replay: int = 512  # replay buffer capacity
    replay_batch: int = 8  # replayed samples per update
    clip: float = 0.2
    lr: float = 3e-3
    entropy: float = 1e-3
    hidden: int = 32
    rounds: int = 3
    uniform_seeds: int = 3  # random seeds cycled (so uniform BRKGA values are cached)
    seed: int = 0
    reward: str = "search"  # "search": steered vs uniform BRKGA; "decode": sampled keys decoded
    samples: int = 16  # decode reward: key vectors drawn per problem and update
    warm_start: str = "none"  # "imitate": fit the best known orders before the rewards
    imitate_updates: int = 300  # updates of the imitation phase
    imitate_budget: int = 2000  # uniform BRKGA decodes that search each target order
    imitate_concentration: float = 4.0  # Beta a + b the imitation phase asks for
    imitate_scale: float = 1.0  # priority logits x this when the imitation ends (widens them)
    imitate_moves: float = 0.0  # weight of the move logits' imitation (0: not fitted)
    imitate_decoder: float = 0.0  # weight of the decoder logit's imitation (0: not fitted)
    decoder_gene: bool = False  # decode reward: also sample the decoder gene (column 7)


@dataclass
class Task:
    """One training problem with everything precomputed."""

    name: str
    problem: Problem
    feats: GraphFeatures
    seeds: dict[str, Solution]
    groups: int
    uniform: dict[int, float] = field(default_factory=dict)
    reference: float = 0.0  # the best portfolio schedule's value
    target: np.ndarray | None = None  # imitation: the best known order
    target_value: float = 0.0
    moved: np.ndarray | None = None  # imitation: nodes the target moved (imitate.moved_nodes)
    decoder: float = 0.5  # imitation: 1 when the post-order decoder suits the graph better


def _torch() -> Any:
    try:
        import torch
    except ImportError as err:  # pragma: no cover - depends on the install
        raise GraphError(
            "training the graphopt policy needs torch: pip install 'timerl[graphopt]'"
        ) from err
    return torch


def make_tasks(config: TrainConfig, log: Callable[[str], None] = print) -> list[Task]:
    """The training problems of ``config.split`` (both objectives where the size allows)."""
    from timerl.graphopt.evaluate import load_index

    entries = [e for e in load_index(Path(config.corpus), config.split)]
    entries = [e for e in entries if 8 <= e["nodes"] <= config.max_nodes]
    if not entries:
        raise GraphError(
            f"{config.corpus}: no graphs of 8 to {config.max_nodes} nodes in split "
            f"{config.split!r} to train on"
        )
    tasks = []
    for e in sorted(entries, key=lambda e: e["name"]):
        graph = Graph.load(Path(config.corpus) / e["path"])
        problems = [("mem", Problem(graph))]
        if graph.n <= config.runtime_max_nodes and config.runtime_share > 0:
            prog = PeakMemory(graph).peak(graph.program_order)
            limit = max(1, int(config.memory_fraction * prog))
            cluster = Cluster.make(2, memory_limit=limit, host=True)
            problems.append(("rt", Problem(graph, "runtime", cluster)))
        for tag, problem in problems:
            seeds = portfolio_solutions(problem)
            feats = problem_features(problem, seeds)
            groups = key_groups(problem.place, problem.swaps)
            ref = min(problem.evaluate(s) for s in seeds.values())
            tasks.append(Task(f"{e['name']}:{tag}", problem, feats, seeds, groups, reference=ref))
    log(f"{len(tasks)} training problems from {len(entries)} graphs of {config.corpus}")
    return tasks


class TorchGraphOps:
    """``policy.GraphOps`` in torch for one graph (edges ``src -> dst``, degrees clamped to
    at least 1): neighbour means as ``index_add`` scatters."""

    def __init__(self, torch: Any, src: Any, dst: Any, deg_in: Any, deg_out: Any) -> None:
        self.torch, self.src, self.dst = torch, src, dst
        self.deg_in, self.deg_out = deg_in, deg_out

    def relu(self, h: Any) -> Any:
        return self.torch.relu(h)

    def pred_mean(self, h: Any) -> Any:
        return self.torch.zeros_like(h).index_add_(0, self.dst, h[self.src]) / self.deg_in

    def succ_mean(self, h: Any) -> Any:
        return self.torch.zeros_like(h).index_add_(0, self.src, h[self.dst]) / self.deg_out

    def with_graph_mean(self, h: Any) -> Any:
        return self.torch.cat([h, h.mean(dim=0, keepdim=True).expand_as(h)], dim=1)

    def keep(self, h: Any) -> Any:
        return h


class TorchPolicy:
    """The network of ``policy.py`` in torch, parameters named as in the weights file."""

    def __init__(self, weights: PolicyWeights) -> None:
        torch = _torch()
        self.torch = torch
        self.hidden, self.rounds = weights.hidden, weights.rounds
        self.params = {
            k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32))
            for k, v in weights.params.items()
        }
        self._graph_cache: dict[int, tuple[Any, ...]] = {}

    def parameters(self) -> list[Any]:
        return list(self.params.values())

    def to_weights(self, meta: dict[str, Any]) -> PolicyWeights:
        params = {k: v.detach().numpy().astype(np.float32).copy() for k, v in self.params.items()}
        return PolicyWeights(params, self.hidden, self.rounds, meta)

    def _graph(self, key: int, feats: GraphFeatures) -> tuple[Any, ...]:
        got = self._graph_cache.get(key)
        if got is None:
            torch = self.torch
            n = feats.x.shape[0]
            src = torch.tensor(feats.src)
            dst = torch.tensor(feats.dst)
            ones = torch.ones(len(feats.src))
            deg_in = torch.zeros(n).index_add_(0, dst, ones).clamp(min=1)[:, None]
            deg_out = torch.zeros(n).index_add_(0, src, ones).clamp(min=1)[:, None]
            got = (torch.tensor(feats.x), src, dst, deg_in, deg_out)
            self._graph_cache[key] = got
        return got

    def forward(self, key: int, feats: GraphFeatures) -> Any:
        x, src, dst, deg_in, deg_out = self._graph(key, feats)
        ops = TorchGraphOps(self.torch, src, dst, deg_in, deg_out)
        return network(self.params, x, self.rounds, ops)

    def log_std(self) -> Any:
        return self.params["log_std"].clamp(*LOG_STD_RANGE)

    def mean_logp(self, mean: Any, z: Any, cols: list[int]) -> Any:
        """Mean over the used genes of the Gaussian log-density of action ``z``."""
        ls = self.log_std()[cols]
        d = (z[:, cols] - mean[:, cols]) / ls.exp()
        return (-0.5 * d * d - ls - 0.5 * math.log(2 * math.pi)).mean()


def uniform_value(task: Task, budget: int, seed: int) -> float:
    """Uniform BRKGA, seeded with the portfolio, at the same budget and seed (cached)."""
    if seed not in task.uniform:
        res = brkga(task.problem, budget=budget, seeds=list(task.seeds.values()), seed=seed)
        task.uniform[seed] = res.value
    return task.uniform[seed]


def _lines(log: Callable[[str], None]) -> Callable[[int, int, str], None]:
    def show(done: int, total: int, text: str) -> None:
        if done == total or done % 10 == 0:
            log(f"[{done}/{total}] {text}")

    return show


def _update(net: Any, opt: Any, loss: Any) -> PolicyWeights:
    """One clipped Adam step on ``loss``; the network's new weights (numpy), marked trained."""
    import torch

    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return net.to_weights({"trained": True})


def train(
    config: TrainConfig,
    *,
    iterations: int,
    out: str | Path,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 10,
    resume: bool = False,
    minutes: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    log: Callable[[str], None] = print,
    workers: int = 1,
    ray_address: str | None = None,
    targets: str | Path | None = None,
    keep: bool = False,
) -> PolicyWeights:
    """Train for ``iterations`` updates (or ``minutes`` of wall time); write weights to ``out``.

    ``keep`` also writes the weights of every policy-gradient checkpoint as a weights file,
    ``OUT-<updates>.npz``, so that one can be chosen afterwards on the validation split (the
    last is not always the best: the decode reward concentrates the proposals as it goes).

    With ``config.warm_start == "imitate"`` the policy-gradient updates are preceded by
    ``config.imitate_updates`` imitation updates (``imitate.py``); their target orders are
    read from or written to ``targets`` (default ``OUT.targets.npz``).

    ``workers > 1`` runs each update's searches in local processes, or as Ray tasks on the
    cluster at ``ray_address``: the same samples, rewards and weights as one worker."""
    if config.reward not in REWARDS:
        raise GraphError(f"--reward {config.reward!r}: choose from {', '.join(REWARDS)}")
    if config.reward == "decode" and config.samples < 2:
        raise GraphError(f"--samples {config.samples}: the decode reward needs at least 2")
    if config.warm_start not in WARM_STARTS:
        raise GraphError(
            f"--warm-start {config.warm_start!r}: choose from {', '.join(WARM_STARTS)}"
        )
    if config.warm_start == "imitate" and config.imitate_concentration <= 0:
        raise GraphError(
            f"--imitate-concentration {config.imitate_concentration}: must be positive"
        )
    if config.warm_start == "imitate" and not 0 < config.imitate_scale <= 1:
        raise GraphError(f"--imitate-scale {config.imitate_scale}: must be in (0, 1]")
    torch = _torch()
    torch.set_num_threads(1)
    out = Path(out)
    ckpt = Path(checkpoint) if checkpoint is not None else out.with_suffix(".ckpt.npz")
    tasks = make_tasks(config, log)
    names = [t.name for t in tasks]
    state: dict[str, Any] = {"iteration": 0, "seconds": 0.0, "samples": 0, "imitation": 0}
    baseline = np.full(len(tasks), np.nan)
    replay: list[tuple[int, np.ndarray, float, float]] = []
    if resume:
        weights, opt_state, state, baseline, replay = _load_checkpoint(ckpt, config, names)
    else:
        weights = PolicyWeights.random(config.hidden, config.rounds, seed=config.seed)
        opt_state = None
    net = TorchPolicy(weights)
    opt = torch.optim.Adam(net.parameters(), lr=config.lr)
    if opt_state is not None:
        _restore_adam(opt, net, opt_state)
    show = progress or _lines(log)
    t_start = time.perf_counter() - state["seconds"]
    recent: list[float] = []
    state.setdefault("imitation", 0)
    pool = TaskPool(workers, ray_address)
    shared = [pool.put((t.problem, t.seeds)) for t in tasks]
    try:
        if config.warm_start == "imitate":
            path = Path(targets) if targets is not None else out.with_suffix(".targets.npz")
            attach_targets(tasks, shared, config, path, pool, log)
        recent_gap: list[float] = []
        while config.warm_start == "imitate" and state["imitation"] < config.imitate_updates:
            if minutes is not None and time.perf_counter() - t_start > 60 * minutes:
                break
            it = state["imitation"]
            rng = np.random.default_rng([config.seed, 1, it])
            loss, gaps = imitation_step(net, tasks, config, rng)
            recent_gap.extend(gaps)
            weights = _update(net, opt, loss)
            state["imitation"] = it + 1
            state["seconds"] = time.perf_counter() - t_start
            gap = 100 * float(np.mean(recent_gap[-40:]))
            show(
                state["imitation"],
                config.imitate_updates,
                f"imitation loss {loss.item():.4f}, mean keys decode {gap:+.2f}% above the "
                "target (last 40)",
            )
            if state["imitation"] % checkpoint_every == 0:
                _save_checkpoint(ckpt, weights, opt, net, config, names, state, baseline, replay)
        if (
            config.warm_start == "imitate"
            and state["imitation"] >= config.imitate_updates
            and not state.get("scaled")
        ):
            scale_priorities(net, config.imitate_scale)
            weights = net.to_weights({"trained": True})
            state["scaled"] = True
        while state["iteration"] < iterations:
            if minutes is not None and time.perf_counter() - t_start > 60 * minutes:
                log(f"stopping at the time limit ({minutes:g} min)")
                break
            it = state["iteration"]
            rng = np.random.default_rng([config.seed, it])
            if config.reward == "decode":
                loss, rewards = decode_loss(net, tasks, config, rng)
            else:
                loss, rewards = search_loss(
                    net, tasks, config, rng, pool, shared, weights, baseline, replay
                )
            recent.extend(rewards)
            state["samples"] += len(rewards)
            weights = _update(net, opt, loss)
            state["iteration"] = it + 1
            state["seconds"] = time.perf_counter() - t_start
            mean_r = 100 * float(np.mean(recent[-40:]))
            versus = "decoded vs portfolio" if config.reward == "decode" else "vs uniform"
            show(state["iteration"], iterations, f"reward {mean_r:+.2f}% {versus} (last 40)")
            if state["iteration"] % checkpoint_every == 0 or state["iteration"] == iterations:
                _save_checkpoint(ckpt, weights, opt, net, config, names, state, baseline, replay)
                if keep:
                    snap = out.with_name(f"{out.stem}-{state['iteration']}{out.suffix}")
                    net.to_weights(weights_meta(config, state, tasks)).save(snap)
    finally:
        pool.close()
    _save_checkpoint(ckpt, weights, opt, net, config, names, state, baseline, replay)
    final = net.to_weights(weights_meta(config, state, tasks))
    final.save(out)
    log(f"wrote {out} after {state['iteration']} updates, {state['seconds']:.0f}s")
    return final


def weights_meta(config: TrainConfig, state: dict[str, Any], tasks: list[Task]) -> dict[str, Any]:
    """The ``meta`` of a weights file written after the updates in ``state``: how it was
    trained and, under ``objectives``, what it learned (what ``learned_search`` steers)."""
    share = config.runtime_share if any(t.problem.objective == "runtime" for t in tasks) else 0.0
    learned = trained_objectives(state["iteration"] > 0, share, imitated=state["imitation"] > 0)
    return {
        "trained": True,
        "iterations": state["iteration"],
        "samples": state["samples"],
        "train_seconds": round(state["seconds"], 1),
        "imitation_updates": state["imitation"],
        "objectives": list(learned),
        "config": asdict(config),
    }


def attach_targets(
    tasks: list[Task],
    shared: list[Any],
    config: TrainConfig,
    path: Path,
    pool: TaskPool,
    log: Callable[[str], None],
) -> None:
    """Give every peak-memory task its target order (searched once, then read from ``path``)."""
    mem = [i for i, t in enumerate(tasks) if t.problem.objective != "runtime"]
    found = compute_targets(
        [tasks[i].name for i in mem],
        [shared[i] for i in mem],
        config.imitate_budget,
        path,
        pool.map,
        log,
    )
    for i in mem:
        task = tasks[i]
        order, task.decoder = found[task.name]
        if sorted(order.tolist()) != list(range(task.problem.n)):
            raise CheckpointError(
                f"imitation targets {path}: the order of {task.name} is not a permutation of "
                f"its {task.problem.n} nodes (the corpus changed?); delete the file"
            )
        task.target = order
        task.target_value = task.problem.evaluate(task.problem.complete(order))
        start = min(task.seeds.values(), key=task.problem.evaluate).order
        task.moved = moved_nodes(start, order)
    gain = [1 - tasks[i].target_value / tasks[i].reference for i in mem if tasks[i].reference]
    log(f"targets: {100 * float(np.mean(gain)):.2f}% below the portfolio on average")


def scale_priorities(net: TorchPolicy, scale: float) -> None:
    """Multiply the priority logits (output column 0) by ``scale``: every mean keeps its side
    of 0.5 and its rank, so the mean schedule stays, while the imitation's means, pushed to
    near 0 and 1 by rank keys, come back toward 0.5 and the Beta samples spread again."""
    with net.torch.no_grad():
        net.params["out.w"][:, 0] *= scale
        net.params["out.b"][0] *= scale


def imitation_step(
    net: TorchPolicy, tasks: list[Task], config: TrainConfig, rng: np.random.Generator
) -> tuple[Any, list[float]]:
    """The imitation loss of ``batch`` peak-memory problems, and how far (relative) the
    schedule of each one's mean priorities is above its target's (before this update)."""
    torch = net.torch
    log_kappa = log_concentration(config.imitate_concentration, BASE_KAPPA)
    loss: Any = 0.0
    gaps = []
    for k in imitation_batch(tasks, config.batch, rng):
        task = tasks[k]
        assert task.target is not None
        action = net.forward(k, task.feats)
        term = imitation_loss(torch, action, task.target, log_kappa)
        if config.imitate_moves > 0 and task.moved is not None:
            term = term + config.imitate_moves * move_loss(torch, action, task.moved)
        if config.imitate_decoder > 0:
            term = term + config.imitate_decoder * decoder_loss(torch, action, task.decoder)
        loss = loss + term / config.batch
        logits = action[:, 0].detach().double().numpy()
        gaps.append(mean_decode_gap(task.problem, logits, task.target_value))
    return loss, gaps


def imitation_batch(tasks: list[Task], batch: int, rng: np.random.Generator) -> list[int]:
    """The problems of one imitation update: ``batch`` draws among those with a target."""
    with_target = [i for i, t in enumerate(tasks) if t.target is not None]
    return [with_target[int(rng.integers(len(with_target)))] for _ in range(batch)]


def beta_params(
    torch: Any, action: Any, groups: int, decoder_gene: bool = False
) -> tuple[Any, Any]:
    """``proposal``'s per-gene Beta(a, b) in torch, so the keys' log-density has a gradient
    (with ``decoder_gene``, the decoder gene's last)."""
    a_parts, b_parts = [], []
    for c in key_columns(groups):
        a, b = beta_from_outputs(
            action[:, c],
            action[:, c + 1],
            torch.sigmoid,
            torch.exp,
            lambda x, lo, hi: x.clamp(lo, hi),
        )
        a_parts.append(a)
        b_parts.append(b)
    if decoder_gene:
        m = torch.sigmoid(action[:, DECODER_COLUMN].mean()).reshape(1)
        a_parts.append(BASE_KAPPA * m)
        b_parts.append(BASE_KAPPA * (1.0 - m))
    return torch.cat(a_parts), torch.cat(b_parts)


def search_loss(
    net: TorchPolicy,
    tasks: list[Task],
    config: TrainConfig,
    rng: np.random.Generator,
    pool: TaskPool,
    shared: list[Any],
    weights: PolicyWeights,
    baseline: np.ndarray,
    replay: list[tuple[int, np.ndarray, float, float]],
) -> tuple[Any, list[float]]:
    """Clipped policy gradient on steered-vs-uniform BRKGA: ``batch`` sampled proposals, each
    searched once, rewarded by its relative improvement over uniform BRKGA with the same seed
    (cached per problem and seed), plus a replayed batch weighted by importance ratios.
    Updates ``baseline`` (per problem), ``replay`` and the tasks' uniform caches in place.
    Returns the loss and the fresh rewards."""
    torch = _torch()
    drawn = []
    for _ in range(config.batch):
        k = pick_task(rng, tasks, config.runtime_share)
        task = tasks[k]
        with torch.no_grad():
            mean = net.forward(k, task.feats)
            std = net.log_std().exp()
        z = mean + std * torch.tensor(rng.standard_normal(mean.shape), dtype=torch.float32)
        cols = used_columns(task.groups)
        with torch.no_grad():
            lp = float(net.mean_logp(mean, z, cols))
        s = int(rng.integers(config.uniform_seeds))
        drawn.append((k, z.numpy().copy(), lp, s))
    # the searches (uniform BRKGA where not cached, and the steered one) are independent:
    # run them together, in the pool's processes or Ray tasks with workers > 1
    missing = sorted({(k, s) for k, _, _, s in drawn if s not in tasks[k].uniform})
    calls = [(shared[k], config.budget, s, None, None) for k, s in missing]
    calls += [(shared[k], config.budget, s, weights, z) for k, z, _, s in drawn]
    values = pool.map(search_value, calls)
    for (k, s), v in zip(missing, values, strict=False):
        tasks[k].uniform[s] = v
    fresh = []
    for (k, z, lp, s), val in zip(drawn, values[len(missing) :], strict=True):
        base = tasks[k].uniform[s]
        reward = 0.0 if base <= 0 else (base - val) / base
        fresh.append((k, z, reward, lp))
    # per-problem baseline, updated with the fresh rewards
    for k, _, r, _ in fresh:
        baseline[k] = r if np.isnan(baseline[k]) else 0.9 * baseline[k] + 0.1 * r
    batch = list(fresh)
    if replay:
        pick = rng.choice(len(replay), size=min(config.replay_batch, len(replay)), replace=False)
        batch.extend(replay[i] for i in pick.tolist())
    replay.extend(fresh)
    del replay[: max(0, len(replay) - config.replay)]
    adv = np.array([r - baseline[k] for k, _, r, _ in batch])
    scale = adv.std() + 1e-4 if len(adv) > 1 else 1.0
    loss = 0.0
    for (k, z, _, lp_old), a in zip(batch, adv / scale, strict=True):
        mean = net.forward(k, tasks[k].feats)
        lp = net.mean_logp(mean, torch.tensor(z), used_columns(tasks[k].groups))
        ratio = (lp - lp_old).clamp(-20, 20).exp()
        surr = torch.minimum(ratio * a, ratio.clamp(1 - config.clip, 1 + config.clip) * a)
        loss = loss - surr / len(batch)
    loss = loss - config.entropy * net.log_std().sum()
    return loss, [r for _, _, r, _ in fresh]


def decode_loss(
    net: TorchPolicy, tasks: list[Task], config: TrainConfig, rng: np.random.Generator
) -> tuple[Any, list[float]]:
    """Policy gradient on the proposals themselves: keys drawn from the policy's Beta per gene
    and decoded straight into schedules (one decode per sample instead of two BRKGA runs).

    A decode is deterministic, so the only noise is the sampling: each problem's ``samples``
    draws share their mean as the baseline and are scaled by their spread, so every problem
    weighs the same whatever its reward's scale. Returns the loss and the rewards (relative
    improvement over the best portfolio schedule)."""
    torch = net.torch
    loss: Any = 0.0
    rewards: list[float] = []
    for _ in range(config.batch):
        k = pick_task(rng, tasks, config.runtime_share)
        task = tasks[k]
        a, b = beta_params(torch, net.forward(k, task.feats), task.groups, config.decoder_gene)
        keys = rng.beta(
            a.detach().double().numpy(), b.detach().double().numpy(), (config.samples, len(a))
        )
        keys = np.clip(keys, 1e-6, 1.0 - 1e-6)
        problem = task.problem.with_decoder_gene() if config.decoder_gene else task.problem
        vals = np.array([problem.fitness(row)[0] for row in keys])
        ref = task.reference if task.reference > 0 else 1.0
        r = (ref - vals) / ref
        rewards.extend(r.tolist())
        adv = (r - r.mean()) / (r.std() + 1e-4)
        dist = torch.distributions.Beta(a, b)
        logp = dist.log_prob(torch.tensor(keys, dtype=torch.float32)).mean(dim=1)
        term = (torch.tensor(adv, dtype=torch.float32) * logp).mean()
        loss = loss - (term + config.entropy * dist.entropy().mean()) / config.batch
    return loss, rewards


def search_value(
    shared: tuple[Problem, dict[str, Solution]],
    budget: int,
    seed: int,
    weights: PolicyWeights | None,
    action: np.ndarray | None,
) -> float:
    """One search's value: uniform BRKGA seeded with the portfolio (``action`` None), or BRKGA
    steered by ``action`` (``weights`` are not read then, and may be None)."""
    problem, seeds = shared
    if action is None:
        return brkga(problem, budget=budget, seeds=list(seeds.values()), seed=seed).value
    return learned_search(
        problem, weights, budget=budget, seed=seed, action=action, seeds=seeds
    ).value


def pick_task(rng: np.random.Generator, tasks: list[Task], runtime_share: float) -> int:
    """A training problem: a runtime one with probability ``runtime_share`` (when any)."""
    rt = [i for i, t in enumerate(tasks) if t.problem.objective == "runtime"]
    mem = [i for i, t in enumerate(tasks) if t.problem.objective != "runtime"]
    pool = rt if rt and rng.random() < runtime_share else mem
    return int(pool[int(rng.integers(len(pool)))])


def _save_checkpoint(
    path: Path,
    weights: PolicyWeights,
    opt: Any,
    net: TorchPolicy,
    config: TrainConfig,
    names: list[str],
    state: dict[str, Any],
    baseline: np.ndarray,
    replay: list[tuple[int, np.ndarray, float, float]],
) -> None:
    extra: dict[str, np.ndarray] = {}
    for name, p in net.params.items():
        st = opt.state.get(p, {})
        if st:
            extra[f"adam/{name}/m"] = st["exp_avg"].detach().numpy()
            extra[f"adam/{name}/v"] = st["exp_avg_sq"].detach().numpy()
            extra[f"adam/{name}/step"] = np.array([float(st["step"])])
    extra["baseline"] = baseline
    extra["replay/task"] = np.array([r[0] for r in replay], dtype=np.int64)
    extra["replay/reward"] = np.array([r[2] for r in replay], dtype=np.float64)
    extra["replay/logp"] = np.array([r[3] for r in replay], dtype=np.float64)
    extra["replay/rows"] = np.array([r[1].shape[0] for r in replay], dtype=np.int64)
    extra["replay/z"] = (
        np.concatenate([r[1] for r in replay]) if replay else np.zeros((0, OUTPUTS), np.float32)
    )
    doc = {"config": asdict(config), "tasks": names, "state": state}
    extra["train_state"] = np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8)
    PolicyWeights(weights.params, weights.hidden, weights.rounds, {"checkpoint": True}).save(
        path, extra
    )


def _load_checkpoint(
    path: Path, config: TrainConfig, names: list[str]
) -> tuple[PolicyWeights, dict[str, np.ndarray], dict[str, Any], np.ndarray, list]:
    loaded = PolicyWeights.load(path, with_extra=True)
    assert isinstance(loaded, tuple)
    weights, extra = loaded
    if "train_state" not in extra:
        raise CheckpointError(f"checkpoint {path}: holds weights only, no training state")
    doc = json.loads(extra["train_state"].tobytes().decode())
    saved = doc["config"]
    defaults = asdict(TrainConfig())  # settings added since the checkpoint was written
    for key, value in asdict(config).items():
        if saved.get(key, defaults[key]) != value:
            raise CheckpointError(
                f"checkpoint {path}: was trained with {key}={saved.get(key)!r}, "
                f"this run asks for {key}={value!r}"
            )
    if doc["tasks"] != names:
        raise CheckpointError(
            f"checkpoint {path}: its training problems differ from those of {config.corpus} "
            f"({len(doc['tasks'])} then, {len(names)} now)"
        )
    rows = extra["replay/rows"].tolist()
    zs = np.split(extra["replay/z"], np.cumsum(rows)[:-1]) if rows else []
    replay = [
        (int(k), z, float(r), float(lp))
        for k, z, r, lp in zip(
            extra["replay/task"].tolist(),
            zs,
            extra["replay/reward"].tolist(),
            extra["replay/logp"].tolist(),
            strict=True,
        )
    ]
    opt_state = {k[5:]: v for k, v in extra.items() if k.startswith("adam/")}
    return weights, opt_state, doc["state"], extra["baseline"], replay


def _restore_adam(opt: Any, net: TorchPolicy, saved: dict[str, np.ndarray]) -> None:
    torch = net.torch
    for name, p in net.params.items():
        if f"{name}/m" not in saved:
            continue
        opt.state[p] = {
            "step": torch.tensor(float(saved[f"{name}/step"][0])),
            "exp_avg": torch.tensor(saved[f"{name}/m"]),
            "exp_avg_sq": torch.tensor(saved[f"{name}/v"]),
        }


def rich_progress() -> tuple[Any, Callable[[int, int, str], None]]:
    """A rich progress bar when stdout is a terminal, else None (plain lines are printed)."""
    if not sys.stdout.isatty():
        return None, _lines(print)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    task = bar.add_task("train", total=None)

    def show(done: int, total: int, text: str) -> None:
        bar.update(task, completed=done, total=total, description=text)

    return bar, show


__all__ = ["TrainConfig", "train"]
