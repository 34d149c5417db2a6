"""Eager PyTorch REINFORCE, with an optional learned value baseline.

Each iteration collects ``num_steps`` steps from every env, computes discounted returns cut at
episode ends, and takes one Adam step on ``-log pi(a|s) * (G - V(s))`` (plus the value loss
when the baseline is on). Returns of episodes still running at the end of a rollout are
completed with the critic's estimate when there is one, and left truncated otherwise: plain
REINFORCE then sees a biased tail, which is why long rollouts suit it best.

    python -m bench.baselines.torch_reinforce --env CartPole-v1 --num-envs 16 --num-steps 256
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.baselines.torch_ppo import ActorCritic, _torch
from bench.common import Config, Result, current_rss_bytes, main_for, mean_or_nan


def discounted_returns(rewards: Any, dones: Any, last_value: Any, gamma: float) -> Any:
    """``G_t = r_t + gamma * G_{t+1}``, restarted wherever ``dones[t]`` ends an episode."""
    torch = _torch()
    out = torch.zeros_like(rewards)
    running = last_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * (1.0 - dones[t]) * running
        out[t] = running
    return out


def run(config: Config) -> Result:
    """Train REINFORCE for ``config.iterations`` rollouts; one gradient step per rollout."""
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
    params = model.parameters()
    if not cfg.value_baseline:
        params = [p for p in params if all(p is not q for q in model.critic.parameters())]
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
    ent = cfg.entropy_coef(env.discrete)
    next_obs = torch.as_tensor(env.reset(), device=device).reshape(B, obs_dim)
    setup_s = time.perf_counter() - start

    iter_seconds: list[float] = []
    returns: list[float] = []
    for _ in range(cfg.iterations):
        t0 = time.perf_counter()
        obs_l, act_l, rew_l, done_l = [], [], [], []
        with torch.no_grad():
            for _t in range(T):
                action = model.dist(next_obs).sample()
                obs_l.append(next_obs)
                act_l.append(action)
                obs, reward, done = env.step(action.cpu().numpy())
                next_obs = torch.as_tensor(obs, device=device).reshape(B, obs_dim)
                rew_l.append(torch.as_tensor(reward, device=device))
                done_l.append(torch.as_tensor(done, device=device, dtype=torch.float32))
            tail = model.value(next_obs) if cfg.value_baseline else torch.zeros(B, device=device)
            ret = discounted_returns(torch.stack(rew_l), torch.stack(done_l), tail, cfg.gamma)
        obs_b = torch.stack(obs_l).reshape(T * B, obs_dim)
        act_b = torch.stack(act_l).reshape(T * B, *act_l[0].shape[1:])
        ret_b = ret.reshape(-1)
        logp, entropy = model.log_prob_entropy(obs_b, act_b)
        loss = -ent * entropy.mean()
        if cfg.value_baseline:
            value = model.value(obs_b)
            adv = ret_b - value.detach()
            loss = loss + cfg.vf_coef * 0.5 * (value - ret_b).pow(2).mean()
        else:
            adv = ret_b
        if cfg.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss = loss - (logp * adv).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        iter_seconds.append(time.perf_counter() - t0)
        returns.append(mean_or_nan(env.completed_returns()))
    env.close()

    fw_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Result.measured(
        "torch_reinforce" + ("" if cfg.value_baseline else "_nobaseline"),
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
