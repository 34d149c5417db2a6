"""Observation and reward normalisation as recurrences over the iteration dim ``i``.

The running statistics are program state like the parameters: ``obs_mean[i + 1]`` is the
previous statistics merged with iteration ``i``'s batch, so checkpoints store them by name
(``state/obs_mean``), a resumed run continues them bit for bit, and the compiler sees them.

Within an iteration the statistics are frozen: the rollout and every update of iteration ``i``
normalise with ``obs_mean[i]``, and only the next iteration sees the moments of this one's
observations. That keeps it a clean recurrence over ``i`` (nothing inside ``t`` or ``u`` feeds
back into the statistics it reads) and makes the targets the update fits the ones the policy
acted on.
"""

from __future__ import annotations

from dataclasses import dataclass

from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor, full

# the constants of the normalised policy input clip((x - mean) / sqrt(var + EPS), -CLIP, CLIP);
# a checkpoint's header records them for ``timerl eval`` and ``timerl export``
EPS = 1e-8
CLIP = 10.0


@dataclass
class RunningMoments:
    """Mean, (population) variance and count of every sample seen before iteration ``i``."""

    mean: RecurrentTensor
    var: RecurrentTensor
    count: RecurrentTensor

    def normalize(self, x: RecurrentTensor, at: Dim, clip: float = CLIP) -> RecurrentTensor:
        """``clip((x - mean[at]) / sqrt(var[at] + EPS), -clip, clip)``."""
        scale = (self.var[at] + EPS).sqrt()
        return ((x - self.mean[at]) / scale).clamp(-clip, clip)

    def scale(self, x: RecurrentTensor, at: Dim, clip: float = CLIP) -> RecurrentTensor:
        """``clip(x / sqrt(var[at] + EPS), -clip, clip)``: divided by the std, not centred."""
        return (x / (self.var[at] + EPS).sqrt()).clamp(-clip, clip)


def running_moments(
    samples: RecurrentTensor, i: Dim, shape: tuple[int, ...], prefix: str
) -> RunningMoments:
    """Statistics over ``(i,)`` of ``shape`` merged each iteration with ``samples``
    (a tensor over ``(i,)`` of shape ``(n, *shape)``: iteration ``i``'s batch).

    Before any data the mean is 0 and the variance 1 (the identity normalisation) with count
    0, so after the first merge the statistics are exactly the first batch's. Batches merge by
    the parallel form of Welford's update (Chan et al.): with ``delta`` the difference of the
    means, ``M2 = var * n_a + var_b * n_b + delta^2 * n_a * n_b / n``.
    """
    n = full((), samples.view.shape[0])  # the batch size, possibly a symbolic bound
    mean = RecurrentTensor.placeholder(shape, "float32", (i,), name=f"{prefix}_mean")
    var = RecurrentTensor.placeholder(shape, "float32", (i,), name=f"{prefix}_var")
    count = RecurrentTensor.placeholder((), "float32", (i,), name=f"{prefix}_count")
    mean[0] = full(shape, 0.0)
    var[0] = full(shape, 1.0)
    count[0] = full((), 0.0)
    data = samples.detach()
    b_mean = data.mean(0)
    b_var = data.var(0, unbiased=False)
    total = count[i] + n
    delta = b_mean - mean[i]
    weight = n / total
    mean[i + 1] = mean[i] + delta * weight
    m2 = var[i] * count[i] + b_var * n + delta * delta * count[i] * weight
    var[i + 1] = m2 / total
    count[i + 1] = total
    return RunningMoments(mean, var, count)


def discounted_return_estimate(
    reward: RecurrentTensor, done: RecurrentTensor, gamma: float, i: Dim, t: Dim
) -> RecurrentTensor:
    """Per env, ``g[t] = gamma * (1 - done[t - 1]) * g[t - 1] + reward[t]``, carried across
    iterations (``g[i + 1, 0]`` continues from ``g[i, T - 1]``): the return whose spread
    reward scaling divides by."""
    T = t.bound
    keep = 1.0 - done.float()
    # what the step before carries in, so every piece reads only earlier points
    carried = RecurrentTensor.placeholder(reward.shape, "float32", (i, t), name="return_carry")
    g = (carried + reward).named("return_estimate")
    carried[0, 0] = full(reward.shape, 0.0)
    carried[i + 1, 0] = g[i, T - 1] * keep[i, T - 1] * gamma
    carried[i, t + 1] = g[i, t] * keep[i, t] * gamma
    return g
