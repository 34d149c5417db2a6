"""Neural-network modules whose parameters are recurrent over the iteration dim.

A parameter is a placeholder over ``(i,)`` with ``requires_grad=True`` and a base case
``w[0] = init``; an optimiser's ``step()`` writes ``w[i + 1]``. ``module.unroll(u)`` gives a
copy whose parameters run over ``(i, u)`` for several updates per iteration (PPO epochs and
minibatches): ``w_u[i, 0] = w[i]``, and the optimiser carries the last update back to
``w[i + 1]``.

A module may declare a **role** (``MLP(..., role="critic")``): its parameters carry it, so a
program picks parameters by what they are for (``policy.parameters(role="critic")``), and a
compiled program lists them with it (``prog.parameters()``). An applied ``MLP`` declares its
activation, which ``prog.activations()`` reports by network name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from timerl.api.scope import current
from timerl.api.tensor import RecurrentTensor
from timerl.errors import ProgramError
from timerl.ir.build import apply
from timerl.ir.graph import View
from timerl.ir.prims import orthogonal_array
from timerl.symbolic import Dim


def orthogonal(rows: int, cols: int, gain: float, rng: np.random.Generator) -> np.ndarray:
    """An orthogonal init (well-conditioned at depth; the usual choice for RL policies)."""
    return orthogonal_array(rows, cols, gain, rng)


def role_of(tensor: RecurrentTensor) -> str | None:
    """The role declared for a parameter (by :func:`parameter` or its module), or None."""
    return tensor.ctx.declarations.roles.get(tensor.op.id)


def _declare_role(tensor: RecurrentTensor, role: str | None) -> None:
    if role is not None:
        tensor.ctx.declarations.roles[tensor.op.id] = role


class Module:
    """A set of named parameters and a forward function over recurrent tensors."""

    role: str | None = None  # what the module is for ("actor", "critic"); its parameters' role

    def parameters(self, role: str | None = None) -> list[RecurrentTensor]:
        """The parameters, in declaration order; with ``role``, those declared with it."""
        out: list[RecurrentTensor] = []
        for value in vars(self).values():
            if isinstance(value, RecurrentTensor) and value.requires_grad:
                out.append(value)
            elif isinstance(value, Module):
                out.extend(value.parameters())
            elif isinstance(value, list):
                for v in value:
                    if isinstance(v, Module):
                        out.extend(v.parameters())
        if role is not None:
            out = [p for p in out if role_of(p) == role]
        return out

    def _modules(self) -> list[Module]:
        """This module and every module inside it."""
        out: list[Module] = [self]
        for value in vars(self).values():
            inner = value if isinstance(value, list) else [value]
            for v in inner:
                if isinstance(v, Module):
                    out.extend(v._modules())
        return out

    def _map(self, fn: Callable[[RecurrentTensor], RecurrentTensor]) -> Module:
        new = object.__new__(type(self))
        for key, value in vars(self).items():
            if isinstance(value, RecurrentTensor) and value.requires_grad:
                value = fn(value)
            elif isinstance(value, Module):
                value = value._map(fn)
            elif isinstance(value, list):
                value = [v._map(fn) if isinstance(v, Module) else v for v in value]
            setattr(new, key, value)
        return new

    def at(self, *index: object) -> Module:
        """This module with every parameter read at ``index`` (e.g. ``policy.at(i)``)."""
        return self._map(lambda p: _Bound(p[index]))

    def unroll(self, dim: Dim) -> Module:
        """A copy with parameters over ``(*domain, dim)`` starting from these parameters."""

        def inner(p: RecurrentTensor) -> RecurrentTensor:
            dom = p.op.domain
            if dim in dom:
                raise ProgramError(f"unroll: {p.name} already runs over {dim.name}")
            q = RecurrentTensor.placeholder(
                p.shape, p.dtype, dom + (dim,), requires_grad=True, name=f"{p.name}@{dim.name}"
            )
            q[tuple(dom) + (0,)] = p
            q.outer = p  # type: ignore[attr-defined]
            _declare_role(q, role_of(p))
            return q

        return self._map(inner)

    def copy(self, prefix: str = "target") -> Module:
        """Separate parameters over the same domain that start equal to these.

        The usual target network of off-policy learners: it is never differentiated, and
        :class:`timerl.api.optim.Polyak` moves it toward the original parameters.
        """

        def inner(p: RecurrentTensor) -> RecurrentTensor:
            dom = p.op.domain
            if not dom or p.outer is not None:
                raise ProgramError(
                    f"copy: {p.name} must run over the iteration dim alone, not "
                    f"({', '.join(d.name for d in dom)})"
                )
            # Start from the same initial value, not from a read of p[0]: the copy is
            # updated from p and p from a loss on the copy, so reading p here would tie the
            # two recurrences into one cycle of ops.
            init = p.op.inputs[0].src if p.op.inputs else None
            if init is None or init.domain:
                raise ProgramError(f"copy: {p.name} must start from a constant initial value")
            q = RecurrentTensor.placeholder(
                p.shape, p.dtype, dom, requires_grad=True, name=f"{prefix}.{p.name}"
            )
            q[tuple(0 for _ in dom)] = RecurrentTensor(View.of(init), p.ctx)
            _declare_role(q, role_of(p))
            return q

        new = self._map(inner)
        for module in new._modules():  # the copy's networks are named as its parameters are
            if isinstance(module, MLP):
                module.name = f"{prefix}.{module.name}"
        return new

    def detached(self) -> Module:
        """This module with every parameter read through ``detach()``: a forward pass that
        passes gradients to its input but never to its own weights (SAC's actor loss)."""
        return self._map(lambda p: p.detach())

    def __call__(self, x: RecurrentTensor) -> RecurrentTensor:
        return self.forward(x)

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        raise NotImplementedError


class _Bound(RecurrentTensor):
    """A parameter read at a fixed index: used in forward passes, not itself trained."""

    __slots__ = ()

    def __init__(self, t: RecurrentTensor) -> None:
        super().__init__(t.view, t.ctx, requires_grad=True)


def parameter(
    value: np.ndarray | RecurrentTensor,
    domain: tuple[Dim, ...],
    name: str,
    role: str | None = None,
) -> RecurrentTensor:
    """A trained parameter over ``domain`` (the iteration dim, or none) starting from
    ``value``: a placeholder with ``requires_grad=True`` and the base case ``w[0] = value``,
    which an optimiser's ``step()`` continues. ``role``: what it is for (see ``role_of``)."""
    from timerl.api.context import from_numpy

    init = value if isinstance(value, RecurrentTensor) else from_numpy(value, name=f"{name}.init")
    p = RecurrentTensor.placeholder(init.shape, init.dtype, domain, requires_grad=True, name=name)
    if domain:
        p[tuple(0 for _ in domain)] = init
    else:
        p[True] = init
    _declare_role(p, role)
    return p


_param = parameter


def _orthogonal_init(rows: int, cols: int, gain: float, seed: int, name: str) -> RecurrentTensor:
    """An orthogonal init drawn when the program runs: the program holds its seed, not the
    array, so the initial weights are freed once the first iteration has read them."""
    view = apply(
        "orthogonal",
        name=name,
        shape=(rows, cols),
        dtype=np.dtype(np.float32),
        gain=float(gain),
        seed=int(seed),
    )
    return RecurrentTensor(view, current())


def _default_domain(domain: Sequence[Dim] | None) -> tuple[Dim, ...]:
    if domain is not None:
        return tuple(domain)
    ctx = current()
    return (ctx.dims[0],) if len(ctx.dims) > 1 else ()


def _check_size(what: str, size: Any, context: str = "") -> None:
    # bool is an int subclass, and numpy integers are not ints: check both explicitly
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
        raise ProgramError(f"{what} must be a positive int, got {size!r}{context}")


class Linear(Module):
    """``y = x @ W + b`` with an orthogonal init (gain ``sqrt(2)`` by default)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        gain: float = math.sqrt(2.0),
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "linear",
        role: str | None = None,
    ) -> None:
        for what, size in (("in_features", in_features), ("out_features", out_features)):
            _check_size(f"Linear {name!r}: {what}", size)
        ctx = current()
        dom = _default_domain(domain)
        stream = seed if seed is not None else ctx.next_stream()
        init = _orthogonal_init(in_features, out_features, gain, stream, f"{name}.weight.init")
        self.role = role
        self.weight = parameter(init, dom, f"{name}.weight", role)
        self.bias = (
            parameter(np.zeros(out_features, np.float32), dom, f"{name}.bias", role)
            if bias
            else None
        )

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y


ACTIVATIONS: dict[str, Callable[[RecurrentTensor], RecurrentTensor]] = {
    "tanh": lambda x: x.tanh(),
    "relu": lambda x: x.relu(),
    "sigmoid": lambda x: x.sigmoid(),
}


class MLP(Module):
    """Linear layers with an activation between them; the last layer has its own init gain."""

    def __init__(
        self,
        sizes: Sequence[int],
        activation: str = "tanh",
        out_gain: float = 1.0,
        domain: Sequence[Dim] | None = None,
        seed: int | None = None,
        name: str = "mlp",
        role: str | None = None,
    ) -> None:
        if len(sizes) < 2:
            raise ProgramError(f"MLP needs at least input and output sizes, got {list(sizes)}")
        for k, size in enumerate(sizes):
            _check_size(f"MLP {name!r}: sizes[{k}]", size, f" (sizes={list(sizes)})")
        if activation not in ACTIVATIONS:
            raise ProgramError(
                f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}"
            )
        self.activation = activation
        self.name = name
        self.role = role
        n = len(sizes) - 1
        self.layers = [
            Linear(
                sizes[k],
                sizes[k + 1],
                gain=out_gain if k == n - 1 else math.sqrt(2.0),
                domain=domain,
                seed=None if seed is None else seed * 1000 + k,
                name=f"{name}.{k}",
                role=role,
            )
            for k in range(n)
        ]

    def forward(self, x: RecurrentTensor) -> RecurrentTensor:
        act = ACTIVATIONS[self.activation]
        if len(self.layers) > 1:  # an activation is applied: declare it
            reads = [p.op.id for p in self.parameters()]
            x.ctx.declarations.note_network(self.name, self.activation, self.role, reads)
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = act(x)
        return x
