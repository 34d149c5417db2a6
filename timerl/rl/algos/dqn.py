"""DQN with experience replay and a target network, as one recurrent-tensor program.

Dims: ``i`` iteration, ``t`` rollout step, ``u`` gradient update within an iteration. Each
iteration acts epsilon-greedily for ``num_steps`` steps of ``num_envs`` envs with the current
Q-network, then takes ``updates_per_iteration`` Adam steps, each on a minibatch drawn uniformly
from the transitions of the last ``buffer_size`` env steps (:class:`~timerl.rl.algos.replay.Replay`).
The target network is a second set of parameters over ``i`` copied from the online one every
``target_update_every`` iterations (:class:`~timerl.api.optim.Polyak` with ``tau=1``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from timerl.api.context import Context
from timerl.api.functional import rand
from timerl.api.nn import MLP, Module
from timerl.api.optim import Adam, Polyak
from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor, full, maximum, where
from timerl.errors import EnvError, ProgramError
from timerl.rl.algos.policy_gradient import (
    FRACTION,
    STEP_FRACTION,
    AlgoConfig,
    AlgoProgram,
    Rule,
    at_least,
    lr_schedule,
)
from timerl.rl.algos.replay import Replay
from timerl.rl.envs.program import Env, make_env


@dataclass
class DQNConfig(AlgoConfig):
    RULES: ClassVar[dict[str, Rule]] = {
        **AlgoConfig.RULES,
        "buffer_size": at_least(1),
        "batch_size": at_least(1),
        "updates_per_iteration": at_least(1),
        "target_update_every": at_least(1),
        "tau": STEP_FRACTION,
        "start_epsilon": FRACTION,
        "end_epsilon": FRACTION,
        "exploration_fraction": STEP_FRACTION,
        "learning_starts": at_least(0),
    }

    num_envs: int = 8
    num_steps: int = 16
    lr: float = 1e-3
    anneal_lr: bool = True  # a decaying step size keeps the learnt greedy policy from drifting
    hidden: tuple[int, ...] = (128, 128)
    max_grad_norm: float = 10.0
    buffer_size: int = 50_000
    batch_size: int = 128
    updates_per_iteration: int = 8
    target_update_every: int = 4  # iterations
    tau: float = 1.0
    start_epsilon: float = 1.0
    end_epsilon: float = 0.01
    exploration_fraction: float = 0.1
    learning_starts: int = 5_000  # env steps before the first update


class QNetwork(Module):
    """One Q-value per discrete action from flattened observations."""

    def __init__(
        self, env: Env, hidden: tuple[int, ...], domain: tuple[Dim, ...], seed: int
    ) -> None:
        if not env.discrete:
            raise EnvError(
                f"{env.vec.env_id}: DQN needs discrete actions; use sac for continuous ones"
            )
        self.obs_dim = int(np.prod(env.obs_shape))
        self.q = MLP(
            [self.obs_dim, *hidden, int(env.num_actions or 0)],
            activation="relu",
            domain=domain,
            seed=seed,
            name="q",
            role="q",
        )

    def forward(self, obs: RecurrentTensor) -> RecurrentTensor:
        return self.q(obs.reshape(obs.view.shape[0], self.obs_dim))


def dqn_loss(
    q: Module,
    target: Module,
    obs: RecurrentTensor,
    action: RecurrentTensor,
    reward: RecurrentTensor,
    next_obs: RecurrentTensor,
    terminated: RecurrentTensor,
    gamma: float,
) -> dict[str, RecurrentTensor]:
    """Mean squared TD error against ``r + gamma * max_a' Q_target(s', a')`` (no bootstrap
    past a terminal state; truncated episodes do bootstrap from their true last observation)."""
    q_all = q(obs)
    q_sa = q_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    next_q = target(next_obs).amax(-1).detach()
    y = reward + (1.0 - terminated.float()) * gamma * next_q
    td = q_sa - y
    return {"loss": (td * td).mean(), "q_mean": q_sa.mean()}


def epsilon(cfg: DQNConfig, i: Dim) -> RecurrentTensor:
    """Linear decay from ``start_epsilon`` to ``end_epsilon`` over the first
    ``exploration_fraction`` of the run, then constant."""
    frac = full((), i) / (full((), i.bound) * cfg.exploration_fraction)
    value = cfg.start_epsilon + (cfg.end_epsilon - cfg.start_epsilon) * frac
    return maximum(value, full((), cfg.end_epsilon))


def dqn(config: DQNConfig | None = None, **overrides: Any) -> AlgoProgram:
    """DQN (Mnih et al. 2015): epsilon-greedy acting, uniform replay, a hard-copied target."""
    cfg = config or DQNConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    for name in ("batch_size", "updates_per_iteration", "target_update_every", "buffer_size"):
        if getattr(cfg, name) < 1:
            raise ProgramError(f"dqn: {name} must be at least 1, got {getattr(cfg, name)}")
    if not 0.0 < cfg.exploration_fraction <= 1.0:
        raise ProgramError(
            f"dqn: exploration_fraction must lie in (0, 1], got {cfg.exploration_fraction}"
        )
    env = make_env(cfg.env_id, cfg.num_envs, cfg.seed, cfg.env_backend, **cfg.env_kwargs)
    per_iter = cfg.num_envs * cfg.num_steps
    T, B = cfg.num_steps, cfg.num_envs
    ctx = Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    with ctx:
        qnet = QNetwork(env, cfg.hidden, (i,), seed=cfg.seed * 10 + 1)
        target = qnet.copy("target")
        # -- acting: epsilon-greedy over the iteration's Q-network ---------------------------
        obs = RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (i, t), name="obs")
        obs[0, 0] = env.reset()
        greedy = qnet.at(i)(obs).argmax(-1)
        eps = epsilon(cfg, i)
        explore = rand((B,), like=obs) < eps
        num_actions = int(env.num_actions or 0)
        uniform = _index_below(rand((B,), like=obs) * float(num_actions), num_actions)
        action = where(explore, uniform, greedy).named("action")
        next_obs, reward, done, terminated, final_obs = env.step(action, full=True)
        obs[i, t + 1] = next_obs
        obs[i + 1, 0] = next_obs[i, T - 1]
        # -- learning: minibatches from the replay window -------------------------------------
        window = max(1, math.ceil(cfg.buffer_size / per_iter))
        replay = Replay(i, t, u, T, B, window, cfg.batch_size)
        learner = qnet.unroll(u)
        parts = dqn_loss(
            learner,
            target.at(i),
            replay.sample(obs),
            replay.sample(action),
            replay.sample(reward),
            replay.sample(final_obs),
            replay.sample(terminated),
            cfg.gamma,
        )
        # No update before `learning_starts` env steps: a zero loss leaves Adam's moments at
        # zero, so the parameters do not move.
        start = math.ceil(cfg.learning_starts / per_iter)
        started = (full((), i) >= float(start)).float()
        loss = parts["loss"] * started
        params = learner.parameters()
        loss.backward(inputs=params)
        Adam(params, lr=lr_schedule(cfg), max_grad_norm=cfg.max_grad_norm).step()
        Polyak(
            target.parameters(), qnet.parameters(), tau=cfg.tau, every=cfg.target_update_every
        ).step()
        last = u.bound - 1
        metrics = {
            "loss": parts["loss"][i, last],
            "q_mean": parts["q_mean"][i, last],
            "epsilon": eps,
            "reward_mean": reward[i, 0:T].mean(),
        }
    bounds = {"T": T, "U": cfg.updates_per_iteration}
    return AlgoProgram("dqn", ctx, env, cfg, metrics, bounds, qnet.parameters())


def _index_below(x: RecurrentTensor, n: int) -> RecurrentTensor:
    """``floor(x)`` as an index below ``n`` (guards float rounding of ``rand() * n``)."""
    return x.floor().clamp(max=float(n - 1)).long()
