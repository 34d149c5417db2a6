"""Experience replay as a recurrence over the iteration dim.

A transition tensor recorded by the rollout runs over ``(i, t)`` with one row per env. The
replay buffer is a ring of ``window`` iteration-sized slots, itself a recurrent tensor over
``i``: at iteration ``i`` the rows of ``x[i, 0:T]`` overwrite slot ``i % window`` of the
buffer of iteration ``i - 1``. Sampling a minibatch for update ``u`` is a ``take`` at uniform
random rows of the filled part, keyed by ``(i, u)``, so a run is reproducible from its seed
like every other random number in a program.

The buffer could also be written as the window ``x[max(0, i - window + 1) : i + 1, 0:T]``
read at every ``i``; that form gathers ``window * T`` points per iteration, while the ring
rewrites one slot with a single vectorised ``where``, which is why it is used here.
"""

from __future__ import annotations

import numpy as np

from timerl.api.functional import rand
from timerl.api.symbols import Dim, Expr, min_
from timerl.api.tensor import RecurrentTensor, full, lift, minimum, where
from timerl.errors import ProgramError


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
        self.rows_per_slot = num_steps * num_envs
        self.capacity = window * self.rows_per_slot
        self._rows: RecurrentTensor | None = None
        self._buffers: dict[int, RecurrentTensor] = {}

    @property
    def size(self) -> Expr:
        """Transitions held at iteration ``i`` (grows until the ring is full)."""
        return min_(self.i + 1, self.window) * self.rows_per_slot

    def rows(self) -> RecurrentTensor:
        """The sampled row indices over ``(i, u)``, shape ``(batch_size,)``."""
        if self._rows is None:
            n = self.size
            pick = (rand((self.batch_size,), key_at=(self.i, self.u)) * full((), n)).floor()
            # rand < 1, but rand * n can round up to n in float32: clamp to the last row
            self._rows = minimum(pick, full((), n) - 1.0).long()
        return self._rows

    def buffer(self, x: RecurrentTensor) -> RecurrentTensor:
        """The ring of ``x`` at iteration ``i``: ``(capacity, ...)`` rows, detached; rows past
        :attr:`size` are zeros until the ring has filled."""
        if tuple(x.domain) != (self.i, self.t):
            raise ProgramError(
                f"replay: {x.name} must run over ({self.i.name}, {self.t.name}), not "
                f"({', '.join(d.name for d in x.domain)})"
            )
        if not x.shape or x.shape[0] != self.num_envs:
            raise ProgramError(
                f"replay: {x.name} must have one row per env ({self.num_envs}), got shape "
                f"{tuple(x.shape)}"
            )
        if x.op.id in self._buffers:
            return self._buffers[x.op.id]
        i, n, cap = self.i, self.rows_per_slot, self.capacity
        item = tuple(x.view.shape[1:])
        block = x[i, 0 : self.num_steps].detach().reshape(n, *item)
        # Row r of the ring holds row r % n of whichever iteration last wrote slot r // n.
        tiled = block.take(lift(np.arange(cap, dtype=np.int64) % n, like=block))
        slot = lift((np.arange(cap) // n).astype(np.float32), like=block)
        here = (slot == full((), i) % float(self.window)).reshape(cap, *(1 for _ in item))
        prev = RecurrentTensor.placeholder((cap, *item), x.dtype, (i,), name=f"replay({x.name})")
        prev[0] = full((cap, *item), 0, dtype=x.dtype)
        ring = where(here, tiled, prev)
        prev[i + 1] = ring
        self._buffers[x.op.id] = ring
        return ring

    def sample(self, x: RecurrentTensor) -> RecurrentTensor:
        """Rows of the ring of ``x`` picked for update ``u`` (shape ``(batch_size, ...)``)."""
        return self.buffer(x).take(self.rows())
