"""The row table: how each primitive's value follows its inputs' rows (a leading axis of many
rows: the steps of a rollout, a minibatch), in one entry per primitive for every pass that
asks.

* ``blocks`` (``compiler/incrementalize.py``): computed a block of rows at a time, which rows
  of each input an op's block of rows reads; ``accumulates``: an op whose value over all rows
  is the sum of its values over blocks of them (a sum over the rows, ``x.T @ g``).
* ``stacks`` (``compiler/reuse.py``): stacking rows commutes with the op, so the op applied
  to stacked rows equals the stack of its rows: the value-number key of its result.
* ``row_view``, ``row_reader``, ``transposes`` (``memory/streams.py``, streaming a block to
  disk): a view that keeps rows read on demand (``ir/rowwise.RowSource``) such rows, a kernel
  that reads its first operand a chunk of rows at a time, and a view that is the 2-D transpose
  of its input.

The rules shared by families of primitives are here; the others are beside their primitive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from timerl.ir.prims.table import RuleTable
from timerl.symbolic import Bound, Const, Expr, Slice

if TYPE_CHECKING:
    from timerl.ir.graph import Op

Shape = tuple[Expr, ...]


class Decline(Exception):
    """An op cannot be computed a block of rows at a time."""


class Numbered(Protocol):
    """What ``stacks`` rules see of an operand's value number (``compiler/reuse.py``)."""

    rank: int

    @property
    def row(self) -> bool: ...


# (op, its row axis, its shape, its inputs' shapes as read) -> each input's row axis (None:
# the input is read whole); shapes have the program's static bounds in them
RowRule = Callable[["Op", int, Shape, Sequence[Shape]], tuple[int | None, ...]]
# (op, its inputs' shapes) -> for each row count the op can sum over, each input's row axis
Accumulation = Callable[["Op", Sequence[Shape]], dict[int, tuple[int | None, ...]]]
# (op, its operands' numbers) -> the key of its value, or None (not row-wise here)
StackRule = Callable[["Op", list[Numbered]], "tuple | None"]
# (the view, whether the block reaches it transposed, the static bounds) -> why its rows
# cannot stay on demand, or None
RowView = Callable[["Op", bool, Mapping[Bound, int]], "str | None"]


@dataclass(frozen=True)
class RowReader:
    """A kernel that reads its first operand, rows kept on demand, a chunk at a time."""

    # why it cannot read this source (given the reader, whether the source is the block's
    # transpose, and the source), or None
    declines: Callable[[Op, bool, Op], str | None]
    # whether it reads the rows as a transpose, holding a slab of its result (given the
    # reader and whether the source is transposed)
    flips: Callable[[Op, bool], bool]
    # rows it reads in all, of a source of ``nrows`` rows (a gather may read some twice)
    rows_read: Callable[[Op, Mapping[Bound, int], int], int]


@dataclass(frozen=True)
class Rows:
    """A primitive's row semantics (the module docstring); a field left None: that pass has
    no rule for it."""

    blocks: RowRule | None = None
    accumulates: Accumulation | None = None
    stacks: StackRule | None = None
    row_view: RowView | None = None
    row_reader: RowReader | None = None
    transposes: bool = False


TABLE: RuleTable[Rows] = RuleTable("rows", "a Rows entry (incrementalize, reuse, budget)")
_NONE = Rows()


def rows(prim: str) -> Rows:
    """The primitive's row semantics (no rule in any field where it is declined)."""
    return TABLE.rule(prim) or _NONE


def block_rule(prim: str) -> RowRule | None:
    """How a primitive's rows follow its inputs' rows (None: it mixes them)."""
    return rows(prim).blocks


def accumulation(prim: str) -> Accumulation | None:
    """How a primitive's value over all rows sums its values over blocks (None: it does not)."""
    return rows(prim).accumulates


def stack_rule(prim: str) -> StackRule | None:
    """The primitive's value-numbering rule over stacked rows (None: not row-wise)."""
    return rows(prim).stacks


def row_view(prim: str) -> RowView | None:
    """The primitive's rule as a view of rows kept on demand (None: it reads them whole)."""
    return rows(prim).row_view


def row_reader(prim: str) -> RowReader | None:
    """The primitive's rule as a kernel reading rows a chunk at a time (None: it does not)."""
    return rows(prim).row_reader


def transposes(prim: str) -> bool:
    """Whether a view of this primitive may be its input's 2-D transpose."""
    return rows(prim).transposes


# --- static sizes ------------------------------------------------------------------------------


def const_size(e: Expr) -> int | None:
    return e.value if isinstance(e, Const) else None


def const_prod(shape: Shape) -> int:
    """Elements of a static shape (0 where a size is not static)."""
    out = 1
    for s in shape:
        out *= const_size(s) or 0
    return out


def reduced_axes(op: Op, rank: int) -> set[int]:
    axes = op.attrs.get("axes")
    return set(range(rank)) if axes is None else {a % rank for a in axes}


# --- blocks of rows: rules shared by families --------------------------------------------------


def aligned(out_rank: int, axis: int, shape: Shape, rows: int | None) -> int | None:
    """The input axis broadcasting puts under output axis ``axis``, if it holds the rows."""
    at = axis - (out_rank - len(shape))
    if at < 0 or const_size(shape[at]) == 1:
        return None
    if const_size(shape[at]) != rows:
        raise Decline(f"an operand has {shape[at]} where the rows are")
    return at


def elementwise_blocks(
    op: Op, axis: int, out: Shape, shapes: Sequence[Shape]
) -> tuple[int | None, ...]:
    return tuple(aligned(len(out), axis, s, const_size(out[axis])) for s in shapes)


def reduce_other(op: Op, axis: int, out: Shape, shapes: Sequence[Shape]) -> tuple[int | None, ...]:
    """A reduction over other axes than the rows keeps each row."""
    rank = len(shapes[0])
    axes = reduced_axes(op, rank)
    kept = range(rank) if op.attrs.get("keepdims") else [a for a in range(rank) if a not in axes]
    at = list(kept)[axis]
    if at in axes:
        raise Decline("reduces the rows")
    return (at,)


def along_other_axis(
    op: Op, axis: int, out: Shape, shapes: Sequence[Shape]
) -> tuple[int | None, ...]:
    """``gather`` (``take_along_axis``) and its transpose ``scatter_add``: each row picks
    from (or adds into) its own row, along another axis."""
    if axis == op.attrs["axis"] % len(out):
        raise Decline("picks along the rows")
    return tuple(aligned(len(out), axis, s, const_size(out[axis])) for s in shapes)


# --- stacked rows (value numbering): rules shared by families ----------------------------------


def attrs_key(op: Op) -> tuple | None:
    """The op's attributes as a hashable key (None where one is not hashable)."""
    items = []
    for k, v in sorted(op.attrs.items()):
        try:
            hash(v)
        except TypeError:
            return None
        items.append((k, v))
    return tuple(items)


def _unbatched_below(op: Op, vals: list[Numbered]) -> bool:
    """Unbatched operands broadcast without touching the row axis."""
    rank = len(op.shape)
    return all(v.row or v.rank < rank for v in vals)


def elementwise_key(op: Op, vals: list[Numbered]) -> tuple | None:
    if not _unbatched_below(op, vals):
        return None
    attrs = attrs_key(op)
    return None if attrs is None else (op.prim, attrs)


def reduce_key(op: Op, vals: list[Numbered]) -> tuple | None:
    """A reduction over axes other than the rows, of row values."""
    axes = op.attrs.get("axes")
    rank = vals[0].rank
    if axes is None or not vals[0].row or any(a % rank == 0 for a in axes):
        return None
    attrs = attrs_key(op)
    return None if attrs is None else (op.prim, attrs)


# --- rows on demand: views that keep them ------------------------------------------------------


def splits_rows(view: Op, static: Mapping[Bound, int]) -> bool:
    """The view keeps a row source's rows whole: it has a multiple of the rows of its input
    (the whole block's ``extent``, or a view of it) in front (``(T, E, D) -> (T * E, D)``)."""
    src = view.inputs[0]
    env = {b: int(v) for b, v in static.items()}
    try:
        nrows = int(view.shape[0].evaluate(env))
        before = src.src.shape
        first = (
            int(src.index[-1].stop.evaluate(env)) - int(src.index[-1].start.evaluate(env))
            if isinstance(src.index[-1], Slice)
            else int(before[0].evaluate(env))
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return first > 0 and nrows % first == 0


def keeps_rows(view: Op, transposed: bool, static: Mapping[Bound, int]) -> str | None:
    """A view of the whole input (identity, detach, a reshape splitting each row into rows)."""
    if transposed or not view.shape or not splits_rows(view, static):
        return f"{view.label} reshapes its rows"
    return None


ELEMENTWISE = Rows(blocks=elementwise_blocks, stacks=elementwise_key)
