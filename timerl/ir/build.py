"""Creating ops: the one place where shape/dtype inference runs and errors get their context."""

from __future__ import annotations

import inspect
import os
import sysconfig
from typing import Any

import numpy as np

from timerl.errors import ProgramError, ShapeError
from timerl.ir import prims
from timerl.ir.graph import Op, View
from timerl.symbolic import Condition, Dim, Expr

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Python's own modules: ``with ctx:`` leaves the context through contextlib, which is no site
# of the user's
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"])


def user_site() -> str | None:
    """``file:line`` of the innermost caller outside the timerl package and Python's own
    modules, for error messages."""
    frame = inspect.currentframe()
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        python = path.startswith(_STDLIB_DIR) and "site-packages" not in path
        if not path.startswith(_PKG_DIR) and not python:
            return (
                f"{os.path.relpath(path) if not path.startswith('..') else path}:{frame.f_lineno}"
            )
        frame = frame.f_back
    return None


def ordered(dims: set[Dim] | frozenset[Dim]) -> tuple[Dim, ...]:
    """Dims in context order: a context creates its dims in order, so creation order is it."""
    return tuple(sorted(dims, key=lambda d: d.uid))


def apply(
    prim: str,
    *inputs: View,
    domain: tuple[Dim, ...] | None = None,
    name: str | None = None,
    effect: bool = False,
    **attrs: Any,
) -> View:
    """Build an op reading ``inputs`` (each with its own index) and return its identity view."""
    rule = prims.get(prim)
    dims: set[Dim] = set()
    for v in inputs:
        dims |= v.dims
    for key in rule.point_attrs:
        # an op whose sizes or values follow the point (``t + 1`` rows) lives over those dims
        values = attrs.get(key)
        for value in values if isinstance(values, (tuple, list)) else (values,):
            if isinstance(value, (Expr, Condition)):
                dims |= {s for s in value.symbols() if isinstance(s, Dim)}
    if domain is None:
        domain = ordered(dims)
    elif not dims <= set(domain):  # a point attr's dims must be inside an explicit domain
        raise ProgramError(
            f"{prim}: operands span dims {sorted(d.name for d in dims)} beyond {domain}"
        )
    site = user_site()
    try:
        shape, dtype = rule.infer([v.shape for v in inputs], [v.dtype for v in inputs], attrs)
    except ShapeError as err:
        operands = ", ".join(f"{v.op.label}{tuple(v.shape)}" for v in inputs)
        raise ShapeError(f"{prim}({operands}){' at ' + site if site else ''}: {err}") from None
    op = Op(
        prim=prim,
        domain=domain,
        shape=shape,
        dtype=np.dtype(dtype),
        inputs=[v.edge() for v in inputs],
        attrs=attrs,
        name=name,
        site=site,
        effect=effect,
    )
    return View.of(op)
