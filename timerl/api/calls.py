"""Calls of the user's own functions from inside a program: host calls and pure calls.

A **host call** runs Python on the host at every point of its domain, in the schedule's time
order: an environment's step, a search that scores the policy's proposal, a logger. It is an
effect (a root of the program that is never duplicated, vectorised, merged or reordered), so
its function may keep state of its own. A **pure call** is a pure function of its inputs with
two faces, one traceable by jax and one on numpy arrays: the passes treat it like any other
op (they may merge, hoist or reorder it), and the jax backend traces it into its loop.

Both declare the arrays the function returns (:class:`Result`): their shapes and dtypes are
what the rest of the program is compiled against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

import numpy as np

from timerl.api.scope import current
from timerl.api.tensor import RecurrentTensor, sizes
from timerl.errors import ProgramError
from timerl.ir.build import apply
from timerl.ir.graph import View
from timerl.symbolic import Expr

__all__ = ["PureFunction", "Result", "host_call", "pure_call"]


@dataclass(frozen=True)
class Result:
    """One array a host or pure call returns: its shape, its dtype, and the name its tensor
    carries in errors, ``explain()`` and renderings."""

    shape: tuple[int | Expr, ...]
    dtype: Any = "float32"
    name: str | None = None  # of a call with one result: the call's own name instead


class PureFunction(Protocol):
    """What :func:`pure_call` calls: ``self(*arrays)`` traced by jax (the jax backend lowers
    the call to it) and ``self.host(*arrays)``, the same function on numpy arrays (what the
    numpy and torch backends run, and the reference); both return a tuple of arrays."""

    def __call__(self, *xs: Any) -> tuple[Any, ...]: ...

    def host(self, *xs: np.ndarray) -> tuple[np.ndarray, ...]: ...


@overload
def host_call(
    fn: Callable[..., Any],
    *inputs: RecurrentTensor,
    result: Result,
    name: str,
    start: Callable[..., Any] | None = None,
    where_assigned: bool = False,
) -> RecurrentTensor: ...


@overload
def host_call(
    fn: Callable[..., Any],
    *inputs: RecurrentTensor,
    results: Sequence[Result],
    name: str,
    exact: bool = False,
    start: Callable[..., Any] | None = None,
    where_assigned: bool = False,
) -> tuple[RecurrentTensor, ...]: ...


def host_call(
    fn: Callable[..., Any],
    *inputs: RecurrentTensor,
    result: Result | None = None,
    results: Sequence[Result] | None = None,
    name: str,
    exact: bool = False,
    start: Callable[..., Any] | None = None,
    where_assigned: bool = False,
) -> RecurrentTensor | tuple[RecurrentTensor, ...]:
    """Call ``fn`` on the host with the inputs' values (numpy arrays) at every point of their
    domain, in time order; its value is the tensor of ``result``, or the tuple of tensors of
    ``results`` (``fn`` then returns a tuple of that many arrays).

    ``exact``: ``fn`` returns exactly the declared shapes and dtypes, so nothing measures or
    casts its arrays (an env step at every point of a rollout). ``start``: a function taking
    the same inputs that begins the work without waiting for it, so the program computes what
    does not need the result meanwhile (an env stepped by remote workers). ``where_assigned``
    (a call without inputs only): the call runs once per point of the dims that the
    assignment storing it moves along, so ``obs[i, 0] = reset()`` calls it at every ``i``."""
    if (result is None) == (results is None):
        raise ProgramError(f"host_call {name}: declare either result= or results=, not both")
    if where_assigned and inputs:
        raise ProgramError(f"host_call {name}: where_assigned applies to a call without inputs")
    _check_inputs(f"host_call {name}", inputs)
    ctx = current()
    parts = [result] if result is not None else list(results or ())
    attrs: dict[str, Any] = {"fn": fn}
    if result is not None:
        attrs.update(shape=tuple(result.shape), dtype=np.dtype(result.dtype))
    else:
        attrs.update(shape=(), dtype=np.dtype(bool))
    if where_assigned:
        attrs["adopt_domain"] = True
    if exact and results is not None:
        # the executor need not measure the arrays, nor a backend cast them again
        attrs["result_nbytes"] = sum(_nbytes(r, name) for r in parts)
        attrs["result_dtypes"] = tuple(np.dtype(r.dtype) for r in parts)
    if start is not None:
        attrs["begin"] = start
    call = apply("udf", *(x.view for x in inputs), effect=True, name=name, **attrs)
    ctx.add_root(call.op)
    if result is not None:
        return RecurrentTensor(call, ctx)
    return _parts(call, parts, ctx)


def pure_call(
    fn: PureFunction, *inputs: RecurrentTensor, results: Sequence[Result], name: str
) -> tuple[RecurrentTensor, ...]:
    """The tensors of the tuple of arrays that the pure function ``fn`` (a
    :class:`PureFunction`) returns for the inputs' values, one per :class:`Result`."""
    if not callable(fn) or not callable(getattr(fn, "host", None)):
        raise ProgramError(
            f"pure_call {name}: fn must be callable (traced by jax) and have a .host method "
            f"(the same function on numpy arrays), got {type(fn).__name__}"
        )
    _check_inputs(f"pure_call {name}", inputs)
    ctx = current()
    call = apply("pure_call", *(x.view for x in inputs), fn=fn, shape=(), dtype=np.dtype(bool))
    call.op.name = name
    return _parts(call, list(results), ctx)


def _parts(call: View, parts: list[Result], ctx: Any) -> tuple[RecurrentTensor, ...]:
    outs = []
    for item, part in enumerate(parts):
        v = apply("tuple_get", call, item=item, shape=tuple(part.shape), dtype=np.dtype(part.dtype))
        v.op.name = part.name
        outs.append(RecurrentTensor(v, ctx))
    return tuple(outs)


def _check_inputs(what: str, inputs: Sequence[Any]) -> None:
    for k, x in enumerate(inputs):
        if not isinstance(x, RecurrentTensor):
            raise ProgramError(
                f"{what}: input {k} is a {type(x).__name__}, not a RecurrentTensor (wrap "
                "arrays with tl.from_numpy)"
            )


def _nbytes(part: Result, name: str) -> int:
    shape = sizes(part.shape, f"host_call {name}")
    if not all(s.is_const for s in shape):
        raise ProgramError(f"host_call {name}: exact results need static shapes, got {part.shape}")
    return (
        int(np.prod([s.evaluate({}) for s in shape], dtype=np.int64))
        * np.dtype(part.dtype).itemsize
    )
