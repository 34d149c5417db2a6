"""The storage table as the runtime keeps it: which store each op gets, and which loop
allocates each block."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from timerl.ir.graph import Op
from timerl.memory.storage import Storage
from timerl.runtime.stores import BlockStore, RingStore, SwappablePoints, TierMeter
from timerl.runtime.streams import READ_AHEAD_ENV, StreamStore
from timerl.schedule.fused import FusedBody, FusedLoop, Region
from timerl.schedule.program import Compute, Loop, Schedule, SwapIn, SwapOut


class StorePlan:
    """The storage table as the executors need it: which ops are blocks or views of blocks,
    and which loop allocates each block.
    ``body``: the statements run (the fusion pass's included), whose loops allocate the
    blocks; by default the schedule's own."""

    def __init__(
        self, schedule: Schedule, storage: Mapping[int, Storage], body: list | None = None
    ) -> None:
        self.storage = storage
        self.blocks: dict[int, Op] = {}
        # point stores a memory budget swaps to disk (``memory/point_swap.py``)
        self.swapped_points = {
            s.op.id for s in schedule.statements() if isinstance(s, (SwapOut, SwapIn)) and s.points
        }
        self.views = {i for i, s in storage.items() if s.kind == "view"}
        self.rings = {i for i, s in storage.items() if s.kind == "ring"}
        self.aliases = {i for i, s in storage.items() if s.kind == "alias"}
        # blocks and rings whose kernel writes each row itself (``Storage.in_place``)
        self.in_place = {
            i
            for i, s in storage.items()
            if s.in_place and s.kind in ("block", "ring") and not s.streamed
        }
        self.allocations: dict[int, list[Op]] = {}  # id(loop) -> blocks it allocates
        # op id -> bytes of streamed rows its kernel holds while it runs (memory/budget.py)
        self.read_bytes = {i: s.read_bytes for i, s in storage.items() if s.read_bytes}

        def visit(body: list, loop: Loop | None) -> None:
            for s in body:
                if isinstance(s, Loop):
                    visit(s.body, s)
                elif isinstance(s, Region):
                    visit(s.stmts, loop)
                elif isinstance(s, (FusedLoop, FusedBody)):
                    visit([s.loop], loop)
                elif isinstance(s, Compute) and loop is not None:
                    st = storage.get(s.op.id)
                    kind = st.kind if st is not None else "point"
                    if kind in ("block", "ring", "alias") and s.op.id not in self.blocks:
                        self.blocks[s.op.id] = s.op
                        self.allocations.setdefault(id(loop), []).append(s.op)

        visit(schedule.body if body is None else body, None)

    def make_stores(
        self, ops: Iterable[Op], backend: Any, tier: TierMeter | None = None
    ) -> dict[int, Any]:
        """A store per op: a ``BlockStore`` for each block, a dict otherwise; the block
        stores count what they hold in the next tier on ``tier``."""
        out: dict[int, Any] = {}
        for op in ops:
            if op.id in self.blocks:
                elem = tuple(int(s.value) for s in op.shape)
                extent = self.storage[op.id].extent or 0
                if op.id in self.rings:
                    outer = len(op.domain) - 1
                    out[op.id] = RingStore(extent, elem, op.dtype, backend, outer)
                    continue
                st = self.storage[op.id]
                if st.streamed:
                    chunk = st.chunk_bytes or None
                    ahead = st.read_ahead and os.environ.get(READ_AHEAD_ENV, "1") != "0"
                    out[op.id] = StreamStore(
                        extent, elem, op.dtype, backend, op.label, chunk, ahead
                    )
                    continue
                owns = op.id not in self.aliases
                out[op.id] = BlockStore(extent, elem, op.dtype, backend, owns)
            elif op.id in self.swapped_points:
                out[op.id] = SwappablePoints(backend)
            else:
                out[op.id] = {}
        if tier is not None:
            for store in out.values():
                if isinstance(store, (BlockStore, SwappablePoints)):
                    store.tier = tier
        return out

    def allocated_by(self, loop: Loop) -> list[Op]:
        return self.allocations.get(id(loop), [])

    def writes_row(self, op: Op, backend: Any) -> bool:
        """Whether ``op``'s kernel writes each point into its row, on ``backend``."""
        return op.id in self.in_place and backend.donating_lowering(op.prim) is not None
