"""Eager PyTorch PPO on Atari with CleanRL's agent: the loop of ``ppo_atari_envpool``.

The Nature-CNN trunk (conv 32 8x8/4, 64 4x4/2, 64 3x3/1, linear 512, ReLUs; orthogonal init,
gain sqrt(2), actor head 0.01, critic head 1) shared by a linear actor and critic, frames
scaled by 1/255 inside the network, a float32 rollout buffer, one Python loop over env steps,
GAE by a reversed loop, ``epochs x minibatches`` clipped-surrogate Adam steps with a single
forward pass per minibatch. The env is the same envpool batch timerl steps.

    python -m bench.baselines.torch_ppo_atari --env Pong-v5 --num-envs 8 --iterations 3
"""

from __future__ import annotations

import math
import time
from typing import Any

from bench.baselines.torch_ppo import gae
from bench.common import Config, Result, current_rss_bytes, main_for, mean_or_nan


def _layer(layer: Any, gain: float = math.sqrt(2.0)) -> Any:
    import torch

    torch.nn.init.orthogonal_(layer.weight, gain)
    torch.nn.init.zeros_(layer.bias)
    return layer


class AtariAgent:
    """CleanRL's Atari agent: a shared Nature-CNN trunk, linear actor and critic heads."""

    def __init__(self, channels: int, actions: int, device: Any) -> None:
        import torch

        nn = torch.nn
        self.trunk = nn.Sequential(
            _layer(nn.Conv2d(channels, 32, 8, stride=4)),
            nn.ReLU(),
            _layer(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            _layer(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            _layer(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        ).to(device)
        self.actor = _layer(nn.Linear(512, actions), 0.01).to(device)
        self.critic = _layer(nn.Linear(512, 1), 1.0).to(device)

    def parameters(self) -> list[Any]:
        mods = (self.trunk, self.actor, self.critic)
        return [p for m in mods for p in m.parameters()]

    def heads(self, frames: Any) -> tuple[Any, Any]:
        """``(logits, value)`` of frames holding 0..255."""
        hidden = self.trunk(frames / 255.0)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


def run(config: Config) -> Result:
    """Train PPO on an envpool Atari id for ``config.iterations`` rollouts and measure it."""
    import torch

    from timerl.rl.envs import make_env

    cfg = config.resolved()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    base_rss = current_rss_bytes()
    start = time.perf_counter()
    device = torch.device(cfg.device)
    env = make_env(cfg.env_id, cfg.num_envs, cfg.seed, "envpool", **cfg.env_kwargs)
    T, B, shape = cfg.num_steps, cfg.num_envs, tuple(env.obs_shape)
    agent = AtariAgent(shape[0], int(env.num_actions), device)
    params = agent.parameters()
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)
    ent = cfg.entropy_coef(True)
    obs_buf = torch.zeros((T, B, *shape), device=device)  # float32, as CleanRL's buffer
    act_buf = torch.zeros((T, B), device=device, dtype=torch.long)
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((T, B), device=device) for _ in range(4))
    next_obs = torch.as_tensor(env.reset(), device=device).float()
    setup_s = time.perf_counter() - start
    iter_seconds: list[float] = []
    returns: list[float] = []
    n, size = T * B, T * B // cfg.minibatches
    for _ in range(cfg.iterations):
        t0 = time.perf_counter()
        with torch.no_grad():
            for t in range(T):
                obs_buf[t] = next_obs
                logits, value = agent.heads(next_obs)
                dist = torch.distributions.Categorical(logits=logits)
                action = dist.sample()
                act_buf[t], logp_buf[t], val_buf[t] = action, dist.log_prob(action), value
                obs, reward, done = env.step(action.cpu().numpy())
                next_obs = torch.as_tensor(obs, device=device).float()
                rew_buf[t] = torch.as_tensor(reward, device=device)
                done_buf[t] = torch.as_tensor(done, device=device)
            last_value = agent.heads(next_obs)[1]
            adv = gae(rew_buf, val_buf, done_buf, last_value, cfg.gamma, cfg.gae_lambda)
        b_obs, b_act = obs_buf.reshape(n, *shape), act_buf.reshape(n)
        b_logp, b_adv = logp_buf.reshape(n), adv.reshape(n)
        b_ret = (adv + val_buf).reshape(n)
        for _ in range(cfg.epochs):
            order = torch.randperm(n, device=device)
            for k in range(cfg.minibatches):
                idx = order[k * size : (k + 1) * size]
                logits, value = agent.heads(b_obs[idx])
                dist = torch.distributions.Categorical(logits=logits)
                log_ratio = dist.log_prob(b_act[idx]) - b_logp[idx]
                ratio = log_ratio.exp()
                a = b_adv[idx]
                if cfg.norm_adv:
                    a = (a - a.mean()) / (a.std() + 1e-8)
                pg = torch.max(-a * ratio, -a * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
                v_loss = 0.5 * (value - b_ret[idx]).pow(2).mean()
                loss = pg.mean() - ent * dist.entropy().mean() + cfg.vf_coef * v_loss
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
        "torch_ppo_atari",
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
