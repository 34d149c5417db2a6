"""The general pieces off-policy programs are built from: replay, target copies, Polyak
updates, the tanh-squashed Normal, and env steps that report terminations and final obs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import timerl as tl
from timerl.api.distributions import TanhNormal
from timerl.api.nn import MLP
from timerl.api.optim import SGD, Polyak
from timerl.rl.algos.replay import Replay


def _counter(i, t, T, B):
    """x[i, t] = [10 * (i * T + t) + b for each env b]: every row names its own point."""
    x = tl.RecurrentTensor.placeholder((B,), "float32", (i, t), name="x")
    x[0, 0] = tl.from_numpy(np.arange(B, dtype=np.float32))
    x[i, t + 1] = x[i, t] + 10.0
    x[i + 1, 0] = x[i, T - 1] + 10.0
    return x


def test_replay_ring_holds_the_last_window_and_samples_inside_it():
    T, B, W, M, I, U = 3, 2, 4, 16, 9, 3
    ctx = tl.Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    with ctx:
        x = _counter(i, t, T, B)
        replay = Replay(i, t, u, T, B, W, M)
        ring, sample = replay.buffer(x), replay.sample(x)
        rows = replay.rows()
    ring_v, sample_v, rows_v = tl.evaluate([ring, sample, rows], bounds={"I": I, "T": T, "U": U})
    assert ring_v.shape == (I, W * T * B) and sample_v.shape == (I, U, M)
    for it in range(I):
        written = {10 * (k * T + s) + b for k in range(it + 1) for s in range(T) for b in range(B)}
        window = {v for v in written if v >= 10 * max(0, it - W + 1) * T}
        filled = min(it + 1, W) * T * B
        # the filled rows are exactly the last W iterations' transitions, the rest zeros
        assert set(ring_v[it, :filled].tolist()) == window, it
        assert not ring_v[it, filled:].any()
        assert set(sample_v[it].ravel().tolist()) <= window
        assert rows_v[it].min() >= 0 and rows_v[it].max() < filled
        # slot it % W holds this iteration's rows in (t, env) order
        slot = ring_v[it, (it % W) * T * B : (it % W + 1) * T * B]
        np.testing.assert_array_equal(
            slot, [10 * (it * T + s) + b for s in range(T) for b in range(B)]
        )
    # different updates draw different rows, and once full the whole window gets sampled
    assert not np.array_equal(sample_v[-1, 0], sample_v[-1, 1])


def test_replay_samples_stay_aligned_across_tensors():
    T, B, W, M = 2, 3, 2, 8
    ctx = tl.Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    with ctx:
        x = _counter(i, t, T, B)
        y = x * 2.0 + 1.0
        replay = Replay(i, t, u, T, B, W, M)
        sx, sy = replay.sample(x), replay.sample(y)
    vx, vy = tl.evaluate([sx, sy], bounds={"I": 5, "T": T, "U": 2})
    np.testing.assert_array_equal(vy, vx * 2.0 + 1.0)


def test_replay_rejects_tensors_it_cannot_hold():
    ctx = tl.Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    with ctx:
        replay = Replay(i, t, u, 4, 2, 3, 8)
        over_i = tl.RecurrentTensor.placeholder((2,), "float32", (i,), name="per_iter")
        with pytest.raises(tl.ProgramError, match="per_iter must run over \\(i, t\\)"):
            replay.buffer(over_i)
        wrong_rows = tl.RecurrentTensor.placeholder((5,), "float32", (i, t), name="wide")
        with pytest.raises(tl.ProgramError, match="wide must have one row per env \\(2\\)"):
            replay.buffer(wrong_rows)
        with pytest.raises(tl.ProgramError, match="batch_size \\(0\\)"):
            Replay(i, t, u, 4, 2, 3, 0)


def _linear_program(tau, every, lr=0.5):
    """w[i+1] = w[i] - lr * grad of sum(w), a copy of w, and Polyak targets over it."""
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        net = MLP([2, 1], domain=(i,), seed=0, name="net")
        target = net.copy("target")
        x = tl.from_numpy(np.ones((1, 2), np.float32))
        loss = net.at(i)(x).sum()
        params = net.parameters()
        loss.backward(inputs=params)
        SGD(params, lr=lr).step()
        Polyak(target.parameters(), params, tau=tau, every=every).step()
    return params, target.parameters()


@pytest.mark.parametrize(("tau", "every"), [(0.25, 1), (1.0, 3), (0.5, 2)])
def test_polyak_trails_the_source_parameters(tau, every):
    I = 7
    src, tgt = _linear_program(tau, every)
    values = tl.evaluate(src + tgt, bounds={"I": I})
    n = len(src)
    for s_v, t_v in zip(values[:n], values[n:], strict=True):
        np.testing.assert_allclose(t_v[0], s_v[0])  # the copy starts equal
        expect = t_v[0].astype(np.float64)
        for it in range(I - 1):
            if (it + 1) % every == 0:
                expect = expect + (s_v[it] - expect) * tau
            np.testing.assert_allclose(t_v[it + 1], expect, rtol=1e-5, atol=1e-6)
        assert not np.allclose(s_v[-1], s_v[0])  # the source did move


def test_polyak_and_copy_reject_bad_input():
    ctx = tl.Context(dims=("i", "u"))
    i, u = ctx.dims
    with ctx:
        a = MLP([2, 3], domain=(i,), seed=0, name="a")
        b = MLP([3, 2], domain=(i,), seed=0, name="b")
        with pytest.raises(tl.ProgramError, match="target a.0.weight .* does not match"):
            Polyak(a.parameters(), b.parameters())
        with pytest.raises(tl.ProgramError, match="tau must lie in"):
            Polyak(a.parameters(), a.copy().parameters(), tau=0.0)
        with pytest.raises(tl.ProgramError, match="2 targets but 1 sources"):
            Polyak(a.parameters(), a.parameters()[:1])
        with pytest.raises(tl.ProgramError, match="copy: .* iteration dim alone"):
            a.unroll(u).copy()


def test_tanh_normal_matches_torch():
    rng = np.random.default_rng(0)
    mean = rng.standard_normal((5, 2)).astype(np.float32)
    std = np.exp(rng.standard_normal((5, 2)) * 0.5).astype(np.float32)
    noise = rng.standard_normal((5, 2)).astype(np.float32)
    low, high = np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32)
    with tl.Context(dims=("t",)):
        dist = TanhNormal(tl.from_numpy(mean), tl.from_numpy(std), low, high)
        action, logp = dist.rsample_and_log_prob(tl.from_numpy(noise))
        mode = dist.mode
    got_a, got_lp, got_mode = tl.evaluate([action, logp, mode])
    f64 = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    x = f64(mean) + f64(std) * f64(noise)
    scale = torch.tensor((high - low) / 2, dtype=torch.float64)
    center = torch.tensor((high + low) / 2, dtype=torch.float64)
    base = torch.distributions.Normal(f64(mean), f64(std))
    ref_lp = base.log_prob(x) - torch.log(scale * (1 - torch.tanh(x) ** 2) + 1e-6)
    np.testing.assert_allclose(got_a, (torch.tanh(x) * scale + center).numpy(), rtol=1e-5)
    np.testing.assert_allclose(got_lp, ref_lp.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_mode, np.tanh(mean) * (high - low) / 2 + (high + low) / 2, 1e-5)
    assert (got_a >= low).all() and (got_a <= high).all()


def test_env_step_full_reports_terminations_and_final_observations():
    env = tl.rl.make_env("CartPole-v1", num_envs=3, seed=0)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        obs = tl.RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (t,), name="obs")
        obs[0] = env.reset()
        action = tl.full((3,), 1, dtype="int64") + obs.sum(-1).long() * 0
        next_obs, reward, done, terminated, final_obs = env.step(action, full=True)
        obs[t + 1] = next_obs
    vals = tl.evaluate([next_obs, done, terminated, final_obs], bounds={"T": 40})
    nxt, d, term, final = vals
    assert d.any(), "always pushing right ends CartPole episodes within 40 steps"
    np.testing.assert_array_equal(term, d)  # CartPole ends by falling, never by time here
    np.testing.assert_array_equal(final[~d], nxt[~d])
    # an ended episode's final obs is where the pole fell; the returned obs is a fresh start
    assert (np.abs(final[d][:, 2]) > 0.2).all()
    assert (np.abs(nxt[d]) < 0.05).all()


@pytest.mark.parametrize("full", [False, True])
def test_the_env_keeps_final_observations_only_for_a_program_that_reads_them(full):
    """A program whose steps never ask for ``final_obs`` must not leave the env holding a
    batch of them: at the end of a rollout they would live through the whole update."""
    env = tl.rl.make_env("Synthetic-v0", num_envs=2, seed=0, episode_length=3)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        obs = tl.RecurrentTensor.placeholder(env.batch_obs_shape, "float32", (t,), name="obs")
        obs[0] = env.reset()
        action = tl.zeros((2, *env.action_shape)) + obs.sum() * 0.0
        obs[t + 1] = env.step(action, full=full)[0]
    tl.evaluate(obs[0:3].sum(), bounds={"T": 3})  # every episode ends at the third step
    assert env.vec.truncated.all() and env.vec.keep_final_obs is full
    assert (env.vec.final_obs is not None) is full
