"""The torch backend: primitives lowered by ``torch_lowering``'s table, on cpu or cuda."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# numpy asks the kernel for transparent huge pages on every array of 4 MiB or more; PyTorch's
# CPU allocator does so only under this variable, which it reads at its first allocation. A
# rollout's blocks and the update's (64000, 64) activations are fresh 16 MiB buffers each
# iteration: on 4 KiB pages synthetic-e256 took 34,000 page faults in its first iteration and
# 3,400 in each later one (4,200 and 0 on numpy), 6-9% of an iteration. Set before torch's first
# allocation (importing it allocates nothing); a value the user set is kept.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch  # noqa: E402 - after the allocator's setting above

from timerl.errors import BackendError
from timerl.runtime import torch_lowering
from timerl.runtime.backend import SUBSCRIPT_LOWERINGS, Backend, math_threads
from timerl.runtime.torch_lowering import DONATING, LOWERINGS, SPECIALISED, torch_dtype


class TorchBackend(Backend):
    name = "torch"
    lowerings = LOWERINGS
    donating_lowerings = DONATING
    inline_lowerings = SUBSCRIPT_LOWERINGS  # as ``torch_lowering`` lowers them
    specialisations = SPECIALISED
    array_type = torch.Tensor
    promotes_like_numpy = False  # int64 + float32 -> float32, int64 / 2 -> float32
    # ``block[t]`` builds a view per call (0.6 us, and as a kernel's ``out=`` 0.9 us more than
    # a view at hand); ``unbind`` builds all of a block's at 0.45 us a row. A rollout step
    # reads its blocks' rows about nine times.
    row_views = staticmethod(lambda rows: rows.unbind(0))

    def __init__(self, device: str = "cpu", threads: int | None = 1) -> None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError(f"device {device!r} asked for, but CUDA is not available")
        super().__init__(device, threads)
        self._dev = torch.device(device)
        self._cpu = self._dev.type == "cpu"
        if self._dev.type == "cuda":
            self.swap_tier = "host"

    @property
    def heap_arrays(self) -> bool:
        return self._cpu

    def cast(self, value: Any, dtype: np.dtype) -> Any:
        return self.caster(dtype)(value)

    def caster(self, dtype: np.dtype) -> Callable[[Any], Any]:
        want = torch_dtype(dtype)  # found once, not at each call (0.4 us)
        return lambda value: value if value.dtype == want else value.to(want)

    def asarray(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(self._dev)
        if type(value) is np.ndarray:
            if self._cpu and value.flags.writeable:
                # the memory ``as_tensor`` would share too, in a third of its time (an env
                # step returns three arrays: 2.5 us of a small rollout's step)
                try:
                    return torch.from_numpy(value)
                except (TypeError, ValueError):  # a dtype torch lacks, negative strides
                    pass
            if any(s < 0 for s in value.strides):  # torch has no negative strides: a copy
                value = np.ascontiguousarray(value)
        return torch.as_tensor(np.asarray(value), device=self._dev)

    def to_numpy(self, value: Any) -> np.ndarray:
        if isinstance(value, torch.Tensor):
            # ``is_cpu``: a flag; ``device.type`` builds a device object first (0.3 us)
            if self._cpu and not value.requires_grad and value.is_cpu:
                return value.numpy()
            return value.detach().cpu().numpy()
        return np.asarray(value)

    def stack(self, values: list[Any]) -> Any:
        return torch.stack(values)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return torch.zeros(shape, dtype=torch_dtype(dtype), device=self._dev)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return torch.empty(shape, dtype=torch_dtype(dtype), device=self._dev)

    def copy(self, value: Any) -> Any:
        return self.asarray(value).clone()

    def broadcast(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        value = self.asarray(value)
        if tuple(value.shape) != shape:
            value = value.expand(*shape)
        want = torch_dtype(dtype)
        return value if value.dtype == want else value.to(want)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        # ``torch.device`` as a context is a Python-level function mode that intercepts every
        # torch call (measured: a third of a CPU PPO run's time). CPU is torch's default, so
        # only another device needs it, for the tensors lowerings create without inputs.
        device = torch.device(self._dev) if self._dev.type != "cpu" else contextlib.nullcontext()
        # large CPU products may run on numpy's BLAS on one thread (``torch_lowering``); on
        # more, numpy's BLAS stays on one thread beside torch's pool
        blas: Any = contextlib.nullcontext()
        if torch_lowering.NUMPY_PRODUCTS and self._dev.type == "cpu" and self.threads is not None:
            blas = math_threads(1, user_api="blas")
        # inference mode, not only no_grad: timerl differentiates its own graph, never through
        # torch's autograd, and without version counters and view tracking each small op is
        # about 10% cheaper
        try:
            with device, blas, torch.inference_mode():
                yield
        finally:
            torch.set_num_threads(before)

    def to_host(self, value: Any) -> Any:
        # Pinned memory lets the copy run asynchronously on the current stream: the swap-out
        # costs the kernel launch only, and the device memory it frees is reused only by
        # kernels queued after the copy (the caching allocator is stream-ordered).
        pinned = self._dev.type == "cuda"
        host = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=pinned)
        return host.copy_(value, non_blocking=pinned)

    def from_host(self, value: Any) -> Any:
        return value.to(self._dev, non_blocking=self._dev.type == "cuda")

    def reset_device_peak(self) -> None:
        if self._dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._dev)

    def device_peak_bytes(self) -> int | None:
        if self._dev.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self._dev))
        return None
