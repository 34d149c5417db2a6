"""take_matmul and row sources: products that read a matrix a chunk of rows at a time."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.ir import prims, rowwise
from timerl.ir.rowwise import RowSource, take_matmul


def _source(x: np.ndarray, reads: list | None = None) -> RowSource:
    def read(a: int, b: int) -> np.ndarray:
        if reads is not None:
            reads.append(b - a)
        return x[a:b].copy()

    return RowSource(len(x), x.shape[1:], x.dtype, read, lambda ids: x[ids].copy())


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 3 * 4 * 4)  # three rows of 4 float32


def test_take_matmul_walks_chunks_and_equals_the_gathered_product(small_chunks):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 4)).astype(np.float32)
    idx = rng.integers(0, 11, size=7)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    g = rng.normal(size=(7, 5)).astype(np.float32)
    np.testing.assert_allclose(take_matmul(x, idx, w), x[idx] @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(take_matmul(x, idx, g, trans=True), x[idx].T @ g, rtol=1e-5)
    idx2 = idx[:6].reshape(2, 3)
    np.testing.assert_allclose(take_matmul(x, idx2, w), x[idx2] @ w, rtol=1e-5, atol=1e-6)
    # a row source in place of the matrix: same values, read three rows at a time
    np.testing.assert_allclose(take_matmul(_source(x), idx, w), x[idx] @ w, rtol=1e-5, atol=1e-6)


def test_row_source_views_and_chunked_matmul(small_chunks):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(10, 2, 2)).astype(np.float32)
    reads: list[int] = []
    src = _source(x, reads)
    flat = src.reshape((10, 4))
    assert flat.shape == (10, 4)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    g = rng.normal(size=(10, 5)).astype(np.float32)
    np.testing.assert_allclose(
        prims.get("matmul").impl(flat, w), x.reshape(10, 4) @ w, rtol=1e-5, atol=1e-6
    )
    assert max(reads) == 3  # never more than a chunk of rows at once
    tr = prims.get("permute").impl(flat, perm=(1, 0))
    assert tr.shape == (4, 10)
    np.testing.assert_allclose(tr.matmul(g), x.reshape(10, 4).T @ g, rtol=1e-5)
    np.testing.assert_allclose(src[3], x[3])
    np.testing.assert_allclose(src[2:6][1, ...], x[3])
    with pytest.raises(TypeError, match="read only by rows"):
        np.asarray(flat)
    with pytest.raises(ValueError, match="reshapes only its rows"):
        flat.reshape((5, 8))


def test_take_matmul_gradients_equal_those_of_the_gathered_product():
    rng = np.random.default_rng(2)
    xv = rng.normal(size=(6, 3))
    wv = rng.normal(size=(3, 2))
    idx = np.array([4, 0, 4, 2])

    def grads(fused: bool):
        with tl.Context(dims=("t",)):
            x = tl.from_numpy(xv, requires_grad=True)
            w = tl.from_numpy(wv, requires_grad=True)
            ids = tl.from_numpy(idx)
            if fused:
                from timerl.ir.build import apply

                y = x._new(apply("take_matmul", x.view, ids.view, w.view))
            else:
                y = x.take(ids) @ w
            loss = (y * y).sum()
            loss.backward()
            return tl.evaluate([loss, x.grad, w.grad], optimize=False)

    for got, want in zip(grads(True), grads(False), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_weight_gradient_sums_chunks_without_a_second_gradient(monkeypatch):
    """``x.T @ g`` over row chunks adds each chunk's product a slab at a time: the kernel's
    working memory is its result, one chunk of rows and one slab, not a second result."""
    import tracemalloc

    monkeypatch.setattr(rowwise, "CHUNK_BYTES", 64 * 2048 * 4)  # 64 rows of 2,048 float32
    monkeypatch.setattr(rowwise, "SLAB_BYTES", 16 << 10)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 2048)).astype(np.float32)
    g = rng.normal(size=(300, 64)).astype(np.float32)
    idx = rng.integers(0, 300, size=200)
    expected = x.T @ g
    source = _source(x).permute((1, 0))
    tracemalloc.start()
    try:
        for compute in (lambda: source.matmul(g), lambda: take_matmul(x, idx, g[:200], trans=True)):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            out = compute()
            peak = tracemalloc.get_traced_memory()[1] - before
            assert peak < out.nbytes + rowwise.CHUNK_BYTES + rowwise.SLAB_BYTES + (64 << 10)
            del out
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(source.matmul(g), expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(
        take_matmul(x, idx, g[:200], trans=True), x[idx].T @ g[:200], rtol=1e-4, atol=1e-3
    )


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "form"),
    [
        ((300, 1), (1, 40), "broadcast product"),
        ((2, 3, 5, 1), (1, 1, 7), "broadcast product"),
        ((25, 8, 6), (6, 40), "rows of a batch as one product"),
        ((40, 2 * rowwise.K_BLOCK + 37), (2 * rowwise.K_BLOCK + 37, 33), "inner blocks"),
        ((4, 3000), (3000, 64), "one call (too few rows to block)"),
        ((5, 3, 4), (5, 4, 2), "one call (batched operands)"),
    ],
)
def test_dense_matmul_equals_matmul_in_every_form(a_shape, b_shape, form):
    rng = np.random.default_rng(1)
    a = rng.normal(size=a_shape).astype(np.float32)
    b = rng.normal(size=b_shape).astype(np.float32)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = rowwise.dense_matmul(a, b)
    assert got.shape == want.shape and got.dtype == np.float32, form
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(a_shape[-1]))
    out = np.full(want.shape, np.nan, dtype=np.float32)
    assert rowwise.dense_matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, got)


def test_dense_matmul_blocks_a_long_inner_size_and_takes_a_transposed_view(monkeypatch):
    calls: list[tuple[int, ...]] = []
    matmul = np.matmul

    def counting(x, y, **kw):
        calls.append(x.shape)
        return matmul(x, y, **kw)

    monkeypatch.setattr(rowwise.np, "matmul", counting)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3 * rowwise.K_BLOCK + 5, 48)).astype(np.float32)
    g = rng.normal(size=(3 * rowwise.K_BLOCK + 5, 64)).astype(np.float32)
    got = rowwise.dense_matmul(x.T, g)  # a weight gradient: x.T @ g over the rows
    assert calls == [(48, rowwise.K_BLOCK)] * 3 + [(48, 5)]
    np.testing.assert_allclose(got, x.T.astype(np.float64) @ g, rtol=1e-5, atol=1e-3)


def test_dense_matmul_blocks_hold_a_slab_not_a_second_product():
    """The partial products of the inner blocks go through a buffer of ``SLAB_BYTES``: a
    first-layer weight gradient must not hold a second gradient-sized array."""
    import tracemalloc

    rng = np.random.default_rng(3)
    a = rng.normal(size=(4096, 3 * rowwise.K_BLOCK)).astype(np.float32)
    b = rng.normal(size=(3 * rowwise.K_BLOCK, 64)).astype(np.float32)
    out = np.empty((4096, 64), dtype=np.float32)  # 1 MiB, four slabs
    tracemalloc.start()
    try:
        rowwise.dense_matmul(a, b, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= rowwise.SLAB_BYTES + (64 << 10)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ((300, 4), 0),
        ((300, 4), (0,)),
        ((30, 10, 3), (0, 1)),
        ((300, 2, 2), -3),
        ((300, 1), 0),  # one column: numpy's pairwise sum
        ((300, 4), 1),  # not leading
        ((30, 10, 3), (1, 2)),
        ((300, 4), None),
        ((300, 4), (0, 1)),  # every axis
        ((10, 4), 0),  # few rows
        ((300, 4), ()),  # no axis
        ((300,), 0),
    ],
)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
def test_leading_sum_is_numpys_sum(shape, axes, keepdims, dtype):
    x = (np.random.default_rng(0).normal(size=shape) * 10).astype(dtype)
    got = rowwise.leading_sum(x, axes, keepdims)
    want = np.sum(x, axis=axes, keepdims=keepdims)
    assert got.shape == want.shape and got.dtype == want.dtype
    rtol = {np.float16: 1e-3, np.float32: 1e-5}.get(dtype, 1e-12)
    np.testing.assert_allclose(got, want, rtol=rtol)


def test_leading_sum_of_a_transposed_view_is_numpys_sum():
    x = np.random.default_rng(1).normal(size=(4, 300)).astype(np.float32).T  # not C-contiguous
    np.testing.assert_allclose(rowwise.leading_sum(x, 0), x.sum(0), rtol=1e-5)


def test_leading_sum_over_many_rows_is_at_least_as_accurate_as_numpys():
    x = np.random.default_rng(2).normal(size=(64000, 8)).astype(np.float32)
    exact = x.astype(np.float64).sum(0)
    got = np.abs(rowwise.leading_sum(x, 0) - exact).max()
    assert got <= np.abs(x.sum(0) - exact).max()
