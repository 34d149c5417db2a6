"""graphopt's graph policy trained by a timerl program: graphs are the environment, a BRKGA
search steered by the policy's sampled proposal is its step.

The program (``graph_policy``) is the policy-gradient loop of ``timerl.graphopt.train`` with
its ``search`` reward, written as recurrent tensors over the iteration dim ``i``:

    x, P, S, mask, cols, pick = problems.observe(i)    # a batch of training problems, padded
    out  = net(x, P, S, mask)                           # (B, N, 7): the mean action
    z    = out + exp(log_std) * noise                   # a sampled action
    r    = problems.step(z, i)                          # steered vs uniform BRKGA, relative
    base[i + 1] = base[i] + pick.T @ (rate * (r - pick @ base[i]))   # per-problem baseline
    loss = -mean(logp(z) * normalise(r - pick @ base[i])) - entropy * sum(log_std)
    w[i + 1] = Adam(w[i], grad loss)

Graphs have different sizes and timerl's points have static shapes, so every graph of a
batch is padded to the largest training graph (``N`` nodes): padded nodes have zero features,
no edges and a zero mask, so the real nodes' values are exactly those of the unpadded
network. Message passing is a dense batched matmul with the mean-over-predecessors and
mean-over-successors matrices ``P`` and ``S`` (``N x N`` each per graph): with the corpus's
graphs (up to a few thousand nodes) that costs less than the searches, and it needs no
segment-sum primitive. The per-problem baseline is a recurrence over ``i`` (a vector over all
training problems, updated through the batch's one-hot ``pick``); duplicates within a batch
add their updates.

Not carried over from ``graphopt.train``: the replay buffer with importance weights, the
imitation warm start and the decode reward. The parameters have the weights file's names,
so ``export_weights`` writes what ``timerl graphopt optimize --weights`` reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from timerl.api.context import Context, from_numpy
from timerl.api.functional import randn
from timerl.api.nn import Module, _param
from timerl.api.optim import Adam
from timerl.api.scope import current
from timerl.api.tensor import RecurrentTensor, cat, full, where
from timerl.errors import GraphError
from timerl.graphopt.features import NUM_FEATURES
from timerl.graphopt.learned import learned_search
from timerl.graphopt.policy import OUTPUTS, PolicyWeights, used_columns
from timerl.graphopt.train import LOG_STD_RANGE, TrainConfig, make_tasks, search_value
from timerl.ir.build import apply
from timerl.rl.algos import AlgoConfig, AlgoProgram
from timerl.symbolic import Dim

BASELINE_RATE = 0.1  # the per-problem baseline's step (graphopt.train's running mean)


@dataclass
class GraphPolicyConfig(AlgoConfig):
    """``num_envs`` problems per iteration, one step each; ``hidden``: one width per round of
    message passing (all equal)."""

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


def _mean_matrix(n_pad: int, to: np.ndarray, frm: np.ndarray) -> np.ndarray:
    """``M @ h`` is, per node, the mean of ``h`` over the nodes ``frm`` its edges come from."""
    m = np.zeros((n_pad, n_pad), dtype=np.float32)
    np.add.at(m, (to, frm), 1.0)
    counts = m.sum(axis=1, keepdims=True)
    return m / np.maximum(counts, 1.0)


class GraphProblems:
    """The training split's problems as a timerl environment (host calls).

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
        )
        self.tasks = make_tasks(tc, log=lambda _: None)
        self.cfg = cfg
        self.vec = self
        self.num_envs = cfg.num_envs
        self.nodes = max(t.problem.n for t in self.tasks)
        self.rt = [k for k, t in enumerate(self.tasks) if t.problem.objective == "runtime"]
        self.mem = [k for k, t in enumerate(self.tasks) if t.problem.objective != "runtime"]
        self._done: list[float] = []
        self._graphs: dict[int, tuple[np.ndarray, ...]] = {}

    # --- what an iteration sees ------------------------------------------------------------
    def picks(self, iteration: int) -> tuple[list[int], list[int]]:
        """The problems of ``iteration`` and the BRKGA seed of each."""
        rng = np.random.default_rng([self.cfg.seed, int(iteration)])
        ks, seeds = [], []
        for _ in range(self.num_envs):
            pool = self.rt if self.rt and rng.random() < self.cfg.runtime_share else self.mem
            ks.append(int(pool[int(rng.integers(len(pool)))]))
            seeds.append(int(rng.integers(self.cfg.uniform_seeds)))
        return ks, seeds

    def graph_arrays(self, k: int) -> tuple[np.ndarray, ...]:
        """Problem ``k`` padded to ``nodes``: features, P, S, node mask, used-column mask."""
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
            pred = _mean_matrix(pad, feats.dst, feats.src)
            succ = _mean_matrix(pad, feats.src, feats.dst)
            got = self._graphs[k] = (x, pred, succ, mask, cols)
        return got

    def _observe(self, iteration: Any) -> tuple[np.ndarray, ...]:
        ks, _ = self.picks(int(iteration))
        parts = [self.graph_arrays(k) for k in ks]
        stacked = [np.stack([p[j] for p in parts]) for j in range(5)]
        pick = np.zeros((self.num_envs, len(self.tasks)), dtype=np.float32)
        pick[np.arange(self.num_envs), ks] = 1.0
        return (*stacked, pick)

    def _step(self, action: np.ndarray, iteration: Any) -> np.ndarray:
        ks, seeds = self.picks(int(iteration))
        out = np.zeros(self.num_envs, dtype=np.float32)
        for b, (k, s) in enumerate(zip(ks, seeds, strict=True)):
            task = self.tasks[k]
            shared = (task.problem, task.seeds)
            if s not in task.uniform:
                task.uniform[s] = search_value(shared, self.cfg.budget, s, None, None)
            base = task.uniform[s]
            z = np.asarray(action[b, : task.problem.n], dtype=np.float32)
            value = learned_search(
                task.problem, None, budget=self.cfg.budget, seed=s, action=z, seeds=task.seeds
            ).value
            out[b] = 0.0 if base <= 0 else (base - value) / base
        self._done.extend((100.0 * out).tolist())
        return out

    # --- as program ops --------------------------------------------------------------------
    def observe(self, iteration: RecurrentTensor) -> tuple[RecurrentTensor, ...]:
        """``(x, P, S, mask, cols, pick)`` of the batch at ``iteration`` (a tensor over i)."""
        ctx = current()
        b, n = self.num_envs, self.nodes
        call = apply(
            "udf",
            iteration.view,
            fn=self._observe,
            shape=(),
            dtype=np.dtype(bool),
            effect=True,
            name="graphs.observe",
        )
        ctx.add_root(call.op)
        shapes = [
            ((b, n, NUM_FEATURES), "x"),
            ((b, n, n), "pred"),
            ((b, n, n), "succ"),
            ((b, n), "mask"),
            ((b, OUTPUTS), "cols"),
            ((b, len(self.tasks)), "pick"),
        ]
        outs = []
        for item, (shape, what) in enumerate(shapes):
            v = apply("tuple_get", call, item=item, shape=shape, dtype=np.dtype("float32"))
            v.op.name = f"graphs.{what}"
            outs.append(RecurrentTensor(v, ctx))
        return tuple(outs)

    def step(self, action: RecurrentTensor, iteration: RecurrentTensor) -> RecurrentTensor:
        """Per problem of the batch, the relative improvement of BRKGA steered by ``action``
        over uniform BRKGA at the same budget and seed."""
        ctx = current()
        view = apply(
            "udf",
            action.view,
            iteration.view,
            fn=self._step,
            shape=(self.num_envs,),
            dtype=np.dtype("float32"),
            effect=True,
            name="graphs.search",
        )
        ctx.add_root(view.op)
        return RecurrentTensor(view, ctx)

    # --- what the training driver asks of an env ---------------------------------------------
    def completed_returns(self) -> np.ndarray:
        done, self._done = self._done, []
        return np.asarray(done, dtype=np.float64)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._done = []

    def close(self) -> None:
        pass


class GraphNet(Module):
    """``timerl.graphopt.policy``'s network over padded batches; parameters named as in the
    weights file, starting from ``init``'s values."""

    def __init__(self, init: PolicyWeights, domain: tuple[Dim, ...]) -> None:
        self.rounds = init.rounds
        self.params = {name: _param(v, domain, name) for name, v in init.params.items()}

    def parameters(self) -> list[RecurrentTensor]:
        return list(self.params.values())

    def _map(self, fn: Any) -> GraphNet:
        new = object.__new__(GraphNet)
        new.rounds = self.rounds
        new.params = {k: fn(v) for k, v in self.params.items()}
        return new

    def mean_action(
        self,
        x: RecurrentTensor,
        pred: RecurrentTensor,
        succ: RecurrentTensor,
        mask: RecurrentTensor,
    ) -> RecurrentTensor:
        p = self.params
        m = mask.unsqueeze(-1)
        h = (x @ p["in.w"] + p["in.b"]).relu() * m
        for r in range(self.rounds):
            msg = h @ p[f"r{r}.self"] + (pred @ h) @ p[f"r{r}.pred"]
            msg = msg + (succ @ h) @ p[f"r{r}.succ"] + p[f"r{r}.b"]
            h = h + msg.relu() * m
        g = h.sum(1, keepdim=True) / m.sum(1, keepdim=True)
        both = cat([h, g.expand(h.shape)], dim=-1)
        return both @ p["out.w"] + p["out.b"]

    def log_std(self) -> RecurrentTensor:
        return self.params["log_std"].clamp(*LOG_STD_RANGE)


def graph_policy(config: GraphPolicyConfig | None = None, **overrides: Any) -> AlgoProgram:
    """The program described in the module docstring."""
    cfg = config or GraphPolicyConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    if not cfg.hidden or len(set(cfg.hidden)) != 1:
        raise GraphError(
            f"graph-policy: hidden is one width per round, all equal, got {list(cfg.hidden)}"
        )
    problems = GraphProblems(cfg)
    init = PolicyWeights.random(cfg.hidden[0], len(cfg.hidden), seed=cfg.seed)
    ctx = Context(dims=("i",))
    (i,) = ctx.dims
    k = len(problems.tasks)
    with ctx:
        iteration = full((), i, dtype="int64")
        x, pred, succ, mask, cols, pick = problems.observe(iteration)
        net = GraphNet(init, (i,))
        pi = net.at(i)
        mean = pi.mean_action(x, pred, succ, mask)
        log_std = pi.log_std()
        std = log_std.exp()
        z = (mean.detach() + std.detach() * randn(mean.shape, like=mean)).named("action")
        reward = problems.step(z, iteration).named("reward")
        base = RecurrentTensor.placeholder((k,), "float32", (i,), name="baseline")
        seen = RecurrentTensor.placeholder((k,), "float32", (i,), name="seen")
        base[0] = from_numpy(np.zeros(k, dtype=np.float32))
        seen[0] = from_numpy(np.zeros(k, dtype=np.float32))
        before = (pick @ base[i].unsqueeze(-1)).squeeze(-1)
        first = (pick @ seen[i].unsqueeze(-1)).squeeze(-1) == 0.0
        rate = where(first, 1.0, BASELINE_RATE)
        step = pick.transpose(0, 1) @ (rate * (reward - before)).unsqueeze(-1)
        base[i + 1] = base[i] + step.squeeze(-1)
        seen[i + 1] = seen[i] + pick.sum(0)
        loss = policy_loss(mean, log_std, mask, cols, z, reward - before, cfg.entropy)
        params = net.parameters()
        loss.backward(inputs=params)
        Adam(params, lr=cfg.lr, max_grad_norm=cfg.max_grad_norm).step()
        metrics = {
            "loss": loss,
            "reward": reward.mean(),
            "action_std": std.mean(),
        }
    return AlgoProgram("graph-policy", ctx, problems, cfg, metrics, {}, params)  # type: ignore[arg-type]


def policy_loss(
    mean: RecurrentTensor,
    log_std: RecurrentTensor,
    mask: RecurrentTensor,
    cols: RecurrentTensor,
    action: RecurrentTensor,
    advantage: RecurrentTensor,
    entropy: float,
) -> RecurrentTensor:
    """The policy gradient's loss: each problem's Gaussian log-density of ``action``, a mean
    over its real nodes and used outputs (a per-gene geometric mean, finite on graphs of any
    size), weighted by its advantage normalised over the batch; minus an entropy bonus."""
    std = log_std.exp()
    d = (action - mean) / std
    lp = d * d * -0.5 - log_std - 0.5 * math.log(2 * math.pi)
    w = mask.unsqueeze(-1) * cols.unsqueeze(1)
    logp = (lp * w).sum((1, 2)) / w.sum((1, 2))
    adv = advantage.detach()
    adv = adv / (adv.std(unbiased=False) + 1e-4)
    return -(logp * adv).mean() - log_std.sum() * entropy


def export_weights(params: dict[str, np.ndarray], cfg: GraphPolicyConfig, out: Path) -> Path:
    """Write trained parameters (by name, as a checkpoint holds them) as a weights file."""
    weights = PolicyWeights(
        {k: np.asarray(v, dtype=np.float32) for k, v in params.items()},
        cfg.hidden[0],
        len(cfg.hidden),
        {"trained": True, "trainer": "timerl program"},
    )
    expected = PolicyWeights.random(cfg.hidden[0], len(cfg.hidden)).params
    missing = sorted(set(expected) - set(weights.params))
    if missing:
        raise GraphError(f"graph-policy: the checkpoint has no parameter {missing[0]!r}")
    weights.save(out)
    return out
