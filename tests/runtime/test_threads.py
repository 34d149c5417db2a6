"""How many threads a program's kernels run on: chosen from its largest kernel, or asked for."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.errors import ProgramError
from timerl.runtime.backend import PARALLEL_MIN_OPS, usable_cores


def _product(rows: int, inner: int, cols: int, **compile_kwargs):
    ctx = tl.Context(dims=("t",))
    with ctx:
        a = tl.from_numpy(np.ones((rows, inner), np.float32))
        b = tl.from_numpy(np.ones((inner, cols), np.float32))
        y = a @ b
        return ctx.compile(outputs=[y], **compile_kwargs), y


def test_a_program_of_small_kernels_runs_on_one_thread_and_one_of_large_ones_on_every_core():
    small, _ = _product(8, 4, 64)
    assert small.backend.threads == 1
    large, _ = _product(512, 512, 512)  # 2 * 512**3 operations
    assert PARALLEL_MIN_OPS <= 2 * 512**3
    assert large.backend.threads == usable_cores()


def test_a_thread_count_asked_for_is_the_programs():
    prog, y = _product(8, 4, 64, options=tl.CompileOptions(threads=3))
    assert prog.backend.threads == 3
    np.testing.assert_array_equal(prog.run().value(y), np.full((8, 64), 4.0, np.float32))


@pytest.mark.parametrize("threads", [0, -2, True, 1.5, "2"])
def test_a_thread_count_that_is_not_a_whole_number_from_one_is_refused(threads):
    with pytest.raises(ProgramError, match=rf"CompileOptions\(threads={threads!r}\)"):
        tl.CompileOptions(threads=threads)


def test_torch_products_stay_in_torchs_pool_on_more_than_one_thread(monkeypatch):
    """numpy's BLAS threads beside torch's took the cores torch's ran on: on more than one
    thread every product is torch's, on one the large ones may be numpy's."""
    torch = pytest.importorskip("torch")
    from timerl.ir import rowwise
    from timerl.runtime import torch_lowering

    monkeypatch.setattr(torch_lowering, "NUMPY_PRODUCTS", True)
    monkeypatch.setattr(torch_lowering, "NUMPY_MIN_ROWS", 1)
    calls = []
    real = rowwise.dense_matmul
    monkeypatch.setattr(rowwise, "dense_matmul", lambda a, b: calls.append(1) or real(a, b))
    rng = np.random.default_rng(0)
    a, b = (
        rng.normal(size=(64, 32)).astype(np.float32),
        rng.normal(size=(32, 16)).astype(np.float32),
    )
    before = torch.get_num_threads()
    try:
        for threads, on_numpy in ((2, False), (1, True)):
            torch.set_num_threads(threads)
            calls.clear()
            got = torch_lowering.LOWERINGS["matmul"](torch.from_numpy(a), torch.from_numpy(b))
            np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-5, atol=1e-5)
            assert bool(calls) == on_numpy, threads
    finally:
        torch.set_num_threads(before)


def test_on_more_than_one_thread_numpys_blas_stays_on_one_beside_torchs_pool(monkeypatch):
    torch = pytest.importorskip("torch")
    from threadpoolctl import threadpool_info

    from timerl.runtime import torch_backend, torch_lowering

    monkeypatch.setattr(torch_lowering, "NUMPY_PRODUCTS", True)
    backend = torch_backend.TorchBackend(threads=2)
    with backend.active():
        blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
        assert torch.get_num_threads() == 2
    assert blas and all(n == 1 for n in blas)
