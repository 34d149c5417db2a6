"""Recurrent PPO: the LSTM policy's segment recurrence (values and gradients) against a torch
reimplementation, the partially observed CartPole, and the policy choice's errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import timerl as tl
from timerl.errors import ProgramError
from timerl.rl.algos.policy_gradient import PPOConfig, ReinforceConfig, ppo
from timerl.rl.algos.recurrent import LSTMPolicy, segment_features

rng = np.random.default_rng(7)


def _close(got, want, tol=2e-4):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-3)
    assert float(np.abs(got - want).max(initial=0.0)) <= tol * scale, (got, want)


def test_segment_values_and_gradients_match_torch():
    """Features recomputed over a 5-step segment from its first state, reset where an
    episode ended, then the actor's log-probabilities and the critic, each on its own LSTM:
    values and every parameter's gradient equal torch.autograd's over the same recurrence."""
    steps, batch, obs_dim, size, actions = 5, 3, 2, 4, 2
    xs = rng.standard_normal((steps, batch, obs_dim)).astype(np.float32)
    dones = np.zeros((steps, batch), bool)
    dones[1, 0] = dones[3, 2] = True
    h0 = (0.5 * rng.standard_normal((batch, 4 * size))).astype(np.float32)
    acts = rng.integers(0, actions, (steps, batch))
    env = SimpleNamespace(discrete=True, obs_shape=(obs_dim,), num_actions=actions)
    ctx = tl.Context(dims=("s",))
    (s,), (big_s,) = ctx.dims, ctx.bounds
    with ctx:
        policy = LSTMPolicy(env, size, (), seed=3)
        obs = tl.from_numpy(xs, domain=(s,))
        done = tl.from_numpy(dones, domain=(s,))
        width = policy.feature_size
        h = segment_features(policy.step, (), tl.from_numpy(h0), obs[s], done[s], s, width)
        h = h.reshape(steps * batch, width)
        logp = policy.log_prob(policy.dist(h), tl.from_numpy(acts.reshape(-1)))
        value = policy.value(h)
        loss = (logp * value.detach()).sum() + (value * value).sum()
        params = policy.parameters()
        loss.backward(inputs=params)
        outs = [logp, value] + [p.grad for p in params]
        got = tl.evaluate(outs + params, bounds={big_s: steps})
        ref = tl.evaluate(outs, bounds={big_s: steps}, optimize=False)
    for g, r in zip(got[: len(outs)], ref, strict=True):
        _close(g, r, 1e-5)
    weights = [
        torch.tensor(np.asarray(w, np.float64), requires_grad=True) for w in got[len(outs) :]
    ]
    enc_w, enc_b, w_ih, w_hh, b_ih, b_hh, act_w, act_b = weights[:8]
    cenc_w, cenc_b, cw_ih, cw_hh, cb_ih, cb_hh, crit_w, crit_b = weights[8:]

    def lstm(x, hh, cc, w_ih, w_hh, b_ih, b_hh):
        z = x @ w_ih + b_ih + hh @ w_hh + b_hh
        i, f, g, o = (z[:, n * size : (n + 1) * size] for n in range(4))
        c2 = torch.sigmoid(f) * cc + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c2), c2

    state = torch.tensor(h0, dtype=torch.float64)
    feats, critic_feats = [], []
    for k in range(steps):
        obs_k = torch.tensor(xs[k], dtype=torch.float64)
        part = [state[:, n * size : (n + 1) * size] for n in range(4)]  # h_a, h_c, c_a, c_c
        h_a, c_a = lstm(torch.tanh(obs_k @ enc_w + enc_b), part[0], part[2], w_ih, w_hh, b_ih, b_hh)
        h_c, c_c = lstm(
            torch.tanh(obs_k @ cenc_w + cenc_b), part[1], part[3], cw_ih, cw_hh, cb_ih, cb_hh
        )
        feats.append(h_a)
        critic_feats.append(h_c)
        keep = torch.tensor(1.0 - dones[k], dtype=torch.float64)[:, None]
        state = torch.cat([h_a, h_c, c_a, c_c], -1) * keep
    hs = torch.cat(feats)
    t_logp = torch.log_softmax(hs @ act_w + act_b, -1)[
        torch.arange(steps * batch), acts.reshape(-1)
    ]
    t_value = (torch.cat(critic_feats) @ crit_w + crit_b).squeeze(-1)
    t_loss = (t_logp * t_value.detach()).sum() + (t_value * t_value).sum()
    grads = torch.autograd.grad(t_loss, weights)
    _close(got[0], t_logp.detach().numpy())
    _close(got[1], t_value.detach().numpy())
    for g, w in zip(got[2 : len(outs)], grads, strict=True):
        _close(g, w.numpy())


def test_cartpole_without_velocities_observes_position_and_angle():
    from timerl.rl.envs import make_env

    full, part = make_env("CartPole-v1", 3, 5), make_env("CartPoleNoVel-v1", 3, 5)
    assert part.obs_shape == (2,)
    np.testing.assert_array_equal(part.reset(), full.reset()[:, [0, 2]])
    for _ in range(40):  # the same trajectories, episode ends included
        a = np.ones(3, np.int64)
        o_full, r_full, d_full = full.step(a)[:3]
        o_part, r_part, d_part = part.step(a)[:3]
        np.testing.assert_array_equal(o_part, o_full[:, [0, 2]])
        np.testing.assert_array_equal(d_part, d_full)
    import gymnasium as gym

    assert gym.make("CartPoleNoVel-v1").observation_space.shape == (2,)


def test_lstm_for_an_algorithm_without_recurrence_names_those_with_it():
    with pytest.raises(
        ProgramError, match=r"reinforce: policy 'lstm' needs recurrent support.*a2c, ppo"
    ):
        ReinforceConfig(policy="lstm")
    with pytest.raises(ProgramError, match="policy must be one of"):
        PPOConfig(policy="transformer")


def test_recurrent_minibatches_are_whole_envs():
    with pytest.raises(ProgramError, match="must divide num_envs=6"):
        ppo(PPOConfig(env_id="CartPoleNoVel-v1", policy="lstm", num_envs=6, minibatches=4))


def test_value_loss_leaves_the_actors_network_alone():
    """Actor and critic run separate LSTMs: the value loss (on unnormalised returns) has no
    gradient into the actor's encoder and cell, so it cannot saturate the actor's features
    (with one shared LSTM it did, and the policy stayed uniform on CartPoleNoVel-v1)."""
    steps, batch, obs_dim, size = 4, 2, 2, 3
    xs = rng.standard_normal((steps, batch, obs_dim)).astype(np.float32)
    env = SimpleNamespace(discrete=True, obs_shape=(obs_dim,), num_actions=2)
    ctx = tl.Context(dims=("s",))
    (s,), (big_s,) = ctx.dims, ctx.bounds
    with ctx:
        policy = LSTMPolicy(env, size, (), seed=1)
        obs = tl.from_numpy(xs, domain=(s,))
        done = tl.from_numpy(np.zeros((steps, batch), bool), domain=(s,))
        first = policy.zero_state(batch)
        width = policy.feature_size
        h = segment_features(policy.step, (), first, obs[s], done[s], s, width)
        h = h.reshape(steps * batch, width)
        value_loss = ((policy.value(h) - 20.0) ** 2.0).mean()
        params = policy.parameters()
        value_loss.backward(inputs=params)
        reached = [p for p in params if p.grad is not None]
        got = tl.evaluate([p.grad for p in reached], bounds={big_s: steps})
    moved = {p.name: float(np.abs(g).max()) for p, g in zip(reached, got, strict=True)}
    actor_side = [n for n in moved if n.startswith(("encoder.", "lstm.", "actor."))]
    assert all(moved[n] == 0.0 for n in actor_side), moved
    assert sorted(n for n in moved if n not in actor_side) == sorted(
        p.name for p in params if p.name.startswith("critic")
    )
    assert all(moved[n] > 0.0 for n in moved if n not in actor_side), moved
