"""A2C (synchronous advantage actor-critic) as a recurrent-tensor program.

Dims: ``i`` iteration, ``t`` rollout step. Each iteration acts for ``num_steps`` steps of
``num_envs`` envs, estimates advantages with GAE (``gae_lambda=1``: bootstrapped n-step
returns, the original A2C) and takes one Adam step on the policy-gradient, value and entropy
terms over the whole rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from timerl.api.context import Context
from timerl.api.optim import Adam
from timerl.rl.algos.policy_gradient import (
    FRACTION,
    NON_NEGATIVE,
    AlgoConfig,
    AlgoProgram,
    Policy,
    Rule,
    _batch,
    _rollout,
    lr_schedule,
)
from timerl.rl.algos.recurrent import recurrent_a2c
from timerl.rl.algos.returns import gae
from timerl.rl.algos.shared import a2c_loss
from timerl.rl.envs.program import make_env


@dataclass
class A2CConfig(AlgoConfig):
    RULES: ClassVar[dict[str, Rule]] = {
        **AlgoConfig.RULES,
        "gae_lambda": FRACTION,
        "vf_coef": NON_NEGATIVE,
        "ent_coef": NON_NEGATIVE.optional(),
    }

    RECURRENT: ClassVar[bool] = True

    num_envs: int = 8
    num_steps: int = 32
    lr: float = 1e-3
    gae_lambda: float = 1.0
    vf_coef: float = 0.5
    ent_coef: float | None = None  # 0.01 for discrete actions, 0 for continuous
    norm_adv: bool = False


def a2c(config: A2CConfig | None = None, **overrides: Any) -> AlgoProgram:
    """A2C (Mnih et al. 2016, synchronous): one full-batch update per rollout."""
    cfg = config or A2CConfig()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg.check_policy()
    if cfg.policy == "lstm":
        return recurrent_a2c(cfg)
    batch = cfg.num_envs * cfg.num_steps
    env = make_env(cfg.env_id, cfg.num_envs, cfg.seed, cfg.env_backend, **cfg.env_kwargs)
    ent_coef = cfg.ent_coef if cfg.ent_coef is not None else (0.01 if env.discrete else 0.0)
    ctx = Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        policy = Policy(env, cfg.hidden, (i,), seed=cfg.seed * 10 + 1)
        ro = _rollout(env, policy, i, t)
        adv = gae(
            ro["reward"], ro["done"], ro["value"], cfg.gamma, cfg.gae_lambda, ro["last_value"]
        )
        ret = adv + ro["value"]
        parts = a2c_loss(
            policy.at(i),
            _batch(ro["obs"], i, t, batch),
            _batch(ro["action"], i, t, batch),
            _batch(adv, i, t, batch),
            _batch(ret, i, t, batch),
            vf_coef=cfg.vf_coef,
            ent_coef=ent_coef,
            norm_adv=cfg.norm_adv,
        )
        params = policy.parameters()
        parts["loss"].backward(inputs=params)
        Adam(params, lr=lr_schedule(cfg), eps=1e-5, max_grad_norm=cfg.max_grad_norm).step()
        metrics = dict(parts)
        metrics["reward_mean"] = ro["reward"][i, 0 : t.bound].mean()
    bounds, params = {"T": cfg.num_steps}, policy.parameters()
    return AlgoProgram("a2c", ctx, env, cfg, metrics, bounds, params, acting=policy.acting())
