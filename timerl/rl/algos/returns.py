"""Return estimators as recurrences over the time dim (backward in time).

All take per-step tensors over ``(..., t)`` of shape ``(num_envs,)`` and a ``done`` mask with
same-step auto-reset semantics: ``done[t]`` means ``reward[t]`` was the last of its episode, so
nothing flows from ``t + 1`` into ``t``. ``bootstrap`` is the value estimate of the observation
after the last step (a tensor over the outer dims), or None to treat the rollout's end as final.
"""

from __future__ import annotations

import math

from timerl.api.functional import arange
from timerl.api.symbols import Dim, Expr, min_
from timerl.api.tensor import RecurrentTensor, full
from timerl.errors import ProgramError


def _time_dim(x: RecurrentTensor, dim: Dim | None) -> Dim:
    if dim is not None:
        if dim not in x.domain:
            raise ProgramError(f"{x.name} does not run over {dim.name}")
        return dim
    if not x.domain:
        raise ProgramError(f"{x.name} has no time dim to compute returns over")
    return x.domain[-1]


def _at(x: RecurrentTensor, dim: Dim, index: Expr) -> RecurrentTensor:
    """``x`` read at ``index`` on ``dim`` and at the current point elsewhere."""
    return x[tuple(index if d is dim else d for d in x.domain)]


def _new(like: RecurrentTensor, name: str) -> RecurrentTensor:
    return RecurrentTensor.placeholder(like.view.shape, "float32", like.domain, name=name)


def _next_value(
    value: RecurrentTensor, bootstrap: RecurrentTensor | None, t: Dim
) -> RecurrentTensor:
    """``value[t + 1]``, and ``bootstrap`` (or 0) past the last step."""
    nxt = _new(value, "next_value")
    nxt[t.eq(t.bound - 1)] = bootstrap if bootstrap is not None else value * 0.0
    nxt[True] = _at(value, t, t + 1)
    return nxt


def discounted_returns(
    reward: RecurrentTensor,
    done: RecurrentTensor,
    gamma: float,
    bootstrap: RecurrentTensor | None = None,
    dim: Dim | None = None,
) -> RecurrentTensor:
    """Monte Carlo returns ``ret[t] = r[t] + gamma * (1 - done[t]) * ret[t + 1]``."""
    t = _time_dim(reward, dim)
    keep = 1.0 - done.float()
    ret = _new(reward, "returns")
    last = reward + keep * gamma * bootstrap if bootstrap is not None else reward
    ret[t.eq(t.bound - 1)] = last
    ret[True] = reward + keep * gamma * _at(ret, t, t + 1)
    return ret


def td_lambda(
    reward: RecurrentTensor,
    done: RecurrentTensor,
    value: RecurrentTensor,
    gamma: float,
    lam: float,
    bootstrap: RecurrentTensor | None = None,
    dim: Dim | None = None,
) -> RecurrentTensor:
    """TD(lambda) returns ``G[t] = r + gamma (1-d) ((1-lam) V[t+1] + lam G[t+1])``."""
    t = _time_dim(reward, dim)
    keep = 1.0 - done.float()
    nxt = _next_value(value, bootstrap, t)
    ret = _new(reward, "td_lambda")
    ret[t.eq(t.bound - 1)] = reward + keep * gamma * nxt
    ret[True] = reward + keep * gamma * (nxt * (1.0 - lam) + _at(ret, t, t + 1) * lam)
    return ret


def gae(
    reward: RecurrentTensor,
    done: RecurrentTensor,
    value: RecurrentTensor,
    gamma: float,
    lam: float,
    bootstrap: RecurrentTensor | None = None,
    dim: Dim | None = None,
) -> RecurrentTensor:
    """Generalised advantage estimates ``A[t] = delta[t] + gamma lam (1-d) A[t+1]``."""
    t = _time_dim(reward, dim)
    keep = 1.0 - done.float()
    delta = reward + keep * gamma * _next_value(value, bootstrap, t) - value
    adv = _new(reward, "gae")
    adv[t.eq(t.bound - 1)] = delta
    adv[True] = delta + keep * (gamma * lam) * _at(adv, t, t + 1)
    return adv


def n_step_returns(
    reward: RecurrentTensor,
    done: RecurrentTensor,
    value: RecurrentTensor,
    gamma: float,
    n: int,
    bootstrap: RecurrentTensor | None = None,
    dim: Dim | None = None,
) -> RecurrentTensor:
    """``G[t] = sum_{k<L} gamma^k r[t+k] + gamma^L V[t+L]``, ``L = min(n, T - t)``, cut at dones.

    Written over the window ``t : min(t + n, T)`` (a dynamic slice), not as a recurrence.
    """
    if n < 1:
        raise ProgramError(f"n_step_returns: n must be >= 1, got {n}")
    t = _time_dim(reward, dim)
    end = min_(t + n, t.bound)
    r = _at(reward, t, slice(t, end))  # (L, B)
    d = _at(done, t, slice(t, end)).float()
    length = end - t
    k = arange(length, dtype="float32")
    k = k.reshape(length, *([1] * len(reward.view.shape)))
    alive = (d.cumsum(0) - d).eq(0.0).float()  # no episode ended before step k of the window
    head = (_pow(gamma, k) * alive * r).sum(0)
    tail_alive = d.sum(0).eq(0.0).float()
    tail = _at(_next_value(value, bootstrap, t), t, end - 1)
    steps = full((), length, dtype="float32", ctx=reward.ctx)
    return head + _pow(gamma, steps) * tail_alive * tail


def _pow(base: float, exponent: RecurrentTensor) -> RecurrentTensor:
    """``base ** exponent`` for a float base and a tensor exponent."""
    if base <= 0.0:
        return exponent.eq(0.0).float()
    return (exponent * math.log(base)).exp()
