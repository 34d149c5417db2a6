"""Backends are found by name, load their array library only when asked for, and refuse a
primitive they cannot lower before anything runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import timerl as tl
from timerl.errors import BackendError
from timerl.runtime.backend import BACKENDS, Backend, backend_class, make_backend
from timerl.runtime.numpy_backend import NumpyBackend


def test_unknown_backend_names_the_choices():
    with pytest.raises(
        BackendError, match=r"unknown backend 'jx'; choose one of \['jax', 'numpy', 'torch'\]"
    ):
        make_backend("jx")


def test_a_missing_extra_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(
        BackendError, match=r"backend 'torch' needs .*pip install 'timerl\[torch\]'"
    ):
        make_backend("torch")
    assert isinstance(make_backend("numpy"), NumpyBackend)


def test_numpy_backend_runs_on_cpu_only():
    with pytest.raises(BackendError, match="cpu only, not 'cuda'"):
        make_backend("numpy", device="cuda")


def test_every_backend_class_is_a_backend_of_its_name():
    for name in BACKENDS:
        cls = backend_class(name)
        assert cls.name == name and issubclass(cls, Backend)


def test_a_numpy_program_never_imports_torch():
    code = (
        "import sys, timerl as tl\n"
        "ctx = tl.Context(dims=('t',))\n"
        "(t,), (T,) = ctx.dims, ctx.bounds\n"
        "with ctx:\n"
        "    x = tl.RecurrentTensor.placeholder((2,), domain=(t,))\n"
        "    x[0] = tl.zeros((2,))\n"
        "    x[t + 1] = (x[t] + tl.rand((2,), like=x)).tanh()\n"
        "p = ctx.compile(bounds={T: 4}, outputs=[x], backend='numpy')\n"
        "p.run(); p.run(compiled=False)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("preset", [None, "0"])
def test_the_torch_backend_asks_for_huge_pages_unless_the_user_said_otherwise(preset):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if preset is not None:
        env["THP_MEM_ALLOC_ENABLE"] = preset
    code = "import os, timerl.runtime.torch_backend; print(os.environ['THP_MEM_ALLOC_ENABLE'])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == (preset or "1")


def _tanh_program(seen: list):
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,), name="x")
        x[0] = tl.zeros(())
        x[t + 1] = (x[t] + 1.0).tanh()
        tl.sink(x, lambda v, p: seen.append(p))
    return ctx, {T: 3}, x


@pytest.mark.parametrize("compiled", [True, False])
def test_a_missing_lowering_fails_before_running_naming_op_and_line(monkeypatch, compiled):
    pytest.importorskip("torch")
    from timerl.runtime import torch_lowering

    monkeypatch.delitem(torch_lowering.LOWERINGS, "tanh")
    seen: list = []
    ctx, bounds, _ = _tanh_program(seen)
    prog = ctx.compile(bounds=bounds, backend="torch")
    with pytest.raises(BackendError, match=r"'tanh' has no torch lowering; .*test_backend\.py:\d+"):
        prog.executor(compiled)
    assert seen == []


def test_torch_casts_where_its_promotion_differs_from_the_declared_dtype():
    pytest.importorskip("torch")
    values = {}
    for backend in ("numpy", "torch"):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.RecurrentTensor.placeholder((3,), dtype="int64", domain=(t,))
            x[0] = tl.arange(3) + 1
            x[t + 1] = x[t] * 2
            y = x / (x + 1)  # int64 / int64: float64 in the IR (numpy's rule), float32 in torch
        prog = ctx.compile(bounds={T: 3}, outputs=[y], backend=backend)
        prog.run()
        values[backend] = np.asarray(prog.value(y))
    assert values["numpy"].dtype == values["torch"].dtype == np.float64
    # torch divides in float32 before the cast: equal to float32 precision
    np.testing.assert_allclose(values["numpy"], values["torch"], rtol=1e-6)


@pytest.mark.parametrize("numpy_products", [True, False])
@pytest.mark.parametrize(
    ("a_shape", "b_shape", "transposed", "dtype"),
    [
        ((300, 64), (64, 2), False, np.float32),
        ((64, 3000), (3000, 3), True, np.float32),  # a weight gradient's transposed view
        ((8, 16), (16, 2), False, np.float64),
        ((5, 40, 48), (48, 64), False, np.float32),  # a batch of rows times a weight
        ((6, 4), (4, 3), False, np.int64),  # not BLAS: torch's product either way
    ],
)
def test_torch_matmul_equals_numpy(
    monkeypatch, numpy_products, a_shape, b_shape, transposed, dtype
):
    pytest.importorskip("torch")
    import torch

    from timerl.ir.rowwise import dense_matmul
    from timerl.runtime import torch_lowering

    monkeypatch.setattr(torch_lowering, "NUMPY_PRODUCTS", numpy_products)
    monkeypatch.setattr(torch_lowering, "NUMPY_MIN_ROWS", 1)  # these small products too
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # as a one-thread program runs
    rng = np.random.default_rng(0)
    a = (rng.normal(size=a_shape[::-1] if transposed else a_shape) * 4).astype(dtype)
    a = a.T if transposed else a
    b = (rng.normal(size=b_shape) * 4).astype(dtype)
    got = torch_lowering.LOWERINGS["matmul"](torch.from_numpy(a), torch.from_numpy(b))
    assert got.dtype == torch.from_numpy(a).dtype
    assert tuple(got.shape) == a_shape[:-1] + b_shape[-1:]
    if numpy_products and dtype != np.int64:  # numpy's own kernel: the numpy backend's values
        np.testing.assert_array_equal(got.numpy(), dense_matmul(a, b))
    np.testing.assert_allclose(got.numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    ("rows", "cols", "general"),
    [(16, 64, False), (16, 2, False), (4096, 64, True), (8192, 2, True)],
)
def test_a_torch_product_of_static_shapes_too_small_for_numpys_blas_is_torchs_own(
    rows, cols, general
):
    # the choice between the two BLAS is made once for the op, not tested at each call
    torch = pytest.importorskip("torch")
    from timerl.runtime.torch_backend import TorchBackend

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = tl.RecurrentTensor.placeholder((rows, 8), domain=(t,))
        x[0] = tl.ones((rows, 8))
        x[t + 1] = x[t] * 0.5
        y = x @ tl.ones((8, cols))
    assert y.op.prim == "matmul"
    kernel = TorchBackend().kernel(y.op)
    assert (kernel is not torch.matmul) == general


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "plain"),
    [
        ((16, 48), (48, 64), True),  # a rollout step's product
        ((16, 1), (1, 64), False),  # an inner size of 1: the reference multiplies
        ((64, 4096), (4096, 64), False),  # a long inner size: the reference sums blocks
        ((8, 16, 48), (48, 64), False),  # a batch of rows: the reference flattens it
    ],
)
def test_a_numpy_product_of_static_shapes_skips_the_references_tests_where_it_can(
    a_shape, b_shape, plain
):
    from timerl.runtime.numpy_backend import NumpyBackend

    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = tl.RecurrentTensor.placeholder(a_shape, domain=(t,))
        x[0] = tl.ones(a_shape)
        x[t + 1] = x[t] * 0.5
        y = x @ tl.ones(b_shape)
        rows = x[0:2] @ tl.ones(b_shape)  # a slice read: an operand of another shape
    backend = NumpyBackend()
    reference = backend.lowering("matmul")
    assert (backend.kernel(y.op) is not reference) == plain
    assert backend.kernel(rows.op) is reference


@pytest.mark.parametrize("numpy_products", [True, False])
@pytest.mark.parametrize("trans", [False, True])
def test_torch_take_matmul_equals_numpy(monkeypatch, numpy_products, trans):
    pytest.importorskip("torch")
    import torch

    from timerl.runtime import torch_lowering

    monkeypatch.setattr(torch_lowering, "NUMPY_PRODUCTS", numpy_products)
    monkeypatch.setattr(torch_lowering, "NUMPY_MIN_ROWS", 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 3, 4)).astype(np.float32)
    idx = rng.integers(0, 50, size=(2, 10))
    w = rng.normal(size=(20, 5) if trans else (12, 5)).astype(np.float32)
    got = torch_lowering.LOWERINGS["take_matmul"](
        torch.from_numpy(x), torch.from_numpy(idx), torch.from_numpy(w), trans=trans
    )
    rows = x[idx].reshape(-1, 12)
    want = rows.T @ w if trans else (rows @ w).reshape(2, 10, 5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_torch_backend_caps_numpys_blas_threads_where_products_run_there(monkeypatch):
    pytest.importorskip("torch")
    from threadpoolctl import threadpool_info, threadpool_limits

    from timerl.runtime import torch_backend, torch_lowering

    monkeypatch.setattr(torch_lowering, "NUMPY_PRODUCTS", True)
    backend = torch_backend.TorchBackend(threads=1)
    with threadpool_limits(limits=2, user_api="blas"):
        with backend.active():
            inside = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
        after = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    assert inside and all(n == 1 for n in inside)
    assert all(n == 2 for n in after)  # restored on the way out


def test_a_gpu_asked_for_where_there_is_none_is_a_clear_error(monkeypatch):
    """``device="cuda"`` (as ``bench rl --device cuda`` passes it) on a machine without a GPU
    names the device, for torch and for jax, before anything runs."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendError, match="device 'cuda' asked for, but CUDA is not available"):
        make_backend("torch", "cuda")

    def no_gpu(platform=None):
        raise RuntimeError(f"Unknown backend {platform}")

    monkeypatch.setattr(jax, "devices", no_gpu)
    with pytest.raises(BackendError, match="device 'cuda' asked for, but jax has none"):
        make_backend("jax", "cuda")


def test_a_host_backend_swaps_to_disk_and_has_no_host_tier():
    """A backend on the host has no host tier to copy to: asking is an error naming it."""
    backend = make_backend("numpy")
    assert backend.swap_tier == "disk"
    with pytest.raises(BackendError, match="the numpy backend on 'cpu' swaps to disk"):
        backend.to_host(np.zeros(3))


def test_torch_takes_host_arrays_as_they_are_and_gives_them_back_the_same():
    pytest.importorskip("torch")
    from timerl.runtime.torch_backend import TorchBackend

    be = TorchBackend()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = be.asarray(a)
    a[0, 0] = 7.0  # the same memory, as torch.as_tensor shares it
    assert t[0, 0].item() == 7.0
    back = be.to_numpy(t)
    back[1, 1] = -1.0
    assert t[1, 1].item() == -1.0
    frozen = np.ones(3, dtype=np.float32)
    frozen.flags.writeable = False
    reversed_ = np.arange(4, dtype=np.int64)[::-1]
    for odd in (frozen, reversed_, np.array([1, 2], dtype=np.uint16)):
        np.testing.assert_array_equal(be.to_numpy(be.asarray(odd)), odd)


def test_thread_caps_find_the_libraries_once_until_a_module_is_imported(monkeypatch):
    """A run caps BLAS to the backend's threads without walking every loaded library again
    (``threadpool_limits`` does, 0.1-0.8 ms a run); an import may load a library, so then
    they are found afresh."""
    from threadpoolctl import threadpool_info

    import timerl.runtime.backend as backend_module

    monkeypatch.setattr(backend_module, "_CONTROLLER", [])
    with backend_module.math_threads(1):
        blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
        assert blas and all(i["num_threads"] == 1 for i in blas)
    first = backend_module._CONTROLLER[0][0]
    with NumpyBackend().active():
        pass
    assert backend_module._CONTROLLER[0][0] is first
    monkeypatch.setitem(sys.modules, "_timerl_new_module", type(sys)("_timerl_new_module"))
    with NumpyBackend().active():
        pass
    assert backend_module._CONTROLLER[0][0] is not first
