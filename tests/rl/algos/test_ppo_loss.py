"""timerl's ppo_loss against a plain PyTorch PPO-clip loss: values and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import timerl as tl
from timerl.rl.algos import Policy, ppo_loss

N = 64
HIDDEN = (16, 16)


def _policy(env_id, seed):
    env = tl.rl.make_env(env_id, 4)
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        policy = Policy(env, HIDDEN, (i,), seed=seed)
    env.close()
    return ctx, policy


def _weights(policy):
    params = policy.parameters()
    values = tl.evaluate(params, bounds={"I": 1})
    return {
        p.name: torch.tensor(v[0], dtype=torch.float64) for p, v in zip(params, values, strict=True)
    }


def _mlp(w, prefix, x):
    n = len([k for k in w if k.startswith(prefix) and k.endswith(".weight")])
    for k in range(n):
        x = x @ w[f"{prefix}.{k}.weight"] + w[f"{prefix}.{k}.bias"]
        if k < n - 1:
            x = torch.tanh(x)
    return x


def torch_ppo_loss(w, discrete, obs, act, old_logp, adv, ret, clip, vf_coef, ent_coef, norm_adv):
    """A plain (CleanRL-style) PPO-clip loss."""
    out = _mlp(w, "actor", obs)
    if discrete:
        dist = torch.distributions.Categorical(logits=out)
        new_logp = dist.log_prob(act)
        entropy = dist.entropy().mean()
    else:
        std = w["policy.log_std"].exp().expand_as(out)
        dist = torch.distributions.Normal(out, std)
        new_logp = dist.log_prob(act).sum(-1)
        entropy = dist.entropy().sum(-1).mean()
    value = _mlp(w, "critic", obs).squeeze(-1)
    if norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    pg_loss = torch.max(pg1, pg2).mean()
    v_loss = 0.5 * ((value - ret) ** 2).mean()
    loss = pg_loss - ent_coef * entropy + vf_coef * v_loss
    approx_kl = ((ratio - 1) - log_ratio).mean()
    return {
        "loss": loss,
        "policy_loss": pg_loss,
        "value_loss": v_loss,
        "entropy": entropy,
        "approx_kl": approx_kl,
    }, new_logp


def _batch(env_id, w, discrete, seed):
    rng = np.random.default_rng(seed)
    obs_dim = w["actor.0.weight"].shape[0]
    obs = rng.standard_normal((N, obs_dim)).astype(np.float32)
    if discrete:
        n_act = w[max(k for k in w if k.startswith("actor") and k.endswith("weight"))].shape[1]
        act = rng.integers(0, n_act, N)
    else:
        act = rng.standard_normal((N, 1)).astype(np.float32)
    adv = (rng.standard_normal(N) * 2 + 0.5).astype(np.float32)
    ret = rng.standard_normal(N).astype(np.float32)
    # old log-probs: the current ones, perturbed so that many ratios leave the clip range
    with torch.no_grad():
        _, cur = torch_ppo_loss(
            w,
            discrete,
            torch.tensor(obs, dtype=torch.float64),
            torch.tensor(act),
            0.0,
            torch.tensor(adv, dtype=torch.float64),
            torch.tensor(ret, dtype=torch.float64),
            0.2,
            0.5,
            0.0,
            False,
        )
    old_logp = (cur.numpy() + rng.standard_normal(N) * 0.4).astype(np.float32)
    return obs, act, old_logp, adv, ret


CASES = [
    ("CartPole-v1", True, 0.01, True),
    ("CartPole-v1", False, 0.0, True),
    ("CartPole-v1", True, 0.05, False),
    ("Pendulum-v1", True, 0.0, False),
    ("Pendulum-v1", False, 0.01, False),
]


PARAMS = [
    pytest.param(*case, backend, id=f"{name}-{backend}")
    for case, name in zip(
        CASES,
        ["cartpole", "cartpole-nonorm", "cartpole-ent", "pendulum", "pendulum-nonorm-ent"],
        strict=True,
    )
    for backend in ("numpy", "torch")
]


@pytest.mark.parametrize(("env_id", "norm_adv", "ent_coef", "big_clip", "backend"), PARAMS)
def test_ppo_loss_and_gradients_match_torch(env_id, norm_adv, ent_coef, big_clip, backend):
    check_ppo_loss(env_id, norm_adv, ent_coef, big_clip, backend)


def check_ppo_loss(env_id, norm_adv, ent_coef, big_clip, backend):
    ctx, policy = _policy(env_id, seed=3)
    discrete = policy.discrete
    w = _weights(policy)
    obs, act, old_logp, adv, ret = _batch(env_id, w, discrete, seed=5)
    clip = 0.3 if big_clip else 0.2
    vf_coef = 0.7
    params = policy.parameters()
    with ctx:
        parts = ppo_loss(
            policy,
            tl.from_numpy(obs),
            tl.from_numpy(act),
            tl.from_numpy(old_logp),
            tl.from_numpy(adv),
            tl.from_numpy(ret),
            clip=clip,
            vf_coef=vf_coef,
            ent_coef=ent_coef,
            norm_adv=norm_adv,
        )
        parts["loss"].backward(inputs=params)
        grads = [p.grad for p in params]
    names = list(parts)
    got = tl.evaluate([parts[k] for k in names] + grads, bounds={"I": 1}, backend=backend)

    tw = {k: v.clone().requires_grad_() for k, v in w.items()}
    ref, new_logp = torch_ppo_loss(
        tw,
        discrete,
        torch.tensor(obs, dtype=torch.float64),
        torch.tensor(act) if discrete else torch.tensor(act, dtype=torch.float64),
        torch.tensor(old_logp, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(ret, dtype=torch.float64),
        clip,
        vf_coef,
        ent_coef,
        norm_adv,
    )
    ratio = (new_logp - torch.tensor(old_logp, dtype=torch.float64)).exp().detach().numpy()
    assert ((ratio < 1 - clip) | (ratio > 1 + clip)).mean() > 0.2  # clipping is exercised
    ref["loss"].backward()

    assert {p.name for p in params} == set(w)
    for k, value in zip(names, got[: len(names)], strict=True):
        assert value.shape == (1,), k
        np.testing.assert_allclose(value[0], ref[k].item(), rtol=1e-4, atol=1e-5, err_msg=k)
    for p, g in zip(params, got[len(names) :], strict=True):
        assert g.shape == (1, *tw[p.name].shape), p.name
        np.testing.assert_allclose(
            g[0], tw[p.name].grad.numpy(), rtol=1e-3, atol=2e-5, err_msg=p.name
        )


def test_policy_rejects_two_dimensional_box_actions():
    class FakeVec:
        env_id = "Fake2D-v0"

    class FakeEnv:
        obs_shape = (3,)
        discrete = False
        num_actions = None
        action_shape = (2, 2)
        vec = FakeVec()

    with tl.Context(dims=("i",)) as ctx:
        (i,) = ctx.dims
        with pytest.raises(tl.TimerlError, match="Fake2D-v0.*flat Box"):
            Policy(FakeEnv(), HIDDEN, (i,), seed=0)


def test_gaussian_policy_starts_at_the_given_log_std():
    """``log_std_init`` sets the initial spread: the parameter, the entropy and the sampled
    actions' deviations from the mean all agree with a Gaussian of that standard deviation."""
    from timerl.rl.train import build

    program = build(
        "ppo",
        {"env_id": "Pendulum-v1", "num_envs": 2, "num_steps": 4, "hidden": [8]}
        | {"log_std_init": -0.7},
    )
    (log_std,) = [p for p in program.params if p.name == "policy.log_std"]
    (value,) = tl.evaluate([log_std], bounds={"I": 1, **program.bounds})
    np.testing.assert_array_equal(value[0], np.full(1, -0.7, np.float32))
    program.env.close()

    env = tl.rl.make_env("Pendulum-v1", 4)
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    obs = np.random.default_rng(0).standard_normal((4096, 3)).astype(np.float32)
    with ctx:
        policy = Policy(env, HIDDEN, (i,), seed=2, log_std_init=-0.7)
        dist = policy.dist(tl.from_numpy(obs))
        outs = [policy.entropy(dist).mean(), dist.sample() - dist.mean]
    env.close()
    entropy, noise = tl.evaluate(outs, bounds={"I": 1})
    np.testing.assert_allclose(entropy[0], 0.5 + 0.5 * np.log(2 * np.pi) - 0.7, rtol=1e-5)
    assert abs(noise[0].std() - np.exp(-0.7)) < 0.03  # 4096 draws: std error ~0.008


def test_only_halfcheetah_defaults_to_a_narrower_initial_gaussian():
    from timerl.rl.train import make_config

    assert make_config("ppo", {"env_id": "HalfCheetah-v5"}).log_std_init == -0.5
    for env_id in ("Hopper-v5", "Walker2d-v5", "Ant-v5", "Pendulum-v1", "CartPole-v1"):
        assert make_config("ppo", {"env_id": env_id}).log_std_init == 0.0, env_id
    given = {"env_id": "HalfCheetah-v5", "log_std_init": 0.0}
    assert make_config("ppo", given).log_std_init == 0.0
