"""DQN, A2C and SAC losses against plain PyTorch on fixed batches: values and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import timerl as tl
from timerl.rl.algos import Policy
from timerl.rl.algos.a2c import a2c_loss
from timerl.rl.algos.dqn import QNetwork, dqn_loss
from timerl.rl.algos.sac import Actor, Critic, Temperature, sac_losses

N = 48


def f64(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def _weights(params):
    values = tl.evaluate(params, bounds={"I": 1})
    return {p.name: f64(v[0]).requires_grad_() for p, v in zip(params, values, strict=True)}


def _mlp(w, prefix, x, act):
    n = len([k for k in w if k.startswith(prefix + ".") and k.endswith(".weight")])
    for k in range(n):
        x = x @ w[f"{prefix}.{k}.weight"] + w[f"{prefix}.{k}.bias"]
        if k < n - 1:
            x = act(x)
    return x


def _check_grads(params, got, w):
    for p, g in zip(params, got, strict=True):
        assert w[p.name].grad is not None, p.name
        np.testing.assert_allclose(
            g[0], w[p.name].grad.numpy(), rtol=1e-3, atol=2e-5, err_msg=p.name
        )


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_dqn_loss_matches_torch(backend):
    env = tl.rl.make_env("CartPole-v1", 2)
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        q = QNetwork(env, (16, 16), (i,), seed=3)
        target = QNetwork(env, (16, 16), (i,), seed=4)
    env.close()
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((N, 4)).astype(np.float32)
    nxt = rng.standard_normal((N, 4)).astype(np.float32)
    act = rng.integers(0, 2, N)
    rew = rng.standard_normal(N).astype(np.float32)
    term = rng.random(N) < 0.3
    params, tparams = q.parameters(), target.parameters()
    with ctx:
        qi, ti = q.at(i), target.at(i)
        parts = dqn_loss(
            qi,
            ti,
            *(tl.from_numpy(a) for a in (obs, act, rew, nxt, term)),
            gamma=0.97,
        )
        parts["loss"].backward(inputs=params)
        grads = [p.grad for p in params]
    got = tl.evaluate([parts["loss"], parts["q_mean"], *grads], bounds={"I": 1}, backend=backend)

    w = _weights(params)
    wt = {k: v.detach() for k, v in _weights(tparams).items()}
    q_sa = _mlp(w, "q", f64(obs), torch.relu).gather(1, torch.tensor(act)[:, None]).squeeze(1)
    next_q = _mlp(wt, "q", f64(nxt), torch.relu).max(1).values
    y = f64(rew) + 0.97 * (1 - f64(term)) * next_q
    ref = torch.nn.functional.mse_loss(q_sa, y)
    ref.backward()
    np.testing.assert_allclose(got[0][0], ref.item(), rtol=1e-4)
    np.testing.assert_allclose(got[1][0], q_sa.mean().item(), rtol=1e-4, atol=1e-6)
    _check_grads(params, got[2:], w)


@pytest.mark.parametrize(
    ("env_id", "norm_adv", "ent_coef"),
    [("CartPole-v1", False, 0.01), ("CartPole-v1", True, 0.0), ("Pendulum-v1", False, 0.02)],
)
def test_a2c_loss_matches_torch(env_id, norm_adv, ent_coef):
    env = tl.rl.make_env(env_id, 2)
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        policy = Policy(env, (16,), (i,), seed=5)
    env.close()
    rng = np.random.default_rng(1)
    obs_dim = policy.obs_dim
    obs = rng.standard_normal((N, obs_dim)).astype(np.float32)
    act = rng.integers(0, 2, N) if policy.discrete else rng.standard_normal((N, 1))
    act = act.astype(np.int64 if policy.discrete else np.float32)
    adv = (rng.standard_normal(N) * 2 + 0.3).astype(np.float32)
    ret = rng.standard_normal(N).astype(np.float32)
    params = policy.parameters()
    with ctx:
        parts = a2c_loss(
            policy.at(i),
            *(tl.from_numpy(a) for a in (obs, act, adv, ret)),
            vf_coef=0.7,
            ent_coef=ent_coef,
            norm_adv=norm_adv,
        )
        parts["loss"].backward(inputs=params)
        grads = [p.grad for p in params]
    names = list(parts)
    got = tl.evaluate([parts[k] for k in names] + grads, bounds={"I": 1})

    w = _weights(params)
    out = _mlp(w, "actor", f64(obs), torch.tanh)
    if policy.discrete:
        dist = torch.distributions.Categorical(logits=out)
        logp, entropy = dist.log_prob(torch.tensor(act)), dist.entropy().mean()
    else:
        dist = torch.distributions.Normal(out, w["policy.log_std"].exp().expand_as(out))
        logp, entropy = dist.log_prob(f64(act)).sum(-1), dist.entropy().sum(-1).mean()
    value = _mlp(w, "critic", f64(obs), torch.tanh).squeeze(-1)
    a = f64(adv)
    if norm_adv:
        a = (a - a.mean()) / (a.std() + 1e-8)
    pg = -(logp * a).mean()
    v_loss = 0.5 * ((value - f64(ret)) ** 2).mean()
    ref = {
        "loss": pg - ent_coef * entropy + 0.7 * v_loss,
        "policy_loss": pg,
        "value_loss": v_loss,
        "entropy": entropy,
    }
    ref["loss"].backward()
    for k, v in zip(names, got[: len(names)], strict=True):
        np.testing.assert_allclose(v[0], ref[k].item(), rtol=1e-4, atol=1e-6, err_msg=k)
    _check_grads(params, got[len(names) :], w)


def test_sac_losses_match_torch():
    env = tl.rl.make_env("Pendulum-v1", 2)
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        actor = Actor(env, (16, 16), (i,), seed=1)
        q1 = Critic(env, (16, 16), (i,), seed=2, name="q1")
        q2 = Critic(env, (16, 16), (i,), seed=3, name="q2")
        t1 = Critic(env, (16, 16), (i,), seed=4, name="t1")
        t2 = Critic(env, (16, 16), (i,), seed=5, name="t2")
        temp = Temperature(0.3, (i,))
    env.close()
    rng = np.random.default_rng(2)
    obs = rng.standard_normal((N, 3)).astype(np.float32)
    nxt = rng.standard_normal((N, 3)).astype(np.float32)
    act = rng.uniform(-2, 2, (N, 1)).astype(np.float32)
    rew = rng.standard_normal(N).astype(np.float32)
    term = rng.random(N) < 0.2
    noise_next = rng.standard_normal((N, 1)).astype(np.float32)
    noise_pi = rng.standard_normal((N, 1)).astype(np.float32)
    params = actor.parameters() + q1.parameters() + q2.parameters() + temp.parameters()
    tparams = t1.parameters() + t2.parameters()
    gamma, target_entropy = 0.95, -1.0
    with ctx:
        parts = sac_losses(
            actor.at(i),
            q1.at(i),
            q2.at(i),
            t1.at(i),
            t2.at(i),
            temp.at(i).log_alpha,
            *(tl.from_numpy(a) for a in (obs, act, rew, nxt, term)),
            gamma=gamma,
            target_entropy=target_entropy,
            noise=(tl.from_numpy(noise_next), tl.from_numpy(noise_pi)),
        )
        parts["loss"].backward(inputs=params)
        grads = [p.grad for p in params]
    names = list(parts)
    got = tl.evaluate([parts[k] for k in names] + grads, bounds={"I": 1})

    w = _weights(params)
    wt = {k: v.detach() for k, v in _weights(tparams).items()}

    def policy(o, eps):
        out = _mlp(w, "actor", o, torch.relu)
        mean, raw = out[:, :1], torch.tanh(out[:, 1:])
        log_std = -5.0 + 0.5 * 7.0 * (raw + 1)
        x = mean + log_std.exp() * f64(eps)
        logp = torch.distributions.Normal(mean, log_std.exp()).log_prob(x)
        logp = logp - torch.log(2.0 * (1 - torch.tanh(x) ** 2) + 1e-6)
        return 2.0 * torch.tanh(x), logp.sum(-1)

    def q(ws, name, o, a):
        return _mlp(ws, name, torch.cat([o, a], -1), torch.relu).squeeze(-1)

    alpha = w["log_alpha"].exp()
    with torch.no_grad():
        a2, lp2 = policy(f64(nxt), noise_next)
        soft = torch.min(q(wt, "t1", f64(nxt), a2), q(wt, "t2", f64(nxt), a2)) - alpha * lp2
        y = f64(rew) + gamma * (1 - f64(term)) * soft
    q_loss = ((q(w, "q1", f64(obs), f64(act)) - y) ** 2).mean()
    q_loss = q_loss + ((q(w, "q2", f64(obs), f64(act)) - y) ** 2).mean()
    a_pi, lp = policy(f64(obs), noise_pi)
    wd = {k: v.detach() for k, v in w.items()}
    q_pi = torch.min(q(wd, "q1", f64(obs), a_pi), q(wd, "q2", f64(obs), a_pi))
    actor_loss = (alpha.detach() * lp - q_pi).mean()
    alpha_loss = -(w["log_alpha"] * (lp.detach() + target_entropy)).mean()
    ref = {
        "loss": q_loss + actor_loss + alpha_loss,
        "q_loss": q_loss,
        "actor_loss": actor_loss,
        "alpha_loss": alpha_loss,
        "entropy": -lp.mean(),
        "alpha": alpha,
    }
    ref["loss"].backward()
    for k, v in zip(names, got[: len(names)], strict=True):
        np.testing.assert_allclose(v[0], ref[k].item(), rtol=1e-4, atol=1e-5, err_msg=k)
    _check_grads(params, got[len(names) :], w)
