"""DRL algorithms written as ordinary recurrent-tensor programs (nothing special-cased).

Each builder returns an :class:`AlgoProgram`: the context, its environment, per-iteration
metric tensors over ``i`` and the bounds to compile with. Dims: ``i`` training iteration,
``t`` rollout step, and for PPO ``u`` one update (epoch x minibatch) within an iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np

from timerl.api.context import Context
from timerl.api.distributions import Categorical, Normal
from timerl.api.nn import MLP, Linear, MinAtarCNN, Module, NatureCNN, parameter, role_of
from timerl.api.optim import Adam
from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor
from timerl.errors import EnvError, ProgramError
from timerl.rl.algos.naming import config_ref
from timerl.rl.algos.normalize import CLIP, EPS, discounted_return_estimate, running_moments
from timerl.rl.algos.recurrent import recurrent_ppo
from timerl.rl.algos.returns import discounted_returns, gae
from timerl.rl.algos.shared import (
    AlgoProgram,
    lr_schedule,
    normalized_advantage,
    ppo_loss,
    rand_perm,
)
from timerl.rl.envs.jax_envs import gymnax_minatar
from timerl.rl.envs.program import Env, make_env
from timerl.rl.envs.pure import PureEnv
from timerl.rl.envs.vector import ATARI_KWARGS, envpool_atari


@dataclass(frozen=True)
class Rule:
    """What a hyper-parameter must be (``what`` says it in the error)."""

    test: Callable[[Any], bool]
    what: str

    def optional(self) -> Rule:
        return Rule(lambda v: v is None or self.test(v), f"{self.what} or None")


def _real(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


def at_least(low: int) -> Rule:
    """An integer of at least ``low`` (a count: envs, steps, epochs, a buffer's size)."""
    return Rule(
        lambda v: isinstance(v, Integral) and not isinstance(v, bool) and v >= low,
        f"an integer >= {low}",
    )


POSITIVE = Rule(lambda v: _real(v) and v > 0, "a positive number")
NON_NEGATIVE = Rule(lambda v: _real(v) and v >= 0, "a number >= 0")
FINITE = Rule(_real, "a finite number")
FRACTION = Rule(lambda v: _real(v) and 0 <= v <= 1, "a number in [0, 1]")
STEP_FRACTION = Rule(lambda v: _real(v) and 0 < v <= 1, "a number in (0, 1]")
WIDTHS = Rule(
    lambda v: isinstance(v, (tuple, list)) and all(at_least(1).test(n) for n in v),
    "a sequence of positive integers (hidden layer widths; empty for a linear policy)",
)


@dataclass
class AlgoConfig:
    # each setting's rule, checked when a config is made (a subclass adds its own), so a bad
    # value is refused by name before an env is made or a program compiled
    RULES: ClassVar[dict[str, Rule]] = {
        "num_envs": at_least(1),
        "num_steps": at_least(1),
        "lr": NON_NEGATIVE,
        "gamma": FRACTION,
        "hidden": WIDTHS,
        "max_grad_norm": POSITIVE.optional(),
        "seed": at_least(0),
        "env_id": Rule(lambda v: isinstance(v, str) and bool(v), "an environment id"),
        "env_kwargs": Rule(lambda v: isinstance(v, Mapping), "a mapping of keyword arguments"),
    }

    env_id: str = "CartPole-v1"
    num_envs: int = 8
    num_steps: int = 128
    lr: float = 2.5e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    hidden: tuple[int, ...] = (64, 64)
    max_grad_norm: float = 0.5
    seed: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_backend: str = "gymnasium"  # or "envpool", or "jax" (rl/envs/pure.py: ppo, reinforce, a2c)
    # the network: "auto" (an MLP; a CNN for image observations where supported), or one of
    # POLICIES; "lstm" only for the algorithms whose config sets RECURRENT
    policy: str = "auto"

    RECURRENT: ClassVar[bool] = False
    POLICIES: ClassVar[tuple[str, ...]] = ("auto", "mlp")

    def __post_init__(self) -> None:
        for name, rule in self.RULES.items():
            value = getattr(self, name)
            if not rule.test(value):
                algo = type(self).__name__.removesuffix("Config").lower()
                where = config_ref(name)  # its flag, or config['name'] from Python
                raise ProgramError(f"{algo}: {name} must be {rule.what}, got {value!r} ({where})")
        self.check_policy()

    def check_policy(self) -> None:
        """A policy kind this algorithm builds; for "lstm", the algorithms that build one."""
        algo = type(self).__name__.removesuffix("Config").lower()
        if self.policy == "lstm" and not self.RECURRENT:
            have = sorted(
                c.__name__.removesuffix("Config").lower()
                for c in _config_classes(AlgoConfig)
                if c.RECURRENT
            )
            raise ProgramError(
                f"{algo}: policy 'lstm' needs recurrent support, which {', '.join(have)} "
                f"have ({config_ref('policy')})"
            )
        known = {*self.POLICIES, *(("lstm",) if self.RECURRENT else ())}
        if self.policy not in known:
            raise ProgramError(
                f"{algo}: policy must be one of {sorted(known)}, got {self.policy!r} "
                f"({config_ref('policy')})"
            )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hidden"] = list(self.hidden)
        return out


def _config_classes(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_config_classes(sub))
    return out


@dataclass
class PPOConfig(AlgoConfig):
    RULES: ClassVar[dict[str, Rule]] = {
        **AlgoConfig.RULES,
        "gae_lambda": FRACTION,
        "epochs": at_least(1),
        "minibatches": at_least(1),
        "clip": POSITIVE,
        "vf_coef": NON_NEGATIVE,
        "ent_coef": NON_NEGATIVE.optional(),
        "log_std_init": FINITE,
    }

    gae_lambda: float = 0.95
    epochs: int = 4
    minibatches: int = 4
    clip: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float | None = None  # 0.01 for discrete actions, 0 for continuous
    norm_adv: bool = True
    # running-statistics normalisation of the policy's input and of the rewards it learns from
    # (timerl.rl.algos.normalize); on by default for the MuJoCo environments
    norm_obs: bool = False
    norm_reward: bool = False
    # initial log standard deviation of the Gaussian policy (continuous actions only)
    log_std_init: float = 0.0

    RECURRENT: ClassVar[bool] = True
    POLICIES: ClassVar[tuple[str, ...]] = ("auto", "mlp", "cnn")


@dataclass
class ReinforceConfig(AlgoConfig):
    RULES: ClassVar[dict[str, Rule]] = {
        **AlgoConfig.RULES,
        "vf_coef": NON_NEGATIVE,
        "ent_coef": NON_NEGATIVE.optional(),
    }

    baseline: bool = True
    vf_coef: float = 0.5
    ent_coef: float | None = None


# Per-environment starting points (what a user gets without flags), measured to learn:
# Pendulum needs a short horizon (gamma 0.9), longer rollouts and more epochs.
# HalfCheetah starts with a narrower Gaussian (std 0.61): from std 1 the policy spent most
# of a 1M-step run shrinking its noise (to about 0.37) and stayed under 1,500, from 0.61 it
# passes 1,500 within 250k steps (docs/training.md compares the two on the same seeds).
ENV_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "Pendulum-v1": {
            "num_envs": 8,
            "num_steps": 256,
            "epochs": 10,
            "minibatches": 8,
            "lr": 1e-3,
            "gamma": 0.9,
        },
        # MuJoCo locomotion: a smaller step and more epochs over longer rollouts (CleanRL's
        # continuous PPO: 2048 steps per iteration, 10 epochs, lr 3e-4).
        **{
            env_id: {
                "num_envs": 8,
                "num_steps": 256,
                "epochs": 10,
                "minibatches": 8,
                "lr": 3e-4,
                "norm_obs": True,
                "norm_reward": True,
                **({"log_std_init": -0.5} if env_id == "HalfCheetah-v5" else {}),
            }
            for env_id in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5")
        },
    },
    "reinforce": {},
}


# CleanRL's ppo_atari_envpool settings, for every envpool Atari id
ATARI_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {
        "env_backend": "envpool",
        "env_kwargs": dict(ATARI_KWARGS),
        "num_envs": 8,
        "num_steps": 128,
        "epochs": 4,
        "minibatches": 4,
        "lr": 2.5e-4,
        "anneal_lr": True,
        "clip": 0.1,
        "ent_coef": 0.01,
        "gamma": 0.99,
        "gae_lambda": 0.95,
    },
}


# gymnax's MinAtar games (gymnax:Breakout-MinAtar, ...): the env inside the program and the
# jitted-JAX MinAtar PPO recipe (the usual one for MinAtar: 64 envs x 128 steps, 4 epochs x 8
# minibatches, lr 5e-4 annealed); the policy is the MinAtar CNN (make_policy). The entropy
# bonus is 0.05, not the recipe's 0.01: with 0.01 the Breakout policy became near-certain
# early (entropy 0.3 of 1.1) and stalled at exactly 7 bricks an episode through 3M steps,
# moving away from the ball at a recurring position; with 0.05 it passed 10 by 0.8M
# (docs/training.md, seed 0).
MINATAR_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {
        "env_backend": "jax",
        "num_envs": 64,
        "num_steps": 128,
        "epochs": 4,
        "minibatches": 8,
        "lr": 5e-4,
        "anneal_lr": True,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip": 0.2,
        "ent_coef": 0.05,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
    },
}


def default_config(algo: str, env_id: str) -> dict[str, Any]:
    """Hyper-parameters for ``algo`` on ``env_id`` before the user's own overrides."""
    if algo in ATARI_DEFAULTS and envpool_atari(env_id):
        return dict(ATARI_DEFAULTS[algo])
    if algo in MINATAR_DEFAULTS and gymnax_minatar(env_id):
        return dict(MINATAR_DEFAULTS[algo])
    return dict(ENV_DEFAULTS.get(algo, {}).get(env_id, {}))


def default_backend(algo: str, env_id: str) -> str:
    """The array backend a run of ``algo`` on ``env_id`` gets without one named: jax where the
    env runs inside the program (MinAtar's defaults), so that the whole iteration is one XLA
    program; torch for envpool's Atari games when torch is installed (its convolutions copy
    no windows: Pong's PPO ran at 1.9x numpy's env steps/s, `bench.rl --configs atari-pong`);
    numpy otherwise."""
    if algo in MINATAR_DEFAULTS and gymnax_minatar(env_id):
        return "jax"
    if algo in ATARI_DEFAULTS and envpool_atari(env_id):
        import importlib.util

        return "torch" if importlib.util.find_spec("torch") is not None else "numpy"
    return "numpy"


class _LogStd(Module):
    """A state-independent log standard deviation for Gaussian policies."""

    def __init__(self, size: int, domain: tuple[Dim, ...], init: float = 0.0) -> None:
        self.log_std = parameter(
            np.full(size, init, np.float32), domain, "policy.log_std", role="actor"
        )

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        return self.log_std


class Policy(Module):
    """Actor (logits or Gaussian mean) and critic MLPs over flattened observations."""

    def __init__(
        self,
        env: Env | PureEnv,
        hidden: tuple[int, ...],
        domain: tuple[Dim, ...],
        seed: int,
        log_std_init: float = 0.0,
    ) -> None:
        self.obs_dim = int(np.prod(env.obs_shape))
        self.obs_ndim = len(env.obs_shape)
        self.discrete = env.discrete
        if env.discrete:
            out = int(env.num_actions or 0)
        else:
            if len(env.action_shape) != 1:
                raise EnvError(f"{env.vec.env_id}: only flat Box action spaces are supported")
            out = env.action_shape[0]
        self.actor = MLP(
            [self.obs_dim, *hidden, out],
            out_gain=0.01,
            domain=domain,
            seed=seed,
            name="actor",
            role="actor",
        )
        self.critic = MLP(
            [self.obs_dim, *hidden, 1],
            out_gain=1.0,
            domain=domain,
            seed=seed + 1,
            name="critic",
            role="critic",
        )
        self.std = None if env.discrete else _LogStd(out, domain, log_std_init)

    def acting(self) -> list[dict[str, Any]]:
        """The network that maps an observation to the actor's output, as layer records."""
        flat = [{"op": "flatten", "ndim": self.obs_ndim}, {"op": "float", "scale": 1.0}]
        return [*flat, *self.actor.describe()]

    def flat(self, obs: RecurrentTensor) -> RecurrentTensor:
        x = obs.reshape(obs.view.shape[0], self.obs_dim)
        return x if obs.dtype == np.float32 else x.float()

    def dist(self, obs: RecurrentTensor) -> Categorical | Normal:
        out = self.actor(self.flat(obs))
        if self.discrete:
            return Categorical(out)
        assert self.std is not None
        return Normal(out, self.std(obs).exp())

    def value(self, obs: RecurrentTensor) -> RecurrentTensor:
        return self.critic(self.flat(obs)).squeeze(-1)

    def log_prob(self, dist: Categorical | Normal, action: RecurrentTensor) -> RecurrentTensor:
        lp = dist.log_prob(action)
        return lp if self.discrete else lp.sum(-1)

    def entropy(self, dist: Categorical | Normal) -> RecurrentTensor:
        ent = dist.entropy()
        return ent if self.discrete else ent.sum(-1)


def image_layout(env: Env | PureEnv) -> str | None:
    """Where the env's image observations keep their channels: ``"CHW"`` (envpool's uint8
    Atari frames), ``"HWC"`` (gymnax's MinAtar planes), or None: not images (float "images"
    such as Synthetic-v0's are features for an MLP)."""
    return getattr(env, "image_layout", None)


class CNNPolicy(Policy):
    """A CNN trunk shared by a linear actor (gain 0.01) and critic (gain 1), as CleanRL's
    Atari agent. The trunk by image size: :class:`NatureCNN` (512 features) for frames of at
    least ``NatureCNN.MIN_SIZE`` (36) pixels a side, the smallest it fits (Atari's 84x84,
    scaled by 1/255 inside); :class:`MinAtarCNN` (128 features) for smaller images (MinAtar's
    10x10 planes). Channels-last observations (``image_layout`` "HWC") are transposed to
    ``(C, H, W)`` inside; observations of unknown layout are taken as ``(C, H, W)``."""

    def __init__(self, env: Env | PureEnv, domain: tuple[Dim, ...], seed: int) -> None:
        self.channels_last = image_layout(env) == "HWC"
        want = "(H, W, C)" if self.channels_last else "(C, H, W)"
        if len(env.obs_shape) != 3:
            raise EnvError(
                f"{env.vec.env_id}: the CNN policy needs image observations {want}, got "
                f"{tuple(env.obs_shape)}"
            )
        if not env.discrete:
            raise EnvError(f"{env.vec.env_id}: the CNN policy supports discrete actions only")
        if self.channels_last:
            height, width, channels = env.obs_shape
        else:
            channels, height, width = env.obs_shape
        self.discrete = True
        self.std = None
        if min(height, width) >= NatureCNN.MIN_SIZE:
            features = 512
            self.trunk: Module = NatureCNN(
                channels, (height, width), features, domain=domain, seed=seed
            )
        else:
            features = 128
            self.trunk = MinAtarCNN(channels, (height, width), features, domain=domain, seed=seed)
        n = int(env.num_actions or 0)
        self.actor = Linear(features, n, gain=0.01, domain=domain, seed=seed + 1, name="actor")
        self.critic = Linear(features, 1, gain=1.0, domain=domain, seed=seed + 2, name="critic")
        self.actor.role, self.critic.role = "actor", "critic"

    def _map(self, fn: Callable[[RecurrentTensor], RecurrentTensor]) -> Module:
        new = super()._map(fn)
        new._memo = []  # type: ignore[attr-defined]  # features are per set of parameters
        return new

    def features(self, obs: RecurrentTensor) -> RecurrentTensor:
        """The trunk's output, built once per observation tensor: the actor and the critic
        read the same features, so their gradients meet there and the trunk's backward pass
        runs once (built twice, it ran twice: autodiff precedes the merging of equal ops)."""
        memo = self.__dict__.setdefault("_memo", [])
        for seen, out in memo:
            if seen is obs:
                return out
        x = obs
        if self.channels_last:  # (..., H, W, C) -> (..., C, H, W)
            lead = x.ndim - 3
            x = x.permute(*range(lead), lead + 2, lead, lead + 1)
        out = self.trunk(x)
        memo.append((obs, out))
        return out

    def acting(self) -> list[dict[str, Any]]:
        # channels-last observations move their channels first, as ``features`` does
        first = [{"op": "permute", "axes": [2, 0, 1]}] if self.channels_last else []
        return [*first, *self.trunk.describe(), *self.actor.describe()]

    def dist(self, obs: RecurrentTensor) -> Categorical | Normal:
        return Categorical(self.actor(self.features(obs)))

    def value(self, obs: RecurrentTensor) -> RecurrentTensor:
        return self.critic(self.features(obs)).squeeze(-1)


def make_policy(cfg: AlgoConfig, env: Env | PureEnv, domain: tuple[Dim, ...]) -> Policy:
    """The network ``cfg.policy`` names; "auto": a CNN where the env's observations are images
    (``image_layout``: envpool's Atari frames, gymnax's MinAtar games), else an MLP. Which CNN
    goes by the image's size (:class:`CNNPolicy`)."""
    seed = cfg.seed * 10 + 1
    image = image_layout(env) is not None
    if cfg.policy == "cnn" or (cfg.policy == "auto" and image and "cnn" in cfg.POLICIES):
        return CNNPolicy(env, domain, seed)
    return Policy(env, cfg.hidden, domain, seed, getattr(cfg, "log_std_init", 0.0))


def _rollout(
    env: Env | PureEnv, policy: Policy, i: Dim, t: Dim, norm_obs: bool = False
) -> dict[str, Any]:
    """Act for T steps per iteration; episodes continue across iterations. ``norm_obs``: the
    policy sees observations normalised by running statistics frozen over the iteration
    (``policy_obs``), merged with this iteration's observations for the next one."""
    T = t.bound
    dtype = getattr(env, "obs_dtype", "float32")
    obs = RecurrentTensor.placeholder(env.batch_obs_shape, dtype, (i, t), name="obs")
    pure = isinstance(env, PureEnv)
    if pure:
        state = env.state_placeholders((i, t))
        first, obs[0, 0] = env.reset_state()
        for x, x0 in zip(state, first, strict=True):
            x[0, 0] = x0
    else:
        obs[0, 0] = env.reset()
    stats = None
    if norm_obs:
        stats = running_moments(_batch(obs, i, t, T * env.num_envs), i, env.obs_shape, "obs")
    pi = policy.at(i)
    policy_obs = stats.normalize(obs, i) if stats is not None else obs
    dist = pi.dist(policy_obs)
    action = dist.sample().named("action")
    logp = pi.log_prob(dist, action).named("logp")
    value = pi.value(policy_obs).named("value")
    if pure:
        nxt, next_obs, reward, done = env.step_state(state, action)
        for x, x1 in zip(state, nxt, strict=True):
            x[i, t + 1] = x1
            x[i + 1, 0] = x1[i, T - 1]
        env.track(reward[i, 0:T], done[i, 0:T])
    else:
        next_obs, reward, done = env.step(action)
    obs[i, t + 1] = next_obs
    obs[i + 1, 0] = next_obs[i, T - 1]
    last_obs = next_obs[i, T - 1]
    if stats is not None:
        last_obs = stats.normalize(last_obs, i)
    last_value = pi.value(last_obs).named("last_value")
    return {
        "obs": obs,
        "policy_obs": policy_obs,
        "obs_stats": stats,
        "action": action,
        "logp": logp,
        "value": value,
        "reward": reward,
        "done": done,
        "last_value": last_value,
    }


def _batch(x: RecurrentTensor, i: Dim, t: Dim, n: int) -> RecurrentTensor:
    """Stack an iteration's rollout ``x[i, 0:T]`` and merge (T, B) into one batch axis."""
    data = x[i, 0 : t.bound].detach()
    return data.reshape(n, *data.view.shape[2:])


def ppo(config: PPOConfig | None = None, **overrides: Any) -> AlgoProgram:
    """PPO-clip with GAE, value loss, entropy bonus, advantage normalisation, and
    ``epochs x minibatches`` Adam updates per iteration over shuffled minibatches."""
    cfg = config or PPOConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg.check_policy()
    if cfg.policy == "lstm":
        return recurrent_ppo(cfg)
    batch = cfg.num_envs * cfg.num_steps
    if cfg.minibatches < 1 or batch % cfg.minibatches:
        raise ProgramError(f"minibatches={cfg.minibatches} must divide the batch of {batch}")
    mb_size = batch // cfg.minibatches
    env = make_env(cfg.env_id, cfg.num_envs, cfg.seed, cfg.env_backend, **cfg.env_kwargs)
    ent_coef = cfg.ent_coef if cfg.ent_coef is not None else (0.01 if env.discrete else 0.0)
    ctx = Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    with ctx:
        policy = make_policy(cfg, env, (i,))
        ro = _rollout(env, policy, i, t, norm_obs=cfg.norm_obs)
        reward = ro["reward"]
        if cfg.norm_reward:
            # rewards divided by the spread of a running discounted return (kept over i and t)
            g = discounted_return_estimate(reward, ro["done"], cfg.gamma, i, t)
            reward = running_moments(_batch(g, i, t, batch), i, (), "return").scale(reward, i)
        adv = gae(reward, ro["done"], ro["value"], cfg.gamma, cfg.gae_lambda, ro["last_value"])
        ret = adv + ro["value"]
        b_obs = _batch(ro["policy_obs"], i, t, batch)
        b_act = _batch(ro["action"], i, t, batch)
        b_logp, b_adv = _batch(ro["logp"], i, t, batch), _batch(adv, i, t, batch)
        b_ret = _batch(ret, i, t, batch)
        # One shuffle per (iteration, epoch); update u takes minibatch u % minibatches of it.
        # A single minibatch is the whole batch: its losses are means, so order does not
        # matter, and skipping the gather saves a batch-sized copy of every input.
        if cfg.minibatches == 1:
            take = lambda x: x  # noqa: E731
        else:
            perm = rand_perm(batch, (i, u // cfg.minibatches))
            mb = perm.narrow(0, (u % cfg.minibatches) * mb_size, mb_size)
            take = lambda x: x.take(mb)  # noqa: E731
        learner = policy.unroll(u)
        parts = ppo_loss(
            learner,
            take(b_obs),
            take(b_act),
            take(b_logp),
            take(b_adv),
            take(b_ret),
            clip=cfg.clip,
            vf_coef=cfg.vf_coef,
            ent_coef=ent_coef,
            norm_adv=cfg.norm_adv,
        )
        loss = parts["loss"]
        params = learner.parameters()
        loss.backward(inputs=params)
        Adam(params, lr=lr_schedule(cfg), eps=1e-5, max_grad_norm=cfg.max_grad_norm).step()
        last = u.bound - 1
        metrics = {name: value[i, last] for name, value in parts.items()}
        metrics["reward_mean"] = ro["reward"][i, 0 : t.bound].mean()
    bounds = {"T": cfg.num_steps, "U": cfg.epochs * cfg.minibatches}
    stats = ro["obs_stats"]
    obs_norm = (
        {"mean": stats.mean.name, "var": stats.var.name, "eps": EPS, "clip": CLIP}
        if stats is not None
        else None
    )
    params = policy.parameters()
    return AlgoProgram("ppo", ctx, env, cfg, metrics, bounds, params, obs_norm, ro, policy.acting())


def reinforce(config: ReinforceConfig | None = None, **overrides: Any) -> AlgoProgram:
    """REINFORCE: Monte Carlo returns (bootstrapped by the critic at the rollout's end when a
    baseline is used), one full-batch Adam step per iteration."""
    cfg = config or ReinforceConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    batch = cfg.num_envs * cfg.num_steps
    env = make_env(cfg.env_id, cfg.num_envs, cfg.seed, cfg.env_backend, **cfg.env_kwargs)
    ent_coef = cfg.ent_coef if cfg.ent_coef is not None else (0.01 if env.discrete else 0.0)
    ctx = Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        policy = Policy(env, cfg.hidden, (i,), seed=cfg.seed * 10 + 1)
        ro = _rollout(env, policy, i, t)
        boot = ro["last_value"] if cfg.baseline else None
        ret = discounted_returns(ro["reward"], ro["done"], cfg.gamma, bootstrap=boot)
        b_obs, b_act, b_ret = (_batch(x, i, t, batch) for x in (ro["obs"], ro["action"], ret))
        pi = policy.at(i)
        dist = pi.dist(b_obs)
        logp = pi.log_prob(dist, b_act)
        entropy = pi.entropy(dist).mean()
        loss = -entropy * ent_coef
        if cfg.baseline:
            value = pi.value(b_obs)
            adv = b_ret - value.detach()
            adv = normalized_advantage(adv)
            v_loss = ((value - b_ret) ** 2.0).mean() * 0.5
            loss = loss - (logp * adv).mean() + v_loss * cfg.vf_coef
        else:
            adv = normalized_advantage(b_ret)
            v_loss = None
            loss = loss - (logp * adv).mean()
        params = policy.parameters()
        if not cfg.baseline:  # no value baseline: nothing trains the critic
            params = [p for p in params if role_of(p) != "critic"]
        loss.backward(inputs=params)
        Adam(params, lr=lr_schedule(cfg), eps=1e-5, max_grad_norm=cfg.max_grad_norm).step()
        metrics = {
            "loss": loss,
            "entropy": entropy,
            "reward_mean": ro["reward"][i, 0 : t.bound].mean(),
        }
        if v_loss is not None:
            metrics["value_loss"] = v_loss
    return AlgoProgram(
        "reinforce", ctx, env, cfg, metrics, {"T": cfg.num_steps}, policy.parameters()
    )
