"""Streamed blocks: a block store whose blocks live in files, read back a chunk at a time.

Under a memory budget ``memory/budget.py`` streams blocks that are read only by rows: each
point's row is written to the block's file right after it is computed (``RowFile``), and
readers read the rows they need, a chunk at a time, the next chunk read ahead on a thread
while a kernel computes on this one.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import closing
from typing import Any

import numpy as np

from timerl.ir.rowwise import RowSource
from timerl.runtime.stores import BlockStore, _block_size, _swap_dir

# "0": streamed blocks are not read ahead (the plan still counts two chunks): to compare
READ_AHEAD_ENV = "TIMERL_READ_AHEAD"


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
    """A block store whose blocks live in files (``memory/budget.py`` chose it under a
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
