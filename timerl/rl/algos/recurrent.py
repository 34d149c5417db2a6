"""Recurrent (LSTM) policies for the on-policy algorithms, written as the recurrence they are.

In the rollout the state is a recurrent tensor over ``t``: ``hc[i, t + 1] = cell(x[i, t],
hc[i, t])``, zeroed where an episode ended (``done[i, t]``: ``obs[i, t + 1]`` starts a new
one), and carried into the next iteration (``hc[i + 1, 0] = hc[i, T]``). The update
recomputes the states over each rollout segment from the segment's stored first state, so the
loss is differentiated through the whole segment (backpropagation through time), and its
minibatches are whole envs (every step of an env in one minibatch), as CleanRL's
``ppo_atari_lstm`` and SB3-contrib's RecurrentPPO do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from timerl.api.context import Context, from_numpy
from timerl.api.distributions import Categorical, Normal
from timerl.api.nn import Linear, LSTMCell, Module
from timerl.api.optim import Adam
from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor, cat
from timerl.errors import EnvError, ProgramError
from timerl.rl.algos.returns import gae
from timerl.rl.algos.shared import AlgoProgram, a2c_loss, lr_schedule, ppo_loss, rand_perm
from timerl.rl.envs.program import make_env


class LSTMPolicy(Module):
    """Two recurrent networks, encoder (linear, tanh) -> LSTM cell, one under the actor's head
    and one under the critic's, as SB3-contrib's RecurrentPPO builds by default.

    A shared trunk lets the value loss, whose targets are unnormalised returns (tens to
    hundreds on CartPole), drive the features: they saturate and the actor's head sees a
    constant (the policy stayed uniform on CartPoleNoVel-v1). CleanRL's shared LSTM learns on
    Atari, whose clipped rewards keep the returns small.

    ``step(obs, hc)`` is one step of the recurrence over the packed state ``[h_actor,
    h_critic, c_actor, c_critic]``; its features are ``[h_actor, h_critic]``, which the
    heads (``dist``, ``value``, ...) take, so
    :func:`timerl.rl.algos.policy_gradient.ppo_loss` runs on them unchanged."""

    def __init__(self, env: Any, size: int, domain: tuple[Dim, ...], seed: int) -> None:
        if not env.discrete:
            raise EnvError(f"{env.vec.env_id}: the LSTM policy supports discrete actions only")
        self.obs_dim = int(np.prod(env.obs_shape))
        self.obs_ndim = len(env.obs_shape)
        self.size = size
        self.discrete = True
        base = seed * 1000
        self.encoder = Linear(
            self.obs_dim, size, domain=domain, seed=base, name="encoder", role="actor"
        )
        self.cell = LSTMCell(size, size, domain=domain, seed=base + 1, name="lstm")
        n = int(env.num_actions or 0)
        self.actor = Linear(
            size, n, gain=0.01, domain=domain, seed=base + 2, name="actor", role="actor"
        )
        self.critic_encoder = Linear(
            self.obs_dim, size, domain=domain, seed=base + 4, name="critic_encoder", role="critic"
        )
        self.critic_cell = LSTMCell(size, size, domain=domain, seed=base + 5, name="critic_lstm")
        self.critic = Linear(
            size, 1, gain=1.0, domain=domain, seed=base + 3, name="critic", role="critic"
        )

    @property
    def feature_size(self) -> int:
        """Width of the features the heads read: both networks' ``h``."""
        return 2 * self.size

    def zero_state(self, batch: int) -> RecurrentTensor:
        return from_numpy(np.zeros((batch, 4 * self.size), np.float32))

    def step(self, obs: RecurrentTensor, hc: RecurrentTensor) -> RecurrentTensor:
        n = self.size
        x = obs.float().reshape(obs.view.shape[0], self.obs_dim)
        h_a, c_a = self.cell(self.encoder(x).tanh(), (hc.narrow(-1, 0, n), hc.narrow(-1, 2 * n, n)))
        h_c, c_c = self.critic_cell(
            self.critic_encoder(x).tanh(), (hc.narrow(-1, n, n), hc.narrow(-1, 3 * n, n))
        )
        return cat([h_a, h_c, c_a, c_c], -1)

    def acting(self) -> list[dict[str, Any]]:
        """The actor's own path (encoder, tanh, its LSTM, head): the critic's LSTM does not
        act, so evaluation and export carry the actor's state only."""
        flat = [{"op": "flatten", "ndim": self.obs_ndim}, {"op": "float", "scale": 1.0}]
        body = [*self.encoder.describe(), {"op": "tanh"}, *self.cell.describe()]
        return [*flat, *body, *self.actor.describe()]

    def features(self, hc: RecurrentTensor) -> RecurrentTensor:
        return hc.narrow(-1, 0, 2 * self.size)

    def dist(self, h: RecurrentTensor) -> Categorical | Normal:
        return Categorical(self.actor(h.narrow(-1, 0, self.size)))

    def value(self, h: RecurrentTensor) -> RecurrentTensor:
        return self.critic(h.narrow(-1, self.size, self.size)).squeeze(-1)

    def log_prob(self, dist: Categorical | Normal, action: RecurrentTensor) -> RecurrentTensor:
        return dist.log_prob(action)

    def entropy(self, dist: Categorical | Normal) -> RecurrentTensor:
        return dist.entropy()


def _keep(done: RecurrentTensor) -> RecurrentTensor:
    return (1.0 - done.float()).unsqueeze(-1)


def recurrent_rollout(env: Any, policy: LSTMPolicy, i: Dim, t: Dim) -> dict[str, Any]:
    """Act for T steps per iteration with the state carried over ``t`` and across ``i``."""
    T = t.bound
    obs = RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (i, t), name="obs")
    obs[0, 0] = env.reset()
    hc = RecurrentTensor.placeholder((env.num_envs, 4 * policy.size), "float32", (i, t))
    hc[0, 0] = policy.zero_state(env.num_envs)
    pi = policy.at(i)
    out = pi.step(obs, hc)
    h = pi.features(out)
    dist = pi.dist(h)
    action = dist.sample().named("action")
    logp = pi.log_prob(dist, action).named("logp")
    value = pi.value(h).named("value")
    next_obs, reward, done = env.step(action)
    carried = out * _keep(done)
    obs[i, t + 1] = next_obs
    obs[i + 1, 0] = next_obs[i, T - 1]
    hc[i, t + 1] = carried
    hc[i + 1, 0] = carried[i, T - 1]
    last = pi.step(next_obs[i, T - 1], carried[i, T - 1])
    last_value = pi.value(pi.features(last)).named("last_value")
    return {
        "obs": obs,
        "policy_obs": obs,
        "obs_stats": None,
        "hc": hc,
        "action": action,
        "logp": logp,
        "value": value,
        "reward": reward,
        "done": done,
        "last_value": last_value,
    }


def segment_features(
    step: Callable[[RecurrentTensor, RecurrentTensor], RecurrentTensor],
    outer: tuple[Dim, ...],
    first: RecurrentTensor,
    obs_at: RecurrentTensor,
    done_at: RecurrentTensor,
    s: Dim,
    size: int,
) -> RecurrentTensor:
    """The features ``h`` at every step of a segment, recomputed from its first state:
    ``g[s + 1] = step(obs[s], g[s]) * (1 - done[s])``, ``g[0] = first``. ``obs_at`` and
    ``done_at`` are read at ``s``; ``outer``: the dims ``first`` runs over; the result is the stack over the segment ``(S, B, size)``,
    differentiable through every step."""
    g = RecurrentTensor.placeholder(
        tuple(first.view.shape), "float32", (*outer, s), name="segment_hc"
    )
    g[(*outer, 0)] = first
    out = step(obs_at, g)
    g[(*outer, s + 1)] = out * _keep(done_at)
    return out[(*outer, slice(0, s.bound))].narrow(-1, 0, size)


def check_recurrent_batch(num_envs: int, minibatches: int) -> int:
    """Envs per minibatch: recurrent minibatches hold whole envs."""
    if num_envs % minibatches:
        raise ProgramError(
            f"minibatches={minibatches} must divide num_envs={num_envs}: a recurrent policy's "
            "minibatches are whole envs"
        )
    return num_envs // minibatches


def recurrent_ppo(cfg: Any) -> AlgoProgram:
    """PPO with an :class:`LSTMPolicy`: rollout as :func:`recurrent_rollout`, then ``epochs x
    minibatches`` updates, each over whole envs with the states recomputed over the segment."""

    def loss(learner: Any, h: RecurrentTensor, b: dict[str, Any], ent_coef: float) -> Any:
        return ppo_loss(
            learner,
            h,
            b["action"],
            b["logp"],
            b["adv"],
            b["ret"],
            clip=cfg.clip,
            vf_coef=cfg.vf_coef,
            ent_coef=ent_coef,
            norm_adv=cfg.norm_adv,
        )

    return _recurrent_program("ppo", cfg, cfg.epochs, cfg.minibatches, loss)


def recurrent_a2c(cfg: Any) -> AlgoProgram:
    """A2C with an :class:`LSTMPolicy`: one full-batch update per rollout, differentiated
    through the whole segment."""

    def loss(learner: Any, h: RecurrentTensor, b: dict[str, Any], ent_coef: float) -> Any:
        return a2c_loss(
            learner,
            h,
            b["action"],
            b["adv"],
            b["ret"],
            vf_coef=cfg.vf_coef,
            ent_coef=ent_coef,
            norm_adv=cfg.norm_adv,
        )

    return _recurrent_program("a2c", cfg, 1, 1, loss)


def _recurrent_program(
    algo: str, cfg: Any, epochs: int, minibatches: int, loss: Callable[..., Any]
) -> AlgoProgram:
    """The recurrent rollout, GAE, and ``epochs x minibatches`` Adam steps on ``loss``, each
    over whole envs with the states recomputed over the segment from its stored first state.
    ``loss(learner, features, batch, ent_coef)``: the minibatch's action, logp, adv and ret
    in ``batch``, aligned with the recomputed features."""

    if getattr(cfg, "norm_obs", False) or getattr(cfg, "norm_reward", False):
        raise ProgramError(
            f"{algo}: the LSTM policy does not normalise observations or rewards yet"
        )
    if cfg.env_backend == "jax":
        raise ProgramError(f'{algo}: the LSTM policy steps host envs, not env backend "jax"')
    per_mb = check_recurrent_batch(cfg.num_envs, minibatches)
    env = make_env(cfg.env_id, cfg.num_envs, cfg.seed, cfg.env_backend, **cfg.env_kwargs)
    ctx = Context(dims=("i", "t", "u", "s"))
    i, t, u, s = ctx.dims
    T = cfg.num_steps
    size = cfg.hidden[0] if cfg.hidden else 64
    with ctx:
        policy = LSTMPolicy(env, size, (i,), cfg.seed * 10 + 1)
        ro = recurrent_rollout(env, policy, i, t)
        adv = gae(
            ro["reward"], ro["done"], ro["value"], cfg.gamma, cfg.gae_lambda, ro["last_value"]
        )
        ent_coef = cfg.ent_coef if cfg.ent_coef is not None else 0.01
        perm = rand_perm(cfg.num_envs, (i, u // minibatches))
        envs = perm.narrow(0, (u % minibatches) * per_mb, per_mb)
        learner = policy.unroll(u)
        first = ro["hc"][i, 0].detach().take(envs)
        obs_at = ro["obs"][i, s].detach().take(envs)
        done_at = ro["done"][i, s].detach().take(envs)
        width = policy.feature_size
        h = segment_features(learner.step, (i, u), first, obs_at, done_at, s, width)
        n = T * per_mb
        h = h.reshape(n, width)

        def seg(x: RecurrentTensor) -> RecurrentTensor:
            data = x[i, 0:T].detach().take(envs, 1)
            return data.reshape(n, *data.view.shape[2:])

        taken = {"action": ro["action"], "logp": ro["logp"], "adv": adv, "ret": adv + ro["value"]}
        parts = loss(learner, h, {k: seg(x) for k, x in taken.items()}, ent_coef)
        params = learner.parameters()
        parts["loss"].backward(inputs=params)
        Adam(params, lr=lr_schedule(cfg), eps=1e-5, max_grad_norm=cfg.max_grad_norm).step()
        last = u.bound - 1
        metrics = {name: value[i, last] for name, value in parts.items()}
        metrics["reward_mean"] = ro["reward"][i, 0:T].mean()
    bounds = {"T": T, "U": epochs * minibatches, "S": T}
    params = policy.parameters()
    return AlgoProgram(algo, ctx, env, cfg, metrics, bounds, params, None, ro, policy.acting())
