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


def _const(value: np.ndarray, like: RecurrentTensor) -> RecurrentTensor | float:
    if value.ndim == 0:
        return float(value)
    from timerl.api.tensor import lift

    return lift(value.astype(np.float32), like=like)
