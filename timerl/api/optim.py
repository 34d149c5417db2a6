"""Optimisers as recurrences over the iteration dim: ``w[i+1] = update(w[i], grad[i])``.

Updates read the previous parameters and gradients *detached*, so ``w.grad[i]`` is exactly the
gradient of ``loss[i]``; optimiser state (Adam's moments) is itself a recurrent tensor. For
parameters unrolled over an inner update dim ``u`` (``module.unroll(u)``) the recurrence runs
over ``u`` inside each iteration and the last update carries to the next iteration:
``w_u[i, u + 1] = update(...)``, ``w[i + 1] = update(...)[i, U - 1]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from timerl.api.tensor import RecurrentTensor, full, where
from timerl.errors import ProgramError
from timerl.ir import prims
from timerl.symbolic import Dim

LearningRate = float | Callable[..., "RecurrentTensor | float"]


def _number_at_least(value: object, low: float, strict: bool = False) -> bool:
    """A real number (not a bool) ``>= low`` (``> low`` when ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return value > low if strict else value >= low


class Optimizer:
    def __init__(
        self,
        params: Sequence[RecurrentTensor],
        lr: LearningRate,
        max_grad_norm: float | None = None,
    ) -> None:
        self.params = list(params)
        if not self.params:
            raise ProgramError("optimizer: no parameters given")
        for p in self.params:
            if not p.requires_grad or not prims.get(p.op.prim).traits.piecewise:
                raise ProgramError(
                    f"optimizer: {p.name} must be a placeholder made with requires_grad=True"
                )
            want = 2 if p.outer is not None else 1
            if len(p.op.domain) != want:
                raise ProgramError(
                    f"optimizer: {p.name} must run over the iteration dim"
                    + (" and one update dim" if want == 2 else "")
                    + f", not ({', '.join(d.name for d in p.op.domain)})"
                )
        if len({p.op.domain for p in self.params}) != 1:
            raise ProgramError("optimizer: all parameters must share one domain")
        self.domain: tuple[Dim, ...] = self.params[0].op.domain
        self.inner = self.params[0].outer is not None
        if not callable(lr) and not _number_at_least(lr, 0.0):
            raise ProgramError(
                f"{type(self).__name__}: lr must be a number >= 0 or a schedule "
                f"lr(*dims), got {lr!r}"
            )
        if max_grad_norm is not None and not _number_at_least(max_grad_norm, 0.0, strict=True):
            raise ProgramError(
                f"{type(self).__name__}: max_grad_norm must be a number > 0 or None, "
                f"got {max_grad_norm!r}"
            )
        self.lr = lr
        self.max_grad_norm = max_grad_norm

    # --- recurrences --------------------------------------------------------------------------
    def _lr(self) -> RecurrentTensor | float:
        return self.lr(*self.domain) if callable(self.lr) else self.lr

    def _steps(self) -> RecurrentTensor:
        """How many updates came before this point, plus one (Adam's bias correction)."""
        if not self.inner:
            return full((), self.domain[0] + 1)
        i, u = self.domain
        return full((), i) * full((), u.bound) + full((), u + 1)

    def _state(self, p: RecurrentTensor, name: str) -> RecurrentTensor:
        """A zero-initialised tensor with the same recurrence structure as ``p``."""
        if not self.inner:
            s = RecurrentTensor.placeholder(p.shape, p.dtype, p.op.domain, name=f"{name}({p.name})")
            s[0] = 0.0
            return s
        outer = p.outer
        assert outer is not None
        s_out = RecurrentTensor.placeholder(
            p.shape, p.dtype, outer.op.domain, name=f"{name}({outer.name})"
        )
        s_out[0] = 0.0
        s_in = RecurrentTensor.placeholder(p.shape, p.dtype, p.op.domain, name=f"{name}({p.name})")
        s_in[self.domain[0], 0] = s_out
        s_in.outer = s_out
        return s_in

    def _advance(self, p: RecurrentTensor, new: RecurrentTensor) -> None:
        if not self.inner:
            p[self.domain[0] + 1] = new
            return
        i, u = self.domain
        p[i, u + 1] = new
        assert p.outer is not None
        p.outer[i + 1] = new[i, u.bound - 1]

    def _grads(self) -> list[RecurrentTensor]:
        grads = []
        for p in self.params:
            if p.grad is None:
                raise ProgramError(f"optimizer.step(): {p.name} has no .grad; call loss.backward()")
            grads.append(p.grad.detach())
        if self.max_grad_norm is not None:
            total = sum((g.square_sum() for g in grads[1:]), grads[0].square_sum())
            scale = (self.max_grad_norm / (total.sqrt() + 1e-6)).clamp(max=1.0)
            grads = [g * scale for g in grads]
        return grads

    def step(self) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """``w[i+1] = w[i] - lr * grad[i]`` (optionally with global-norm gradient clipping)."""

    def step(self) -> None:
        lr = self._lr()
        for p, g in zip(self.params, self._grads(), strict=True):
            self._advance(p, p.detach() - g * lr)


class Adam(Optimizer):
    """Adam with bias correction (and optional clipping by global norm, lr schedules)."""

    def __init__(
        self,
        params: Sequence[RecurrentTensor],
        lr: LearningRate = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        max_grad_norm: float | None = None,
    ) -> None:
        super().__init__(params, lr, max_grad_norm)
        if len(betas) != 2 or not all(_number_at_least(b, 0.0) and b < 1.0 for b in betas):
            raise ProgramError(f"Adam: betas must be two numbers in [0, 1), got {betas!r}")
        if not _number_at_least(eps, 0.0, strict=True):
            raise ProgramError(f"Adam: eps must be a number > 0, got {eps!r}")
        self.betas, self.eps = betas, eps

    def step(self) -> None:
        b1, b2 = self.betas
        lr = self._lr()
        steps = self._steps()
        corr1 = 1.0 - full((), b1) ** steps
        corr2 = 1.0 - full((), b2) ** steps
        for p, g in zip(self.params, self._grads(), strict=True):
            m, v = self._state(p, "adam_m"), self._state(p, "adam_v")
            m_new = m * b1 + g * (1.0 - b1)
            v_new = v * b2 + g * g * (1.0 - b2)
            self._advance(m, m_new)
            self._advance(v, v_new)
            # torch's order, m / (sqrt(v) / sqrt(c2) + eps), keeps one array beside the state
            # rather than two, but holds m until the last division: under a budget that swaps
            # the moments, memory-e8 planned 18.8 MiB with it, 16.0 with this (benchmarks.md)
            update = (m_new / corr1) / ((v_new / corr2).sqrt() + self.eps)
            self._advance(p, p.detach() - update * lr)


class Polyak(Optimizer):
    """Target parameters that trail sources: ``target <- (1 - tau) * target + tau * source``.

    The update at a point reads the sources at that same point, i.e. before the optimiser's
    update there, so targets lag the sources by one update (one iteration for targets over
    ``(i,)``). ``every=k`` applies it only at every k-th step (``tau=1, every=k``: a hard copy
    every k steps, as in DQN) and keeps the targets unchanged in between.
    """

    def __init__(
        self,
        targets: Sequence[RecurrentTensor],
        sources: Sequence[RecurrentTensor],
        tau: float = 0.005,
        every: int = 1,
    ) -> None:
        super().__init__(targets, lr=0.0)
        self.sources = list(sources)
        if len(self.sources) != len(self.params):
            raise ProgramError(
                f"Polyak: {len(self.params)} targets but {len(self.sources)} sources"
            )
        for p, s in zip(self.params, self.sources, strict=True):
            if tuple(p.shape) != tuple(s.shape) or s.op.domain != p.op.domain:
                raise ProgramError(
                    f"Polyak: target {p.name} {tuple(p.shape)} over "
                    f"({', '.join(d.name for d in p.op.domain)}) does not match source "
                    f"{s.name} {tuple(s.shape)} over ({', '.join(d.name for d in s.op.domain)})"
                )
        if not 0.0 < tau <= 1.0:
            raise ProgramError(f"Polyak: tau must lie in (0, 1], got {tau}")
        if int(every) < 1:
            raise ProgramError(f"Polyak: every must be at least 1, got {every}")
        self.tau, self.every = float(tau), int(every)

    def step(self) -> None:
        due = None
        if self.every > 1:
            due = (self._steps() % float(self.every)) == 0.0
        for p, s in zip(self.params, self.sources, strict=True):
            old = p.detach()
            new = old + (s.detach() - old) * self.tau if self.tau < 1.0 else s.detach()
            self._advance(p, new if due is None else where(due, new, old))
