"""Array backends behind one small interface: primitives' lowerings plus a few array utilities."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from timerl.errors import BackendError
from timerl.ir import prims
from timerl.ir.graph import Op


class Backend:
    """``threads`` caps the math library's threads while a program runs: RL-sized kernels are
    small, and a multi-threaded BLAS on a busy 2-core machine spends more time waking
    threads than multiplying (measured: 935 us vs 8 us per 8x4x64 matmul)."""

    name = "abstract"

    def __init__(self, device: str = "cpu", threads: int | None = 1) -> None:
        self.device = device
        self.threads = threads

    def impl(self, prim: str) -> Callable[..., Any]:
        raise NotImplementedError

    def kernel(self, op: Op) -> Callable[..., Any]:
        """The function that computes ``op``'s value at one point."""
        return self.impl(op.prim)

    def asarray(self, value: Any) -> Any:
        raise NotImplementedError

    def to_numpy(self, value: Any) -> np.ndarray:
        raise NotImplementedError

    def stack(self, values: list[Any]) -> Any:
        raise NotImplementedError

    def nbytes(self, value: Any) -> int:
        raise NotImplementedError

    def broadcast(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        raise NotImplementedError

    def truth(self, value: Any) -> bool:
        return bool(self.to_numpy(value).all())

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        yield

    def device_peak_bytes(self) -> int | None:
        return None


class NumpyBackend(Backend):
    """The reference backend every other configuration is tested against."""

    name = "numpy"

    def __init__(self, device: str = "cpu", threads: int | None = 1) -> None:
        if device != "cpu":
            raise BackendError(f"the numpy backend runs on the cpu only, not {device!r}")
        super().__init__(device, threads)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if self.threads is None:
            yield
            return
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=self.threads):
            yield

    def impl(self, prim: str) -> Callable[..., Any]:
        return prims.get(prim).numpy

    def asarray(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def to_numpy(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def stack(self, values: list[Any]) -> np.ndarray:
        return np.stack(values)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def nbytes(self, value: Any) -> int:
        if isinstance(value, (tuple, list)):
            return sum(self.nbytes(v) for v in value)
        return int(getattr(value, "nbytes", 0))

    def broadcast(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        value = np.asarray(value)
        if value.shape != shape:
            value = np.broadcast_to(value, shape)
        return value.astype(dtype, copy=False)


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, device: str = "cpu", threads: int | None = 1) -> None:
        if importlib.util.find_spec("torch") is None:
            raise BackendError("backend 'torch' needs PyTorch: pip install 'timerl[torch]'")
        import torch

        self.torch = torch
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError(f"device {device!r} asked for, but CUDA is not available")
        super().__init__(device, threads)
        self._dev = torch.device(device)

    def impl(self, prim: str) -> Callable[..., Any]:
        rule = prims.get(prim)
        if rule.torch is None:
            raise BackendError(f"primitive {prim!r} has no torch lowering")
        return rule.torch

    def kernel(self, op: Op) -> Callable[..., Any]:
        """Torch promotes mixed dtypes differently from the numpy rules the IR declares
        (int64 + float32 -> float32, int64 / 2 -> float32, not float64): cast where they differ.
        Only ops with an operand of another dtype pay for the check."""
        fn = self.impl(op.prim)
        if not prims.get(op.prim).elementwise or all(e.src.dtype == op.dtype for e in op.inputs):
            return fn
        want = prims._torch_dtype(op.dtype)

        def cast(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            return out if out.dtype == want else out.to(want)

        return cast

    def asarray(self, value: Any) -> Any:
        if isinstance(value, self.torch.Tensor):
            return value.to(self._dev)
        return self.torch.as_tensor(np.asarray(value), device=self._dev)

    def to_numpy(self, value: Any) -> np.ndarray:
        if isinstance(value, self.torch.Tensor):
            return value.detach().cpu().numpy()
        return np.asarray(value)

    def stack(self, values: list[Any]) -> Any:
        return self.torch.stack(values)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.torch.zeros(shape, dtype=prims._torch_dtype(dtype), device=self._dev)

    def nbytes(self, value: Any) -> int:
        if isinstance(value, (tuple, list)):
            return sum(self.nbytes(v) for v in value)
        if isinstance(value, self.torch.Tensor):
            return value.element_size() * value.nelement()
        return int(getattr(value, "nbytes", 0))

    def broadcast(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        value = self.asarray(value)
        if tuple(value.shape) != shape:
            value = value.expand(*shape)
        want = prims._torch_dtype(dtype)
        return value if value.dtype == want else value.to(want)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        before = self.torch.get_num_threads()
        if self.threads is not None:
            self.torch.set_num_threads(self.threads)
        try:
            with self.torch.device(self._dev), self.torch.no_grad():
                yield
        finally:
            self.torch.set_num_threads(before)

    def device_peak_bytes(self) -> int | None:
        if self._dev.type == "cuda":
            return int(self.torch.cuda.max_memory_allocated(self._dev))
        return None


BACKENDS: dict[str, type[Backend]] = {"numpy": NumpyBackend, "torch": TorchBackend}


def make_backend(name: str, device: str = "cpu", threads: int | None = 1) -> Backend:
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}") from None
    return cls(device, threads)
