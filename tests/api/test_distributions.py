"""Categorical and Normal against torch.distributions; seeded, reproducible sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import timerl as tl

BACKENDS = ["numpy", "torch"]


def _t(x):
    return torch.tensor(np.asarray(x), dtype=torch.float64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_categorical_log_prob_entropy_probs(backend, scale):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((6, 5)) * scale).astype(np.float32)
    acts = rng.integers(0, 5, 6)
    with tl.Context(dims=("t",)):
        dist = tl.distributions.Categorical(tl.from_numpy(logits))
        outs = [dist.log_prob(tl.from_numpy(acts)), dist.entropy(), dist.probs]
    lp, ent, probs = tl.evaluate(outs, backend=backend)
    ref = torch.distributions.Categorical(logits=_t(logits))
    np.testing.assert_allclose(lp, ref.log_prob(torch.tensor(acts)).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref.entropy().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(probs, ref.probs.numpy(), rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(lp)) and np.all(np.isfinite(ent))


@pytest.mark.parametrize("backend", BACKENDS)
def test_categorical_over_a_domain(backend):
    """Logits over ``(i, t)`` with a batch axis: log_prob/entropy pointwise."""
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 3, 4, 3)).astype(np.float32)  # (I, T, B, A)
    acts = rng.integers(0, 3, (2, 3, 4))
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        dist = tl.distributions.Categorical(tl.from_numpy(logits, domain=(i, t)))
        lp = dist.log_prob(tl.from_numpy(acts, domain=(i, t)))
        ent = dist.entropy()
    got_lp, got_ent = tl.evaluate([lp, ent], backend=backend)
    ref = torch.distributions.Categorical(logits=_t(logits))
    np.testing.assert_allclose(got_lp, ref.log_prob(torch.tensor(acts)).numpy(), atol=1e-5)
    np.testing.assert_allclose(got_ent, ref.entropy().numpy(), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_normal_log_prob_entropy(backend):
    rng = np.random.default_rng(2)
    mean = rng.standard_normal((7, 3)).astype(np.float32)
    std = np.exp(rng.standard_normal((7, 3))).astype(np.float32)
    x = rng.standard_normal((7, 3)).astype(np.float32) * 2
    with tl.Context(dims=("t",)):
        dist = tl.distributions.Normal(tl.from_numpy(mean), tl.from_numpy(std))
        outs = [dist.log_prob(tl.from_numpy(x)), dist.entropy()]
    lp, ent = tl.evaluate(outs, backend=backend)
    ref = torch.distributions.Normal(_t(mean), _t(std))
    np.testing.assert_allclose(lp, ref.log_prob(_t(x)).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref.entropy().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_prob_gradients_match_torch(backend):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    acts = rng.integers(0, 4, 5)
    mean = rng.standard_normal((5, 2)).astype(np.float32)
    log_std = (rng.standard_normal(2) * 0.3).astype(np.float32)
    x = rng.standard_normal((5, 2)).astype(np.float32)
    w = rng.standard_normal(5).astype(np.float32)
    with tl.Context(dims=("t",)):
        lg = tl.from_numpy(logits, requires_grad=True)
        mu = tl.from_numpy(mean, requires_grad=True)
        ls = tl.from_numpy(log_std, requires_grad=True)
        wt = tl.from_numpy(w)
        cat = tl.distributions.Categorical(lg)
        nrm = tl.distributions.Normal(mu, ls.exp())
        loss = (cat.log_prob(tl.from_numpy(acts)) * wt).sum() + cat.entropy().mean()
        loss = loss + (nrm.log_prob(tl.from_numpy(x)).sum(-1) * wt).sum() + nrm.entropy().sum()
        loss.backward()
        grads = [lg.grad, mu.grad, ls.grad]
    got = tl.evaluate([loss, *grads], backend=backend)

    tlg, tmu, tls = (_t(a).requires_grad_() for a in (logits, mean, log_std))
    tc = torch.distributions.Categorical(logits=tlg)
    tn = torch.distributions.Normal(tmu, tls.exp().expand(5, 2))
    tw = _t(w)
    ref_loss = (tc.log_prob(torch.tensor(acts)) * tw).sum() + tc.entropy().mean()
    # torch's Normal entropy is per element (5, 2); timerl's std has shape (2,), so its entropy
    # is per component: compare with the entropy of one row
    ref_loss = ref_loss + (tn.log_prob(_t(x)).sum(-1) * tw).sum() + tn.entropy()[0].sum()
    ref_loss.backward()
    np.testing.assert_allclose(got[0], ref_loss.item(), rtol=1e-5, atol=1e-5)
    for g, r in zip(got[1:], (tlg.grad, tmu.grad, tls.grad), strict=True):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-4, atol=1e-5)


def _categorical_samples(probs, n, seed, backend="numpy"):
    with tl.Context(dims=("t",)):
        logits = tl.from_numpy(np.tile(np.log(probs).astype(np.float32), (n, 1)))
        s = tl.distributions.Categorical(logits).sample()
    return tl.evaluate(s, seed=seed, backend=backend)


def _normal_samples(mean, std, n, seed, backend="numpy"):
    with tl.Context(dims=("t",)):
        m = tl.from_numpy(np.tile(np.asarray(mean, np.float32), (n, 1)))
        sd = tl.from_numpy(np.tile(np.asarray(std, np.float32), (n, 1)))
        s = tl.distributions.Normal(m, sd).sample()
    return tl.evaluate(s, seed=seed, backend=backend)


PROBS = np.array([0.1, 0.2, 0.3, 0.4])


def test_categorical_sampling_is_seeded():
    a = _categorical_samples(PROBS, 2000, seed=1)
    b = _categorical_samples(PROBS, 2000, seed=1)
    c = _categorical_samples(PROBS, 2000, seed=2)
    np.testing.assert_array_equal(a, b)
    assert (a != c).mean() > 0.3
    assert a.shape == (2000,)
    assert np.issubdtype(a.dtype, np.integer)
    assert a.min() >= 0 and a.max() <= 3


def test_categorical_frequencies_match_probs():
    n = 40_000
    s = _categorical_samples(PROBS, n, seed=7)
    freq = np.bincount(s, minlength=4) / n
    # 5 standard errors
    se = np.sqrt(PROBS * (1 - PROBS) / n)
    assert np.all(np.abs(freq - PROBS) < 5 * se), (freq, PROBS)


def test_categorical_never_samples_impossible_actions():
    probs = np.array([0.5, 1e-30, 0.5])
    s = _categorical_samples(probs / probs.sum(), 5000, seed=3)
    assert not np.any(s == 1)


def test_normal_sampling_is_seeded_and_has_the_right_moments():
    mean, std = [1.0, -2.0, 0.0], [0.5, 2.0, 1.0]
    n = 40_000
    a = _normal_samples(mean, std, n, seed=4)
    b = _normal_samples(mean, std, n, seed=4)
    c = _normal_samples(mean, std, n, seed=5)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert a.shape == (n, 3)
    assert np.all(np.abs(a.mean(0) - mean) < 5 * np.array(std) / np.sqrt(n)), a.mean(0)
    np.testing.assert_allclose(a.std(0), std, rtol=0.03)


def test_sampling_identical_across_backends():
    np.testing.assert_array_equal(
        _categorical_samples(PROBS, 3000, seed=9, backend="numpy"),
        _categorical_samples(PROBS, 3000, seed=9, backend="torch"),
    )
    np.testing.assert_allclose(
        _normal_samples([0.0, 1.0], [1.0, 3.0], 3000, seed=9, backend="numpy"),
        _normal_samples([0.0, 1.0], [1.0, 3.0], 3000, seed=9, backend="torch"),
        rtol=1e-6,
        atol=1e-6,
    )


def test_samples_are_fresh_at_every_point_of_the_domain():
    """Samples over ``(i, t)`` differ between points but are reproducible per point."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        logits = tl.from_numpy(np.zeros((3, 4, 64, 5), np.float32), domain=(i, t))
        s = tl.distributions.Categorical(logits).sample()
        mean = tl.from_numpy(np.zeros((3, 4, 64), np.float32), domain=(i, t))
        n = tl.distributions.Normal(mean, mean * 0.0 + 1.0).sample()
    cat1, nrm1 = tl.evaluate([s, n], seed=0)
    cat2, nrm2 = tl.evaluate([s, n], seed=0)
    np.testing.assert_array_equal(cat1, cat2)
    np.testing.assert_array_equal(nrm1, nrm2)
    flat = nrm1.reshape(12, 64)
    for a in range(12):
        for b in range(a + 1, 12):
            assert not np.allclose(flat[a], flat[b])
    assert len({tuple(row) for row in cat1.reshape(12, 64)}) == 12


@pytest.mark.parametrize("backend", BACKENDS)
def test_beta_log_prob_entropy_and_their_gradients_equal_torchs(backend):
    rng = np.random.default_rng(7)
    a_np = rng.uniform(0.3, 5.0, 6).astype(np.float32)
    b_np = rng.uniform(0.3, 5.0, 6).astype(np.float32)
    x_np = rng.uniform(0.05, 0.95, 6).astype(np.float32)
    with tl.Context(dims=("t",)):
        a = tl.from_numpy(a_np, requires_grad=True)
        b = tl.from_numpy(b_np, requires_grad=True)
        dist = tl.distributions.Beta(a, b)
        loss = dist.log_prob(tl.from_numpy(x_np)).sum() + dist.entropy().sum() * 0.5
        loss.backward()
        outs = [dist.log_prob(tl.from_numpy(x_np)), dist.entropy(), dist.mean, a.grad, b.grad]
    lp, ent, mean, ga, gb = tl.evaluate(outs, backend=backend)
    ta, tb = _t(a_np).requires_grad_(), _t(b_np).requires_grad_()
    ref = torch.distributions.Beta(ta, tb)
    ref_loss = ref.log_prob(_t(x_np)).sum() + ref.entropy().sum() * 0.5
    ref_loss.backward()
    np.testing.assert_allclose(lp, ref.log_prob(_t(x_np)).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref.entropy().detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, ref.mean.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(ga, ta.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_beta_samples_follow_the_distribution_shapes_below_one_included(backend):
    stats = pytest.importorskip("scipy.stats")
    a_np = np.array([0.3, 0.7, 1.0, 2.5, 9.0], dtype=np.float32)
    b_np = np.array([0.5, 3.0, 1.0, 2.5, 0.8], dtype=np.float32)
    n = 4000
    with tl.Context(dims=("i",)) as ctx:
        (i,), (I,) = ctx.dims, ctx.bounds
        a = tl.from_numpy(np.tile(a_np, (n, 1)), domain=(i,))
        b = tl.from_numpy(np.tile(b_np, (n, 1)), domain=(i,))
        s = tl.distributions.Beta(a, b).sample()
    draws = np.asarray(tl.evaluate(s, bounds={I: n}, seed=3, backend=backend))
    assert draws.shape == (n, 5) and np.all((draws >= 0) & (draws <= 1))
    for k in range(5):  # the draws are a pure function of the seed: this cannot flake
        assert stats.kstest(draws[:, k], "beta", args=(a_np[k], b_np[k])).pvalue > 1e-3
