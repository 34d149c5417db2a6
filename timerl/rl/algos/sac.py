"""SAC (soft actor-critic) for continuous actions, as one recurrent-tensor program.

Dims: ``i`` iteration, ``t`` rollout step, ``u`` gradient update within an iteration. Each
iteration acts for ``num_steps`` steps of ``num_envs`` envs with the current tanh-squashed
Gaussian policy (uniform random actions before ``learning_starts``), then takes
``updates_per_iteration`` updates, each on a minibatch from the replay window
(:class:`~timerl.rl.algos.replay.Replay`): twin Q-functions regressed on the soft Bellman target of
slowly moving target copies (:class:`~timerl.api.optim.Polyak`), the policy on
``alpha * log pi - min Q``, and the temperature ``alpha`` toward a target entropy of
``-action_dim``. All parameters, targets included, are recurrences over ``(i, u)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from timerl.api.context import Context
from timerl.api.distributions import TanhNormal
from timerl.api.functional import rand
from timerl.api.nn import MLP, Module, parameter
from timerl.api.optim import Adam, Polyak
from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor, cat, full, lift, minimum, where
from timerl.errors import EnvError, ProgramError
from timerl.rl.algos.policy_gradient import (
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    STEP_FRACTION,
    AlgoConfig,
    AlgoProgram,
    Rule,
    at_least,
)
from timerl.rl.algos.replay import Replay
from timerl.rl.envs.program import Env, make_env

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class SACConfig(AlgoConfig):
    RULES: ClassVar[dict[str, Rule]] = {
        **AlgoConfig.RULES,
        "policy_lr": NON_NEGATIVE,
        "buffer_size": at_least(1),
        "batch_size": at_least(1),
        "updates_per_iteration": at_least(1),
        "tau": STEP_FRACTION,
        "init_alpha": POSITIVE,
        "target_entropy": FINITE.optional(),
        "learning_starts": at_least(0),
    }

    env_id: str = "Pendulum-v1"
    num_envs: int = 4
    num_steps: int = 8
    lr: float = 1e-3  # Q-functions and temperature
    policy_lr: float = 3e-4
    anneal_lr: bool = False
    hidden: tuple[int, ...] = (128, 128)
    max_grad_norm: float | None = None  # type: ignore[assignment]
    buffer_size: int = 100_000
    batch_size: int = 128
    # one update per 4 env steps: the update's cost is mostly per-op dispatch on a CPU
    updates_per_iteration: int = 8
    tau: float = 0.005
    init_alpha: float = 1.0
    target_entropy: float | None = None  # -action_dim
    learning_starts: int = 1_000  # env steps of uniform random actions


class Actor(Module):
    """A tanh-squashed Gaussian policy with a state-dependent standard deviation."""

    def __init__(
        self, env: Env, hidden: tuple[int, ...], domain: tuple[Dim, ...], seed: int
    ) -> None:
        self.obs_dim = int(np.prod(env.obs_shape))
        self.act_dim = env.action_shape[0]
        self.low = np.asarray(env.vec.action_low, dtype=np.float32)
        self.high = np.asarray(env.vec.action_high, dtype=np.float32)
        self.net = MLP(
            [self.obs_dim, *hidden, 2 * self.act_dim],
            activation="relu",
            out_gain=0.01,
            domain=domain,
            seed=seed,
            name="actor",
            role="actor",
        )

    def dist(self, obs: RecurrentTensor) -> TanhNormal:
        out = self.net(obs.reshape(obs.view.shape[0], self.obs_dim))
        mean = out.narrow(-1, 0, self.act_dim)
        raw = out.narrow(-1, self.act_dim, self.act_dim).tanh()
        log_std = LOG_STD_MIN + (raw + 1.0) * (0.5 * (LOG_STD_MAX - LOG_STD_MIN))
        return TanhNormal(mean, log_std.exp(), self.low, self.high)


class Critic(Module):
    """Q(s, a) from the flattened observation and the action, concatenated."""

    def __init__(
        self, env: Env, hidden: tuple[int, ...], domain: tuple[Dim, ...], seed: int, name: str
    ) -> None:
        self.obs_dim = int(np.prod(env.obs_shape))
        self.net = MLP(
            [self.obs_dim + env.action_shape[0], *hidden, 1],
            activation="relu",
            domain=domain,
            seed=seed,
            name=name,
            role="critic",
        )

    def q(self, obs: RecurrentTensor, action: RecurrentTensor) -> RecurrentTensor:
        flat = obs.reshape(obs.view.shape[0], self.obs_dim)
        return self.net(cat([flat, action], -1)).squeeze(-1)


class Temperature(Module):
    """SAC's entropy coefficient, learnt as its logarithm so it stays positive."""

    def __init__(self, init: float, domain: tuple[Dim, ...]) -> None:
        self.log_alpha = parameter(
            np.asarray(math.log(init), np.float32), domain, "log_alpha", role="temperature"
        )


def sac_losses(
    actor: Actor,
    q1: Critic,
    q2: Critic,
    target1: Critic,
    target2: Critic,
    log_alpha: RecurrentTensor,
    obs: RecurrentTensor,
    action: RecurrentTensor,
    reward: RecurrentTensor,
    next_obs: RecurrentTensor,
    terminated: RecurrentTensor,
    gamma: float,
    target_entropy: float,
    noise: tuple[RecurrentTensor, RecurrentTensor] | None = None,
) -> dict[str, RecurrentTensor]:
    """The three SAC objectives on one minibatch; each is wired so that summing them and
    differentiating w.r.t. all parameters gives every network only its own gradient.

    ``noise``: the standard normal draws for the next-state and the current-state actions
    (default: fresh ones from the program's random streams)."""
    next_noise, pi_noise = noise if noise is not None else (None, None)
    alpha = log_alpha.exp().detach()
    next_action, next_logp = actor.dist(next_obs).rsample_and_log_prob(next_noise)
    next_logp = next_logp.sum(-1)
    next_q = minimum(target1.q(next_obs, next_action), target2.q(next_obs, next_action))
    soft = next_q - alpha * next_logp
    y = (reward + (1.0 - terminated.float()) * gamma * soft).detach()
    e1, e2 = q1.q(obs, action) - y, q2.q(obs, action) - y
    q_loss = (e1 * e1).mean() + (e2 * e2).mean()
    pi_action, logp = actor.dist(obs).rsample_and_log_prob(pi_noise)
    logp = logp.sum(-1)
    # Q weights read detached: the actor's loss moves the actor only.
    d1, d2 = q1.detached(), q2.detached()
    assert isinstance(d1, Critic) and isinstance(d2, Critic)
    q_pi = minimum(d1.q(obs, pi_action), d2.q(obs, pi_action))
    actor_loss = (alpha * logp - q_pi).mean()
    alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
    return {
        "loss": q_loss + actor_loss + alpha_loss,
        "q_loss": q_loss,
        "actor_loss": actor_loss,
        "alpha_loss": alpha_loss,
        "entropy": -logp.mean(),
        "alpha": alpha,
    }


def sac(config: SACConfig | None = None, **overrides: Any) -> AlgoProgram:
    """SAC with twin Q-functions, Polyak targets and automatic temperature (Haarnoja et al.
    2018)."""
    cfg = config or SACConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    for name in ("batch_size", "updates_per_iteration", "buffer_size"):
        if getattr(cfg, name) < 1:
            raise ProgramError(f"sac: {name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.init_alpha <= 0:
        raise ProgramError(f"sac: init_alpha must be positive, got {cfg.init_alpha}")
    env = make_env(cfg.env_id, cfg.num_envs, cfg.seed, cfg.env_backend, **cfg.env_kwargs)
    if env.discrete or len(env.action_shape) != 1:
        env.close()
        raise EnvError(
            f"{cfg.env_id}: SAC needs a flat Box action space; use dqn or ppo for discrete actions"
        )
    if not (np.isfinite(env.vec.action_low).all() and np.isfinite(env.vec.action_high).all()):
        env.close()
        raise EnvError(f"{cfg.env_id}: SAC squashes actions into a box with finite bounds")
    act_dim = env.action_shape[0]
    target_entropy = cfg.target_entropy if cfg.target_entropy is not None else -float(act_dim)
    per_iter = cfg.num_envs * cfg.num_steps
    T, B = cfg.num_steps, cfg.num_envs
    ctx = Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    with ctx:
        seed = cfg.seed * 10 + 1
        actor = Actor(env, cfg.hidden, (i,), seed)
        q1 = Critic(env, cfg.hidden, (i,), seed + 1, "q1")
        q2 = Critic(env, cfg.hidden, (i,), seed + 2, "q2")
        target1, target2 = q1.copy("target"), q2.copy("target")
        temp = Temperature(cfg.init_alpha, (i,))
        # -- acting ------------------------------------------------------------------------
        obs = RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (i, t), name="obs")
        obs[0, 0] = env.reset()
        start = math.ceil(cfg.learning_starts / per_iter)
        started = full((), i) >= float(start)
        low, high = actor.low, actor.high
        uniform = rand((B, act_dim), like=obs) * lift(high - low) + lift(low)
        action = where(started, actor.at(i).dist(obs).sample(), uniform).named("action")
        next_obs, reward, done, terminated, final_obs = env.step(action, full=True)
        obs[i, t + 1] = next_obs
        obs[i + 1, 0] = next_obs[i, T - 1]
        # -- learning ----------------------------------------------------------------------
        window = max(1, math.ceil(cfg.buffer_size / per_iter))
        replay = Replay(i, t, u, T, B, window, cfg.batch_size)
        actor_u, q1_u, q2_u = actor.unroll(u), q1.unroll(u), q2.unroll(u)
        t1_u, t2_u, temp_u = target1.unroll(u), target2.unroll(u), temp.unroll(u)
        assert isinstance(actor_u, Actor) and isinstance(temp_u, Temperature)
        assert all(isinstance(m, Critic) for m in (q1_u, q2_u, t1_u, t2_u))
        parts = sac_losses(
            actor_u,
            q1_u,  # type: ignore[arg-type]
            q2_u,  # type: ignore[arg-type]
            t1_u,  # type: ignore[arg-type]
            t2_u,  # type: ignore[arg-type]
            temp_u.log_alpha,
            replay.sample(obs),
            replay.sample(action),
            replay.sample(reward),
            replay.sample(final_obs),
            replay.sample(terminated),
            cfg.gamma,
            target_entropy,
        )
        # Nothing is learnt before `learning_starts`: a zero loss leaves Adam's moments at 0.
        loss = parts["loss"] * started.float()
        q_params = q1_u.parameters() + q2_u.parameters()
        pi_params, alpha_params = actor_u.parameters(), temp_u.parameters()
        loss.backward(inputs=q_params + pi_params + alpha_params)
        Adam(q_params, lr=cfg.lr, max_grad_norm=cfg.max_grad_norm).step()
        Adam(pi_params, lr=cfg.policy_lr, max_grad_norm=cfg.max_grad_norm).step()
        Adam(alpha_params, lr=cfg.lr).step()
        Polyak(t1_u.parameters() + t2_u.parameters(), q_params, tau=cfg.tau).step()
        last = u.bound - 1
        metrics = {k: v[i, last] for k, v in parts.items() if k != "loss"}
        metrics["reward_mean"] = reward[i, 0:T].mean()
    bounds = {"T": T, "U": cfg.updates_per_iteration}
    params = actor.parameters() + q1.parameters() + q2.parameters() + temp.parameters()
    return AlgoProgram("sac", ctx, env, cfg, metrics, bounds, params)
