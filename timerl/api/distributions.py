"""Probability distributions built from primitives; sampling is seeded and reproducible."""

from __future__ import annotations

import math

import numpy as np

from timerl.api.functional import rand, randn
from timerl.api.tensor import RecurrentTensor


class Categorical:
    """Over the last axis of ``logits``; samples by the Gumbel-max trick."""

    def __init__(self, logits: RecurrentTensor) -> None:
        self.logits = logits
        self.log_probs = logits.log_softmax(-1)

    def sample(self) -> RecurrentTensor:
        u = rand(self.logits.view.shape, like=self.logits)
        u = u * (1.0 - 2e-7) + 1e-7  # keep log(-log(u)) finite
        gumbel = -(-(u.log())).log()
        return (self.logits.detach() + gumbel).argmax(-1)

    def log_prob(self, action: RecurrentTensor) -> RecurrentTensor:
        return self.log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> RecurrentTensor:
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    @property
    def probs(self) -> RecurrentTensor:
        return self.log_probs.exp()


class Normal:
    """Independent normals (elementwise, like ``torch.distributions.Normal``)."""

    def __init__(self, mean: RecurrentTensor, std: RecurrentTensor) -> None:
        self.mean = mean
        self.std = std

    def sample(self) -> RecurrentTensor:
        noise = randn(self.mean.view.shape, like=self.mean)
        return self.mean.detach() + self.std.detach() * noise

    def rsample(self, noise: RecurrentTensor | None = None) -> RecurrentTensor:
        """A sample that gradients flow through (the reparameterisation trick); ``noise``
        (standard normal, the mean's shape) replaces the program's own draw when given."""
        if noise is None:
            noise = randn(self.mean.view.shape, like=self.mean)
        return self.mean + self.std * noise

    def log_prob(self, value: RecurrentTensor) -> RecurrentTensor:
        var = self.std * self.std
        return (
            -((value - self.mean) ** 2.0) / (var * 2.0)
            - self.std.log()
            - 0.5 * math.log(2 * math.pi)
        )

    def entropy(self) -> RecurrentTensor:
        return self.std.log() + (0.5 + 0.5 * math.log(2 * math.pi))


class TanhNormal:
    """``low + (tanh(x) + 1) / 2 * (high - low)`` for ``x ~ Normal(mean, std)``: actions that
    stay inside a box, with the log-density corrected for the squashing (as SAC needs)."""

    def __init__(
        self,
        mean: RecurrentTensor,
        std: RecurrentTensor,
        low: float | np.ndarray = -1.0,
        high: float | np.ndarray = 1.0,
    ) -> None:
        self.base = Normal(mean, std)
        self.scale = _const((np.asarray(high) - np.asarray(low)) / 2.0, mean)
        self.center = _const((np.asarray(high) + np.asarray(low)) / 2.0, mean)

    def _squash(self, x: RecurrentTensor) -> RecurrentTensor:
        return x.tanh() * self.scale + self.center

    def rsample_and_log_prob(
        self, noise: RecurrentTensor | None = None
    ) -> tuple[RecurrentTensor, RecurrentTensor]:
        """A reparameterised action and its elementwise log-density (sum it over the action
        axis for a joint one); ``noise`` as in :meth:`Normal.rsample`."""
        x = self.base.rsample(noise)
        y = x.tanh()
        action = y * self.scale + self.center
        # change of variables: d action / dx = scale * (1 - tanh(x)^2); the 1e-6 keeps the
        # log finite where tanh saturates in float32
        log_prob = self.base.log_prob(x) - (self.scale * (1.0 - y * y) + 1e-6).log()
        return action, log_prob

    def sample(self) -> RecurrentTensor:
        return self._squash(self.base.sample())

    @property
    def mode(self) -> RecurrentTensor:
        """The squashed mean: the action of the deterministic policy."""
        return self._squash(self.base.mean)


class Beta:
    """Independent Beta(a, b) on (0, 1), elementwise: a policy over bounded actions (scale a
    sample to the box), and the proposals graphopt's policy gives BRKGA.

    ``sample`` draws each Gamma variate by Marsaglia and Tsang's method with a fixed number of
    tries (``TRIES``, taking the first accepted; each try is accepted with probability above
    0.95 at the boosted shape ``a + 1 >= 1``, so all are rejected less than once in 2e10
    variates, and then the last try is kept), boosted by ``U^(1/a)`` so shapes below 1 work;
    ``Beta = X / (X + Y)``. A pure function of the program's seed and the point, as every
    random op."""

    TRIES = 8

    def __init__(self, a: RecurrentTensor, b: RecurrentTensor) -> None:
        self.a = a
        self.b = b

    def _log_norm(self) -> RecurrentTensor:
        """``log B(a, b)``."""
        return self.a.lgamma() + self.b.lgamma() - (self.a + self.b).lgamma()

    def log_prob(self, value: RecurrentTensor) -> RecurrentTensor:
        return (
            (self.a - 1.0) * value.log() + (self.b - 1.0) * (1.0 - value).log() - self._log_norm()
        )

    def entropy(self) -> RecurrentTensor:
        total = self.a + self.b
        return (
            self._log_norm()
            - (self.a - 1.0) * self.a.digamma()
            - (self.b - 1.0) * self.b.digamma()
            + (total - 2.0) * total.digamma()
        )

    @property
    def mean(self) -> RecurrentTensor:
        return self.a / (self.a + self.b)

    def sample(self) -> RecurrentTensor:
        x = _gamma_sample(self.a.detach(), self.TRIES)
        y = _gamma_sample(self.b.detach(), self.TRIES)
        return x / (x + y)


def _gamma_sample(shape: RecurrentTensor, tries: int) -> RecurrentTensor:
    """Gamma(shape, 1) variates of ``shape``'s shape (Marsaglia-Tsang at ``shape + 1``, then
    times ``U^(1 / shape)``)."""
    from timerl.api.tensor import where

    dims = tuple(shape.view.shape)
    d = shape + (1.0 - 1.0 / 3.0)
    c = 1.0 / (d * 9.0).sqrt()
    out = accepted = None
    for _ in range(tries):  # the first accepted try; the last one if none is
        x = randn(dims, like=shape)
        u = rand(dims, like=shape)
        v = (x * c + 1.0) ** 3.0
        positive = v.clamp(min=1e-30)
        ok = (v > 0.0) & (u.log() < x * x * 0.5 + d - d * positive + d * positive.log())
        value = d * positive
        if out is None:
            out, accepted = value, ok
        else:
            out = where(accepted, out, value)
            accepted = accepted | ok
    boost = rand(dims, like=shape).clamp(min=1e-30) ** (1.0 / shape)
    return out * boost


def _const(value: np.ndarray, like: RecurrentTensor) -> RecurrentTensor | float:
    if value.ndim == 0:
        return float(value)
    from timerl.api.tensor import lift

    return lift(value.astype(np.float32), like=like)
