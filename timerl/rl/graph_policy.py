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
from timerl.api.functional import max as max_
from timerl.api.functional import randn
from timerl.api.nn import Module, _param
from timerl.api.optim import Adam
from timerl.api.scope import current
from timerl.api.tensor import RecurrentTensor, cat, full, minimum, where
from timerl.errors import GraphError
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem, Solution, order_keys
from timerl.graphopt.features import NUM_FEATURES
from timerl.graphopt.imitate import log_concentration, mean_decode_gap, pair_index
from timerl.graphopt.learned import learned_search
from timerl.graphopt.parallel import TaskPool
from timerl.graphopt.policy import BASE_KAPPA, OUTPUTS, PolicyWeights, used_columns
from timerl.graphopt.train import LOG_STD_RANGE, TrainConfig, attach_targets, make_tasks
from timerl.ir.build import apply
from timerl.rl.algos import AlgoConfig, AlgoProgram
from timerl.symbolic import Dim

BASELINE_RATE = 0.1  # the per-problem baseline's step (graphopt.train's running mean)
PHASES = ("search", "imitate")


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
    phase: str = "search"  # or "imitate": fit the mean priorities to the best known orders
    init: str = ""  # a weights file to start from ("": a random network drawn from ``seed``)
    targets: str = ""  # imitate: the target orders' file (searched and written when missing)
    imitate_budget: int = 2000  # imitate: uniform BRKGA decodes that search each target
    imitate_concentration: float = 4.0  # imitate: the Beta a + b the proposals are pulled to
    replay: int = 2  # search: past iterations whose batches each update scores again
    clip: float = 0.2  # search: the importance ratio's clip (as in PPO) for replayed samples
    search_workers: int = 1  # local processes running an update's searches (same results)


def _mean_matrix(n_pad: int, to: np.ndarray, frm: np.ndarray) -> np.ndarray:
    """``M @ h`` is, per node, the mean of ``h`` over the nodes ``frm`` its edges come from."""
    m = np.zeros((n_pad, n_pad), dtype=np.float32)
    np.add.at(m, (to, frm), 1.0)
    counts = m.sum(axis=1, keepdims=True)
    return m / np.maximum(counts, 1.0)


def _quiet(line: str) -> None:
    """The driver's progress says how training goes; graphopt's own lines stay out of it."""


def search(
    shared: tuple[Problem, dict[str, Solution]], budget: int, seed: int, action: Any
) -> float:
    """One search's value: uniform BRKGA seeded with the portfolio (``action`` None), or
    BRKGA steered by ``action`` (a pure call, for the search processes)."""
    problem, seeds = shared
    if action is None:
        return brkga(problem, budget=budget, seeds=list(seeds.values()), seed=seed).value
    return learned_search(problem, None, budget=budget, seed=seed, action=action, seeds=seeds).value


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
            tc.imitate_budget = cfg.imitate_budget
            attach_targets(self.tasks, self.shared, tc, Path(cfg.targets), self.pool, _quiet)
        self.vec = self
        self.num_envs = cfg.num_envs
        self.nodes = max(t.problem.n for t in self.tasks)
        self.rt = [k for k, t in enumerate(self.tasks) if t.problem.objective == "runtime"]
        self.mem = [k for k, t in enumerate(self.tasks) if t.problem.objective != "runtime"]
        self.imitated = [k for k, t in enumerate(self.tasks) if t.target is not None]
        self.pairs = max(
            (len(pair_index(self.tasks[k].target)[0]) for k in self.imitated), default=1
        )
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

    def imitation_picks(self, iteration: int) -> list[int]:
        """The problems of an imitation update: ``graphopt.train``'s own draws, so both
        trainers see the same batches."""
        rng = np.random.default_rng([self.cfg.seed, 1, int(iteration)])
        return [self.imitated[int(rng.integers(len(self.imitated)))] for _ in range(self.num_envs)]

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
        keys[:n] = order_keys(task.target) - 0.5 / max(n, 1)
        t = np.clip(keys[:n], 1e-6, 1 - 1e-6)
        floor = np.mean(t * np.log(t) + (1 - t) * np.log(1 - t), dtype=np.float32)
        return earlier, later, pmask, keys, np.asarray(floor, dtype=np.float32)

    def graph_arrays(self, k: int) -> tuple[np.ndarray, ...]:
        """Problem ``k`` padded to ``nodes``: features, P, S, node mask, used-column mask.
        The small arrays are kept; the dense ``N x N`` matrices are built per batch (kept,
        a hundred problems of 1,200 nodes would hold a gigabyte)."""
        got = self._graphs.get(k)
        task = self.tasks[k]
        if got is None:
            feats, n, pad = task.feats, task.problem.n, self.nodes
            x = np.zeros((pad, NUM_FEATURES), dtype=np.float32)
            x[:n] = feats.x
            mask = np.zeros(pad, dtype=np.float32)
            mask[:n] = 1.0
            cols = np.zeros(OUTPUTS, dtype=np.float32)
            cols[used_columns(task.groups)] = 1.0
            got = self._graphs[k] = (x, mask, cols)
        x, mask, cols = got
        feats = task.feats
        pred = _mean_matrix(self.nodes, feats.dst, feats.src)
        succ = _mean_matrix(self.nodes, feats.src, feats.dst)
        return x, pred, succ, mask, cols

    def _observe_targets(self, iteration: Any) -> tuple[np.ndarray, ...]:
        ks = self.imitation_picks(int(iteration))
        parts = [self.graph_arrays(k)[:4] + self.target_arrays(k) for k in ks]
        return tuple(np.stack([p[j] for p in parts]) for j in range(9))

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
        parts = [self.graph_arrays(k) for k in ks]
        stacked = [np.stack([p[j] for p in parts]) for j in range(5)]
        pick = np.zeros((self.num_envs, len(self.tasks)), dtype=np.float32)
        pick[np.arange(self.num_envs), ks] = 1.0
        return (*stacked, pick)

    def _step(self, action: np.ndarray, iteration: Any) -> np.ndarray:
        ks, seeds = self.picks(int(iteration))
        budget = self.cfg.budget
        # the uniform references not cached yet and the steered searches, run together (in
        # ``search_workers`` processes)
        pairs = zip(ks, seeds, strict=True)
        missing = sorted({(k, s) for k, s in pairs if s not in self.tasks[k].uniform})
        calls = [(self.shared[k], budget, s, None) for k, s in missing]
        for b, (k, s) in enumerate(zip(ks, seeds, strict=True)):
            z = np.asarray(action[b, : self.tasks[k].problem.n], dtype=np.float32)
            calls.append((self.shared[k], budget, s, z))
        sizes = [self.tasks[k].problem.n for k, _ in missing] + [
            self.tasks[k].problem.n for k in ks
        ]
        values = self.pool.map(search, calls, sizes=sizes)
        for (k, s), v in zip(missing, values, strict=False):
            self.tasks[k].uniform[s] = v
        out = np.zeros(self.num_envs, dtype=np.float32)
        for b, (k, s) in enumerate(zip(ks, seeds, strict=True)):
            base, value = self.tasks[k].uniform[s], values[len(missing) + b]
            out[b] = 0.0 if base <= 0 else (base - value) / base
        self._done.extend((100.0 * out).tolist())
        return out

    # --- as program ops --------------------------------------------------------------------
    def observe(self, iteration: RecurrentTensor) -> tuple[RecurrentTensor, ...]:
        """``(x, P, S, mask, cols, pick)`` of the batch at ``iteration`` (a tensor over i)."""
        b, n = self.num_envs, self.nodes
        return self._host_tuple(
            self._observe,
            iteration,
            "graphs.observe",
            [
                ((b, n, NUM_FEATURES), "float32", "x"),
                ((b, n, n), "float32", "pred"),
                ((b, n, n), "float32", "succ"),
                ((b, n), "float32", "mask"),
                ((b, OUTPUTS), "float32", "cols"),
                ((b, len(self.tasks)), "float32", "pick"),
            ],
        )

    def observe_targets(self, iteration: RecurrentTensor) -> tuple[RecurrentTensor, ...]:
        """``(x, P, S, mask, first, second, pair_mask, keys, floor)`` of an imitation batch."""
        b, n, p = self.num_envs, self.nodes, self.pairs
        return self._host_tuple(
            self._observe_targets,
            iteration,
            "graphs.observe_targets",
            [
                ((b, n, NUM_FEATURES), "float32", "x"),
                ((b, n, n), "float32", "pred"),
                ((b, n, n), "float32", "succ"),
                ((b, n), "float32", "mask"),
                ((b, p), "int64", "first"),
                ((b, p), "int64", "second"),
                ((b, p), "float32", "pair_mask"),
                ((b, n), "float32", "keys"),
                ((b,), "float32", "floor"),
            ],
        )

    def score(self, logits: RecurrentTensor, iteration: RecurrentTensor) -> RecurrentTensor:
        """Per problem, how much higher (relative) the schedule its mean priorities decode to
        is than its target's."""
        return self._host_rows(self._score, logits, iteration, "graphs.score")

    def _host_rows(
        self, fn: Any, value: RecurrentTensor, iteration: RecurrentTensor, name: str
    ) -> RecurrentTensor:
        """A host call of ``(value, iteration)`` giving one float per problem of the batch."""
        ctx = current()
        view = apply(
            "udf",
            value.view,
            iteration.view,
            fn=fn,
            shape=(self.num_envs,),
            dtype=np.dtype("float32"),
            effect=True,
            name=name,
        )
        ctx.add_root(view.op)
        return RecurrentTensor(view, ctx)

    def _host_tuple(
        self, fn: Any, iteration: RecurrentTensor, name: str, parts: list[tuple]
    ) -> tuple[RecurrentTensor, ...]:
        ctx = current()
        call = apply(
            "udf", iteration.view, fn=fn, shape=(), dtype=np.dtype(bool), effect=True, name=name
        )
        ctx.add_root(call.op)
        outs = []
        for item, (shape, dtype, what) in enumerate(parts):
            v = apply("tuple_get", call, item=item, shape=shape, dtype=np.dtype(dtype))
            v.op.name = f"graphs.{what}"
            outs.append(RecurrentTensor(v, ctx))
        return tuple(outs)

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
    """The program of the module docstring (``phase`` "search"), or the imitation warm start
    (``phase`` "imitate"): the mean priorities fitted to each graph's best known order."""
    cfg = config or GraphPolicyConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    if not cfg.hidden or len(set(cfg.hidden)) != 1:
        raise GraphError(
            f"graph-policy: hidden is one width per round, all equal, got {list(cfg.hidden)}"
        )
    problems = GraphProblems(cfg)
    init = _initial_weights(cfg)
    ctx = Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        iteration = full((), i, dtype="int64")
        net = GraphNet(init, (i,))
        pi = net.at(i)
        if cfg.phase == "imitate":
            loss, metrics = _imitation(problems, pi, iteration, cfg)
        else:
            loss, metrics = _search(problems, net, iteration, cfg, i)
        params = net.parameters()
        loss.backward(inputs=params)
        Adam(params, lr=cfg.lr, max_grad_norm=cfg.max_grad_norm).step()
    return AlgoProgram("graph-policy", ctx, problems, cfg, metrics, {}, params)  # type: ignore[arg-type]


def _initial_weights(cfg: GraphPolicyConfig) -> PolicyWeights:
    width, rounds = cfg.hidden[0], len(cfg.hidden)
    if not cfg.init:
        return PolicyWeights.random(width, rounds, seed=cfg.seed)
    got = PolicyWeights.load(cfg.init)
    assert isinstance(got, PolicyWeights)
    if (got.hidden, got.rounds) != (width, rounds):
        raise GraphError(
            f"graph-policy: {cfg.init} holds a network of width {got.hidden} and {got.rounds} "
            f"rounds, the settings ask for width {width} and {rounds} rounds"
        )
    return got


def _search(
    problems: GraphProblems,
    net: GraphNet,
    iteration: RecurrentTensor,
    cfg: GraphPolicyConfig,
    i: Dim,
) -> tuple[RecurrentTensor, dict[str, RecurrentTensor]]:
    k = len(problems.tasks)
    pi = net.at(i)
    x, pred, succ, mask, cols, pick = problems.observe(iteration)
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
    logp = sample_logp(mean, log_std, mask, cols, z)
    adv = normalised(reward - before)
    loss = -(logp * adv).mean()
    for back in range(1, cfg.replay + 1):
        # the batch of ``back`` iterations ago (its graphs, its action, the log-density it
        # was drawn with and its advantage), scored by this iteration's network; before
        # iteration ``back`` there is none: the first batch is read and the term is 0
        at = max_(i - back, 0)
        old = [v[at] for v in (x, pred, succ, mask, cols, z, logp, adv)]
        ox, opred, osucc, omask, ocols, oz, ologp, oadv = old
        lp_now = sample_logp(pi.mean_action(ox, opred, osucc, omask), log_std, omask, ocols, oz)
        ratio = (lp_now - ologp.detach()).clamp(-20.0, 20.0).exp()
        clipped = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)
        surrogate = minimum(ratio * oadv, clipped * oadv).mean()
        loss = loss - where(iteration >= back, surrogate, 0.0)
    loss = loss / (1 + cfg.replay) - log_std.sum() * cfg.entropy
    metrics = {"loss": loss, "reward": reward.mean(), "action_std": std.mean()}
    metrics["advantage"] = adv.mean()
    return loss, metrics


def _imitation(
    problems: GraphProblems, pi: GraphNet, iteration: RecurrentTensor, cfg: GraphPolicyConfig
) -> tuple[RecurrentTensor, dict[str, RecurrentTensor]]:
    x, pred, succ, mask, first, second, pair_mask, keys, floor = problems.observe_targets(iteration)
    mean = pi.mean_action(x, pred, succ, mask)
    # how far above its target each problem's mean priorities decode (before this update)
    gap = problems.score(mean.narrow(-1, 0, 1).squeeze(-1).detach(), iteration)
    log_kappa = log_concentration(cfg.imitate_concentration, BASE_KAPPA)
    loss = imitation_loss(mean, mask, first, second, pair_mask, keys, floor, log_kappa)
    return loss, {"loss": loss, "gap": gap.mean()}


def _softplus(x: RecurrentTensor) -> RecurrentTensor:
    """``log(1 + exp(x))`` without overflow."""
    return x.relu() + ((-x.abs()).exp() + 1.0).log()


def imitation_loss(
    mean: RecurrentTensor,
    mask: RecurrentTensor,
    first: RecurrentTensor,
    second: RecurrentTensor,
    pair_mask: RecurrentTensor,
    keys: RecurrentTensor,
    floor: RecurrentTensor,
    log_kappa: float,
) -> RecurrentTensor:
    """``graphopt.imitate.imitation_loss`` over a padded batch, averaged over it: a pairwise
    logistic loss on the target's nearby pairs, the cross-entropy of the priority mean
    against the rank keys less its floor, and pulls on the concentration and bias outputs;
    padded nodes and pairs are masked out of every mean."""
    logit = mean.narrow(-1, 0, 1).squeeze(-1)
    diff = logit.gather(-1, first) - logit.gather(-1, second)
    pairs = pair_mask.sum(-1)
    rank = (_softplus(-diff) * pair_mask).sum(-1) / where(pairs > 0.0, pairs, 1.0)
    nodes = mask.sum(-1)
    calib = ((_softplus(logit) - keys * logit) * mask).sum(-1) / nodes + floor
    conc = mean.narrow(-1, 1, 1).squeeze(-1) - log_kappa
    bias = mean.narrow(-1, 6, 1).squeeze(-1)
    rest = ((conc * conc + bias * bias) * mask).sum(-1) / nodes
    return (rank + calib + rest * 0.1).mean()


def sample_logp(
    mean: RecurrentTensor,
    log_std: RecurrentTensor,
    mask: RecurrentTensor,
    cols: RecurrentTensor,
    action: RecurrentTensor,
) -> RecurrentTensor:
    """Each problem's Gaussian log-density of ``action``: a mean over its real nodes and used
    outputs (a per-gene geometric mean, finite on graphs of any size)."""
    d = (action - mean) / log_std.exp()
    lp = d * d * -0.5 - log_std - 0.5 * math.log(2 * math.pi)
    w = mask.unsqueeze(-1) * cols.unsqueeze(1)
    return (lp * w).sum((1, 2)) / w.sum((1, 2))


def normalised(advantage: RecurrentTensor) -> RecurrentTensor:
    """Advantages over their spread in the batch (not centred: the baseline centres them)."""
    adv = advantage.detach()
    return adv / (adv.std(unbiased=False) + 1e-4)


def policy_loss(
    mean: RecurrentTensor,
    log_std: RecurrentTensor,
    mask: RecurrentTensor,
    cols: RecurrentTensor,
    action: RecurrentTensor,
    advantage: RecurrentTensor,
    entropy: float,
) -> RecurrentTensor:
    """The policy gradient's loss: the log-density of ``action`` weighted by the normalised
    advantage, minus an entropy bonus."""
    logp = sample_logp(mean, log_std, mask, cols, action)
    return -(logp * normalised(advantage)).mean() - log_std.sum() * entropy


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
