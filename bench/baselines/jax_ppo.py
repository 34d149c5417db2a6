"""Fully jitted JAX PPO: rollout, GAE and update compiled into one XLA program per iteration.

This is the strongest kind of baseline for timerl: no Python runs inside an iteration, the env
itself is JAX code (:mod:`timerl.rl.envs.jax_envs`), and XLA fuses what it can. With ``--scan`` all
iterations also run inside one compiled ``lax.scan`` (timings are then averages). The algorithm
and network follow :mod:`bench.common` exactly, as the PyTorch baseline does.

    python -m bench.baselines.jax_ppo --env Synthetic-v0 --num-envs 256 --iterations 20
"""

from __future__ import annotations

import math
import os
import sys
import time
from functools import partial
from typing import Any

import numpy as np

from bench.common import (
    BaselineUnavailable,
    Config,
    Result,
    current_rss_bytes,
    main_for,
)


def _imports() -> tuple[Any, Any, Any]:
    try:
        import jax
        import jax.numpy as jnp
        import optax
    except ImportError as err:
        raise BaselineUnavailable(
            f"jax_ppo needs jax and optax ({err.name} is not installed): pip install 'timerl[jax]'"
        ) from err
    return jax, jnp, optax


def init_mlp(key: Any, in_dim: int, out_dim: int, layers: int, size: int, gain: float) -> list:
    """``[(W, b), ...]`` with the orthogonal init of bench.common."""
    jax, jnp, _ = _imports()
    dims = [in_dim] + [size] * layers + [out_dim]
    keys = jax.random.split(key, len(dims) - 1)
    out = []
    for k, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        scale = gain if k == len(dims) - 2 else math.sqrt(2)
        w = jax.nn.initializers.orthogonal(scale)(keys[k], (a, b), jnp.float32)
        out.append((w, jnp.zeros(b, jnp.float32)))
    return out


def mlp(layers: list, x: Any) -> Any:
    jax, jnp, _ = _imports()
    for w, b in layers[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = layers[-1]
    return x @ w + b


def policy(params: dict, obs: Any, discrete: bool) -> tuple[Any, Any]:
    """Logits (discrete) or ``(mean, log_std)`` (continuous) for flat observations."""
    out = mlp(params["actor"], obs)
    return (out, None) if discrete else (out, params["log_std"])


def init_minatar_cnn(key: Any, obs_shape: tuple[int, ...], actions: int) -> dict:
    """The MinAtar paper's network over channels-last ``(H, W, C)`` images: conv 16 3x3 (HWIO
    kernel), ReLU, flatten, dense 128, ReLU, shared by a policy head (gain 0.01) and a value
    head (gain 1); orthogonal init, gain sqrt(2) in the trunk, zero biases."""
    jax, jnp, _ = _imports()
    height, width, channels = obs_shape
    k_conv, k_dense, k_pi, k_v = jax.random.split(key, 4)
    ortho = jax.nn.initializers.orthogonal
    features = 16 * (height - 2) * (width - 2)
    return {
        "conv": (ortho(math.sqrt(2))(k_conv, (3, 3, channels, 16)), jnp.zeros(16)),
        "dense": (ortho(math.sqrt(2))(k_dense, (features, 128)), jnp.zeros(128)),
        "pi": (ortho(0.01)(k_pi, (128, actions)), jnp.zeros(actions)),
        "v": (ortho(1.0)(k_v, (128, 1)), jnp.zeros(1)),
    }


def minatar_cnn(params: dict, obs: Any) -> tuple[Any, Any]:
    """``(logits, value)`` for a batch of ``(H, W, C)`` images."""
    jax, jnp, _ = _imports()
    w, b = params["conv"]
    x = jax.lax.conv_general_dilated(
        obs, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    x = jax.nn.relu(x + b).reshape(obs.shape[0], -1)
    w, b = params["dense"]
    x = jax.nn.relu(x @ w + b)
    (wp, bp), (wv, bv) = params["pi"], params["v"]
    return x @ wp + bp, (x @ wv + bv)[:, 0]


def actor_critic(params: dict, obs: Any, discrete: bool, cnn: bool) -> tuple[tuple, Any]:
    """The policy head and the value of a batch of observations (images for the CNN)."""
    if cnn:
        logits, value = minatar_cnn(params, obs)
        return (logits, None), value
    flat = obs.reshape(obs.shape[0], -1)
    return policy(params, flat, discrete), mlp(params["critic"], flat)[:, 0]


def log_prob_entropy(head: tuple[Any, Any], actions: Any, discrete: bool) -> tuple[Any, Any]:
    jax, jnp, _ = _imports()
    out, log_std = head
    if discrete:
        logp_all = jax.nn.log_softmax(out)
        logp = jnp.take_along_axis(logp_all, actions[..., None], axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        return logp, entropy
    z = (actions - out) / jnp.exp(log_std)
    logp = jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi), axis=-1)
    entropy = jnp.sum(log_std + 0.5 + 0.5 * math.log(2 * math.pi)) * jnp.ones(out.shape[:-1])
    return logp, entropy


def sample(key: Any, head: tuple[Any, Any], discrete: bool) -> Any:
    jax, jnp, _ = _imports()
    out, log_std = head
    if discrete:
        return jax.random.categorical(key, out)
    return out + jnp.exp(log_std) * jax.random.normal(key, out.shape)


def make_env_step(cfg: Config, env: Any) -> Any:
    """One rollout step for ``lax.scan``: act on the carried observation, record it with the
    action, step the env. ``carry = (params, env_state, obs, key, ep_ret, ret_sum, count)``."""
    jax, jnp, _ = _imports()
    discrete, cnn = env.discrete, cfg.policy == "minatar_cnn"

    def env_step(carry: tuple, _: Any) -> tuple[tuple, dict]:
        params, env_state, obs, key, ep_ret, ret_sum, count = carry
        key, k_act = jax.random.split(key)
        head, value = actor_critic(params, obs, discrete, cnn)
        action = sample(k_act, head, discrete)
        logp, _ = log_prob_entropy(head, action, discrete)
        rec = {"obs": obs, "actions": action, "logp": logp, "value": value}  # acted on
        env_state, obs, reward, done = env.step(env_state, action, env.params)
        ep_ret = ep_ret + reward
        ret_sum = ret_sum + jnp.sum(jnp.where(done, ep_ret, 0.0))
        count = count + jnp.sum(done)
        ep_ret = jnp.where(done, 0.0, ep_ret)
        rec |= {"reward": reward, "done": done.astype(jnp.float32)}
        return (params, env_state, obs, key, ep_ret, ret_sum, count), rec

    return env_step


def make_iteration(cfg: Config, env: Any, tx: Any) -> Any:
    """One PPO iteration as a pure function ``runner -> (runner, (return_sum, episodes))``."""
    jax, jnp, _ = _imports()
    lax = jax.lax
    T, discrete = cfg.num_steps, env.discrete
    cnn = cfg.policy == "minatar_cnn"
    ent = cfg.entropy_coef(discrete)
    n, mb_size = cfg.batch_size, cfg.batch_size // cfg.minibatches
    env_step = make_env_step(cfg, env)

    def gae(traj: dict, last_value: Any) -> Any:
        def back(carry: tuple, x: tuple) -> tuple[tuple, Any]:
            running, next_value = carry
            reward, done, value = x
            live = 1.0 - done
            delta = reward + cfg.gamma * next_value * live - value
            running = delta + cfg.gamma * cfg.gae_lambda * live * running
            return (running, value), running

        init = (jnp.zeros_like(last_value), last_value)
        _, adv = lax.scan(back, init, (traj["reward"], traj["done"], traj["value"]), reverse=True)
        return adv

    def loss_fn(params: dict, mb: dict) -> Any:
        head, value = actor_critic(params, mb["obs"], discrete, cnn)
        logp, entropy = log_prob_entropy(head, mb["actions"], discrete)
        adv = mb["adv"]
        if cfg.norm_adv:
            adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
        ratio = jnp.exp(logp - mb["logp"])
        clipped = jnp.clip(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)
        pg = jnp.maximum(-adv * ratio, -adv * clipped).mean()
        v_loss = 0.5 * jnp.mean((value - mb["returns"]) ** 2)
        return pg + cfg.vf_coef * v_loss - ent * entropy.mean()

    def sgd_step(state: tuple, mb: dict) -> tuple[tuple, None]:
        params, opt_state = state
        grads = jax.grad(loss_fn)(params, mb)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
        return (params, opt_state), None

    def epoch(carry: tuple, key: Any) -> tuple[tuple, None]:
        batch = carry[2]
        if cfg.minibatches == 1:
            state, _ = sgd_step(carry[:2], batch)
            return (*state, batch), None
        perm = jax.random.permutation(key, n)
        mbs = jax.tree_util.tree_map(
            lambda x: x[perm].reshape((cfg.minibatches, mb_size, *x.shape[1:])), batch
        )
        state, _ = lax.scan(sgd_step, carry[:2], mbs)
        return (*state, batch), None

    def iteration(runner: dict) -> tuple[dict, tuple[Any, Any]]:
        params, opt_state = runner["params"], runner["opt_state"]
        zero = jnp.zeros((), jnp.float32)
        carry = (params, runner["env_state"], runner["obs"], runner["key"], runner["ep_ret"])
        carry, traj = lax.scan(env_step, (*carry, zero, zero), None, length=T)
        _, env_state, obs, key, ep_ret, ret_sum, count = carry
        _, last_value = actor_critic(params, obs, discrete, cnn)
        adv = gae(traj, last_value)
        batch = {
            "obs": traj["obs"].reshape((n, *traj["obs"].shape[2:])),
            "actions": traj["actions"].reshape((n, *traj["actions"].shape[2:])),
            "logp": traj["logp"].reshape(n),
            "adv": adv.reshape(n),
            "returns": (adv + traj["value"]).reshape(n),
        }
        key, k_epochs = jax.random.split(key)
        (params, opt_state, _), _ = lax.scan(
            epoch, (params, opt_state, batch), jax.random.split(k_epochs, cfg.epochs)
        )
        runner = {"params": params, "opt_state": opt_state, "env_state": env_state}
        runner |= {"obs": obs, "key": key, "ep_ret": ep_ret}
        return runner, (ret_sum, count)

    return iteration


def run(config: Config, scan_iterations: bool = False) -> Result:
    """Train jitted PPO; ``setup_s`` includes XLA compilation, done before the first iteration."""
    jax, jnp, optax = _imports()
    from timerl.rl.envs.jax_envs import make_jax_env

    cfg = config.resolved()
    base_rss = current_rss_bytes()
    start = time.perf_counter()
    platform = {"cuda": "gpu"}.get(cfg.device.split(":")[0], cfg.device.split(":")[0])
    try:
        device = jax.devices(platform)[0]
    except RuntimeError as err:
        raise BaselineUnavailable(f"jax has no {cfg.device!r} device: {err}") from err
    with jax.default_device(device):
        env = make_jax_env(cfg.env_id, num_envs=cfg.num_envs, seed=cfg.seed, **cfg.env_kwargs)
        obs_dim = int(np.prod(env.obs_shape))
        out_dim = env.num_actions if env.discrete else int(np.prod(env.action_shape))
        key = jax.random.key(cfg.seed)
        key, k_actor, k_critic, k_env = jax.random.split(key, 4)
        if cfg.policy == "minatar_cnn":
            if len(env.obs_shape) != 3 or not env.discrete:
                raise ValueError(
                    f"{cfg.env_id}: the MinAtar CNN needs (H, W, C) images and discrete "
                    f"actions, got observations {env.obs_shape}"
                )
            params = init_minatar_cnn(k_actor, env.obs_shape, out_dim)
        else:
            params = {
                "actor": init_mlp(
                    k_actor, obs_dim, out_dim, cfg.hidden_layers, cfg.hidden_size, 0.01
                ),
                "critic": init_mlp(k_critic, obs_dim, 1, cfg.hidden_layers, cfg.hidden_size, 1.0),
            }
        if not env.discrete:
            params["log_std"] = jnp.zeros(out_dim, jnp.float32)
        tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr, eps=1e-5))
        env_state, obs = env.reset(k_env, env.params)
        runner = {"params": params, "opt_state": tx.init(params), "env_state": env_state}
        runner |= {"obs": obs, "key": key, "ep_ret": jnp.zeros(cfg.num_envs, jnp.float32)}
        # Distinct buffers for every leaf: equal constants (zeros) may share one, and the
        # runner is donated to each call so the iteration updates it in place.
        runner = jax.tree_util.tree_map(jnp.copy, runner)
        iteration = make_iteration(cfg, env, tx)
        if scan_iterations:

            def many(r: dict) -> tuple[dict, tuple[Any, Any]]:
                return jax.lax.scan(lambda c, _: iteration(c), r, None, length=cfg.iterations)

            step_fn = jax.jit(many, donate_argnums=0).lower(runner).compile()
        else:
            step_fn = jax.jit(iteration, donate_argnums=0).lower(runner).compile()
        setup_s = time.perf_counter() - start

        iter_seconds: list[float] = []
        metrics: list[tuple[float, float]] = []
        if scan_iterations:
            t0 = time.perf_counter()
            runner, (ret_sum, count) = step_fn(runner)
            jax.block_until_ready(runner)
            total = time.perf_counter() - t0
            iter_seconds = [total / cfg.iterations] * cfg.iterations
            metrics = list(
                zip(np.asarray(ret_sum).tolist(), np.asarray(count).tolist(), strict=True)
            )
        else:
            for _ in range(cfg.iterations):
                t0 = time.perf_counter()
                runner, (ret_sum, count) = step_fn(runner)
                jax.block_until_ready(runner)
                iter_seconds.append(time.perf_counter() - t0)
                metrics.append((float(ret_sum), float(count)))
    returns = [s / c if c > 0 else float("nan") for s, c in metrics]
    fw_peak = None
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        fw_peak = int(stats["peak_bytes_in_use"])
    return Result.measured(
        "jax_ppo" + ("_scan" if scan_iterations else ""),
        cfg,
        iter_seconds,
        returns,
        start=start,
        setup_s=setup_s,
        framework_peak_bytes=fw_peak,
        base_rss_bytes=base_rss,
    )


def pin_xla_threads() -> None:
    """Keep XLA's CPU backend on one thread, like the pinned PyTorch runs (before jax loads)."""
    if "jax" in sys.modules:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "multi_thread_eigen" not in flags:
        extra = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{flags} {extra}".strip()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    scan = "--scan" in argv
    argv = [a for a in argv if a != "--scan"]
    threads = argv[argv.index("--threads") + 1] if "--threads" in argv else "1"
    if threads == "1":
        pin_xla_threads()
    return main_for(partial(run, scan_iterations=scan), __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
