"""Products that read a matrix by rows, a chunk of fixed bytes at a time.

``take_matmul`` (``x[idx] @ w`` and ``x[idx]^T @ g``) never builds the gathered rows: it walks
the indices in chunks of ``CHUNK_BYTES`` of rows, so its temporary memory is one chunk, not a
minibatch. The same kernels accept a ``RowSource`` in place of ``x``: rows that live
elsewhere (a file, ``runtime/stores.py``'s streamed blocks) and are read on demand. A row
source also answers the few whole-block views storage lets a block's readers take (reshape
keeping the rows, identity, the 2-D transpose) and the matmul that reads it whole, chunk by
chunk, so a reader never holds more than a chunk of it. The kernels walk a source through
``chunks``/``gathers``, so that one that reads ahead (a streamed file) holds two chunks: the
one computed on and the next (``read_buffer_bytes``, which the memory plan counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import numpy as np

CHUNK_BYTES = 4 << 20  # bytes of rows one step of a row-walking kernel holds
SLAB_BYTES = 256 << 10  # bytes of the product one accumulating step computes before adding
# OpenBLAS's single-threaded sgemm slows 2-2.5x once the inner dimension runs to thousands
# while the outer ones stay small: a weight gradient ``x.T @ g`` over a rollout,
# (64, 16000) @ (16000, 64), takes 9.9 ms whole and 4.0 ms as 256-row blocks summed; a
# (12288, 8000) @ (8000, 64) first-layer one 942 vs 373 ms. Below 16 rows or 32 columns of
# product the blocks' extra calls cost more than they save (measured on this project's
# 2-core EPYC; ``dense_matmul`` picks by those sizes).
K_BLOCK = 256


def chunk_rows(row_bytes: int, chunk_bytes: int | None = None) -> int:
    """How many rows of ``row_bytes`` fit one chunk of ``chunk_bytes`` (``CHUNK_BYTES`` by
    default; at least one row)."""
    size = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return max(1, size // max(int(row_bytes), 1))


def slab_rows(out_cols: int, itemsize: int) -> int:
    """How many rows of a product with ``out_cols`` columns one slab of ``SLAB_BYTES`` holds
    (at least one)."""
    return max(1, SLAB_BYTES // max(out_cols * itemsize, 1))


def slab_bytes(out_rows: int, out_cols: int, itemsize: int) -> int:
    """Bytes of the slab ``add_transposed_product`` allocates for an ``out`` of this shape
    (none where the whole product is one step)."""
    step = slab_rows(out_cols, itemsize)
    return 0 if step >= out_rows else step * out_cols * itemsize


def read_buffer_bytes(
    nrows: int, row_bytes: int, chunk_bytes: int | None = None, ahead: bool = False
) -> int:
    """The bytes of rows a kernel reading ``nrows`` rows of ``row_bytes`` by chunks holds at
    once: one chunk, or two where the next is read ahead while this one is computed on."""
    step = chunk_rows(row_bytes, chunk_bytes)
    held = min(step, max(int(nrows), 1)) * int(row_bytes)
    return held * (2 if ahead and nrows > step else 1)


def add_transposed_product(out: np.ndarray, rows: np.ndarray, g: np.ndarray) -> None:
    """``out += rows.T @ g`` without a temporary the size of ``out``.

    ``out`` is a weight gradient (3 MiB for a 12,288 x 64 first layer): summing each chunk's
    whole product into it would hold a second one. The product is computed a slab of
    ``out``'s rows at a time instead, into one small buffer, so a streamed or gathered
    reader's working memory is its chunk of rows and that slab.
    """
    k, n = out.shape
    step = slab_rows(n, out.dtype.itemsize)
    if step >= k:
        out += dense_matmul(rows.T, g)
        return
    slab = np.empty((step, n), dtype=out.dtype)
    for a in range(0, k, step):
        b = min(a + step, k)
        part = slab[: b - a]
        dense_matmul(rows[:, a:b].T, g, out=part)
        out[a:b] += part


def dense_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b)``, by the fastest of three equivalent forms for its shapes.

    An inner size of 1 is a broadcast product (no sum: the same values, a third of the
    time); a batch of rows times one matrix is one 2-D product over the rows; a long inner
    size with a product of at least 16 x 32 is summed over ``K_BLOCK`` blocks of it.
    """
    k = a.shape[-1]
    if k == 1 and b.ndim >= 2:
        return np.multiply(a, b, out=out)
    if (
        a.ndim > 2
        and b.ndim == 2
        and a.flags.c_contiguous
        and (out is None or out.flags.c_contiguous)
    ):
        flat = None if out is None else out.reshape(-1, b.shape[1])
        res = dense_matmul(a.reshape(-1, k), b, out=flat)
        return res.reshape(*a.shape[:-1], b.shape[1]) if out is None else out
    if a.ndim != 2 or b.ndim != 2 or _whole(a.shape, b.shape):
        return np.matmul(a, b, out=out)
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = np.empty((m, n), dtype=np.result_type(a.dtype, b.dtype))
    # A slab of ``out``'s rows at a time, so the blocks' partial products need a buffer of
    # ``SLAB_BYTES``, not a second ``out`` (3 MiB for a first-layer weight gradient). Each
    # element is summed over the same blocks in the same order: the same bits, and no slower.
    rows = slab_rows(n, out.dtype.itemsize)
    part = np.empty((min(rows, m), n), dtype=out.dtype)
    for r in range(0, m, rows):
        slab, a_rows = out[r : r + rows], a[r : r + rows]
        np.matmul(a_rows[:, :K_BLOCK], b[:K_BLOCK], out=slab)
        for s in range(K_BLOCK, k, K_BLOCK):
            slab += np.matmul(a_rows[:, s : s + K_BLOCK], b[s : s + K_BLOCK], out=part[: len(slab)])
    return out


def _whole(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether a 2-D product of these shapes runs as one ``np.matmul``, not by blocks."""
    return a_shape[-1] < 2 * K_BLOCK or a_shape[0] < 16 or b_shape[1] < 32


def is_plain_product(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """Whether ``dense_matmul`` of operands of these shapes is ``np.matmul`` as it is."""
    return len(a_shape) == len(b_shape) == 2 and a_shape[-1] != 1 and _whole(a_shape, b_shape)


def leading_sum(x: np.ndarray, axes: int | tuple[int, ...] | None, keepdims: bool = False):
    """``np.sum(x, axes)``; over leading axes of a float array, as one matrix-vector product.

    numpy sums over a leading axis row after row, with a loop over the remaining elements
    per row: a bias gradient over a rollout, (64000, 64) summed over rows, takes 1.5 ms, and
    (64000, 2) 0.7 ms, against 0.6 and 0.02 ms as ``ones @ x`` (BLAS), whose blocked
    accumulation is also the more accurate of the two (measured on this project's Xeon).
    A single column is a contiguous sum: numpy's pairwise sum is kept there. Called for
    every sum, so the shape tests stay cheap (a rollout step sums small arrays).
    """
    lead = _leading_axes(x, axes)
    if lead:
        rows, rest = math.prod(x.shape[:lead]), x.shape[lead:]
        if rows >= 64 and math.prod(rest) >= 2:
            out = np.ones(rows, dtype=x.dtype) @ x.reshape(rows, -1)
            return out.reshape((1,) * lead + rest if keepdims else rest)
    return np.asarray(np.sum(x, axis=axes, keepdims=keepdims))


_BLAS_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # float16 has no BLAS product


def _leading_axes(x: np.ndarray, axes: int | tuple[int, ...] | None) -> int:
    """How many leading axes of a C-contiguous BLAS float array ``axes`` names, all but the
    last at most, else 0."""
    if axes is None or not isinstance(x, np.ndarray) or x.dtype not in _BLAS_FLOATS:
        return 0
    ndim = x.ndim
    if ndim < 2 or axes == ():
        return 0
    one = isinstance(axes, (int, np.integer))
    picked = [axes % ndim] if one else sorted(a % ndim for a in axes)
    lead = len(picked)
    if lead == ndim or picked[-1] != lead - 1 or not x.flags.c_contiguous:
        return 0
    return lead


class RowSource:
    """A matrix (or a block of rows of any shape) read by rows on demand.

    ``read(start, stop)`` returns rows ``start:stop`` as a fresh array; ``take(ids)`` the
    rows at ``ids``. ``transposed`` marks the 2-D transpose of a row matrix: only a matmul
    (``x.T @ g``, summed over row chunks) reads it.
    """

    __slots__ = ("nrows", "row_shape", "dtype", "transposed", "chunk_bytes", "_read", "_take")

    def __init__(
        self,
        nrows: int,
        row_shape: tuple[int, ...],
        dtype: Any,
        read: Callable[[int, int], np.ndarray],
        take: Callable[[np.ndarray], np.ndarray],
        transposed: bool = False,
        chunk_bytes: int | None = None,
    ) -> None:
        self.nrows = nrows
        self.row_shape = tuple(int(s) for s in row_shape)
        self.dtype = np.dtype(dtype)
        self.transposed = transposed
        self.chunk_bytes = chunk_bytes  # None: ``CHUNK_BYTES`` when read
        self._read = read
        self._take = take

    @property
    def shape(self) -> tuple[int, ...]:
        if self.transposed:
            return (*self.row_shape, self.nrows)
        return (self.nrows, *self.row_shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.row_shape)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    def _with(self, nrows: int, row_shape: tuple[int, ...], transposed: bool) -> RowSource:
        """The same bytes seen as ``nrows`` rows of ``row_shape``: each row split into
        ``nrows // self.nrows`` consecutive rows (a reshape of a batch of per-step rows)."""
        split = nrows // self.nrows if self.nrows else 1
        read, take, shape = self._read, self._take, tuple(row_shape)

        def read_split(a: int, b: int) -> np.ndarray:
            lo, hi = a // split, -(-b // split)
            rows = read(lo, hi).reshape(((hi - lo) * split, *shape))
            return rows[a - lo * split : b - lo * split]

        def take_split(ids: np.ndarray) -> np.ndarray:
            rows = take(ids // split).reshape((len(ids), split, *shape))
            return rows[np.arange(len(ids)), ids % split]

        if split == 1:
            return RowSource(
                nrows,
                shape,
                self.dtype,
                lambda a, b: read(a, b).reshape((b - a, *shape)),
                lambda ids: take(ids).reshape((len(ids), *shape)),
                transposed,
                self.chunk_bytes,
            )
        return RowSource(
            nrows, shape, self.dtype, read_split, take_split, transposed, self.chunk_bytes
        )

    def step(self) -> int:
        """Rows of one chunk of this source's kernels."""
        return chunk_rows(self.row_bytes, self.chunk_bytes)

    def chunks(self, step: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """Rows ``a:b`` of every ``step``, in order. A caller drops each chunk before it asks
        for the next: a source that reads ahead then holds two chunks, never three."""
        for a in range(0, self.nrows, step):
            b = min(a + step, self.nrows)
            yield a, b, self._read(a, b)

    def gathers(self, ids: np.ndarray, step: int) -> Iterator[tuple[int, np.ndarray]]:
        """The rows at ``ids[a:a + step]`` for every ``step``, in order (as ``chunks``)."""
        for a in range(0, len(ids), step):
            yield a, self._take(ids[a : a + step])

    def read(self, start: int, stop: int) -> np.ndarray:
        return self._read(start, stop)

    def take(self, ids: np.ndarray) -> np.ndarray:
        return self._take(np.asarray(ids, dtype=np.int64).reshape(-1))

    def reshape(self, shape: tuple[int, ...]) -> RowSource:
        nrows, row_shape = self.row_reshape(shape)
        return self._with(nrows, row_shape, False)

    def row_reshape(self, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """``(rows, row shape)`` of ``shape`` when it splits each row into whole rows (the
        only reshape a row source makes), else the error saying why."""
        shape = tuple(int(s) for s in shape)
        size = int(np.prod(self.row_shape, dtype=np.int64)) * self.nrows
        if (
            self.transposed
            or not shape
            or not self.nrows
            or shape[0] % self.nrows
            or int(np.prod(shape, dtype=np.int64)) != size
        ):
            raise ValueError(
                f"a row source of shape {self.shape} reshapes only its rows (each into whole "
                f"rows), not to {shape}"
            )
        return shape[0], shape[1:]

    def permute(self, perm: tuple[int, ...]) -> RowSource:
        if tuple(perm) != (1, 0) or len(self.row_shape) != 1:
            raise ValueError(f"a row source of shape {self.shape} only transposes as a matrix")
        return self._with(self.nrows, self.row_shape, not self.transposed)

    def __getitem__(self, key: Any) -> Any:
        """One row (``x[k]``, ``x[k, ...]``) read now, or a slice of rows (a row source)."""
        if self.transposed:
            raise ValueError("a transposed row source is read only by a matmul")
        k = key[0] if isinstance(key, tuple) and key[1:] in ((), (Ellipsis,)) else key
        if isinstance(k, slice):
            start, stop, step = k.indices(self.nrows)
            if step != 1:
                raise ValueError("a row source is sliced with step 1")
            read, take, n = self._read, self._take, max(stop - start, 0)
            return RowSource(
                n,
                self.row_shape,
                self.dtype,
                lambda a, b: read(start + a, start + b),
                lambda ids: take(np.asarray(ids) + start),
                chunk_bytes=self.chunk_bytes,
            )
        k = int(k)
        if not -self.nrows <= k < self.nrows:
            raise IndexError(f"row {k} of {self.nrows}")
        k %= self.nrows
        return self._read(k, k + 1)[0]

    def matmul(self, w: Any) -> np.ndarray:
        """``self @ w`` (or ``self.T @ w``), reading a chunk of rows at a time."""
        if np.ndim(w) != 2 or (self.transposed and len(self.row_shape) != 1):
            raise ValueError(f"matmul of a row source of shape {self.shape} by {np.shape(w)}")
        step = self.step()
        dtype = np.result_type(self.dtype, w.dtype)
        if self.transposed:
            out = np.zeros((self.row_shape[0], w.shape[-1]), dtype=dtype)
            with closing(self.chunks(step)) as parts:
                for a, b, rows in parts:
                    add_transposed_product(out, rows, w[a:b])
                    del rows  # before the next chunk is asked for (see ``chunks``)
            return out
        # rows of any rank times a matrix: each chunk is a batch of products
        out = np.empty((self.nrows, *self.row_shape[:-1], w.shape[-1]), dtype=dtype)
        with closing(self.chunks(step)) as parts:
            for a, b, rows in parts:
                dense_matmul(rows, w, out=out[a:b])
                del rows
        return out

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            f"rows of shape {self.shape} kept out of memory are read only by rows "
            "(take_matmul, a matmul, a row): this reader would load them whole"
        )

    def __repr__(self) -> str:
        return f"RowSource({self.shape}, {self.dtype}{', transposed' if self.transposed else ''})"


def _gathers(x: Any, ids: np.ndarray, step: int) -> Iterator[tuple[int, np.ndarray]]:
    if isinstance(x, RowSource):
        return x.gathers(ids, step)
    return ((a, np.take(x, ids[a : a + step], axis=0)) for a in range(0, ids.size, step))


def take_matmul(x: Any, idx: Any, w: Any, trans: bool = False) -> np.ndarray:
    """``x[idx] @ w`` (``trans``: ``x[idx].T @ w``), each row of ``x`` flattened, without the
    gathered rows in memory."""
    ids = np.asarray(idx).reshape(-1)
    row_bytes = int(np.prod(x.shape[1:], dtype=np.int64)) * np.dtype(x.dtype).itemsize
    step = x.step() if isinstance(x, RowSource) else chunk_rows(row_bytes)
    dtype = np.result_type(x.dtype, w.dtype)
    k = row_bytes // np.dtype(x.dtype).itemsize
    if trans:
        out = np.zeros((k, w.shape[-1]), dtype=dtype)
        with closing(_gathers(x, ids, step)) as parts:
            for a, rows in parts:
                add_transposed_product(out, rows.reshape(-1, k), w[a : a + step])
                del rows  # dies before the next chunk is gathered
        return out
    out = np.empty((ids.size, w.shape[-1]), dtype=dtype)
    with closing(_gathers(x, ids, step)) as parts:
        for a, rows in parts:
            dense_matmul(rows.reshape(-1, k), w, out=out[a : a + step])
            del rows
    return out.reshape((*np.shape(idx), w.shape[-1]))


def rows_matmul(a: Any, b: Any) -> Any:
    """``np.matmul``, reading a row source first operand by chunks."""
    if isinstance(a, RowSource):
        return a.matmul(b)
    return dense_matmul(np.asarray(a), np.asarray(b))
