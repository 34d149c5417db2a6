"""Donation: an elementwise op writes its result into the buffer of an input that dies at it.

Decided on the schedule with its memory statements: op ``Y`` (elementwise, not a view) donates
input ``X`` when the statements right after ``Y``'s (its frees) free exactly the point of ``X``
that ``Y`` reads, so no one reads that point after ``Y``. Its buffer is then ``Y``'s to write
(``out=`` on numpy and torch), and the old and new values are never both live. The buffer must
be ``X``'s alone, written by nothing else:

* ``X`` computes a fresh array (an elementwise op that is not a view, or a matmul): not a view
  of another tensor, not a constant the program holds, not a host call's value;
* no op that may share its input's buffer reads ``X`` (``Traits.shares_input``: a view, a
  merge, basic indexing, a host call): its value would share the buffer and outlive the free;
* ``X`` is a point store (not a block's row), not a kept output, computed exactly where ``Y``
  runs (both unguarded, or the same guard and ``Y`` reads ``X`` at its own point);
* same static shape and dtype as ``Y`` (no broadcast into it), every input of ``Y`` of that
  dtype (the result is computed in it), ``Y`` of rank at least one.

``X`` may also be a merge (a recurrence's first point from one tensor, the rest from its own
previous point: an optimiser's moment, a parameter updated by minibatches). A merge returns
one of its branches' arrays, so its buffer is ``Y``'s to write when every branch's source
meets the rules above and the point the branch reads is freed between the merge and ``Y``
(the merge was its last reader): whichever branch was taken, the merge's value is then the
only reference to that buffer. Without this, each such update held the old and the new
value at once (3 MiB apiece for a first-layer weight of 12,288 x 64).

The table maps ``Y``'s op id to the position of the input it writes into. ``Y`` takes that
point out of ``X``'s store, so the free after it releases nothing: a donated result allocates
nothing new, and the meter and ``planned_peak`` count it so. Backends without a lowering that
writes into an input (jax: immutable arrays) skip the entries
(``Backend.donations``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from timerl.ir import prims
from timerl.ir.graph import Op
from timerl.schedule.program import Compute, Free, Loop, Schedule, Stmt
from timerl.symbolic import TRUE, Const, Slice, always_eq, always_lt0


def _fresh(op: Op) -> bool:
    """Whether ``op``'s kernel always returns a new array of its own."""
    t = prims.get(op.prim).traits
    if t.view or t.piecewise or t.host or t.constant:
        return False
    return t.fresh


def _static_shape(op: Op) -> tuple[int, ...] | None:
    if not all(isinstance(s, Const) for s in op.shape):
        return None
    return tuple(int(s.value) for s in op.shape)


def computes_into(y: Op) -> bool:
    """Whether ``y``'s kernel can write its result into a buffer it is given (``out=``): an
    elementwise op that is not a view, of static rank at least one, whose inputs all have its
    dtype (the result is computed in it, with no cast after)."""
    t = prims.get(y.prim).traits
    if not t.elementwise or t.view or t.piecewise or t.host or t.random or t.constant:
        return False
    shape = _static_shape(y)
    if shape is None or len(shape) < 1:
        return False
    return all(e.src.dtype == y.dtype for e in y.inputs)


def plan_donations(
    sched: Schedule, ops: Iterable[Op], storage: Mapping[int, object], keep: set[int]
) -> dict[int, int]:
    """Op id -> the input position whose buffer it writes its result into."""
    ops = list(ops)
    aliased_by: dict[int, set[int]] = {}  # op -> the readers that may share its buffer
    for op in ops:
        if prims.get(op.prim).traits.shares_input:
            for e in op.inputs:
                aliased_by.setdefault(e.src.id, set()).add(op.id)
    aliased = set(aliased_by)
    out: dict[int, int] = {}
    taken: set[int] = set()  # frees already consumed by a donation

    def point_kind(op_id: int) -> str:
        st = storage.get(op_id)
        return getattr(st, "kind", "point") if st is not None else "point"

    def visit(body: list[Stmt], outer: list[list[Stmt]]) -> None:
        for j, s in enumerate(body):
            if isinstance(s, Loop):
                visit(s.body, [*outer, body[:j]])
                continue
            if not isinstance(s, Compute) or not computes_into(s.op):
                continue
            y = s.op
            if point_kind(y.id) != "point":
                continue
            frees: list[Free] = []
            for nxt in body[j + 1 :]:
                if not isinstance(nxt, Free):
                    break
                frees.append(nxt)
            before = [*outer, body[:j]]  # what ran before ``y``, from the outermost body in
            for e in y.inputs:
                x = e.src
                if not _donor(x, y, e, keep, aliased, point_kind(x.id)) and not (
                    _merge_donor(x, y, e, keep, aliased, point_kind(x.id))
                    and _branches_die(x, before, keep, aliased_by, point_kind, _chain([x]))
                ):
                    continue
                free = next((f for f in frees if id(f) not in taken and _frees_read(f, e)), None)
                if free is not None:
                    # the last input reading that point takes it (inputs are read in order)
                    out[y.id] = max(j for j, f in enumerate(y.inputs) if _same_read(f, e))
                    taken.add(id(free))
                    break

    visit(sched.body, [])
    return out


def _donor(x: Op, y: Op, e, keep: set[int], aliased: set[int], kind: str) -> bool:
    return _fresh(x) and _dies_into(x, y, e, keep, aliased, kind)


def _merge_donor(x: Op, y: Op, e, keep: set[int], aliased: set[int], kind: str) -> bool:
    """``_donor``'s rules for a merge ``x`` (its branches are checked by ``_branches_die``)."""
    return prims.get(x.prim).traits.piecewise and _dies_into(x, y, e, keep, aliased, kind)


def _dies_into(x: Op, y: Op, e, keep: set[int], aliased: set[int], kind: str) -> bool:
    """Whether ``y`` may take ``x``'s point as its own buffer, whatever computed it: a point
    store no view shares and no output keeps, computed where ``y`` runs, of ``y``'s static
    shape and dtype, read whole and unconditionally."""
    return (
        kind == "point"
        and x.id not in keep
        and x.id not in aliased
        and _runs_with(x, y, e)
        and x.dtype == y.dtype
        and _static_shape(x) == _static_shape(y)
        and e.cond == TRUE
        and not any(isinstance(i, Slice) for i in e.index)
    )


def _branches_die(
    merge: Op,
    before: list[list[Stmt]],
    keep: set[int],
    aliased_by: Mapping[int, set[int]],
    point_kind: Callable[[int], str],
    chain: set[int],
) -> bool:
    """Whether each branch of ``merge`` hands it a buffer no one else holds once the merge has
    run: a fresh point, a constant (the lowering copies it into the merge), or a merge of such
    (an outer recurrence's point, itself read from an inner one's last); and the point read is
    freed after the merge (the merge was its last reader) and before the donation. Only
    merges of ``chain`` (those the donated value can come through) may share a branch's
    buffer, and each of those has let go of it by then.

    ``before`` lists the statements run before the donating op, from its outermost body in,
    each cut at the statement that leads to it."""
    for level in range(len(before) - 1, -1, -1):
        body = before[level]
        at = next((k for k, s in enumerate(body) if isinstance(s, Compute) and s.op is merge), None)
        if at is not None:
            break
    else:
        return False
    frees = [
        f for part in [body[at + 1 :], *before[level + 1 :]] for f in part if isinstance(f, Free)
    ]
    for b in merge.inputs:
        src = b.src
        traits = prims.get(src.prim).traits
        if traits.constant and not src.domain:
            continue  # broadcast and copied into the merge, not shared (``runtime/codegen.py``)
        if src.dtype != merge.dtype or _static_shape(src) != _static_shape(merge):
            return False  # a broadcast or a cast: not the branch's buffer
        if not (
            point_kind(src.id) == "point"
            and src.id not in keep
            and aliased_by.get(src.id, set()) <= chain
            and not any(isinstance(i, Slice) for i in b.index)
        ):
            return False
        if not (_fresh(src) or traits.piecewise) or not any(_frees_point(f, b) for f in frees):
            return False
        if traits.piecewise and not _branches_die(src, before, keep, aliased_by, point_kind, chain):
            return False
    return True


def owned_merges(donations: Mapping[int, int], by_id: Mapping[int, Op]) -> set[int]:
    """The merges whose buffer a donation writes into, with the merges their branches read
    (``_branches_die``): a constant branch of theirs is copied, not shared."""
    return _chain(by_id[i].inputs[k].src for i, k in donations.items() if i in by_id)


def copies_branch(merge: Op, edge, owned: set[int]) -> bool:
    """Whether the lowering of ``merge`` copies the value ``edge`` reads into a buffer of its
    own: a constant branch of a merge a donation writes into (``owned_merges``), which would
    otherwise share the program's constant (both executors)."""
    return merge.id in owned and prims.get(edge.src.prim).traits.constant


def aliasing_merges(ops: Iterable[Op], owned: set[int]) -> set[int]:
    """The merges whose value is one of their branches' buffers, not a new array: every
    branch has the merge's static shape and dtype (no broadcast, no cast) and is not copied
    (``copies_branch``).

    Such a merge is counted with its bytes, as every value is, and the branch's free after
    it takes them back; but no peak is recorded where it is computed, since nothing new is
    allocated there. Otherwise the moment between the two counts its buffer twice, and
    where a recurrence starts an update (memory-e8's first-layer weight) that moment was the
    program's peak. ``planned_peak`` and both executors' meters count the same."""
    out: set[int] = set()
    for op in ops:
        shape = _static_shape(op)
        if not prims.get(op.prim).traits.piecewise or shape is None:
            continue
        if all(
            e.src.dtype == op.dtype
            and _static_shape(e.src) == shape
            and not copies_branch(op, e, owned)
            for e in op.inputs
        ):
            out.add(op.id)
    return out


def _chain(merges: Iterable[Op]) -> set[int]:
    """The ids of these merges and of the merges their branches read, transitively."""
    found: set[int] = set()
    todo = list(merges)
    while todo:
        op = todo.pop()
        if prims.get(op.prim).traits.piecewise and op.id not in found:
            found.add(op.id)
            todo.extend(e.src for e in op.inputs)
    return found


def _frees_point(free: Free, e) -> bool:
    """Whether ``free`` releases the point edge ``e`` reads, wherever ``e`` reads it: the point
    is under its prefix, and its kept points are never that point."""
    n = len(free.prefix)
    if free.op is not e.src or n > len(e.index):
        return False
    if not all(always_eq(a, b) for a, b in zip(free.prefix, e.index[:n], strict=True)):
        return False
    if not free.pinned:
        return True
    if n == 0:
        return False
    last = e.index[n - 1]
    return all(always_lt0(last - p) or always_lt0(p - last) for p in free.pinned)


def _same_read(a, b) -> bool:
    return (
        a.src is b.src
        and a.cond == b.cond
        and len(a.index) == len(b.index)
        and all(
            not isinstance(x, Slice) and not isinstance(y, Slice) and always_eq(x, y)
            for x, y in zip(a.index, b.index, strict=True)
        )
    )


def _runs_with(x: Op, y: Op, e) -> bool:
    """Whether ``x``'s point is computed exactly where ``y`` runs, so that the donation
    consumes every point the free after ``y`` would release: both unguarded, or ``y`` reads
    ``x`` at its own point under the same guard."""
    if y.guard == TRUE:
        return x.guard == TRUE
    same_point = tuple(x.domain) == tuple(y.domain) and all(
        i is d for i, d in zip(e.index, y.domain, strict=True)
    )
    return same_point and x.guard == y.guard


def _frees_read(free: Free, e) -> bool:
    """Whether ``free`` releases exactly the one point that edge ``e`` reads."""
    if free.op is not e.src or free.pinned or len(free.prefix) != len(e.src.domain):
        return False
    return all(always_eq(a, b) for a, b in zip(free.prefix, e.index, strict=True))


def describe(donations: Mapping[int, int], ops: Iterable[Op]) -> list[str]:
    """One line per donation, for ``explain``."""
    by_id = {op.id: op for op in ops}
    lines = []
    for i, k in donations.items():
        y = by_id.get(i)
        if y is None:
            continue
        lines.append(f"{y.label} writes into {y.inputs[k].src.label}'s buffer (its last reader)")
    return lines
