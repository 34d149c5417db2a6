"""Experience replay as a read pattern, not a data structure.

A transition tensor recorded by the rollout runs over ``(i, t)``. The replay buffer of the
last ``W`` iterations is just the window ``x[max(0, i - W + 1) : i + 1, 0 : T]`` of that tensor
read at iteration ``i``: a dynamic-shape temporal slice the compiler keeps in a bounded store.
Sampling a minibatch for update ``u`` is a ``take`` at uniform random rows keyed by ``(i, u)``,
so a run is reproducible from its seed like every other random number in a program.
"""

from __future__ import annotations

from timerl.api.functional import rand
from timerl.api.tensor import RecurrentTensor, full, minimum
from timerl.errors import ProgramError
from timerl.symbolic import Dim, Expr, max_, min_


class Replay:
    """Uniform sampling from the transitions of the last ``window`` iterations.

    ``i`` is the iteration dim and ``t`` the rollout step dim of the recorded tensors, each
    holding one row per env (shape ``(num_envs, ...)``); ``u`` indexes the updates within an
    iteration. Every tensor sampled with the same :class:`Replay` at the same update gets the
    same rows, so ``obs``, ``action`` and ``reward`` stay aligned.
    """

    def __init__(
        self, i: Dim, t: Dim, u: Dim, num_steps: int, num_envs: int, window: int, batch_size: int
    ) -> None:
        if window < 1 or batch_size < 1 or num_steps < 1 or num_envs < 1:
            raise ProgramError(
                f"replay: window ({window}), batch_size ({batch_size}), num_steps ({num_steps}) "
                f"and num_envs ({num_envs}) must all be at least 1"
            )
        self.i, self.t, self.u = i, t, u
        self.num_steps, self.num_envs = num_steps, num_envs
        self.window, self.batch_size = window, batch_size
        self._rows: RecurrentTensor | None = None

    @property
    def size(self) -> Expr:
        """Transitions held at iteration ``i`` (grows until the window is full)."""
        return min_(self.i + 1, self.window) * (self.num_steps * self.num_envs)

    def rows(self) -> RecurrentTensor:
        """The sampled row indices over ``(i, u)``, shape ``(batch_size,)``."""
        if self._rows is None:
            n = self.size
            # rand < 1, but rand * n can round up to n in float32: clamp to the last row
            pick = (rand((self.batch_size,), key_at=(self.i, self.u)) * full((), n)).floor()
            self._rows = minimum(pick, full((), n) - 1.0).long()
        return self._rows

    def buffer(self, x: RecurrentTensor) -> RecurrentTensor:
        """The window of ``x`` at iteration ``i`` as one batch of rows, detached."""
        if tuple(x.domain[:2]) != (self.i, self.t):
            raise ProgramError(
                f"replay: {x.name} must run over ({self.i.name}, {self.t.name}), not "
                f"({', '.join(d.name for d in x.domain)})"
            )
        if not x.shape or x.shape[0] != self.num_envs:
            raise ProgramError(
                f"replay: {x.name} must have one row per env ({self.num_envs}), got shape "
                f"{tuple(x.shape)}"
            )
        lo = max_(0, self.i - self.window + 1)
        data = x[lo : self.i + 1, 0 : self.num_steps].detach()
        return data.reshape(self.size, *x.view.shape[1:])

    def sample(self, x: RecurrentTensor) -> RecurrentTensor:
        """Rows of the window of ``x`` picked for update ``u`` (shape ``(batch_size, ...)``)."""
        return self.buffer(x).take(self.rows())
