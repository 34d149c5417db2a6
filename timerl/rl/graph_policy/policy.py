"""graphopt's graph policy trained by a timerl program: graphs are the environment, a BRKGA
search steered by the policy's sampled proposal is its step.

The program (``graph_policy``) is the policy-gradient loop of ``timerl.graphopt.train`` with
its ``search`` reward, written as recurrent tensors over the iteration dim ``i``:

    x, edges, mask, cols, pick = problems.observe(i)    # a batch of problems, padded
    out  = net(x, edges, mask)                           # (B, N, 7): the mean action
    z    = out + exp(log_std) * noise                   # a sampled action
    r    = problems.step(z, i)                          # steered vs uniform BRKGA, relative
    base[i + 1] = base[i] + pick.T @ (rate * (r - pick @ base[i]))   # per-problem baseline
    loss = -mean(logp(z) * normalise(r - pick @ base[i])) - entropy * sum(log_std)
    w[i + 1] = Adam(w[i], grad loss)

Graphs have different sizes and timerl's points have static shapes, so every graph of a
batch is padded to the largest training graph (``problems.py``): padded nodes have zero
features, no edges and a zero mask, so the real nodes' values are exactly those of the
unpadded network. Message passing is a ``take`` of each edge's source row and an
``index_add`` (scatter-add) at its destination, weighted so the sums are means; dense
``N x N`` matrices per graph and batched matmuls took 2.8x the time of an imitation update
at 1,200 nodes (measured).
The per-problem baseline is a recurrence over ``i`` (a vector over all training problems,
updated through the batch's one-hot ``pick``); duplicates within a batch add their updates.
Each update also scores the batches of the last ``replay`` iterations again, read at
``max(i - k, 0)``, weighted by their clipped importance ratios.

The imitation warm start is the same network under ``graphopt.imitate``'s loss (``phase``
"imitate"). The decode reward (``phase`` "decode") draws ``samples`` key vectors per problem
from the network's own Beta proposals, has the environment decode each into a schedule and
score it, and follows the gradient of the keys' Beta log-density weighted by each sample's
reward against its problem's other samples, plus the Beta's entropy. The parameters have
the weights file's names, so ``export_weights`` writes what ``timerl graphopt optimize
--weights`` reads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from timerl.api.context import Context, from_numpy
from timerl.api.distributions import Beta
from timerl.api.functional import max as max_
from timerl.api.functional import randn
from timerl.api.nn import Module
from timerl.api.nn import parameter as _param
from timerl.api.optim import Adam
from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor, cat, full, minimum, where
from timerl.errors import GraphError
from timerl.graphopt.imitate import log_concentration
from timerl.graphopt.policy import (
    BASE_KAPPA,
    LOG_KAPPA_RANGE,
    PolicyWeights,
    key_columns,
    trained_objectives,
)
from timerl.graphopt.train import LOG_STD_RANGE
from timerl.rl.algos.policy_gradient import AlgoProgram
from timerl.rl.graph_policy.problems import GraphPolicyConfig, GraphProblems

BASELINE_RATE = 0.1  # the per-problem baseline's step (graphopt.train's running mean)
# every key group's mean logit column (priorities, device keys, swap keys): a padded batch
# carries all three, and the losses mask out the groups a problem does not use
_KEY_COLUMNS = key_columns(3)


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
        self, x: RecurrentTensor, edges: tuple[RecurrentTensor, ...], mask: RecurrentTensor
    ) -> RecurrentTensor:
        """The mean action of a padded batch ``x`` (B, N, features); ``edges`` the batch's
        ``(src, dst, w_pred, w_succ)``, node indices counted across the batch."""
        p = self.params
        b, n = x.shape[0], x.shape[1]
        src, dst, w_pred, w_succ = edges
        w_pred, w_succ = w_pred.unsqueeze(-1), w_succ.unsqueeze(-1)
        m = mask.unsqueeze(-1)
        h = (x @ p["in.w"] + p["in.b"]).relu() * m
        width = p["in.b"].shape[0]
        for r in range(self.rounds):
            rows = h.reshape(b * n, width)
            # a message per edge, summed at its end: the mean over predecessors (successors)
            pred = (rows.take(src) * w_pred).index_add(dst, b * n).reshape(b, n, width)
            succ = (rows.take(dst) * w_succ).index_add(src, b * n).reshape(b, n, width)
            msg = h @ p[f"r{r}.self"] + pred @ p[f"r{r}.pred"]
            msg = msg + succ @ p[f"r{r}.succ"] + p[f"r{r}.b"]
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
        elif cfg.phase == "decode":
            loss, metrics = _decode(problems, pi, iteration, cfg)
        else:
            loss, metrics = _search(problems, pi, iteration, cfg, i)
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
    pi: GraphNet,
    iteration: RecurrentTensor,
    cfg: GraphPolicyConfig,
    i: Dim,
) -> tuple[RecurrentTensor, dict[str, RecurrentTensor]]:
    x, src, dst, w_pred, w_succ, mask, cols, pick = problems.observe(iteration)
    edges = (src, dst, w_pred, w_succ)
    mean = pi.mean_action(x, edges, mask)
    log_std = pi.log_std()
    std = log_std.exp()
    z = (mean.detach() + std.detach() * randn(mean.shape, like=mean)).named("action")
    reward = problems.step(z, iteration).named("reward")
    logp = sample_logp(mean, log_std, mask, cols, z)
    adv = normalised(reward - running_baseline(reward, pick, i))
    loss = -(logp * adv).mean()
    for back in range(1, cfg.replay + 1):
        # the batch of ``back`` iterations ago (its graphs, its action, the log-density it
        # was drawn with and its advantage), scored by this iteration's network; before
        # iteration ``back`` there is none: the first batch is read and the term is 0
        at = max_(i - back, 0)
        ox, omask, ocols, oz, ologp, oadv = (v[at] for v in (x, mask, cols, z, logp, adv))
        oedges = tuple(v[at] for v in edges)
        lp_now = sample_logp(pi.mean_action(ox, oedges, omask), log_std, omask, ocols, oz)
        ratio = (lp_now - ologp.detach()).clamp(-20.0, 20.0).exp()
        clipped = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)
        surrogate = minimum(ratio * oadv, clipped * oadv).mean()
        loss = loss - where(iteration >= back, surrogate, 0.0)
    loss = loss / (1 + cfg.replay) - log_std.sum() * cfg.entropy
    metrics = {
        "loss": loss,
        "reward": reward.mean(),
        "action_std": std.mean(),
        "advantage": adv.mean(),
    }
    return loss, metrics


def _decode(
    problems: GraphProblems, pi: GraphNet, iteration: RecurrentTensor, cfg: GraphPolicyConfig
) -> tuple[RecurrentTensor, dict[str, RecurrentTensor]]:
    x, src, dst, w_pred, w_succ, mask, cols, _ = problems.observe(iteration)
    mean = pi.mean_action(x, (src, dst, w_pred, w_succ), mask)
    a, b = beta_params(mean)
    batch, nodes, groups = a.shape
    drawn = (batch, cfg.samples, nodes, groups)
    keys = Beta(a.detach().unsqueeze(1).expand(drawn), b.detach().unsqueeze(1).expand(drawn))
    keys = keys.sample().clamp(1e-6, 1.0 - 1e-6).named("keys")
    reward = problems.decode(keys, iteration).named("reward")
    loss = decode_loss(a, b, mask, cols, keys, reward, cfg.entropy)
    return loss, {"loss": loss, "reward": reward.mean()}


def beta_params(mean: RecurrentTensor) -> tuple[RecurrentTensor, RecurrentTensor]:
    """Each key group's Beta(a, b) per node, (batch, nodes, 3): ``graphopt.policy.proposal``
    on the padded batch (a group a problem does not use is masked out by the losses)."""
    logits = cat([mean.narrow(-1, c, 1) for c in _KEY_COLUMNS], dim=-1)
    log_kappa = cat([mean.narrow(-1, c + 1, 1) for c in _KEY_COLUMNS], dim=-1)
    m = logits.sigmoid()
    kappa = log_kappa.clamp(*LOG_KAPPA_RANGE).exp() * BASE_KAPPA
    return (m * kappa).clamp(min=1e-3), ((1.0 - m) * kappa).clamp(min=1e-3)


def decode_loss(
    a: RecurrentTensor,
    b: RecurrentTensor,
    mask: RecurrentTensor,
    cols: RecurrentTensor,
    keys: RecurrentTensor,
    reward: RecurrentTensor,
    entropy: float,
) -> RecurrentTensor:
    """``graphopt.train.decode_loss`` over a padded batch: per problem, the mean over its
    samples of the keys' log-density (a mean over the problem's genes) times the sample's
    reward less its problem's mean, over their spread; plus ``entropy`` times the Beta's mean
    entropy over the genes."""
    r = reward.detach()
    centred = r - r.mean(1, keepdim=True)
    adv = centred / (r.std(1, keepdim=True, unbiased=False) + 1e-4)
    used = cat([cols.narrow(-1, c, 1) for c in _KEY_COLUMNS], dim=-1)  # (batch, 3)
    genes = mask.unsqueeze(-1) * used.unsqueeze(1)  # (batch, nodes, 3)
    per_gene = Beta(a.unsqueeze(1), b.unsqueeze(1)).log_prob(keys)
    count = genes.sum((1, 2))
    logp = (per_gene * genes.unsqueeze(1)).sum((2, 3)) / count.unsqueeze(-1)
    spread = (Beta(a, b).entropy() * genes).sum((1, 2)) / count
    return -((adv * logp).mean(1) + spread * entropy).mean()


def running_baseline(reward: RecurrentTensor, pick: RecurrentTensor, i: Dim) -> RecurrentTensor:
    """Each problem's running mean reward before this iteration, per problem of the batch:
    a vector over all problems carried over ``i`` and updated through the batch's one-hot
    ``pick`` (a problem's first reward sets it, later ones move it by ``BASELINE_RATE``)."""
    k = pick.shape[-1]
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
    return before


def _imitation(
    problems: GraphProblems, pi: GraphNet, iteration: RecurrentTensor, cfg: GraphPolicyConfig
) -> tuple[RecurrentTensor, dict[str, RecurrentTensor]]:
    x, *edges, mask, first, second, pair_mask, keys, floor = problems.observe_targets(iteration)
    mean = pi.mean_action(x, tuple(edges), mask)
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
        {
            "trained": True,
            "trainer": "timerl program",
            "objectives": list(trained_objectives(cfg.phase != "imitate", cfg.runtime_share)),
        },
    )
    expected = PolicyWeights.random(cfg.hidden[0], len(cfg.hidden)).params
    missing = sorted(set(expected) - set(weights.params))
    if missing:
        raise GraphError(f"graph-policy: the checkpoint has no parameter {missing[0]!r}")
    weights.save(out)
    return out
