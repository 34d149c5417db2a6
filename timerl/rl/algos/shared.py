"""What the feed-forward programs (``policy_gradient.py``, ``a2c.py``) and the recurrent ones
(``recurrent.py``) share: the built program's record, the learning-rate schedule, the
PPO-clip and A2C losses (and the advantage normalisation REINFORCE uses too) and the
minibatch permutation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from timerl.api.context import Context
from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor, maximum
from timerl.rl.envs.program import Env
from timerl.rl.envs.pure import PureEnv


@dataclass
class AlgoProgram:
    name: str
    ctx: Context
    env: Env | PureEnv
    config: Any  # the algorithm's AlgoConfig
    metrics: dict[str, RecurrentTensor]  # each a scalar over (i,)
    bounds: dict[str, int]  # everything but the iteration bound I
    params: list[RecurrentTensor]
    # how the acting network's input is normalised (names of the statistics in checkpoints'
    # state and the constants), for ``timerl eval`` and ``timerl export``; None: raw input
    obs_norm: dict[str, Any] | None = None
    # the rollout's tensors (obs, action, reward, ...) by name, to sink or inspect
    rollout: dict[str, Any] = field(default_factory=dict)
    # the acting network as layer records (``Module.describe()``), stored in checkpoints so
    # ``timerl eval`` and ``timerl export`` run any policy; None: an MLP found by name
    acting: list[dict[str, Any]] | None = None

    @property
    def steps_per_iteration(self) -> int:
        return self.config.num_envs * self.config.num_steps


def lr_schedule(cfg: Any) -> Any:
    """The configured learning rate, or a function of the iteration annealing it to 0."""
    if not cfg.anneal_lr:
        return cfg.lr

    def schedule(i: Dim, *_: Dim) -> RecurrentTensor:
        from timerl.api.tensor import full

        return (1.0 - full((), i) / full((), i.bound)) * cfg.lr

    return schedule


def normalized_advantage(advantage: RecurrentTensor) -> RecurrentTensor:
    """Advantages shifted to mean 0 and scaled to standard deviation 1 over the batch, so the
    policy's step size does not follow the rewards' scale (1e-8 keeps a constant batch
    finite)."""
    return (advantage - advantage.mean()) / (advantage.std() + 1e-8)


def policy_terms(
    policy: Any, obs: RecurrentTensor, action: RecurrentTensor
) -> tuple[RecurrentTensor, RecurrentTensor, RecurrentTensor]:
    """What an actor-critic loss reads of the policy at ``obs``: the log-probability of
    ``action``, the mean entropy, and the value."""
    dist = policy.dist(obs)
    logp = policy.log_prob(dist, action)
    entropy = policy.entropy(dist).mean()
    return logp, entropy, policy.value(obs)


def ppo_loss(
    policy: Any,
    obs: RecurrentTensor,
    action: RecurrentTensor,
    old_logp: RecurrentTensor,
    advantage: RecurrentTensor,
    returns: RecurrentTensor,
    clip: float = 0.2,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    norm_adv: bool = True,
) -> dict[str, RecurrentTensor]:
    """The PPO-clip objective on one (mini)batch: clipped surrogate, value loss, entropy."""
    new_logp, entropy, value = policy_terms(policy, obs, action)
    if norm_adv:
        advantage = normalized_advantage(advantage)
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - clip, 1 + clip)
    pg_loss = maximum(-advantage * ratio, -advantage * clipped).mean()
    v_loss = ((value - returns) ** 2.0).mean() * 0.5
    loss = pg_loss - entropy * ent_coef + v_loss * vf_coef
    approx_kl = ((ratio - 1.0) - log_ratio).mean()
    return {
        "loss": loss,
        "policy_loss": pg_loss,
        "value_loss": v_loss,
        "entropy": entropy,
        "approx_kl": approx_kl,
    }


def a2c_loss(
    policy: Any,
    obs: RecurrentTensor,
    action: RecurrentTensor,
    advantage: RecurrentTensor,
    returns: RecurrentTensor,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    norm_adv: bool = False,
) -> dict[str, RecurrentTensor]:
    """``-mean(log pi(a|s) * A) + vf_coef * 0.5 * mean((V - R)^2) - ent_coef * entropy``."""
    logp, entropy, value = policy_terms(policy, obs, action)
    advantage = advantage.detach()
    if norm_adv:
        advantage = normalized_advantage(advantage)
    pg_loss = -(logp * advantage).mean()
    v_loss = ((value - returns.detach()) ** 2.0).mean() * 0.5
    loss = pg_loss - entropy * ent_coef + v_loss * vf_coef
    return {"loss": loss, "policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy}


def rand_perm(n: int, key_at: tuple) -> RecurrentTensor:
    from timerl.api.functional import rand

    return rand((n,), key_at=key_at).argsort(0)
