"""Probability distributions built from primitives; sampling is seeded and reproducible."""

from __future__ import annotations

import math

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

    def log_prob(self, value: RecurrentTensor) -> RecurrentTensor:
        var = self.std * self.std
        return (
            -((value - self.mean) ** 2.0) / (var * 2.0)
            - self.std.log()
            - 0.5 * math.log(2 * math.pi)
        )

    def entropy(self) -> RecurrentTensor:
        return self.std.log() + (0.5 + 0.5 * math.log(2 * math.pi))
