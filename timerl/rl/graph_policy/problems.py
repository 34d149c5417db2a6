"""The training split's graphs as a timerl environment: the host calls of the programs that
train graphopt's policy (``graph_policy.py``).

A batch of problems is padded to the largest training graph (``N`` nodes, ``E`` edges):
features, a node mask, and the edge list with the weights that turn a sum over a node's
incoming (outgoing) edges into the mean over its predecessors (successors). The search phase's step runs BRKGA steered by the sampled
action against uniform BRKGA at the same budget and seed (in ``search_workers`` processes);
the imitation phase's batches carry each graph's target order as padded pair indices and rank
keys, and its score says how far above the target the mean priorities decode. The decode
phase's step decodes each sampled key vector straight into a schedule and scores it against
the best portfolio schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from timerl.api.calls import Result, host_call
from timerl.api.tensor import RecurrentTensor
from timerl.errors import GraphError
from timerl.graphopt.features import NUM_FEATURES
from timerl.graphopt.imitate import mean_decode_gap, pair_index, rank_keys
from timerl.graphopt.parallel import TaskPool
from timerl.graphopt.policy import OUTPUTS, key_columns, used_columns
from timerl.graphopt.train import (
    TrainConfig,
    attach_targets,
    imitation_batch,
    make_tasks,
    pick_task,
    search_value,
)
from timerl.rl.algos.policy_gradient import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    AlgoConfig,
    Rule,
    at_least,
)

PHASES = ("search", "imitate", "decode")


@dataclass
class GraphPolicyConfig(AlgoConfig):
    """``num_envs`` problems per iteration, one step each; ``hidden``: one width per round of
    message passing (all equal)."""

    RULES: ClassVar[dict[str, Rule]] = {
        **AlgoConfig.RULES,
        "max_nodes": at_least(1),
        "runtime_share": FRACTION,
        "budget": at_least(1),
        "entropy": NON_NEGATIVE,
        "uniform_seeds": at_least(1),
        "imitate_budget": at_least(1),
        "imitate_concentration": POSITIVE,
        "replay": at_least(0),
        "clip": POSITIVE,
        "search_workers": at_least(1),
        "samples": at_least(2),
    }

    env_id: str = "graphopt-corpus"
    num_envs: int = 4
    num_steps: int = 1
    lr: float = 3e-3
    anneal_lr: bool = False
    hidden: tuple[int, ...] = (32, 32, 32)
    max_grad_norm: float = 1.0
    corpus: str = "corpus"
    split: str = "train"
    max_nodes: int = 600
    runtime_share: float = 0.3
    budget: int = 400  # BRKGA evaluations per sampled proposal (and per uniform reference)
    entropy: float = 1e-3
    uniform_seeds: int = 3  # BRKGA seeds cycled, so uniform BRKGA's values are cached
    phase: str = "search"  # or "imitate": fit the mean priorities to the best known orders
    init: str = ""  # a weights file to start from ("": a random network drawn from ``seed``)
    targets: str = ""  # imitate: the target orders' file (searched and written when missing)
    imitate_budget: int = 2000  # imitate: uniform BRKGA decodes that search each target
    imitate_concentration: float = 4.0  # imitate: the Beta a + b the proposals are pulled to
    replay: int = 2  # search: past iterations whose batches each update scores again
    clip: float = 0.2  # search: the importance ratio's clip (as in PPO) for replayed samples
    search_workers: int = 1  # local processes running an update's searches (same results)
    samples: int = 16  # decode: key vectors drawn per problem and update


def _quiet(line: str) -> None:
    """The driver's progress says how training goes; graphopt's own lines stay out of it."""


class GraphProblems:
    """The training split's problems as a timerl environment (host calls): ``observe`` and
    ``step`` for the search phase, ``observe_targets`` and ``score`` for the imitation.

    Which problems an iteration sees is a function of (seed, iteration), so a resumed run
    sees what the uninterrupted one would; uniform BRKGA's values are cached per problem and
    seed (recomputed after a resume: they are deterministic). ``vec`` is the env itself: the
    training driver reads ``completed_returns`` (here: the rewards in percent) from it."""

    def __init__(self, cfg: GraphPolicyConfig) -> None:
        if cfg.env_id != GraphPolicyConfig.env_id:
            raise GraphError(
                f"graph-policy: its environment is the graphs of --corpus, not {cfg.env_id!r}"
            )
        if cfg.num_steps != 1:
            raise GraphError(f"graph-policy: num_steps must be 1 (one search), got {cfg.num_steps}")
        if cfg.num_envs < 2:
            raise GraphError(
                f"graph-policy: num_envs (problems per iteration) must be at least 2 to "
                f"normalise the advantages, got {cfg.num_envs}"
            )
        tc = TrainConfig(
            corpus=cfg.corpus,
            split=cfg.split,
            max_nodes=cfg.max_nodes,
            runtime_share=cfg.runtime_share,
            budget=cfg.budget,
            seed=cfg.seed,
            imitate_budget=cfg.imitate_budget,
        )
        if cfg.phase not in PHASES:
            raise GraphError(f"graph-policy: phase {cfg.phase!r}; choose from {', '.join(PHASES)}")
        self.tasks = make_tasks(tc, log=_quiet)
        self.cfg = cfg
        self.pool = TaskPool(cfg.search_workers)
        self.shared = [self.pool.put((t.problem, t.seeds)) for t in self.tasks]
        if cfg.phase == "imitate":
            if not cfg.targets:
                raise GraphError(
                    "graph-policy: the imitate phase needs --targets FILE (searched when missing)"
                )
            attach_targets(self.tasks, self.shared, tc, Path(cfg.targets), self.pool, _quiet)
        self.vec = self
        self.num_envs = cfg.num_envs
        self.nodes = max(t.problem.n for t in self.tasks)
        self.edges = max(max(len(t.feats.src) for t in self.tasks), 1)
        targets = [t.target for t in self.tasks if t.target is not None]
        self.pairs = max((len(pair_index(order)[0]) for order in targets), default=1)
        self._done: list[float] = []
        self._graphs: dict[int, tuple[np.ndarray, ...]] = {}

    # --- what an iteration sees ------------------------------------------------------------
    def picks(self, iteration: int) -> tuple[list[int], list[int]]:
        """The problems of ``iteration`` and the BRKGA seed of each."""
        rng = np.random.default_rng([self.cfg.seed, int(iteration)])
        ks, seeds = [], []
        for _ in range(self.num_envs):
            ks.append(pick_task(rng, self.tasks, self.cfg.runtime_share))
            seeds.append(int(rng.integers(self.cfg.uniform_seeds)))
        return ks, seeds

    def imitation_picks(self, iteration: int) -> list[int]:
        """The problems of an imitation update: ``graphopt.train``'s own draws, so both
        trainers see the same batches."""
        rng = np.random.default_rng([self.cfg.seed, 1, int(iteration)])
        return imitation_batch(self.tasks, self.num_envs, rng)

    def target_arrays(self, k: int) -> tuple[np.ndarray, ...]:
        """Problem ``k``'s target padded: pair indices (earlier, later) and their mask, the
        rank keys, and the keys' own cross-entropy (the floor the loss subtracts)."""
        task = self.tasks[k]
        assert task.target is not None
        first, second = pair_index(task.target)
        earlier = np.zeros(self.pairs, dtype=np.int64)
        later = np.zeros(self.pairs, dtype=np.int64)
        earlier[: len(first)] = first
        later[: len(second)] = second
        pmask = np.zeros(self.pairs, dtype=np.float32)
        pmask[: len(first)] = 1.0
        n = task.problem.n
        keys = np.zeros(self.nodes, dtype=np.float32)
        keys[:n] = rank_keys(task.target)
        t = np.clip(keys[:n], 1e-6, 1 - 1e-6)
        floor = np.mean(t * np.log(t) + (1 - t) * np.log(1 - t), dtype=np.float32)
        return earlier, later, pmask, keys, np.asarray(floor, dtype=np.float32)

    def graph_arrays(self, k: int) -> tuple[np.ndarray, ...]:
        """Problem ``k`` padded to ``nodes`` nodes and ``edges`` edges: features, node mask,
        used-column mask, and per edge its source, its destination and the weights that
        make sums over edges means: 1 / in-degree of the destination (the mean over a
        node's predecessors), 1 / out-degree of the source (over its successors); padded
        edges join node 0 to itself with weight 0."""
        got = self._graphs.get(k)
        if got is None:
            task = self.tasks[k]
            feats, n, pad = task.feats, task.problem.n, self.nodes
            x = np.zeros((pad, NUM_FEATURES), dtype=np.float32)
            x[:n] = feats.x
            mask = np.zeros(pad, dtype=np.float32)
            mask[:n] = 1.0
            cols = np.zeros(OUTPUTS, dtype=np.float32)
            cols[used_columns(task.groups)] = 1.0
            e = len(feats.src)
            src = np.zeros(self.edges, dtype=np.int64)
            dst = np.zeros(self.edges, dtype=np.int64)
            src[:e], dst[:e] = feats.src, feats.dst
            into = np.bincount(feats.dst, minlength=pad).astype(np.float32)
            out_of = np.bincount(feats.src, minlength=pad).astype(np.float32)
            w_pred = np.zeros(self.edges, dtype=np.float32)
            w_succ = np.zeros(self.edges, dtype=np.float32)
            w_pred[:e] = 1.0 / into[feats.dst]
            w_succ[:e] = 1.0 / out_of[feats.src]
            got = self._graphs[k] = (x, mask, cols, src, dst, w_pred, w_succ)
        return got

    def batch_arrays(self, ks: list[int]) -> tuple[np.ndarray, ...]:
        """The batch of problems ``ks``: ``(x, src, dst, w_pred, w_succ, mask, cols)``, the
        edges of all graphs in one list whose node indices count across the batch (graph
        ``b``'s nodes from ``b * nodes``), as the network's flattened rows do."""
        parts = [self.graph_arrays(k) for k in ks]
        x, mask, cols = (np.stack([p[j] for p in parts]) for j in range(3))
        offsets = np.arange(len(ks), dtype=np.int64)[:, None] * self.nodes
        src = (np.stack([p[3] for p in parts]) + offsets).reshape(-1)
        dst = (np.stack([p[4] for p in parts]) + offsets).reshape(-1)
        w_pred = np.concatenate([p[5] for p in parts])
        w_succ = np.concatenate([p[6] for p in parts])
        return x, src, dst, w_pred, w_succ, mask, cols

    def _observe_targets(self, iteration: Any) -> tuple[np.ndarray, ...]:
        ks = self.imitation_picks(int(iteration))
        graphs = self.batch_arrays(ks)[:6]
        targets = [self.target_arrays(k) for k in ks]
        return (*graphs, *(np.stack([t[j] for t in targets]) for j in range(5)))

    def _score(self, logits: np.ndarray, iteration: Any) -> np.ndarray:
        ks = self.imitation_picks(int(iteration))
        out = np.zeros(self.num_envs, dtype=np.float32)
        for b, k in enumerate(ks):
            task = self.tasks[k]
            row = np.asarray(logits[b, : task.problem.n], dtype=np.float64)
            out[b] = mean_decode_gap(task.problem, row, task.target_value)
        self._done.extend((-100.0 * out).tolist())
        return out

    def _observe(self, iteration: Any) -> tuple[np.ndarray, ...]:
        ks, _ = self.picks(int(iteration))
        pick = np.zeros((self.num_envs, len(self.tasks)), dtype=np.float32)
        pick[np.arange(self.num_envs), ks] = 1.0
        return (*self.batch_arrays(ks), pick)

    def _step(self, action: np.ndarray, iteration: Any) -> np.ndarray:
        ks, seeds = self.picks(int(iteration))
        budget = self.cfg.budget
        # the uniform references not cached yet and the steered searches, run together (in
        # ``search_workers`` processes)
        pairs = zip(ks, seeds, strict=True)
        missing = sorted({(k, s) for k, s in pairs if s not in self.tasks[k].uniform})
        calls = [(self.shared[k], budget, s, None, None) for k, s in missing]
        for b, (k, s) in enumerate(zip(ks, seeds, strict=True)):
            z = np.asarray(action[b, : self.tasks[k].problem.n], dtype=np.float32)
            calls.append((self.shared[k], budget, s, None, z))
        sizes = [self.tasks[k].problem.n for k, _ in missing] + [
            self.tasks[k].problem.n for k in ks
        ]
        values = self.pool.map(search_value, calls, sizes=sizes)
        for (k, s), v in zip(missing, values, strict=False):
            self.tasks[k].uniform[s] = v
        out = np.zeros(self.num_envs, dtype=np.float32)
        for b, (k, s) in enumerate(zip(ks, seeds, strict=True)):
            base, value = self.tasks[k].uniform[s], values[len(missing) + b]
            out[b] = 0.0 if base <= 0 else (base - value) / base
        self._done.extend((100.0 * out).tolist())
        return out

    def _decode(self, keys: np.ndarray, iteration: Any) -> np.ndarray:
        """Per problem and sample, the relative improvement of the schedule the keys decode to
        over the best portfolio schedule (``graphopt.train.decode_loss``'s reward). ``keys``
        is (batch, samples, nodes, key group); a problem reads its own nodes and groups, laid
        out as its decoder expects (all priorities, then the device keys, then the swaps)."""
        ks, _ = self.picks(int(iteration))
        out = np.zeros(keys.shape[:2], dtype=np.float32)
        for b, k in enumerate(ks):
            task = self.tasks[k]
            n = task.problem.n
            groups = [c // 2 for c in key_columns(task.groups)]
            ref = task.reference if task.reference > 0 else 1.0
            for s in range(keys.shape[1]):
                row = np.concatenate([keys[b, s, :n, g] for g in groups]).astype(np.float64)
                out[b, s] = (ref - task.problem.fitness(row)[0]) / ref
        self._done.extend((100.0 * out.mean(1)).tolist())
        return out

    # --- as program ops --------------------------------------------------------------------
    def observe(self, iteration: RecurrentTensor) -> tuple[RecurrentTensor, ...]:
        """``(x, src, dst, w_pred, w_succ, mask, cols, pick)`` of the batch at ``iteration``
        (a tensor over i)."""
        b = self.num_envs
        extra = [((b, OUTPUTS), "float32", "cols"), ((b, len(self.tasks)), "float32", "pick")]
        return self._host_tuple(
            self._observe, iteration, "graphs.observe", self._graph_parts() + extra
        )

    def observe_targets(self, iteration: RecurrentTensor) -> tuple[RecurrentTensor, ...]:
        """``(x, src, dst, w_pred, w_succ, mask, first, second, pair_mask, keys, floor)`` of
        an imitation batch."""
        b, n, p = self.num_envs, self.nodes, self.pairs
        extra = [
            ((b, p), "int64", "first"),
            ((b, p), "int64", "second"),
            ((b, p), "float32", "pair_mask"),
            ((b, n), "float32", "keys"),
            ((b,), "float32", "floor"),
        ]
        return self._host_tuple(
            self._observe_targets, iteration, "graphs.observe_targets", self._graph_parts() + extra
        )

    def _graph_parts(self) -> list[tuple]:
        """(shape, dtype, name) of a batch's graphs: ``(x, src, dst, w_pred, w_succ, mask)``."""
        b, n, e = self.num_envs, self.nodes, self.edges
        return [
            ((b, n, NUM_FEATURES), "float32", "x"),
            ((b * e,), "int64", "src"),
            ((b * e,), "int64", "dst"),
            ((b * e,), "float32", "w_pred"),
            ((b * e,), "float32", "w_succ"),
            ((b, n), "float32", "mask"),
        ]

    def score(self, logits: RecurrentTensor, iteration: RecurrentTensor) -> RecurrentTensor:
        """Per problem, how much higher (relative) the schedule its mean priorities decode to
        is than its target's."""
        return self._host_rows(self._score, logits, iteration, "graphs.score")

    def _host_rows(
        self,
        fn: Any,
        value: RecurrentTensor,
        iteration: RecurrentTensor,
        name: str,
        shape: tuple[int, ...] | None = None,
    ) -> RecurrentTensor:
        """A host call of ``(value, iteration)`` giving floats of ``shape`` (default: one per
        problem of the batch)."""
        result = Result(shape or (self.num_envs,), np.dtype("float32"))
        return host_call(fn, value, iteration, result=result, name=name)

    def _host_tuple(
        self, fn: Any, iteration: RecurrentTensor, name: str, parts: list[tuple]
    ) -> tuple[RecurrentTensor, ...]:
        results = [Result(shape, dtype, f"graphs.{what}") for shape, dtype, what in parts]
        return host_call(fn, iteration, results=results, name=name)

    def decode(self, keys: RecurrentTensor, iteration: RecurrentTensor) -> RecurrentTensor:
        """Per problem and sample (batch, samples), how much better than the best portfolio
        schedule the sampled keys decode."""
        return self._host_rows(
            self._decode, keys, iteration, "graphs.decode", (self.num_envs, self.cfg.samples)
        )

    def step(self, action: RecurrentTensor, iteration: RecurrentTensor) -> RecurrentTensor:
        """Per problem of the batch, the relative improvement of BRKGA steered by ``action``
        over uniform BRKGA at the same budget and seed."""
        return self._host_rows(self._step, action, iteration, "graphs.search")

    # --- what the training driver asks of an env ---------------------------------------------
    def completed_returns(self) -> np.ndarray:
        done, self._done = self._done, []
        return np.asarray(done, dtype=np.float64)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._done = []

    def close(self) -> None:
        self.pool.close()
