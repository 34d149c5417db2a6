"""Block stores and circular buffers: an op's points along its last dim held in one
preallocated array per outer point.

``memory/storage.py`` decides which ops get one. A block is allocated when the loop over its
dim starts (``allocate``), each point is written in place into its row, and a slice read along
the dim is a view of the block (``rows``). It is freed whole (``free_all``/``free_prefix``).

``BlockStore`` also answers the dict interface the rest of the runtime uses on point stores
(``store[point]``, ``items``, ``pop``...), so snapshots, checkpoints and generic multi-slice
gathers work on it unchanged; a row that was never written reads as missing (``KeyError``).
``RingStore`` is the circular buffer: ``k`` rows, point ``p`` in row ``p % k``.

Where they go under a memory budget: ``swap_out`` writes a block to a file of this process's
swap directory and ``swap_in`` reads it back; ``SwappablePoints`` does the same for the points
of a point store; ``streams.StreamStore`` keeps blocks in files from the start. Which store an
op gets is ``store_plan.StorePlan``'s; a fused loop's stacked results are a
``row_store.RowStore``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

_SWAP_DIR: list[str] = []
SWAP_DIR_ENV = "TIMERL_SWAP_DIR"  # where swapped and streamed blocks go (else the temp dir)


def _swap_dir() -> str:
    """One directory of this process's own for swapped blocks, removed at exit.

    It is made fresh (a unique name) under ``TIMERL_SWAP_DIR`` or the temp dir, so the files
    a crashed run left behind never meet a new run's."""
    if not _SWAP_DIR:
        parent = os.environ.get(SWAP_DIR_ENV) or None
        if parent is not None:
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as err:
                raise OSError(
                    f"{SWAP_DIR_ENV}={parent!r} is not a usable directory: {err}"
                ) from err
        path = tempfile.mkdtemp(prefix=f"timerl-swap-{os.getpid()}-", dir=parent)
        atexit.register(shutil.rmtree, path, True)
        _SWAP_DIR.append(path)
    return _SWAP_DIR[0]


# references to a spare block's rows where nothing else holds them: the spare list's and
# ``sys.getrefcount``'s own argument
_RESTING_REFS = 2


def _write_swap_file(array: np.ndarray, suffix: str) -> str:
    """``array``'s bytes, raw, in a new file of the swap directory (never mapped): its path."""
    fd, path = tempfile.mkstemp(prefix="timerl-swap-", suffix=suffix, dir=_swap_dir())
    with os.fdopen(fd, "wb") as f:
        array.tofile(f)
    return path


def _read_swap_file(path: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """What ``_write_swap_file`` wrote, in a fresh array; the file is removed."""
    array = np.fromfile(path, dtype=dtype).reshape(shape)
    os.unlink(path)
    return array


def _block_size(extent: int, elem: tuple[int, ...], dtype: Any) -> int:
    """Bytes of a block of ``extent`` rows of shape ``elem``."""
    return int(np.prod((extent, *elem), dtype=np.int64)) * np.dtype(dtype).itemsize


class TierMeter:
    """Bytes held in the next memory tier (disk, or host memory from an accelerator) by
    swapped and streamed blocks: the run's live count and its peak, shared by its stores."""

    __slots__ = ("live", "peak")

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def add(self, n: int) -> None:
        self.live += n
        if self.live > self.peak:
            self.peak = self.live

    def sub(self, n: int) -> None:
        self.live -= n


class BlockStore:
    """Blocks of ``extent`` rows of shape ``elem``, keyed by the point of the outer dims."""

    __slots__ = (
        "blocks",
        "extent",
        "elem",
        "dtype",
        "empty",
        "nbytes_of",
        "block_bytes",
        "backend",
        "on_disk",
        "on_host",
        "moved",
        "tier",
        "spare",
        "bases",
    )

    def __init__(
        self, extent: int, elem: tuple[int, ...], dtype: Any, backend: Any, owns: bool = True
    ) -> None:
        self.blocks: dict[tuple, tuple[Any, np.ndarray]] = {}  # outer -> (rows, written mask)
        self.extent = extent
        self.elem = elem
        self.dtype = dtype
        self.empty = backend.empty
        self.nbytes_of = backend.nbytes
        self.backend = backend
        # outer -> (file, dtype, written mask) of a block swapped out to disk
        self.on_disk: dict[tuple, tuple[str, np.dtype, np.ndarray]] = {}
        # outer -> (host copy, written mask) of a block swapped out of an accelerator
        self.on_host: dict[tuple, tuple[Any, np.ndarray]] = {}
        self.moved = 0  # bytes moved to the next tier (disk or host memory) and back
        self.tier = TierMeter()  # the run's, shared by its stores (``make_stores``)
        # an alias's blocks are another store's memory: freeing them releases nothing
        self.block_bytes = _block_size(extent, elem, dtype) if owns else 0
        # None, or a list holding at most one freed block's rows for the next allocation
        # (``keep_spare``)
        self.spare: list[np.ndarray] | None = None
        self.bases: dict[int, np.ndarray] = {}  # id of a block's rows -> the array under them

    def keep_spare(self, fault_in: bool = True) -> None:
        """Keep a freed block's rows for the next block instead of giving them back.

        A block above the C heap's mmap threshold (memory-e8's 375 MiB rollout of images) is
        a fresh mapping at each allocation, and each iteration faulted all of its pages in
        again: about 96,000 faults, 10% of the iteration. Chosen by the compiler only where
        holding the rows while the block is dead keeps the run under its planned peak
        (``PlannedPeak.spare_blocks``). ``fault_in``: make the spare now and touch its pages,
        so that the first iteration does not fault them (setup does).

        The rows kept are a numpy array, the block's memory on any CPU backend (a torch
        block is a tensor over it, ``torch.from_numpy``): a view of the rows still alive,
        numpy's (its ``base``) or torch's (its storage), holds a reference to that array, and
        rows a view can still read are not reused (views of a freed block may outlive its
        free by a few statements)."""
        self.spare = []
        if fault_in and self.block_bytes:
            rows = np.empty((self.extent, *self.elem), self.dtype)
            rows[...] = 0
            self.spare.append(rows)

    def _give_back(self, rows: Any) -> None:
        """A freed block's rows: kept as the spare where this store keeps one."""
        if self.spare is None:
            return
        base = rows if type(rows) is np.ndarray else self.bases.pop(id(rows), None)
        if base is not None and not self.spare:
            self.spare.append(base)

    def _new_rows(self) -> Any:
        spare = self.spare
        if spare is None:
            return self.empty((self.extent, *self.elem), self.dtype)
        if spare and sys.getrefcount(spare[0]) <= _RESTING_REFS:
            base = spare.pop()
        else:
            spare.clear()
            base = np.empty((self.extent, *self.elem), self.dtype)
        rows = self.backend.asarray(base)
        if rows is not base:
            self.bases[id(rows)] = base  # what ``_give_back`` keeps of it
        return rows

    # --- what the executors call -----------------------------------------------------------
    def allocate(self, outer: tuple) -> int:
        """Make the block of ``outer`` if it does not exist yet; the bytes it took."""
        if outer in self.blocks:
            return 0
        self.blocks[outer] = (self._new_rows(), np.zeros(self.extent, dtype=bool))
        return self.block_bytes

    def share(self, outer: tuple, base: BlockStore) -> int:
        """Make the block of ``outer`` a view of ``base``'s, rows reshaped to this elem."""
        if outer not in self.blocks:
            rows = base.blocks[outer][0].reshape((self.extent, *self.elem))
            self.blocks[outer] = (rows, np.zeros(self.extent, dtype=bool))
        return 0

    def rows(self, outer: tuple, start: int, stop: int) -> Any:
        """A view of rows ``start:stop`` of the block of ``outer``."""
        return self.blocks[outer][0][start:stop]

    def free_all(self) -> int:
        n = len(self.blocks) * self.block_bytes
        while self.blocks:
            self._give_back(self.blocks.popitem()[1][0])
        self._forget_swapped(())
        return n

    # --- swapping to the next tier ------------------------------------------------------------
    def swap_out(self, key: tuple) -> int:
        """Move the blocks under ``key`` to the backend's next tier; bytes released.

        On the host that tier is disk: each block's rows written raw to a file and read back
        explicitly into a fresh array (``tofile``/``fromfile``: no copy of the block on the
        way, never mapped), so a swapped block holds no memory at all; the written mask
        (a byte a row) stays. An accelerator's next tier is host memory
        (``Backend.to_host``)."""
        k = len(key)
        n = 0
        to_host = self.backend.swap_tier == "host"
        for outer in [o for o in self.blocks if o[:k] == key]:
            rows, written = self.blocks.pop(outer)
            n += self.block_bytes
            if to_host:
                self.on_host[outer] = (self.backend.to_host(rows), written)
                continue
            array = np.ascontiguousarray(self.backend.to_numpy(rows))
            self.on_disk[outer] = (_write_swap_file(array, ".rows"), array.dtype, written)
        self.moved += n
        self.tier.add(n)
        return n

    def swap_in(self, key: tuple) -> int:
        """Bring back the blocks under ``key`` that ``swap_out`` moved; bytes taken again."""
        k = len(key)
        n = 0
        for outer in [o for o in self.on_host if o[:k] == key]:
            rows, written = self.on_host.pop(outer)
            self.blocks[outer] = (self.backend.from_host(rows), written)
            n += self.block_bytes
        for outer in [o for o in self.on_disk if o[:k] == key]:
            path, dtype, written = self.on_disk.pop(outer)
            rows = _read_swap_file(path, dtype, (self.extent, *self.elem))
            self.blocks[outer] = (self.backend.asarray(rows), written)
            n += self.block_bytes
        self.moved += n
        self.tier.sub(n)
        return n

    def _forget_swapped(self, key: tuple) -> None:
        k = len(key)
        for outer in [o for o in self.on_host if o[:k] == key]:
            del self.on_host[outer]
            self.tier.sub(self.block_bytes)
        for outer in [o for o in self.on_disk if o[:k] == key]:
            os.unlink(self.on_disk.pop(outer)[0])
            self.tier.sub(self.block_bytes)

    def free_prefix(self, key: tuple) -> int:
        k = len(key)
        gone = [outer for outer in self.blocks if outer[:k] == key]
        for outer in gone:
            self._give_back(self.blocks.pop(outer)[0])
        self._forget_swapped(key)
        return len(gone) * self.block_bytes

    # --- the dict interface of a point store -----------------------------------------------
    def __getitem__(self, point: tuple) -> Any:
        rows, written = self.blocks[point[:-1]]
        last = point[-1]
        if not (0 <= last < self.extent) or not written[last]:
            raise KeyError(point)
        return rows[last]

    def _block(self, outer: tuple) -> tuple[Any, np.ndarray]:
        """The block of ``outer`` (rows, record of points), allocated on its first write."""
        if outer not in self.blocks:
            self.allocate(outer)
        return self.blocks[outer]

    def __setitem__(self, point: tuple, value: Any) -> None:
        rows, written = self._block(point[:-1])
        rows[point[-1]] = value
        written[point[-1]] = True

    def row_to_write(self, point: tuple) -> Any:
        """The row of ``point``, marked written: a kernel writes the value into it."""
        rows, written = self._block(point[:-1])
        written[point[-1]] = True
        return rows[point[-1]]

    def get(self, point: tuple, default: Any = None) -> Any:
        try:
            return self[point]
        except KeyError:
            return default

    def __contains__(self, point: object) -> bool:
        return isinstance(point, tuple) and self.get(point) is not None

    def pop(self, point: tuple, default: Any = None) -> Any:
        """Forget one point (its row stays allocated until the block is freed)."""
        value = self.get(point, default)
        if point[:-1] in self.blocks and 0 <= point[-1] < self.extent:
            self.blocks[point[:-1]][1][point[-1]] = False
        return value

    def items(self) -> Iterator[tuple[tuple, Any]]:
        for outer, (rows, written) in list(self.blocks.items()):
            for k in np.flatnonzero(written):
                yield outer + (int(k),), rows[k]

    def keys(self) -> Iterator[tuple]:
        return (p for p, _ in self.items())

    __iter__ = keys

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def __len__(self) -> int:
        return sum(int(written.sum()) for _, written in self.blocks.values())

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def clear(self) -> None:
        self.blocks.clear()
        self.bases.clear()

    def __repr__(self) -> str:
        return f"BlockStore({len(self.blocks)} blocks of {self.extent} x {self.elem})"


class RingStore(BlockStore):
    """A circular buffer: ``extent`` rows per outer point, point ``p`` along the dim in row
    ``p % extent`` (``memory/storage.py`` chose the window). Each row records which point it
    holds, so reading a point that was overwritten or freed is a ``KeyError``, as on a dict."""

    __slots__ = ("outer_len",)

    def __init__(
        self, extent: int, elem: tuple[int, ...], dtype: Any, backend: Any, outer_len: int
    ) -> None:
        super().__init__(extent, elem, dtype, backend)
        self.outer_len = outer_len  # coordinates before the ring's dim

    def allocate(self, outer: tuple) -> int:
        if outer in self.blocks:
            return 0
        self.blocks[outer] = (
            self.empty((self.extent, *self.elem), self.dtype),
            np.full(self.extent, -1, dtype=np.int64),
        )
        return self.block_bytes

    def window(self, outer: tuple, start: int, stop: int) -> Any:
        """Points ``start:stop`` in order: a view of the rows when they do not wrap around."""
        rows, held = self.blocks[outer]
        n = self.extent
        for p in range(start, stop):
            if held[p % n] != p:
                raise KeyError(outer + (p,))
        first = start % n if stop > start else 0
        if first + (stop - start) <= n:
            return rows[first : first + stop - start]
        return rows[[p % n for p in range(start, stop)]]

    def free_prefix(self, key: tuple) -> int:
        if len(key) > self.outer_len:  # one point: its row stays until the buffer is freed
            self.pop(key)
            return 0
        return BlockStore.free_prefix(self, key)

    def __getitem__(self, point: tuple) -> Any:
        rows, held = self.blocks[point[:-1]]
        last = point[-1]
        if held[last % self.extent] != last:
            raise KeyError(point)
        return rows[last % self.extent]

    def __setitem__(self, point: tuple, value: Any) -> None:
        rows, held = self._block(point[:-1])
        rows[point[-1] % self.extent] = value
        held[point[-1] % self.extent] = point[-1]

    def row_to_write(self, point: tuple) -> Any:
        rows, held = self._block(point[:-1])
        held[point[-1] % self.extent] = point[-1]
        return rows[point[-1] % self.extent]

    def pop(self, point: tuple, default: Any = None) -> Any:
        """Forget one point (its row stays allocated until the buffer is freed)."""
        value = self.get(point, default)
        entry = self.blocks.get(point[:-1])
        if entry is not None and entry[1][point[-1] % self.extent] == point[-1]:
            entry[1][point[-1] % self.extent] = -1
        return value

    def items(self) -> Iterator[tuple[tuple, Any]]:
        for outer, (rows, held) in list(self.blocks.items()):
            for r in np.flatnonzero(held >= 0):
                yield outer + (int(held[r]),), rows[r]

    def __len__(self) -> int:
        return sum(int((held >= 0).sum()) for _, held in self.blocks.values())

    def __repr__(self) -> str:
        return f"RingStore({len(self.blocks)} rings of {self.extent} x {self.elem})"


class SwappablePoints(dict):
    """A point store whose points a memory budget moves to disk while they are idle: an
    optimiser's moments between two updates, a gradient waiting for the optimiser
    (``memory/point_swap.py``).

    Each swapped point is written raw to a file of its own and read back into a fresh array,
    like a swapped block (``BlockStore.swap_out``). A point on disk is still the program's
    state: ``snapshot`` reads it through ``all_items``, and ``clear`` deletes its file."""

    def __init__(self, backend: Any) -> None:
        super().__init__()
        self.backend = backend
        self.on_disk: dict[tuple, tuple[str, np.dtype, tuple[int, ...]]] = {}
        self.moved = 0  # bytes moved to disk and back
        self.tier = TierMeter()  # the run's, shared by its stores (``make_stores``)

    def swap_out(self, key: tuple) -> int:
        """Write the points under ``key`` to disk and drop them; bytes released."""
        n = 0
        for point in [p for p in self if p[: len(key)] == key]:
            array = np.ascontiguousarray(self.backend.to_numpy(self.pop(point)))
            self.on_disk[point] = (_write_swap_file(array, ".point"), array.dtype, array.shape)
            n += array.nbytes
        self.moved += n
        self.tier.add(n)
        return n

    def swap_in(self, key: tuple) -> int:
        """Read back the points under ``key`` that ``swap_out`` wrote; bytes taken again."""
        n = 0
        for point in [p for p in self.on_disk if p[: len(key)] == key]:
            array = _read_swap_file(*self.on_disk.pop(point))
            self[point] = self.backend.asarray(array)
            n += array.nbytes
        self.moved += n
        self.tier.sub(n)
        return n

    def all_items(self) -> Iterator[tuple[tuple, Any]]:
        """Every point, those on disk read back (as numpy) without moving them."""
        yield from self.items()
        for point, (path, dtype, shape) in self.on_disk.items():
            yield point, np.fromfile(path, dtype=dtype).reshape(shape)

    def clear(self) -> None:
        super().clear()
        for path, dtype, shape in self.on_disk.values():
            self.tier.sub(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
            os.unlink(path)
        self.on_disk.clear()
