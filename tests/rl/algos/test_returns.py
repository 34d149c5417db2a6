"""Return estimators against plain numpy loops, with episode boundaries and bootstrapping."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import timerl as tl

BACKENDS = ["numpy", "torch"]
GAMMA = 0.97


# --- independent references (one rollout: arrays (T, B), bootstrap (B,) or None) -------------
def ref_discounted(r, d, gamma, boot=None):
    T = r.shape[0]
    out = np.zeros_like(r, dtype=np.float64)
    nxt = np.zeros(r.shape[1]) if boot is None else boot.astype(np.float64)
    for t in reversed(range(T)):
        nxt = r[t] + gamma * (1.0 - d[t]) * nxt
        out[t] = nxt
    return out


def ref_gae(r, d, v, gamma, lam, boot=None):
    T, B = r.shape
    v_ext = np.concatenate([v, np.zeros((1, B)) if boot is None else boot[None]], 0)
    out = np.zeros((T, B))
    for b in range(B):
        adv = 0.0
        for t in reversed(range(T)):
            next_v = float(v_ext[t + 1, b])
            nonterminal = 0.0 if d[t, b] else 1.0
            delta = r[t, b] + gamma * nonterminal * next_v - v[t, b]
            adv = delta + gamma * lam * nonterminal * adv
            out[t, b] = adv
    return out


def ref_td_lambda(r, d, v, gamma, lam, boot=None):
    T, B = r.shape
    out = np.zeros((T, B))
    for b in range(B):
        g_next = 0.0 if boot is None else float(boot[b])  # G[T] = V[T]
        for t in reversed(range(T)):
            v_next = (0.0 if boot is None else float(boot[b])) if t == T - 1 else v[t + 1, b]
            nonterminal = 0.0 if d[t, b] else 1.0
            g = r[t, b] + gamma * nonterminal * ((1 - lam) * v_next + lam * g_next)
            out[t, b] = g
            g_next = g
    return out


def ref_n_step(r, d, v, gamma, n, boot=None):
    T, B = r.shape
    v_ext = np.concatenate([v, np.zeros((1, B)) if boot is None else boot[None]], 0)
    out = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            g, disc, ended = 0.0, 1.0, False
            steps = min(n, T - t)
            for k in range(steps):
                g += disc * r[t + k, b]
                disc *= gamma
                if d[t + k, b]:
                    ended = True
                    break
            if not ended:
                g += gamma**steps * v_ext[t + steps, b]
            out[t, b] = g
    return out


# --- data --------------------------------------------------------------------------------------
def _data(seed, I_=3, T_=9, B=4, p_done=0.25):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((I_, T_, B)).astype(np.float32)
    d = rng.random((I_, T_, B)) < p_done
    d[0, -1, 0] = True  # an episode ending exactly at the rollout's end (masks the bootstrap)
    if B > 1:
        d[0, :, 1] = False  # one env never done within iteration 0
    v = rng.standard_normal((I_, T_, B)).astype(np.float32)
    boot = rng.standard_normal((I_, B)).astype(np.float32)
    return r, d, v, boot


def _build(kind, r, d, v, boot, use_boot, **kw):
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        rt = tl.from_numpy(r, domain=(i, t))
        dt = tl.from_numpy(d, domain=(i, t))
        vt = tl.from_numpy(v, domain=(i, t))
        bt = tl.from_numpy(boot, domain=(i,)) if use_boot else None
        if kind == "discounted":
            out = tl.rl.discounted_returns(rt, dt, GAMMA, bootstrap=bt)
        elif kind == "gae":
            out = tl.rl.gae(rt, dt, vt, GAMMA, kw["lam"], bootstrap=bt)
        elif kind == "td_lambda":
            out = tl.rl.td_lambda(rt, dt, vt, GAMMA, kw["lam"], bootstrap=bt)
        else:
            out = tl.rl.n_step_returns(rt, dt, vt, GAMMA, kw["n"], bootstrap=bt)
    return out


def _reference(kind, r, d, v, boot, use_boot, **kw):
    out = []
    for k in range(r.shape[0]):
        b = boot[k] if use_boot else None
        if kind == "discounted":
            out.append(ref_discounted(r[k], d[k], GAMMA, b))
        elif kind == "gae":
            out.append(ref_gae(r[k], d[k], v[k], GAMMA, kw["lam"], b))
        elif kind == "td_lambda":
            out.append(ref_td_lambda(r[k], d[k], v[k], GAMMA, kw["lam"], b))
        else:
            out.append(ref_n_step(r[k], d[k], v[k], GAMMA, kw["n"], b))
    return np.stack(out)


CASES = [
    ("discounted", {}),
    ("gae", {"lam": 0.95}),
    ("gae", {"lam": 0.0}),
    ("gae", {"lam": 1.0}),
    ("td_lambda", {"lam": 0.9}),
    ("td_lambda", {"lam": 0.0}),
    ("td_lambda", {"lam": 1.0}),
    ("n_step", {"n": 1}),
    ("n_step", {"n": 3}),
    ("n_step", {"n": 20}),  # longer than the rollout: Monte Carlo + bootstrap
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("use_boot", [False, True], ids=["no_boot", "boot"])
@pytest.mark.parametrize(("kind", "kw"), CASES, ids=[f"{k}-{kw}" for k, kw in CASES])
def test_returns_match_numpy_loops(kind, kw, use_boot, backend):
    r, d, v, boot = _data(seed=zlib.crc32(f"{kind}{kw}".encode()))
    out = _build(kind, r, d, v, boot, use_boot, **kw)
    got = tl.evaluate(out, backend=backend)
    want = _reference(kind, r, d, v, boot, use_boot, **kw)
    assert got.shape == r.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_agree_on_all_estimators(backend):
    r, d, v, boot = _data(seed=11, I_=2, T_=6, B=3)
    outs = [_build(k, r, d, v, boot, True, **kw) for k, kw in CASES]
    got = [tl.evaluate(o, backend=backend) for o in outs]
    ref = [tl.evaluate(o, backend="numpy") for o in outs]
    for g, w in zip(got, ref, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_returns_over_time_dim_only():
    """A rollout over ``(t,)`` alone (no iteration dim)."""
    r, d, v, boot = _data(seed=5, I_=1, T_=8, B=2)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        rt = tl.from_numpy(r[0], domain=(t,))
        dt = tl.from_numpy(d[0], domain=(t,))
        vt = tl.from_numpy(v[0], domain=(t,))
        ret = tl.rl.discounted_returns(rt, dt, GAMMA)
        adv = tl.rl.gae(rt, dt, vt, GAMMA, 0.9)
    got_ret, got_adv = tl.evaluate([ret, adv])
    np.testing.assert_allclose(got_ret, ref_discounted(r[0], d[0], GAMMA), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_adv, ref_gae(r[0], d[0], v[0], GAMMA, 0.9), rtol=1e-5, atol=1e-5)


def test_gae_plus_value_is_td_lambda():
    """The identity A_GAE(lambda) + V = G(lambda), per iteration and step."""
    r, d, v, boot = _data(seed=3)
    adv = tl.evaluate(_build("gae", r, d, v, boot, True, lam=0.8))
    tdl = tl.evaluate(_build("td_lambda", r, d, v, boot, True, lam=0.8))
    np.testing.assert_allclose(adv + v, tdl, rtol=1e-5, atol=1e-5)


def test_done_cuts_every_estimator():
    """Changing rewards/values after a done must not change anything at or before it."""
    r, d, v, boot = _data(seed=8, I_=1, T_=8, B=2, p_done=0.0)
    d[0, 3, :] = True
    r2, v2, boot2 = r.copy(), v.copy(), boot.copy()
    r2[0, 4:] += 10.0
    v2[0, 4:] -= 7.0
    boot2 += 5.0
    for kind, kw in CASES:
        a = tl.evaluate(_build(kind, r, d, v, boot, True, **kw))
        b = tl.evaluate(_build(kind, r2, d, v2, boot2, True, **kw))
        np.testing.assert_allclose(a[0, :4], b[0, :4], rtol=1e-6, atol=1e-6, err_msg=kind)


def test_n_step_rejects_bad_n():
    r, d, v, boot = _data(seed=1, I_=1, T_=4, B=1)
    with pytest.raises(tl.ProgramError, match="n must be >= 1"):
        _build("n_step", r, d, v, boot, False, n=0)
