"""Eager PyTorch PPO: the hand-written, step-by-step program timerl's compiled PPO replaces.

Written the way a practitioner would (one Python loop over env steps, tensors preallocated,
GAE by a reversed loop), following the conventions of :mod:`bench.common`, so that a speed
difference measures compilation and scheduling rather than a different algorithm.

    python -m bench.baselines.torch_ppo --env CartPole-v1 --num-envs 16 --iterations 50
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from bench.common import (
    Config,
    Result,
    current_rss_bytes,
    main_for,
    mean_or_nan,
)


def _torch() -> Any:
    import torch

    return torch


def build_mlp(in_dim: int, out_dim: int, layers: int, size: int, out_gain: float) -> Any:
    """``layers`` tanh hidden layers of ``size`` units; orthogonal init as in bench.common."""
    torch = _torch()
    nn = torch.nn
    mods: list[Any] = []
    width = in_dim
    for _ in range(layers):
        lin = nn.Linear(width, size)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        mods += [lin, nn.Tanh()]
        width = size
    head = nn.Linear(width, out_dim)
    nn.init.orthogonal_(head.weight, out_gain)
    nn.init.zeros_(head.bias)
    return nn.Sequential(*mods, head)


class ActorCritic:
    """Separate policy and value MLPs; a Categorical or a diagonal Normal policy."""

    def __init__(self, obs_dim: int, env: Any, layers: int, size: int, device: Any) -> None:
        torch = _torch()
        self.discrete = bool(env.discrete)
        out = env.num_actions if self.discrete else int(np.prod(env.action_shape))
        self.actor = build_mlp(obs_dim, out, layers, size, 0.01).to(device)
        self.critic = build_mlp(obs_dim, 1, layers, size, 1.0).to(device)
        self.log_std = torch.nn.Parameter(torch.zeros(out, device=device))

    def parameters(self) -> list[Any]:
        params = list(self.actor.parameters()) + list(self.critic.parameters())
        return params if self.discrete else [*params, self.log_std]

    def value(self, obs: Any) -> Any:
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: Any) -> Any:
        torch = _torch()
        out = self.actor(obs)
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))

    def log_prob_entropy(self, obs: Any, actions: Any) -> tuple[Any, Any]:
        d = self.dist(obs)
        if self.discrete:
            return d.log_prob(actions), d.entropy()
        return d.log_prob(actions).sum(-1), d.entropy().sum(-1)


def gae(rewards: Any, values: Any, dones: Any, last_value: Any, gamma: float, lam: float) -> Any:
    """Generalised advantage estimates over a ``(T, B)`` rollout; ``done`` cuts the recursion.

    With same-step auto-reset, ``dones[t]`` means transition ``t`` ended its episode, so
    neither the next value nor later advantages flow back across it.
    """
    torch = _torch()
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    next_value = last_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * live - values[t]
        running = delta + gamma * lam * live * running
        adv[t] = running
        next_value = values[t]
    return adv


def ppo_update(model: ActorCritic, opt: Any, batch: dict[str, Any], cfg: Config, ent: float):
    """``epochs`` passes of ``minibatches`` clipped-surrogate Adam steps over one rollout."""
    torch = _torch()
    n = batch["obs"].shape[0]
    size = n // cfg.minibatches
    params = model.parameters()
    for _ in range(cfg.epochs):
        order = torch.randperm(n, device=batch["obs"].device) if cfg.minibatches > 1 else None
        for k in range(cfg.minibatches):
            idx = None if order is None else order[k * size : (k + 1) * size]
            mb = batch if idx is None else {key: v[idx] for key, v in batch.items()}
            logp, entropy = model.log_prob_entropy(mb["obs"], mb["actions"])
            adv = mb["advantages"]
            if cfg.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = (logp - mb["logprobs"]).exp()
            surrogate = torch.max(
                -adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)
            )
            v_loss = 0.5 * (model.value(mb["obs"]) - mb["returns"]).pow(2).mean()
            loss = surrogate.mean() + cfg.vf_coef * v_loss - ent * entropy.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()


def run(config: Config) -> Result:
    """Train PPO for ``config.iterations`` rollouts and report speed, memory and returns."""
    from timerl.rl.envs import make_env

    torch = _torch()
    cfg = config.resolved()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    base_rss = current_rss_bytes()
    start = time.perf_counter()
    device = torch.device(cfg.device)
    env = make_env(cfg.env_id, num_envs=cfg.num_envs, seed=cfg.seed, **cfg.env_kwargs)
    T, B = cfg.num_steps, cfg.num_envs
    obs_dim = int(np.prod(env.obs_shape))
    model = ActorCritic(obs_dim, env, cfg.hidden_layers, cfg.hidden_size, device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-5)
    ent = cfg.entropy_coef(env.discrete)
    act_shape = () if env.discrete else env.action_shape
    obs_buf = torch.zeros((T, B, obs_dim), device=device)
    act_dtype = torch.long if env.discrete else torch.float32
    act_buf = torch.zeros((T, B, *act_shape), device=device, dtype=act_dtype)
    logp_buf = torch.zeros((T, B), device=device)
    rew_buf = torch.zeros((T, B), device=device)
    done_buf = torch.zeros((T, B), device=device)
    val_buf = torch.zeros((T, B), device=device)
    next_obs = torch.as_tensor(env.reset(), device=device).reshape(B, obs_dim)
    setup_s = time.perf_counter() - start

    iter_seconds: list[float] = []
    returns: list[float] = []
    for _ in range(cfg.iterations):
        t0 = time.perf_counter()
        with torch.no_grad():
            for t in range(T):
                obs_buf[t] = next_obs
                d = model.dist(next_obs)
                action = d.sample()
                logp = d.log_prob(action)
                logp_buf[t] = logp if env.discrete else logp.sum(-1)
                val_buf[t] = model.value(next_obs)
                act_buf[t] = action
                obs, reward, done = env.step(action.cpu().numpy())
                next_obs = torch.as_tensor(obs, device=device).reshape(B, obs_dim)
                rew_buf[t] = torch.as_tensor(reward, device=device)
                done_buf[t] = torch.as_tensor(done, device=device)
            last_value = model.value(next_obs)
            adv = gae(rew_buf, val_buf, done_buf, last_value, cfg.gamma, cfg.gae_lambda)
        batch = {
            "obs": obs_buf.reshape(T * B, obs_dim),
            "actions": act_buf.reshape(T * B, *act_shape),
            "logprobs": logp_buf.reshape(-1),
            "advantages": adv.reshape(-1),
            "returns": (adv + val_buf).reshape(-1),
        }
        ppo_update(model, opt, batch, cfg, ent)
        if device.type == "cuda":
            torch.cuda.synchronize()
        iter_seconds.append(time.perf_counter() - t0)
        returns.append(mean_or_nan(env.completed_returns()))
    env.close()

    fw_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Result.measured(
        "torch_ppo",
        cfg,
        iter_seconds,
        returns,
        start=start,
        setup_s=setup_s,
        framework_peak_bytes=fw_peak,
        base_rss_bytes=base_rss,
    )


def main(argv: list[str] | None = None) -> int:
    return main_for(run, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
