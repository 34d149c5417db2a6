"""The JAX backend: primitives lowered by ``jax_lowering``'s table, pure regions jitted.

Outside regions each op is one eager ``jnp`` call (10-50 us of dispatch each). The code
generator therefore asks ``fuse`` for one ``jax.jit``-ed function per run of pure statements
(``schedule/fused.Region``, ``runtime/regions.py``); the jitted functions are kept here, on the backend a compiled
program owns, so a second ``run`` (a fresh executor, regenerated code) finds them traced and
compiled already. ``region_stats`` counts traces and the seconds they and XLA's compilation
took, for ``prog.stats()``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from timerl.errors import BackendError
from timerl.runtime.backend import Backend
from timerl.runtime.jax_loops import body_function, loop_function
from timerl.runtime.jax_lowering import LOWERINGS, TRACED_ATTRS
from timerl.runtime.numpy_backend import NumpyBackend
from timerl.schedule.fused import BodyPlan, LoopPlan

# ``TIMERL_NUMPY_REGIONS=0`` jits every region, none runs as numpy kernels (for tests and
# comparisons; read when a program is compiled)
NUMPY_REGIONS_ENV = "TIMERL_NUMPY_REGIONS"


@functools.lru_cache(maxsize=4096)
def _array_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


def _returned_by(plan: BodyPlan, op: int) -> int:
    """The nested loop of ``plan`` whose last values hold ``op``."""
    return next(
        k for k, nest in enumerate(plan.loops) if op in nest.keep and op in nest.plan.finals
    )


def _x64() -> Any:
    """64-bit types while timerl makes or computes arrays (see ``jax_lowering``'s docstring)."""
    return jax.enable_x64(True)


class JaxBackend(Backend):
    """``threads`` caps only the math library's threads, for the regions run as numpy
    kernels: XLA sizes its CPU thread pool when jax starts."""

    name = "jax"
    mutable_arrays = False  # a run keeps point stores: its arrays are never written in place
    lowerings = LOWERINGS
    promotes_like_numpy = False  # jax's own lattice: int64 + float32 -> float32
    # what the fusion pass asks (``Backend.capabilities``)
    fuses = True
    fuses_loops = True  # a loop whose body traces runs as one lax.fori_loop (jax_loops.py)
    fuses_bodies = True  # an iteration whose body traces, inner loops nested, as one call
    traced_attrs = TRACED_ATTRS
    host_results_numpy = True

    def __init__(self, device: str = "cpu", threads: int | None = 1) -> None:
        super().__init__(device, threads)
        platform = "gpu" if device.startswith("cuda") or device.startswith("gpu") else device
        index = int(device.split(":")[1]) if ":" in device else 0
        try:
            self._dev = jax.devices(platform.split(":")[0])[index]
        except (RuntimeError, IndexError) as exc:
            raise BackendError(f"device {device!r} asked for, but jax has none: {exc}") from None
        self._regions: dict[Hashable, Callable[..., Any]] = {}
        self._loops: dict[Hashable, Callable[..., Any]] = {}
        self._bodies: dict[Hashable, Callable[..., Any]] = {}
        self.calls = 0  # calls of jitted functions (regions, loops, iteration bodies)
        # a region in a loop stepping a host call, small enough that numpy's kernels cost
        # less than a jitted call, runs on these (``regions.py``); on the CPU only, where
        # numpy reads a jax array in place
        self.host_kernels = NumpyBackend(threads=threads) if self._dev.platform == "cpu" else None
        # the regions run as numpy kernels so far, as explain() names them
        self.kernel_regions: set[str] = set()
        self.traces = 0
        self.trace_seconds = 0.0
        self.donated_bytes = 0  # bytes of inputs donated to iteration calls

    @property
    def numpy_regions(self) -> bool:
        """Whether a small region in a loop stepping the host may run as numpy kernels: on
        the CPU (where numpy reads a jax array in place), unless switched off."""
        return self.host_kernels is not None and os.environ.get(NUMPY_REGIONS_ENV, "1") != "0"

    def cast(self, value: Any, dtype: np.dtype) -> Any:
        want = np.dtype(dtype)
        return value if value.dtype == want else value.astype(want)

    # --- jitted regions --------------------------------------------------------------------------
    def _jitted(self, fn: Callable[..., Any], **jit: Any) -> Callable[..., Any]:
        """``fn`` jitted, its traces, their seconds and every call counted for ``stats()``."""

        def traced(*args: Any) -> Any:
            self.traces += 1  # runs only while jax traces
            return fn(*args)

        jitted = jax.jit(traced, **jit)

        def call(*args: Any) -> Any:
            self.calls += 1
            before = self.traces
            start = time.perf_counter()
            out = jitted(*args)
            if self.traces != before:  # this call traced and compiled
                self.trace_seconds += time.perf_counter() - start
            return out

        return call

    def fuse(self, key: Hashable, fn: Callable[..., tuple]) -> Callable[..., tuple]:
        """``fn`` jitted, once per ``key`` for the life of this backend (so of its program);
        its first argument is static (a region's branch choices: a new value retraces)."""
        cached = self._regions.get(key)
        if cached is None:
            cached = self._regions[key] = self._jitted(fn, static_argnums=0)
        return cached

    def fuse_loop(self, key: Hashable, plan: LoopPlan) -> Callable[..., Any]:
        """The loop ``plan`` describes as one jitted ``lax.fori_loop``, once per ``key`` for
        the life of this backend; its traces count with the regions'."""
        cached = self._loops.get(key)
        if cached is None:
            cached = self._loops[key] = self._jitted(loop_function(plan))
        return cached

    def fuse_body(self, key: Hashable, plan: BodyPlan) -> Callable[..., Any]:
        """One iteration of a loop, inner loops nested, as one jitted function of the values
        read before it and the traced loop index; once per ``key`` for this backend's life."""
        cached = self._bodies.get(key)
        if cached is None:
            run = body_function(plan)
            cached = self._donating(run, plan) if plan.donate else self._jitted(run)
            self._bodies[key] = cached
        return cached

    def _donating(self, run: Callable[..., Any], plan: BodyPlan) -> Callable[..., Any]:
        """``run(inputs, index)`` jitted with the inputs ``plan.donate`` names donated: XLA
        writes the iteration's new parameters, moments and env state into the buffers of the
        previous iteration's, which the schedule frees after the call. An input is donated
        only when it is the very array the previous call returned for its op and no other
        input is that array; otherwise (the first iteration's fillers and initial values, a
        restored snapshot) a copy is donated, so no array a store still holds is lost."""
        positions = [k for k, _ in plan.donate]
        skip = frozenset(positions)

        def split(donated: tuple, kept: tuple, index: Any) -> Any:
            it_d, it_k = iter(donated), iter(kept)
            count = len(donated) + len(kept)
            inputs = tuple(next(it_d) if k in skip else next(it_k) for k in range(count))
            out = run(inputs, index)
            # an output that is a donated input unchanged comes back as a buffer of its own
            taken = {id(x) for x in donated}
            return jax.tree_util.tree_map(lambda x: jnp.copy(x) if id(x) in taken else x, out)

        jitted = self._jitted(split, donate_argnums=0)
        kept_at = [k for k in range(plan.n_inputs) if k not in skip]
        # where the call returns each donated op: the top-level values (-1) or a nested loop's
        where = {op: -1 if op in plan.outs else _returned_by(plan, op) for _, op in plan.donate}
        last: dict[int, Any] = {}
        sizes: dict[tuple, int] = {}  # (op, shape) -> bytes: an array's nbytes costs more

        def call(inputs: tuple, index: Any) -> Any:
            kept = tuple([inputs[k] for k in kept_at])
            others = set(map(id, kept))
            donated = []
            for k, op in plan.donate:
                x = inputs[k]
                if last.get(op) is not x or id(x) in others:
                    x = jax.device_put(x, may_alias=False)  # a fresh buffer of its own
                else:
                    others.add(id(x))
                    size = sizes.get((op, x.shape))
                    if size is None:
                        size = sizes[(op, x.shape)] = self.nbytes(x)
                    self.donated_bytes += size
                donated.append(x)
            out = jitted(tuple(donated), kept, index)
            top, nested = out
            for op, at in where.items():
                last[op] = top[op] if at < 0 else nested[at][0][op]
            return out

        return call

    def device_peak_bytes(self) -> int | None:
        # XLA's allocator has no reset: this is the process's peak on the device, not the run's
        if self._dev.platform == "cpu":
            return None
        stats = self._dev.memory_stats() or {}
        peak = stats.get("peak_bytes_in_use")
        return None if peak is None else int(peak)

    def region_stats(self) -> dict[str, Any]:
        return {
            "jit_loops": len(self._loops),
            "jit_bodies": len(self._bodies),
            "jit_calls": self.calls,
            "jit_regions": len(self._regions),
            "numpy_regions": len(self.kernel_regions),
            "jit_traces": self.traces,
            "jit_trace_compile_seconds": self.trace_seconds,
            "donated_bytes": self.donated_bytes,
        }

    # --- arrays --------------------------------------------------------------------------------
    # Arrays are made on the default device (``jax.default_device``), never ``device_put`` to
    # it: a committed array where a region first saw an uncommitted one compiles the region
    # again (measured: 22 recompiles, 12 s, in a PPO program's second iteration).
    @contextlib.contextmanager
    def _making(self) -> Iterator[None]:
        with _x64(), jax.default_device(self._dev):
            yield

    def asarray(self, value: Any) -> Any:
        if isinstance(value, jax.Array):
            return value
        with self._making():
            return jnp.asarray(np.asarray(value))

    def to_numpy(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def stack(self, values: list[Any]) -> Any:
        """On the CPU a numpy array: ``jnp.stack`` of a rollout's 128 rows (the gather after
        a loop stepping a host env) takes 5 ms of dispatch per row's checks, numpy 0.1 ms
        (a jax array on the CPU is read without a copy); making a jax array of the result
        took 0.1-1.5 ms a gather inside a run, and leaving it a numpy array (a jitted call
        takes it as it is) saved 1.6 ms of a 93 ms PPO iteration on gymnasium CartPole."""
        if self._dev.platform == "cpu":
            return np.stack([np.asarray(v) for v in values])
        with self._making():
            return jnp.stack(values)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self._making():
            return jnp.zeros(shape, dtype=np.dtype(dtype))

    def nbytes(self, value: Any) -> int:
        """From shape and dtype: a jax array's own ``nbytes`` costs about 3 us, and the code
        after a fused iteration counts the bytes of some sixty values."""
        if isinstance(value, (tuple, list)):
            return sum(self.nbytes(v) for v in value)
        dtype = getattr(value, "dtype", None)
        if dtype is None:
            return int(getattr(value, "nbytes", 0))
        return _array_bytes(value.shape, dtype)

    def copy(self, value: Any) -> Any:
        return self.asarray(value)  # immutable: nothing writes into it

    def broadcast(self, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self._making():
            value = self.asarray(value)
            if tuple(value.shape) != tuple(shape):
                value = jnp.broadcast_to(value, shape)
            want = np.dtype(dtype)
            return value if value.dtype == want else value.astype(want)

    def select(self, cond: Any, a: Any, b: Any) -> Any:
        """``a`` where ``cond`` holds, else ``b`` (inside a traced region)."""
        return jnp.where(cond, a, b)

    def truth(self, value: Any) -> bool:
        return bool(np.asarray(value).all())

    def use_threads(self, threads: int | None) -> None:
        """The threads of the regions run as numpy kernels; XLA keeps its own pool."""
        super().use_threads(threads)
        if self.host_kernels is not None:
            self.host_kernels.use_threads(threads)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """jax's scope, and (as on the numpy backend) the math library's threads capped for
        the regions run as numpy kernels."""
        with self._making():
            if self.host_kernels is None or self.threads is None:
                yield
                return
            with self.host_kernels.active():
                yield
