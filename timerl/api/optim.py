"""Optimisers as recurrences over the iteration dim: ``w[i+1] = update(w[i], grad[i])``.

Updates read the previous parameters and gradients *detached*, so ``w.grad[i]`` is exactly the
gradient of ``loss[i]``; optimiser state (Adam's moments) is itself a recurrent tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from timerl.api.tensor import RecurrentTensor, full
from timerl.errors import ProgramError
from timerl.symbolic import Dim, Expr

Schedule = Callable[[Expr], "RecurrentTensor | float"]


class Optimizer:
    def __init__(
        self,
        params: Sequence[RecurrentTensor],
        lr: float | Schedule,
        max_grad_norm: float | None = None,
    ) -> None:
        self.params = list(params)
        if not self.params:
            raise ProgramError("optimizer: no parameters given")
        dims = {p.op.domain[:1] for p in self.params}
        if len(dims) != 1 or not next(iter(dims)):
            raise ProgramError(
                "optimizer: every parameter must be a placeholder whose first domain dim is the "
                "iteration dim (e.g. domain=(i,))"
            )
        self.dim: Dim = next(iter(dims))[0]
        for p in self.params:
            if not p.requires_grad:
                raise ProgramError(f"optimizer: parameter {p.name} needs requires_grad=True")
        self.lr = lr
        self.max_grad_norm = max_grad_norm

    def _lr(self) -> RecurrentTensor | float:
        if callable(self.lr):
            return self.lr(self.dim)
        return self.lr

    def _grads(self) -> list[RecurrentTensor]:
        i = self.dim
        grads = []
        for p in self.params:
            if p.grad is None:
                raise ProgramError(f"optimizer.step(): {p.name} has no .grad; call loss.backward()")
            grads.append(p.grad.detach())
        if self.max_grad_norm is not None:
            total = sum(((g * g).sum() for g in grads[1:]), (grads[0] * grads[0]).sum())
            norm = total.sqrt()
            scale = (self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
            grads = [g * scale for g in grads]
        del i
        return grads

    def step(self) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """``w[i+1] = w[i] - lr * grad[i]`` (optionally with global-norm gradient clipping)."""

    def step(self) -> None:
        i = self.dim
        lr = self._lr()
        for p, g in zip(self.params, self._grads(), strict=True):
            p[i + 1] = p.detach() - g * lr


class Adam(Optimizer):
    """Adam with bias correction; moments are recurrent tensors over the iteration dim."""

    def __init__(
        self,
        params: Sequence[RecurrentTensor],
        lr: float | Schedule = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        max_grad_norm: float | None = None,
    ) -> None:
        super().__init__(params, lr, max_grad_norm)
        self.betas, self.eps = betas, eps

    def step(self) -> None:
        i = self.dim
        b1, b2 = self.betas
        lr = self._lr()
        step = full((), i + 1, dtype="float32")
        corr1 = 1.0 - full((), b1) ** step
        corr2 = 1.0 - full((), b2) ** step
        for p, g in zip(self.params, self._grads(), strict=True):
            dom = p.op.domain
            m = RecurrentTensor.placeholder(p.shape, p.dtype, dom, name=f"adam_m({p.name})")
            v = RecurrentTensor.placeholder(p.shape, p.dtype, dom, name=f"adam_v({p.name})")
            m[i.eq(0)] = 0.0
            v[i.eq(0)] = 0.0
            m_new = m * b1 + g * (1.0 - b1)
            v_new = v * b2 + g * g * (1.0 - b2)
            m[i + 1] = m_new
            v[i + 1] = v_new
            update = (m_new / corr1) / ((v_new / corr2).sqrt() + self.eps)
            p[i + 1] = p.detach() - update * lr
