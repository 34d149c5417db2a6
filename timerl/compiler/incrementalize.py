"""Incrementalisation: a computation over many rows runs as a loop over blocks of them.

PPO's update computes the loss and its gradient over every point of the rollout at once:
each op of the forward and backward pass holds ``N`` rows (8,000 at 8 envs x 1,000 steps),
and only the weight gradients and a few sums leave the computation. Within one domain ``D``
(the update's ``(i, u)``), a *row region* is a set of ops over ``D`` whose values share a row
axis of static size ``N`` such that each row of an op's value depends only on the same row
of its inputs (elementwise ops, a product by a weight, reshapes that keep the rows,
reductions over other axes: each primitive's ``blocks`` rule in the row table,
``ir/prims/rows.py``), and whose readers outside the region are *accumulations* (its
``accumulates`` rule): a sum over the row axis, or a product that contracts it (``x.T @ g``,
a weight gradient).

Such a region runs over a new dim ``k`` of ``K = N / B`` blocks. At ``k`` each region op
holds rows ``k B .. (k + 1) B`` of its old value; an input from outside the region is read
through a ``narrow`` view of those rows (no copy); each accumulation computes its block's
part and adds it to a running sum, a recurrence along ``k`` read after the last block::

    part[k]  = f(block k of the region)
    total[k] = part[0]                  if k == 0
               total[k - 1] + part[k]   if k >= 1

Only one block of each intermediate is alive at once. A recurrence's domain conditions widen
to every point (``ir/reads.py``), so a running sum is used only where every op of the region
can be computed at every point of its domain (a training loop's update: it then also runs
at the last iteration, whose result nothing reads); elsewhere the ``K`` parts are kept (a
block store) and summed after the loop, ``total = sum(part[0:K])``, which keeps each op's
conditions exact. An accumulation whose running sum (or parts) would hold more than the
rows it reads runs whole after the loop instead, on its region inputs kept whole
(``gathered``), as does any reader outside the region. The sums are the same sums in
another order, so results equal the unblocked program's up to float rounding (the tests
compare them value for value). The rest of the compiler schedules the new loop like any
other: the rewrite only introduces a dim.

It runs where a memory budget needs it (``api/context.py`` derives the number of blocks from
the budget) or where ``CompileOptions.blocks`` asks for it. ``B`` is the largest divisor of
``N`` at most ``N`` over the blocks asked for, so every block has one static shape. One region
per row count and domain, the domain's regions taken by the bytes they save, most first (PPO's
update has two: the batch's 8,000 rows, and the 12,288 rows of the first layer's weights that
Adam updates elementwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from timerl.compiler.spec import ProgramSpec
from timerl.ir import prims
from timerl.ir.graph import Edge, Op, View, consumers
from timerl.ir.prims.rows import Decline, accumulation, const_prod, const_size
from timerl.ir.prims.rows import block_rule as row_rule
from timerl.ir.reads import computable_points
from timerl.symbolic import TRUE, Const, Dim, Expr, Slice

MIN_BLOCKS = 2  # fewer blocks than this is no incrementalisation
# a region whose largest op holds less than this over all rows is not worth its loop: a
# loop over the blocks of many small ops (Adam's update of a 256 x 256 weight) costs more
# calls than its memory is worth
MIN_OP_BYTES = 1 << 20


Shape = tuple[Expr, ...]


@dataclass
class Region:
    """Ops over ``domain`` computed a block of their ``rows`` rows at a time: each op's row
    axis and its inputs' (None: read whole), the accumulations with their inputs' row axes,
    and the region ops also read whole after the loop."""

    domain: tuple[Dim, ...]
    rows: int
    axis: dict[int, int]
    inputs: dict[int, tuple[int | None, ...]]
    sums: dict[int, tuple[int | None, ...]]
    held: dict[int, int]  # op id -> bytes of its value over all rows (not gathered or a view)
    gathered: set[int]  # read whole after the loop too: their blocks are kept
    running: bool  # sums run along the blocks (else each block's part is kept)


def _eligible(op: Op, keep: set[int]) -> bool:
    p = prims.get(op.prim)
    t = p.traits
    return not (op.effect or t.random or t.host or t.multi_output or p.keyed or op.id in keep)


def _internal(e: Edge, domain: tuple[Dim, ...]) -> bool:
    """The edge reads its source, an op over ``domain``, at the reader's own point (a
    source in the region), under a condition on ``domain`` alone."""
    return (
        e.src.domain == domain
        and View(e.src, e.index).is_identity
        and e.cond.symbols() <= set(domain)
    )


class _Analysis:
    """Finding the row region of one domain; shapes are read with the static bounds in."""

    def __init__(
        self, spec: ProgramSpec, domain: tuple[Dim, ...], blocks: int, running: bool = False
    ) -> None:
        self.spec, self.domain, self.blocks, self.running = spec, domain, blocks, running
        self.static: dict = dict(spec.static)
        self.keep = set(spec.keep) | {op.id for op in spec.roots}
        self.by_id = {op.id: op for op in spec.ops}
        self.readers = consumers(spec.ops)

    def resolve(self, shape: Shape) -> Shape:
        return tuple(
            Const(s.evaluate(self.static)) if s.symbols() <= self.static.keys() else s
            for s in shape
        )

    def out(self, op: Op) -> Shape:
        return self.resolve(op.shape)

    def ins(self, op: Op) -> list[Shape]:
        return [self.resolve(View(e.src, e.index).shape) for e in op.inputs]

    def nbytes(self, op: Op) -> int:
        return const_prod(self.out(op)) * op.dtype.itemsize

    def region(self, tried: set[int] = frozenset()) -> Region | None:
        """The region (of a row count not in ``tried``) whose blocks save the most."""
        sums: dict[int, dict[int, tuple[int | None, ...]]] = {}
        leading: dict[int, list[Op]] = {}  # row count -> ops with that many rows in front
        for op in self.spec.ops:
            if op.domain != self.domain:
                continue
            acc = accumulation(op.prim)
            if acc is not None and _eligible(op, set()):
                for rows, axes in acc(op, self.ins(op)).items():
                    if rows > 1:
                        sums.setdefault(rows, {})[op.id] = axes
            out = self.out(op)
            rows = const_size(out[0]) if out else None
            if rows and rows > 1 and row_rule(op.prim) is not None:
                leading.setdefault(rows, []).append(op)
        candidates = set(sums) | {n for n, found in leading.items() if len(found) > 1}
        candidates -= set(tried)
        grown = [self.grow(n, sums.get(n, {}), leading.get(n, [])) for n in sorted(candidates)]
        worth = [
            r for r in grown if r is not None and max(r.held.values(), default=0) >= MIN_OP_BYTES
        ]
        return max(worth, key=_saved, default=None)

    def grow(
        self, rows: int, seeds: dict[int, tuple[int | None, ...]], leading: list[Op]
    ) -> Region | None:
        """The region of ``rows`` rows the accumulations ``seeds`` and the ops ``leading``
        reach through row-wise ops, less what cannot run by blocks."""
        domain, keep, by_id = self.domain, self.keep, self.by_id
        # an accumulation keeps a part per block: where those hold more than the region's
        # rows it reads, it runs whole after the loop on its gathered rows
        sums = {s: axes for s, axes in seeds.items() if self.accumulates(by_id[s])}
        axis: dict[int, int] = {}
        in_axes: dict[int, tuple[int | None, ...]] = {}
        bad: set[int] = set()
        stack: list[Op] = []

        def propose(src: Op, ax: int) -> None:
            if src.id in axis:
                if axis[src.id] != ax:
                    bad.add(src.id)
                return
            axis[src.id] = ax
            rule = row_rule(src.prim)
            out = self.out(src)
            try:
                if rule is None or const_size(out[ax]) != rows:
                    raise Decline(src.prim)
                in_axes[src.id] = rule(src, ax, out, self.ins(src))
                self.not_a_view_of_outside(src)
                self.not_wide(src, in_axes[src.id])
            except Decline:
                bad.add(src.id)
                return
            stack.append(src)

        def reach(op: Op, axes: tuple[int | None, ...]) -> None:
            for e, ax in zip(op.inputs, axes, strict=True):
                if ax is not None and _internal(e, domain) and _eligible(e.src, keep):
                    propose(e.src, ax)

        for s, axes in seeds.items():
            reach(by_id[s], axes)
        for op in leading:
            if _eligible(op, keep):
                propose(op, 0)
        while stack:
            op = stack.pop()
            reach(op, in_axes[op.id])
        region = {i for i in axis if i not in bad}
        gathered: set[int] = set()
        changed = True
        while changed:  # drop what a reader needs whole elsewhere, or cannot read by rows
            changed = False
            gathered = set()
            for i in sorted(region):
                ok = self.inputs_ok(by_id[i], in_axes[i], region, rows)
                for c, e in self.readers[i]:
                    if not ok:
                        break
                    if _reads_rows(c, e, i, axis[i], region, sums, in_axes):
                        continue
                    # read whole after the loop (at any point: the gathered value has the
                    # op's domain): its blocks are kept and read as one array (a view stays
                    # whole: gathering would copy it); a reader in the loop that needs it
                    # whole cannot have it
                    ok = (
                        c.id not in region
                        and c.id not in sums
                        and axis[i] == 0
                        and not prims.get(by_id[i].prim).traits.view
                    )
                    gathered.add(i)
                if not ok:
                    region.discard(i)
                    changed = True
            for s in sorted(sums):
                op = by_id[s]
                if not self.inputs_ok(op, sums[s], region, rows) or not any(
                    e.src.id in region for e in op.inputs
                ):
                    del sums[s]
                    changed = True
        if not region - gathered:
            return None
        held = {
            i: self.nbytes(by_id[i])
            for i in region
            if i not in gathered and not prims.get(by_id[i].prim).traits.view
        }
        return Region(
            domain,
            rows,
            {i: axis[i] for i in region},
            {i: in_axes[i] for i in region},
            sums,
            held,
            gathered,
            self.running,
        )

    def outside(self, e: Edge) -> bool:
        """The edge's source is computed outside any region of this domain: another domain
        or point, an op that cannot run by blocks, or a view of such a value (it costs
        nothing whole, and its readers in the region read its rows through a narrow)."""
        if not (_internal(e, self.domain) and _eligible(e.src, self.keep)):
            return True
        return prims.get(e.src.prim).traits.view and any(
            not (_internal(x, self.domain) and _eligible(x.src, self.keep)) for x in e.src.inputs
        )

    def not_a_view_of_outside(self, op: Op) -> None:
        if prims.get(op.prim).traits.view and any(self.outside(e) for e in op.inputs):
            raise Decline(f"a view of {op.inputs[0].src.label}, computed outside")

    def not_wide(self, op: Op, axes: tuple[int | None, ...]) -> None:
        """A product whose rows come from an outside input much wider than its own rows
        (the first layer over image observations) runs whole: by blocks it would hold a
        block of the input's rows, read from disk where the input is streamed
        (``memory/budget.py``); whole, it reads them by chunks and holds only its value."""
        out = self.out(op)
        own = max(const_prod(out) // max(const_size(out[0]) or 1, 1), 1)
        for e, shape, ax in zip(op.inputs, self.ins(op), axes, strict=True):
            if ax is None or not self.outside(e):
                continue
            width = const_prod(shape) // max(const_size(shape[ax]) or 1, 1)
            if width > WIDE * own:
                raise Decline(f"reads rows of {e.src.label} {width // own}x as wide")

    def accumulates(self, op: Op) -> bool:
        """Whether summing ``op`` block by block holds less than gathering its row inputs:
        a running sum and a part, or ``K`` parts, against the region's rows it reads."""
        rows_in = sum(
            self.nbytes(e.src)
            for e in op.inputs
            if _internal(e, self.domain) and _eligible(e.src, self.keep)
        )
        held = 2 if self.running else self.blocks
        return held * self.nbytes(op) < rows_in

    def inputs_ok(self, op: Op, axes: tuple[int | None, ...], region: set[int], rows: int) -> bool:
        """Each row input is a region op read at the same point, or has the rows to narrow."""
        for e, shape, ax in zip(op.inputs, self.ins(op), axes, strict=True):
            if ax is None or (e.src.id in region and _internal(e, self.domain)):
                continue
            if ax >= len(shape) or const_size(shape[ax]) != rows:
                return False
        return True


WIDE = 4  # an outside input's rows this many times wider than an op's own are read whole


def find_region(
    spec: ProgramSpec, domain: tuple[Dim, ...], blocks: int, running: bool = False
) -> Region | None:
    """The row region over ``domain`` (module docstring) to run in about ``blocks`` blocks,
    with running sums or not, or None."""
    return _Analysis(spec, domain, blocks, running).region()


def _saved(region: Region) -> int:
    """What the region's ops hold over all rows: what running it by blocks saves."""
    return sum(region.held.values())


def _reads_rows(
    reader: Op,
    e: Edge,
    src: int,
    ax: int,
    region: set[int],
    sums: dict[int, tuple[int | None, ...]],
    in_axes: dict[int, tuple[int | None, ...]],
) -> bool:
    """The reader takes ``src`` block by block: it is in the region or an accumulation,
    reading it at its own point along the same row axis."""
    if reader.id in region:
        axes = in_axes[reader.id]
    elif reader.id in sums:
        axes = sums[reader.id]
    else:
        return False
    return all(
        axes[n] == ax for n, x in enumerate(reader.inputs) if x is e or x.src.id == src
    ) and all(_internal(x, reader.domain) for x in reader.inputs if x.src.id == src)


# --- rewriting -------------------------------------------------------------------------------


def block_rows(rows: int, blocks: int) -> int:
    """Rows per block for about ``blocks`` blocks: the largest divisor of ``rows`` at most
    ``rows / blocks`` (every block has the same static shape)."""
    asked = max(rows // max(blocks, 1), 1)
    best = 1
    for b in range(1, int(rows**0.5) + 1):
        if rows % b == 0:
            for c in (b, rows // b):
                if best < c <= asked:
                    best = c
    return best


class _Rewriter:
    def __init__(self, spec: ProgramSpec, region: Region, size: int, dim: Dim) -> None:
        self.spec, self.region, self.size, self.k = spec, region, size, dim
        self.domain = (*region.domain, dim)
        self.point = tuple(self.domain)
        self.new: dict[int, Op] = {}
        self.extra: list[Op] = []
        self.narrows: dict[tuple, Op] = {}
        self.gathers: dict[int, Op] = {}

    def _block_shape(self, shape: Shape, ax: int) -> Shape:
        return (*shape[:ax], Const(self.size), *shape[ax + 1 :])

    def _attrs(self, op: Op, ax: int) -> dict:
        """A primitive's ``shape`` attribute, where it has one, is its value's shape: the
        block's, at ``k``."""
        attrs = dict(op.attrs)
        if "shape" in attrs and len(tuple(attrs["shape"])) == len(op.shape):
            attrs["shape"] = self._block_shape(tuple(attrs["shape"]), ax)
        return attrs

    def _input(self, e: Edge, ax: int | None) -> Edge:
        """The block-``k`` reader's edge: a region op at ``k``, rows of an outside value, or
        the outside value whole (it has no rows)."""
        if ax is None:
            return Edge(self.new.get(e.src.id, e.src), e.index, e.cond)
        if e.src.id in self.region.axis and _internal(e, self.region.domain):
            return Edge(self.new[e.src.id], self.point, e.cond)
        key = (e.src.id, tuple(map(str, e.index)), ax)
        if key not in self.narrows:
            view = View(e.src, e.index)
            self.narrows[key] = Op(
                prim="narrow",
                domain=self.domain,
                shape=self._block_shape(view.shape, ax),
                dtype=e.src.dtype,
                inputs=[Edge(self.new.get(e.src.id, e.src), e.index)],
                attrs={"axis": ax, "start": self.k * self.size, "length": self.size},
                name=f"{e.src.label}[rows of {self.k.name}]",
                site=e.src.site,
            )
            self.extra.append(self.narrows[key])
        return Edge(self.narrows[key], self.point, e.cond)

    def wire(self) -> list[Op]:
        region, spec = self.region, self.spec
        for op in spec.ops:
            if op.id in region.axis:
                ax = region.axis[op.id]
                self.new[op.id] = Op(
                    prim=op.prim,
                    domain=self.domain,
                    shape=self._block_shape(op.shape, ax),
                    dtype=op.dtype,
                    attrs=self._attrs(op, ax),
                    name=op.name,
                    site=op.site,
                )
            else:
                self.new[op.id] = op.unwired()
        for op in spec.ops:
            if op.id in region.axis:
                self.new[op.id].inputs = [
                    self._input(e, ax)
                    for e, ax in zip(op.inputs, region.inputs[op.id], strict=True)
                ]
            elif op.id in region.sums:
                self._accumulate(op, self.new[op.id])
            else:
                self.new[op.id].inputs = [
                    Edge(self._whole(e.src), e.index, e.cond) for e in op.inputs
                ]
        return [self.new[op.id] for op in spec.ops] + self.extra

    def _whole(self, src: Op) -> Op:
        """What a reader outside the region reads for ``src``: a gathered region op is its
        blocks over ``k`` read as one array (a block store's rows: a view, no copy)."""
        if src.id not in self.region.gathered:
            return self.new[src.id]
        if src.id not in self.gathers:
            blocks = Slice(Const(0), self.k.bound)
            self.gathers[src.id] = Op(
                prim="reshape",
                domain=self.region.domain,
                shape=src.shape,
                dtype=src.dtype,
                inputs=[Edge(self.new[src.id], (*self.region.domain, blocks))],
                attrs={"shape": src.shape},
                name=f"{src.label}[all blocks]",
                site=src.site,
            )
            self.extra.append(self.gathers[src.id])
        return self.gathers[src.id]

    def _accumulate(self, op: Op, total: Op) -> None:
        """``op`` becomes the sum of its parts over the blocks: a running sum along ``k``
        where the region is needed at every point, else the parts kept (a block store of
        ``K``) and summed after the loop."""
        axes = self.region.sums[op.id]
        part = Op(
            prim=op.prim,
            domain=self.domain,
            shape=op.shape,
            dtype=op.dtype,
            inputs=[self._input(e, ax) for e, ax in zip(op.inputs, axes, strict=True)],
            attrs=dict(op.attrs),
            name=f"{op.label}[block]",
            site=op.site,
        )
        self.extra.append(part)
        outer, k = self.region.domain, self.k
        if not self.region.running:
            total.prim, total.attrs = "sum", {"axes": (0,), "keepdims": False}
            total.inputs = [Edge(part, (*outer, Slice(Const(0), k.bound)))]
            return
        running = Op(
            prim="merge",
            domain=self.domain,
            shape=op.shape,
            dtype=op.dtype,
            attrs={"shape": op.shape, "dtype": op.dtype},
            name=f"{op.label}[sum over {k.name}]",
            site=op.site,
        )
        step = Op(
            prim="add",
            domain=self.domain,
            shape=op.shape,
            dtype=op.dtype,
            inputs=[Edge(running, (*outer, k - 1)), Edge(part, self.point)],
            name=f"{op.label}[+block]",
            site=op.site,
        )
        running.inputs = [Edge(part, self.point, k.eq(0)), Edge(step, self.point, k >= 1)]
        self.extra += [step, running]
        total.prim, total.attrs = "identity", {}
        total.inputs = [Edge(running, (*outer, k.bound - 1))]


def incrementalize(spec: ProgramSpec, blocks: int, notes: list[str] | None = None) -> ProgramSpec:
    """The program with each row region (module docstring) run in about ``blocks`` blocks
    of rows (``block_rows``)."""
    domains = sorted({op.domain for op in spec.ops}, key=lambda d: (len(d), [x.name for x in d]))
    for domain in domains:
        tried: set[int] = set()  # row counts of this domain's regions, run or declined
        while True:
            region = _region(spec, domain, blocks, tried)
            if region is None:
                break
            tried.add(region.rows)
            size = block_rows(region.rows, blocks)
            count = region.rows // size
            if count < MIN_BLOCKS or count > 2 * blocks:
                continue  # too few blocks, or rows that do not split into about as many
            dim = Dim(f"blocks{len(spec.dims)}")
            spec = _with_dim(spec, domain, dim, count)
            spec = spec.with_ops(_Rewriter(spec, region, size, dim).wire())
            if notes is not None:
                where = ", ".join(d.name for d in domain) or "top level"
                notes.append(
                    f"incrementalised: {len(region.axis)} ops over {region.rows:,} rows "
                    f"({where}) run {size:,} rows at a time in a loop over {dim.name} "
                    f"({count} blocks); " + _sums_note(region)
                )
    return spec


def _sums_note(region: Region) -> str:
    if not region.sums:
        return "no sum over its rows"
    how = "as they go" if region.running else "from parts kept per block"
    return f"{len(region.sums)} sums over its rows accumulated {how}"


def _region(
    spec: ProgramSpec, domain: tuple[Dim, ...], blocks: int, tried: set[int]
) -> Region | None:
    """The domain's next region (of a row count not ``tried``), with running sums where
    every op of it can be computed at every point: a running sum is a recurrence along the
    blocks, whose domain conditions widen to every point (PPO's update then also runs at the
    last iteration, whose result nothing reads)."""
    region = _Analysis(spec, domain, blocks, True).region(tried)
    if region is None:
        return None
    computable = computable_points(list(spec.ops))
    if all(computable[i] == TRUE for i in (*region.axis, *region.sums)):
        return region
    return _Analysis(spec, domain, blocks, False).region(tried)


def _with_dim(spec: ProgramSpec, domain: tuple[Dim, ...], dim: Dim, blocks: int) -> ProgramSpec:
    """The spec with ``dim`` (``blocks`` points) placed right inside ``domain``'s dims."""
    dims = list(spec.dims)
    at = max((dims.index(d) + 1 for d in domain), default=0)
    dims.insert(at, dim)
    static = {**spec.static, dim.bound: blocks}
    return ProgramSpec(
        ops=spec.ops,
        roots=spec.roots,
        outputs=spec.outputs,
        dims=tuple(dims),
        until=spec.until,
        static=static,
        dynamic=spec.dynamic,
    )
