"""Linear recurrences as one scan: ``x[t] = a[t] + c[t] * x[t + 1]`` over a whole loop.

GAE and discounted returns are first-order linear recurrences backward in time:

    adv[.., T - 1] = b[.., T - 1]
    adv[.., t]     = a[.., t] + c[.., t] * adv[.., t + 1]        (t < T - 1)

Point by point, each step is a piecewise choice, a product, a sum and their bookkeeping in a
loop over ``t`` of its own, although ``a``, ``c`` and ``b`` are known before that loop starts
(on PPO's numpy program the loop took about 3% of a 16-env iteration). This pass rewrites such
an ``x`` into

    s[..]     = linear_scan(a[.., 0:T], c[.., 0:T], b[.., T - 1])   (one op, no ``t``)
    x[.., t]  = select_at(s[..], index=t)

(``x`` keeps its id: its readers, and a user reading it as an output, read the rows) and
vectorisation, which runs next, reads ``s`` whole where ``x`` was read whole and a row of it
where ``x`` was read at a point. The scan computes each row as the program did (the product,
then the sum, in the op's dtype), so the values are the same to the bit. The forward form
(``x[.., 0] = b``, ``x[.., t] = a + c * x[.., t - 1]``) is the same scan in the other direction.

An ``x`` is rewritten only when all of this holds (else it is left as written):

- it is a piecewise definition over its innermost dim ``t`` (not the program's outermost, which
  carries the training state and its iteration hooks) with a static extent, of two branches:
  the first where ``t == T - 1`` (or ``t == 0``), the second unconditional;
- the second branch is ``add(a, m)`` (either order) with ``m = mul(c, x[.., t + 1])`` (either
  order; ``t - 1`` forward), ``x`` read at its own outer point; the sum and product are read by
  nothing else, and nobody reads them but this definition;
- ``a``, ``c`` and the first branch's ``b`` are read at the point itself, over dims of ``x``
  with ``t`` among them for ``a`` and ``c``; ``a`` has ``x``'s shape, ``c`` and ``b`` its shape
  or none (a number the scan broadcasts);
  every value has ``x``'s floating dtype;
- none of ``a``, ``c``, ``b`` depends on ``x`` at the same outer point (they must be complete
  before the scan runs); reads of an earlier or later outer point (the parameters' ``i - 1``)
  do not count;
- ``a`` and ``c`` can be computed at every point of ``t`` (``ir/reads.computable_points``):
  the scan reads them whole, also at the base's point, where the loop never needed them (a
  term reading ``u[t + 1]`` is out of range at ``T - 1``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from timerl.compiler.spec import ProgramSpec
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, carried, consumers, copy_graph, walk
from timerl.ir.reads import computable_points
from timerl.symbolic import TRUE, Condition, Const, Dim, Expr, Slice


class _Decline(Exception):
    """A linear recurrence the pass cannot rewrite (``explain()`` says why)."""


class _NotLinear(Exception):
    """Not a linear recurrence over an inner dim: nothing to say about it."""


def _at_point(e: Edge, dims: Sequence[Dim]) -> bool:
    """``e`` reads its source at the reader's own point, over some of ``dims``."""
    return all(i is d and d in dims for i, d in zip(e.index, e.src.domain, strict=True))


def _depends_on(starts: Iterable[Op], x: Op, dim: Dim) -> bool:
    """Whether a value read from ``starts`` needs ``x`` at the same point of its outer dims."""
    stack, seen = list(starts), set()
    while stack:
        op = stack.pop()
        if op.id == x.id:
            return True
        if op.id in seen:
            continue
        seen.add(op.id)
        stack.extend(e.src for e in op.inputs if not carried(e, dim))
    return False


def _reads(op: Op, x: Op) -> bool:
    return prims.get(op.prim).traits.algebra == "mul" and any(e.src.id == x.id for e in op.inputs)


def _split(op: Op, kind: str, x: Op | None = None) -> tuple[Edge, Edge]:
    """The two operands of an op computing ``kind`` (``Traits.algebra``: ``"add"``,
    ``"mul"``), the one reading ``x`` (if given) second."""
    if prims.get(op.prim).traits.algebra != kind or len(op.inputs) != 2:
        raise _NotLinear
    first, second = op.inputs
    if x is not None and first.src.id == x.id:
        first, second = second, first
    return first, second


def _match(x: Op, spec: ProgramSpec, readers: dict) -> tuple[Op, Op, Edge, Edge, Edge, bool]:
    """``(sum, product, a, c, b, reverse)`` of a recurrence ``x`` the pass can rewrite."""
    if not prims.get(x.prim).traits.piecewise or not x.domain or len(x.inputs) != 2:
        raise _NotLinear
    t = x.domain[-1]
    if spec.dims and t is spec.dims[0]:
        raise _NotLinear  # the training iteration's parameters and moments: left as written
    base, step = x.inputs
    if step.cond != TRUE or not _at_point(step, x.domain) or not _at_point(base, x.domain):
        raise _NotLinear
    if base.cond == t.eq(t.bound - 1):
        reverse, lag = True, 1
    elif base.cond == t.eq(Const(0)):
        reverse, lag = False, -1
    else:
        raise _NotLinear
    total = step.src
    a, prod_edge = _split(total, "add")
    if not _reads(prod_edge.src, x):
        a, prod_edge = prod_edge, a
    product = prod_edge.src
    c, xe = _split(product, "mul", x)
    if xe.src.id != x.id or xe.cond != TRUE or not _at_point(prod_edge, x.domain):
        raise _NotLinear
    for d, idx in zip(x.domain, xe.index, strict=True):
        want = d + lag if d is t else d
        if not (idx is d if d is not t else isinstance(idx, Expr) and idx == want):
            raise _NotLinear
    if spec.static.get(t.bound, 0) < 1:
        raise _Decline(f"the extent of {t.name} is not static")
    if not np.issubdtype(x.dtype, np.floating) or not all(isinstance(s, Const) for s in x.shape):
        raise _Decline("not a float tensor of static shape")
    if any(len(readers[o.id]) != 1 for o in (total, product)):
        raise _Decline("its step's product or sum is read elsewhere too")
    for e, name in ((a, "a"), (c, "c")):
        if e.cond != TRUE or not _at_point(e, x.domain) or t not in e.src.domain:
            raise _Decline(f"its term {name} is not read at its own point along {t.name}")
    if (
        a.src.shape != x.shape
        or c.src.shape not in (x.shape, ())
        or base.src.shape not in (x.shape, ())
    ):
        raise _Decline("its terms' shapes differ from its own")
    if any(o.dtype != x.dtype for o in (a.src, c.src, base.src, total, product)):
        raise _Decline("its terms have another dtype")
    if _depends_on((a.src, c.src, base.src), x, t):
        raise _Decline("its terms depend on it")
    return total, product, a, c, base, reverse


def _rewrite(x: Op, a: Edge, c: Edge, b: Edge, reverse: bool) -> tuple[Op, Op]:
    """The scan over ``x``'s outer point and ``x`` as a row of it."""
    t = x.domain[-1]
    whole = Slice(Const(0), t.bound)
    end = t.bound - 1 if reverse else Const(0)

    def sliced(e: Edge, at: Expr | Slice) -> Edge:
        return Edge(e.src, tuple(at if i is t else i for i in e.index))

    extent = (t.bound, *x.shape)
    scan = Op(
        prim="linear_scan",
        domain=x.domain[:-1],
        shape=extent,
        dtype=x.dtype,
        inputs=[sliced(a, whole), sliced(c, whole), sliced(b, end)],
        attrs={"reverse": reverse},
        name=f"scan({x.label})",
        site=x.site,
    )
    row = Op(
        prim="select_at",
        domain=x.domain,
        shape=x.shape,
        dtype=x.dtype,
        inputs=[Edge(scan, tuple(x.domain[:-1]))],
        attrs={"index": t},
        name=x.name,
        site=x.site,
        id=x.id,  # the same tensor: its readers, and a user reading it as an output, find it
    )
    return scan, row


def scan_recurrences(spec: ProgramSpec, notes: list[str] | None = None) -> ProgramSpec:
    """The program with every linear recurrence the pass can show equal rewritten as a scan."""
    readers = consumers(spec.ops)
    computable: dict[int, Condition] | None = None  # where each op can be computed (lazily)
    replaced: set[int] = set()
    created: list[Op] = []
    for x in spec.ops:
        if not prims.get(x.prim).traits.piecewise:
            continue
        try:
            _, _, a, c, b, reverse = _match(x, spec, readers)
        except _NotLinear:
            continue
        except _Decline as why:
            if notes is not None:
                notes.append(f"not scanned {x.label}: {why}")
            continue
        if computable is None:
            computable = computable_points(list(spec.ops))
        if computable[a.src.id] != TRUE or computable[c.src.id] != TRUE:
            # the scan reads them over the whole range, the base's point too, where the loop
            # never needed them (``u[t + 1]`` at ``T - 1``)
            if notes is not None:
                notes.append(f"not scanned {x.label}: its terms are not defined at every point")
            continue
        scan, row = _rewrite(x, a, c, b, reverse)
        replaced.add(x.id)
        created += [scan, row]
        if notes is not None:
            notes.append(f"scanned {x.label} over {x.domain[-1].name} as one linear recurrence")
    if not replaced:
        return spec
    copied = copy_graph([op for op in spec.ops if op.id not in replaced] + created)
    return spec.with_ops(walk(spec.with_ops(copied).roots))
