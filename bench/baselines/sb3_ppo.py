"""Stable-Baselines3 PPO, the widely used library implementation, under bench.common's settings.

Optional: without ``stable_baselines3`` installed :func:`run` raises
:class:`~bench.common.BaselineUnavailable`, which harnesses report as a skipped row. Envs are
SB3's own ``DummyVecEnv`` of single gymnasium envs (``Synthetic-v0`` through a one-env adapter),
so its env stepping is per-env Python, as SB3 users run it; SB3 also clips the value loss only
when asked (it is not) and does not anneal the learning rate, matching the other baselines.

    python -m bench.baselines.sb3_ppo --env CartPole-v1 --num-envs 16 --iterations 20
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.common import (
    BaselineUnavailable,
    Config,
    Result,
    current_rss_bytes,
    main_for,
    mean_or_nan,
)


def _imports() -> tuple[Any, Any]:
    try:
        import stable_baselines3 as sb3
        import torch
    except ImportError as err:
        raise BaselineUnavailable(
            f"sb3_ppo needs stable-baselines3, which is not installed ({err}); "
            "pip install stable-baselines3"
        ) from err
    return sb3, torch


def _synthetic_gym_env(seed: int, env_kwargs: dict[str, Any]) -> Any:
    """One Synthetic-v0 copy as a gymnasium.Env, for SB3's DummyVecEnv."""
    import gymnasium as gym

    from timerl.rl.envs import make_env

    class SyntheticGym(gym.Env):
        def __init__(self) -> None:
            self.inner = make_env("Synthetic-v0", num_envs=1, seed=seed, **env_kwargs)
            self.observation_space = gym.spaces.Box(
                -np.inf, np.inf, self.inner.obs_shape, np.float32
            )
            self.action_space = gym.spaces.Box(
                self.inner.action_low, self.inner.action_high, dtype=np.float32
            )

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
            super().reset(seed=seed)
            return self.inner.reset()[0], {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
            obs, reward, _ = self.inner.step(np.asarray(action)[None])
            final = self.inner.final_obs
            truncated = bool(self.inner.truncated[0])
            # SB3 resets by itself: hand it the final obs and let its reset() start the next.
            out = final[0] if final is not None and truncated else obs[0]
            return out, float(reward[0]), bool(self.inner.terminated[0]), truncated, {}

    return SyntheticGym()


def run(config: Config) -> Result:
    """Train SB3 PPO for ``config.iterations`` rollouts of ``num_steps`` x ``num_envs``."""
    sb3, torch = _imports()
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    cfg = config.resolved()
    torch.set_num_threads(cfg.threads)
    base_rss = current_rss_bytes()
    start = time.perf_counter()
    if cfg.env_id == "Synthetic-v0":
        factory = lambda: _synthetic_gym_env(cfg.seed, cfg.env_kwargs)  # noqa: E731
        venv = make_vec_env(factory, n_envs=cfg.num_envs, seed=cfg.seed)
    else:
        kwargs = cfg.env_kwargs
        venv = make_vec_env(cfg.env_id, n_envs=cfg.num_envs, seed=cfg.seed, env_kwargs=kwargs)
    discrete = hasattr(venv.action_space, "n")
    layers = [cfg.hidden_size] * cfg.hidden_layers
    model = sb3.PPO(
        "MlpPolicy",
        venv,
        learning_rate=cfg.lr,
        n_steps=cfg.num_steps,
        batch_size=cfg.batch_size // cfg.minibatches,
        n_epochs=cfg.epochs,
        gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        clip_range=cfg.clip_coef,
        ent_coef=cfg.entropy_coef(discrete),
        vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        normalize_advantage=cfg.norm_adv,
        policy_kwargs={"net_arch": {"pi": layers, "vf": layers}, "activation_fn": torch.nn.Tanh},
        seed=cfg.seed,
        device=cfg.device,
        verbose=0,
    )
    iter_seconds: list[float] = []
    returns: list[float] = []

    class Timer(BaseCallback):
        """Times each rollout+update cycle and collects completed-episode returns."""

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()
            self.done_returns: list[float] = []

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    self.done_returns.append(float(info["episode"]["r"]))
            return True

        def _on_rollout_start(self) -> None:
            # a rollout starts after the previous update: close that iteration
            if self.num_timesteps > 0:
                now = time.perf_counter()
                iter_seconds.append(now - self.t0)
                returns.append(mean_or_nan(self.done_returns))
                self.t0, self.done_returns = now, []

        def _on_training_end(self) -> None:
            iter_seconds.append(time.perf_counter() - self.t0)
            returns.append(mean_or_nan(self.done_returns))

    setup_s = time.perf_counter() - start
    model.learn(total_timesteps=cfg.batch_size * cfg.iterations, callback=Timer())
    venv.close()
    device = torch.device(cfg.device)
    fw_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Result.measured(
        "sb3_ppo",
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
