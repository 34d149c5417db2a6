"""Block stores and circular buffers: an op's points along its last dim held in one
preallocated array per outer point.

``compiler/storage.py`` decides which ops get one. A block is allocated when the loop over its
dim starts (``allocate``), each point is written in place into its row, and a slice read along
the dim is a view of the block (``rows``). It is freed whole (``free_all``/``free_prefix``).

``BlockStore`` also answers the dict interface the rest of the runtime uses on point stores
(``store[point]``, ``items``, ``pop``...), so snapshots, checkpoints and generic multi-slice
gathers work on it unchanged; a row that was never written reads as missing (``KeyError``).
``RingStore`` is the circular buffer: ``k`` rows, point ``p`` in row ``p % k``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import closing
from typing import Any

import numpy as np

from timerl.compiler.storage import Storage
from timerl.ir.graph import Edge, Op
from timerl.ir.rowwise import RowSource
from timerl.schedule.fused import FusedBody, FusedLoop, Region
from timerl.schedule.program import Compute, Free, Loop, Schedule, SwapIn, SwapOut
from timerl.symbolic import Dim, Slice

_SWAP_DIR: list[str] = []
SWAP_DIR_ENV = "TIMERL_SWAP_DIR"  # where swapped and streamed blocks go (else the temp dir)
# "0": streamed blocks are not read ahead (the plan still counts two chunks): to compare
READ_AHEAD_ENV = "TIMERL_READ_AHEAD"


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
    ``p % extent`` (``compiler/storage.py`` chose the window). Each row records which point it
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


class RowFile(RowSource):
    """One block's rows in a file: each row written with ``pwrite`` at its offset when it is
    computed, read back with ``preadv`` a chunk of rows at a time. Nothing is mapped, so rows
    on disk hold no memory of the process. The file is unlinked as soon as it is open (only
    its descriptor names it): a run that dies leaves nothing behind.

    A reshape keeping whole rows, a slice of rows and the 2-D transpose are ``RowFile`` views
    of the same descriptor (another stride, offset or flag), so every read is one ``preadv``
    of exactly the bytes asked for. With ``ahead``, a kernel's chunked reads (``chunks``,
    ``gathers``) read the next chunk on a background thread while the kernel computes on
    this one (``preadv`` and numpy's products release the GIL): two chunks held, not one.

    ``counter`` is shared with the store: [bytes moved, seconds a kernel waited on a read,
    chunks that were read ahead in time, chunks waited for].

    The row written last is kept until it is read once, or another read or write comes: a
    rollout's step reads the observation it has just written (the policy's first layer), and
    reading it back from the file took a fresh array and its page faults at every step
    (memory-e8 under its budget: 97,000 of its 247,000 faults an iteration). Read so, the
    row is the array that was written, shown in the reader's row shape."""

    __slots__ = (
        "owner",
        "fd",
        "offset",
        "stride",
        "counter",
        "ahead",
        "name",
        "written",
        "__weakref__",
    )

    def __init__(
        self,
        nrows: int,
        row_shape: tuple[int, ...],
        dtype: Any,
        counter: list,
        name: str = "a streamed block",
        chunk_bytes: int | None = None,
        ahead: bool = False,
    ) -> None:
        fd, path = tempfile.mkstemp(prefix="timerl-stream-", suffix=".rows", dir=_swap_dir())
        os.unlink(path)
        self.owner = self  # the file whose descriptor a view reads (closed with its store)
        self.fd = fd
        self.written: tuple[int, np.ndarray] | None = None  # (row, array) written last
        self.offset = 0
        self.stride = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        while len(counter) < 4:
            counter.append(0)
        self.counter = counter
        self.ahead = ahead
        self.name = name
        os.ftruncate(fd, nrows * self.stride)
        super().__init__(
            nrows, row_shape, dtype, self._read_rows, self._take_rows, chunk_bytes=chunk_bytes
        )

    def _view(
        self, nrows: int, row_shape: tuple[int, ...], offset: int, transposed: bool
    ) -> RowFile:
        """The same file's bytes from ``offset`` seen as ``nrows`` rows of ``row_shape``."""
        view = object.__new__(RowFile)
        view.owner = self.owner
        view.fd = -1
        view.written = None  # (the owner's is the one kept)
        view.offset = offset
        view.stride = int(np.prod(row_shape, dtype=np.int64)) * self.dtype.itemsize
        view.counter = self.counter
        view.ahead = self.ahead
        view.name = self.name
        RowSource.__init__(
            view,
            nrows,
            row_shape,
            self.dtype,
            view._read_rows,
            view._take_rows,
            transposed,
            self.chunk_bytes,
        )
        return view

    # --- reads: ``_load`` runs on the calling thread or the read-ahead thread ----------------
    def _empty(self, request: tuple[int, int] | np.ndarray) -> np.ndarray:
        n = request[1] - request[0] if isinstance(request, tuple) else len(request)
        return np.empty((n, *self.row_shape), dtype=self.dtype)

    def _load(self, request: tuple[int, int] | np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows ``a:b`` (a pair) or the rows at ``ids`` (an array) read from the file into
        ``out`` now.

        Touches no shared state (the caller counts the bytes) and allocates nothing: it may run
        on the read-ahead thread, while ``out`` is allocated on the caller's (memory a thread
        allocates comes from an arena of its own, which would hold freed chunks apart)."""
        fd = self.owner.fd
        if fd < 0:
            raise OSError("the file was closed (its block was freed)")
        if isinstance(request, tuple):
            self._fill(fd, out, request[0])
            return out
        ids = request
        # runs of consecutive rows in ``ids`` are read with one call each
        k = 0
        while k < len(ids):
            j = k + 1
            while j < len(ids) and ids[j] == ids[j - 1] + 1:
                j += 1
            self._fill(fd, out[k:j], int(ids[k]))
            k = j
        return out

    def _fill(self, fd: int, out: np.ndarray, row: int) -> None:
        view = memoryview(out.reshape(-1).view(np.uint8))
        got = 0
        start = self.offset + row * self.stride
        while got < len(view):  # preadv may return short counts
            n = os.preadv(fd, [view[got:]], start + got)
            if n <= 0:
                raise OSError(f"short read at row {row}")
            got += n

    def _failed(self, request: tuple[int, int] | np.ndarray, err: BaseException) -> OSError:
        if isinstance(request, tuple):
            what = f"rows {request[0]}:{request[1]}"
        else:
            what = f"{len(request)} rows from row {int(request[0]) if len(request) else 0}"
        return OSError(f"reading {what} of the streamed block {self.name} from disk failed: {err}")

    def _read_now(
        self, request: tuple[int, int] | np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        self.owner.written = None
        try:
            rows = self._load(request, self._empty(request) if out is None else out)
        except OSError as err:
            raise self._failed(request, err) from err
        self.counter[0] += rows.nbytes
        return rows

    def _read_rows(self, start: int, stop: int) -> np.ndarray:
        return self._read_now((start, stop))

    def _take_rows(self, ids: np.ndarray) -> np.ndarray:
        return self._read_now(ids)

    def chunks(self, step: int) -> Iterator[tuple[int, int, np.ndarray]]:
        spans = [(a, min(a + step, self.nrows)) for a in range(0, self.nrows, step)]
        with closing(self._read_all(spans)) as reads:
            for a, b in spans:
                rows = next(reads)
                yield a, b, rows
                del rows  # (a ``zip`` would keep it until the next chunk is read)

    def gathers(self, ids: np.ndarray, step: int) -> Iterator[tuple[int, np.ndarray]]:
        starts = range(0, len(ids), step)
        with closing(self._read_all([ids[a : a + step] for a in starts])) as reads:
            for a in starts:
                rows = next(reads)
                yield a, rows
                del rows

    def _read_all(self, requests: list) -> Iterator[np.ndarray]:
        """Each request's rows in order; with ``ahead``, the next one is read meanwhile.

        The read-ahead thread is this generator's own (a pool of one, shut down when the
        generator ends or is closed, waiting for the one read in flight): a kernel reads a
        source start to end, so one thread one chunk ahead is all the overlap there is to
        have, and no thread outlives the kernel, even one interrupted mid-way. A failed read
        is raised here, on the caller's thread, naming the block."""
        counter = self.counter
        self.owner.written = None
        # chunks the caller let go of, read into again: a new array per chunk would be mapped
        # and its pages faulted in under a memory budget, where the heap keeps no freed pages
        # (memory-e32 reads its 1.5 GiB of observations four times an iteration)
        spare: list[np.ndarray] = []

        def buffer(request: tuple[int, int] | np.ndarray) -> np.ndarray:
            # the smallest spare that holds the rows; a shorter chunk (a read's last) is read
            # into its front, or a spare of a full chunk would sit unused beside a new one
            n = request[1] - request[0] if isinstance(request, tuple) else len(request)
            fits = [k for k, rows in enumerate(spare) if len(rows) >= n]
            if not fits:
                return self._empty(request)
            rows = spare.pop(min(fits, key=lambda k: len(spare[k])))
            return rows if len(rows) == n else rows[:n]

        if not self.ahead or len(requests) < 2:
            for request in requests:
                began = time.perf_counter()
                rows = self._read_now(request, buffer(request))
                counter[1] += time.perf_counter() - began
                counter[3] += 1
                yield rows
                if sys.getrefcount(rows) == 2:  # this name and the call's: nobody else holds it
                    spare.append(rows)
                del rows
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="timerl-read-ahead")
        pending: Future | None = None
        try:
            pending = pool.submit(self._load, requests[0], buffer(requests[0]))
            for k, request in enumerate(requests):
                if pending.done():
                    counter[2] += 1
                else:
                    counter[3] += 1
                    began = time.perf_counter()
                    wait([pending])
                    counter[1] += time.perf_counter() - began
                try:
                    rows = pending.result()
                except OSError as err:
                    raise self._failed(request, err) from err
                counter[0] += rows.nbytes
                pending = None
                if k + 1 < len(requests):
                    after = requests[k + 1]
                    pending = pool.submit(self._load, after, buffer(after))
                yield rows
                if sys.getrefcount(rows) == 2:  # the caller dropped it: the read after next's
                    spare.append(rows)
                del rows  # the caller dropped its reference too: two chunks at most
        finally:
            if pending is not None:
                pending.cancel()
            pool.shutdown(wait=True)

    def __setitem__(self, key: Any, value: Any) -> None:
        k = int(key[0] if isinstance(key, tuple) else key)
        row = np.ascontiguousarray(np.asarray(value, dtype=self.dtype))
        data = memoryview(row.reshape(-1).view(np.uint8))
        if len(data) != self.stride:
            raise ValueError(f"a row of {row.shape} does not fit rows of {self.row_shape}")
        fd = self.owner.fd
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], self.offset + k * self.stride + done)
        self.counter[0] += done
        at = self._owner_row(k)
        self.owner.written = None if at is None else (at, row)

    # --- views that keep whole rows ---------------------------------------------------------
    def reshape(self, shape: tuple[int, ...]) -> RowSource:
        nrows, row_shape = self.row_reshape(shape)
        return self._view(nrows, row_shape, self.offset, False)

    def permute(self, perm: tuple[int, ...]) -> RowSource:
        if tuple(perm) != (1, 0) or len(self.row_shape) != 1:
            return RowSource.permute(self, perm)  # raises, saying why
        return self._view(self.nrows, self.row_shape, self.offset, not self.transposed)

    def __getitem__(self, key: Any) -> Any:
        k = key[0] if isinstance(key, tuple) and key[1:] in ((), (Ellipsis,)) else key
        if isinstance(k, slice) and not self.transposed:
            start, stop, step = k.indices(self.nrows)
            if step == 1:
                n = max(stop - start, 0)
                return self._view(n, self.row_shape, self.offset + start * self.stride, False)
        written = self._written_row(k)
        if written is not None:
            return written
        return RowSource.__getitem__(self, key)

    def _owner_row(self, k: int) -> int | None:
        """The owner's number of this view's row ``k``, where the view keeps the owner's rows
        whole from a row's offset (else None)."""
        at, rest = divmod(self.offset - self.owner.offset, self.owner.stride)
        if rest or self.transposed or self.stride != self.owner.stride:
            return None
        return at + k

    def _written_row(self, k: Any) -> np.ndarray | None:
        """Row ``k`` as the array written last, where that is the row asked for (then no
        longer kept), else None."""
        owner = self.owner
        if owner.written is None or not isinstance(k, (int, np.integer)):
            return None
        row, array = owner.written
        if not -self.nrows <= k < self.nrows or self._owner_row(int(k) % self.nrows) != row:
            return None
        owner.written = None
        return array.reshape(self.row_shape)

    def close(self) -> None:
        self.written = None
        if self.owner is self and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


class StreamStore(BlockStore):
    """A block store whose blocks live in files (``compiler/budget.py`` chose it under a
    memory budget): a block takes no memory, each point's row is written to the file right
    after it is computed, and readers read the rows they need (``RowFile``), ``chunk_bytes``
    at a time and, with ``ahead``, the next chunk read while this one is computed on."""

    __slots__ = ("counter", "name", "chunk_bytes", "ahead")

    def __init__(
        self,
        extent: int,
        elem: tuple[int, ...],
        dtype: Any,
        backend: Any,
        name: str = "a streamed block",
        chunk_bytes: int | None = None,
        ahead: bool = False,
    ) -> None:
        super().__init__(extent, elem, dtype, backend, owns=False)
        self.counter: list = [0, 0.0, 0, 0]  # see ``RowFile``
        self.name = name
        self.chunk_bytes = chunk_bytes
        self.ahead = ahead

    def allocate(self, outer: tuple) -> int:
        if outer not in self.blocks:
            rows = RowFile(
                self.extent,
                self.elem,
                self.dtype,
                self.counter,
                self.name,
                self.chunk_bytes,
                self.ahead,
            )
            self.blocks[outer] = (rows, np.zeros(self.extent, dtype=bool))
            self.tier.add(self.file_bytes)
        return 0

    @property
    def file_bytes(self) -> int:
        """The bytes of one block's file, written as its rows are computed."""
        return _block_size(self.extent, self.elem, self.dtype)

    @property
    def streamed_bytes(self) -> int:
        return self.counter[0]

    def read_stats(self) -> tuple[float, int, int]:
        """Seconds kernels waited on reads, chunks read ahead in time, chunks waited for."""
        return float(self.counter[1]), int(self.counter[2]), int(self.counter[3])

    def _close(self, outers: list[tuple]) -> None:
        for outer in outers:
            self.blocks.pop(outer)[0].close()
            self.tier.sub(self.file_bytes)

    def free_all(self) -> int:
        self._close(list(self.blocks))
        return 0

    def free_prefix(self, key: tuple) -> int:
        k = len(key)
        self._close([o for o in self.blocks if o[:k] == key])
        return 0

    def clear(self) -> None:
        self.free_all()

    def __repr__(self) -> str:
        return f"StreamStore({len(self.blocks)} blocks of {self.extent} x {self.elem} on disk)"


class SwappablePoints(dict):
    """A point store whose points a memory budget moves to disk while they are idle: an
    optimiser's moments between two updates, a gradient waiting for the optimiser
    (``compiler/point_swap.py``).

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


class StorePlan:
    """The storage table as the executors need it: which ops are blocks or views of blocks,
    which loop allocates each block, and the source the code generator emits for them.
    ``body``: the statements run (the fusion pass's included), whose loops allocate the
    blocks; by default the schedule's own."""

    def __init__(
        self, schedule: Schedule, storage: Mapping[int, Storage], body: list | None = None
    ) -> None:
        self.storage = storage
        self.blocks: dict[int, Op] = {}
        # point stores a memory budget swaps to disk (``compiler/point_swap.py``)
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
        # the source of a block's entry at an outer point (op id, key source, the dims the key
        # mentions): the code generator reads an entry a loop does not change once before it
        self.entry_src: Callable[[int, str, frozenset], str] = lambda i, key, _dims: f"BL{i}[{key}]"
        # the source of one row of a block's entry (entry source, row source)
        self.row_of_entry: Callable[[str, str], str] = lambda entry, row: f"{entry}[0][{row}]"
        # op id -> bytes of streamed rows its kernel holds while it runs (compiler/budget.py)
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

    # --- generated source ------------------------------------------------------------------
    def allocate_src(self, loop: Loop, name_of: Callable) -> list[str]:
        lines = []
        for op in self.allocated_by(loop):
            outer = _key([name_of(d) for d in op.domain[:-1]])
            if op.id in self.aliases:
                lines.append(f"S{op.id}.share({outer}, S{op.inputs[0].src.id})")
                continue
            lines.append(f"M[0] += S{op.id}.allocate({outer})")
            lines.append("if M[0] > M[1]: M[1] = M[0]")
        return lines

    def _row_of(self, op: Op, name_of: Callable) -> tuple[str, str, str]:
        """Sources of ``op``'s block at its point, the row its point goes in and what marks
        the point written there: row ``last`` and ``True`` in a block; in a ring row ``last mod
        rows``, which records the point it holds."""
        outer = op.domain[:-1]
        block = self.entry_src(op.id, _key([name_of(d) for d in outer]), frozenset(outer))
        last = name_of(op.domain[-1])
        if op.id in self.rings:
            return block, f"{last} % {self.storage[op.id].extent}", last
        return block, last, "True"

    def block_write_src(self, op: Op, var: str, name_of: Callable) -> list[str]:
        block, row, mark = self._row_of(op, name_of)
        if op.id in self.aliases:  # the row is already there: its base's row, reshaped
            return [f"{block}[1][{row}] = {mark}"]
        return [f"_b = {block}", f"_b[0][{row}] = {var}", f"_b[1][{row}] = {mark}"]

    def writes_row(self, op: Op, backend: Any) -> bool:
        """Whether ``op``'s kernel writes each point into its row, on ``backend``."""
        return op.id in self.in_place and backend.donating_lowering(op.prim) is not None

    def row_src(self, op: Op, name_of: Callable) -> tuple[str, str]:
        """The row a kernel writes ``op``'s point into (``writes_row``), and the line that
        then marks the point written."""
        block, row, mark = self._row_of(op, name_of)
        return self.row_of_entry(block, row), f"{block}[1][{row}] = {mark}"

    def block_read_src(self, edge: Edge, src_of: Callable) -> str | None:
        """A row or a view of rows of one block; None for reads that span blocks."""
        outer, last = edge.index[:-1], edge.index[-1]
        if any(isinstance(i, Slice) for i in outer):
            return None
        key = _key([src_of(i) for i in outer])
        if edge.src.id in self.rings:
            if isinstance(last, Slice):
                return f"S{edge.src.id}.window({key}, {src_of(last.start)}, {src_of(last.stop)})"
            return f"S{edge.src.id}[{key[:-1]} {src_of(last)},)]"
        dims = frozenset(x for i in outer for x in i.symbols() if isinstance(x, Dim))
        entry = self.entry_src(edge.src.id, key, dims)
        rows = f"{entry}[0]"
        if isinstance(last, Slice):
            return f"{rows}[{src_of(last.start)}:{src_of(last.stop)}]"
        if edge.src.shape:  # ``[k]`` (torch takes a third less time than ``[k, ...]``)
            return self.row_of_entry(entry, src_of(last))
        # ``[k, ...]`` keeps a 0-d row an array (``[k]`` would give a numpy scalar)
        return f"{rows}[{src_of(last)}, ...]"

    def read_src(self, op: Op) -> list[str]:
        """The meter's peak with the chunks ``op``'s kernel reads a streamed block into."""
        n = self.read_bytes.get(op.id)
        return [f"if M[0] + {n} > M[1]: M[1] = M[0] + {n}"] if n else []

    def swap_src(self, stmt: SwapOut | SwapIn, key: str) -> list[str]:
        if stmt.op.id in self.swapped_points:
            if isinstance(stmt, SwapOut):
                return [f"M[0] -= S{stmt.op.id}.swap_out({key})"]
            return [f"M[0] += S{stmt.op.id}.swap_in({key})", "if M[0] > M[1]: M[1] = M[0]"]
        if stmt.op.id not in self.blocks:
            return []  # held as points on this backend: nothing to swap
        if isinstance(stmt, SwapOut):
            # ``_b`` (the block a loop wrote last) must not keep the swapped block alive
            return ["_b = None", f"M[0] -= S{stmt.op.id}.swap_out({key})"]
        return [f"M[0] += S{stmt.op.id}.swap_in({key})", "if M[0] > M[1]: M[1] = M[0]"]

    def block_free_src(self, stmt: Free, key: str) -> list[str]:
        if stmt.op.id in self.rings and len(stmt.prefix) == len(stmt.op.domain):
            return [f"S{stmt.op.id}.pop({key})"]  # one point: the ring keeps its rows
        # ``_b`` (the block a loop wrote last) must not keep a freed block alive
        if not stmt.prefix:
            return ["_b = None", f"M[0] -= S{stmt.op.id}.free_all()"]
        return ["_b = None", f"M[0] -= S{stmt.op.id}.free_prefix({key})"]


def _key(items: list[str]) -> str:
    return "(" + "".join(f"{x}, " for x in items) + ")"


class _Released:
    """What ``RowStore.pop`` returns for a row never split out: its byte count, for the meter."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class RowStore(dict):
    """A point store that also holds, per outer point, rows along the last dim as one stacked
    array (a fused loop's every-iteration values), split out only when a row is read alone.

    Splitting a stacked array costs one dispatch per row on the jax backend, and the usual
    readers want it whole again (a slice ``x[i, 0:T]``, or the next fused loop's per-iteration
    input): ``stacked`` hands it over as it is, unless a row was written since. Rows the loop
    did not keep (guarded off, freed) are in the array too; a valid program never reads them.
    Point reads, writes and frees behave as on a dict; ``values()`` (read only to count bytes
    when freeing) does not split rows.
    """

    __slots__ = ("lazy",)

    def __init__(self, points: dict | None = None) -> None:
        super().__init__(points or {})
        # outer -> [rows, the ks not split out yet, bytes of a row, whether a row was rewritten]
        self.lazy: dict[tuple, list] = {}

    @classmethod
    def adopt(cls, stores: dict, op_id: int) -> RowStore:
        """The store of ``op_id``, made a ``RowStore`` in place (once) keeping its points."""
        store = stores[op_id]
        if not isinstance(store, RowStore):
            store = stores[op_id] = RowStore(store)
        return store

    def put_rows(
        self, outer: tuple, rows: Any, ks: list[int], row_bytes: int | None = None
    ) -> None:
        """Points ``outer + (k,)`` for ``k`` in ``ks`` are ``rows[k]``; ``row_bytes``, the
        bytes of one row where the caller knows them (a jax array's ``nbytes`` is slow)."""
        if outer in self.lazy:
            self._split_all(outer)
            del self.lazy[outer]
        wanted = set(ks)
        held = dict.__len__(self)
        if held >= len(ks):
            for k in ks:
                dict.pop(self, (*outer, k), None)
        elif held:  # a few points held (a loop's last row, stored alone): scan those
            for p in [p for p in dict.keys(self) if p[-1] in wanted and p[:-1] == outer]:
                dict.pop(self, p)
        if row_bytes is None:
            row_bytes = int(getattr(rows, "nbytes", 0)) // max(int(rows.shape[0]), 1)
        self.lazy[outer] = [rows, wanted, row_bytes, False]

    def stacked(self, outer: tuple, n: int) -> Any:
        """The rows of ``outer`` as one array of ``n``, or None where it is not held so."""
        entry = self.lazy.get(outer)
        if entry is None or entry[3] or int(entry[0].shape[0]) != n:
            return None
        return entry[0]

    def _entry(self, key: object) -> list | None:
        if not self.lazy or not isinstance(key, tuple) or not key:
            return None
        entry = self.lazy.get(key[:-1])
        return entry if entry is not None and key[-1] in entry[1] else None

    def _split(self, key: tuple) -> bool:
        entry = self._entry(key)
        if entry is None:
            return False
        entry[1].discard(key[-1])
        dict.__setitem__(self, key, entry[0][key[-1]])
        return True

    def _split_all(self, outer: tuple | None = None) -> None:
        for o in [outer] if outer is not None else list(self.lazy):
            entry = self.lazy.get(o)
            if entry is not None:
                for k in sorted(entry[1]):
                    self._split((*o, k))

    def __getitem__(self, key: tuple) -> Any:
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            if self._split(key):
                return dict.__getitem__(self, key)
            raise

    def get(self, key: tuple, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._entry(key) is not None

    def __setitem__(self, key: tuple, value: Any) -> None:
        entry = self.lazy.get(key[:-1]) if self.lazy else None
        if entry is not None:
            entry[1].discard(key[-1])
            entry[3] = True  # the stacked array no longer holds this point's value
        dict.__setitem__(self, key, value)

    def pop(self, key: tuple, *default: Any) -> Any:
        entry = self._entry(key)
        if entry is None:
            return dict.pop(self, key, *default)
        entry[1].discard(key[-1])
        if not entry[1]:
            del self.lazy[key[:-1]]  # no row left to split out: drop the array
        return _Released(entry[2])

    def pop_prefix(self, prefix: tuple, nbytes: Callable[[Any], int]) -> int:
        """Drop every point under ``prefix`` at once (whole stacked arrays, not row by row);
        the bytes released, as ``nbytes`` counts each point."""
        n = len(prefix)
        released = 0
        for outer in [o for o in self.lazy if o[:n] == prefix]:
            entry = self.lazy.pop(outer)
            released += nbytes(_Released(entry[2])) * len(entry[1])
        for point in [p for p in dict.keys(self) if p[:n] == prefix]:
            released += nbytes(dict.pop(self, point))
        return released

    def keys(self) -> Any:
        lazy = [(*o, k) for o, entry in self.lazy.items() for k in entry[1]]
        return list(dict.keys(self)) + lazy

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.keys())

    def values(self) -> Any:
        released = [_Released(e[2]) for e in self.lazy.values() for _ in e[1]]
        return list(dict.values(self)) + released

    def items(self) -> Any:
        self._split_all()
        return dict.items(self)

    def __len__(self) -> int:
        return dict.__len__(self) + sum(len(e[1]) for e in self.lazy.values())

    def __bool__(self) -> bool:
        return len(self) > 0

    def clear(self) -> None:
        self.lazy.clear()
        dict.clear(self)
