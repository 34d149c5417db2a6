"""Independent searches and evaluations spread over processes or Ray tasks.

graphopt's expensive work (one graph's methods in ``eval``, one sampled search in ``train``)
is a pure function of its arguments, so it can run anywhere. :class:`TaskPool` runs such calls

- in this process (``workers=1``);
- in ``workers`` processes of this machine (``workers > 1``, no Ray address);
- as Ray tasks (``pip install "timerl[ray]"``) on the cluster at ``ray_address`` (or
  ``RAY_ADDRESS``), or on the Ray this process already runs.

It returns the results in call order, so results do not depend on where calls ran. Why not a
local Ray when no address is given: starting one costs about 7 CPU-seconds on a 2-core machine
(its servers, agents and prestarted workers) and its services keep a few percent of a core
busy, for no capacity a process pool lacks; `timerl graphopt eval --workers 2` over the test
split took 45 s with processes and 55 s with a local Ray (80-90 s with one worker). Ray pays
once there are machines to spread over. Kept apart from the RL layer's Ray code because
graphopt stands alone.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from timerl.errors import GraphError, TimerlError


class Shared:
    """A large argument shared by many calls: put into Ray's object store once, the first time
    a Ray task needs it; the value itself for a call that runs in a process."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.ref: Any = None


class TaskPool:
    """Runs ``fn(*args)`` calls here, in local processes or on Ray, ``workers`` at a time."""

    def __init__(self, workers: int = 1, ray_address: str | None = None) -> None:
        if int(workers) < 1:
            raise GraphError(f"--workers must be at least 1, got {workers}")
        self.workers = int(workers)
        self._ray: Any = None
        self._started = False  # this pool joined a cluster (and disconnects from it)
        self._local: ProcessPoolExecutor | None = None
        self._remote: dict[Callable[..., Any], Any] = {}
        address = ray_address or os.environ.get("RAY_ADDRESS") or None
        running = sys.modules.get("ray")  # a Ray this process runs (imported only if so)
        if address or (self.workers > 1 and running and running.is_initialized()):
            try:
                import ray
            except ModuleNotFoundError:
                raise GraphError(
                    f'graphopt --ray-address {address} needs ray: pip install "timerl[ray]"'
                ) from None
            self._ray = ray
            if not ray.is_initialized():
                ray.init(address=address, logging_level=logging.WARNING)
                self._started = True

    def put(self, value: Any) -> Shared:
        """Share a large argument between calls (see :class:`Shared`)."""
        return Shared(value)

    def map(
        self,
        fn: Callable[..., Any],
        calls: Sequence[tuple[Any, ...]],
        on_done: Callable[[int, Any], None] | None = None,
        sizes: Sequence[float] | None = None,
    ) -> list[Any]:
        """``[fn(*args) for args in calls]``; ``on_done(index, result)`` as each finishes.

        ``sizes`` (a rough cost per call) starts the largest calls first: a long call that
        started last would run alone while the other workers idle (longest-first is the
        classic cure for that tail). Results stay in call order either way.
        ``fn`` must be a module-level function (workers import it by name)."""
        if self._ray is None and self.workers == 1:
            out = []
            for i, args in enumerate(calls):
                out.append(fn(*_plain(args)))
                if on_done is not None:
                    on_done(i, out[-1])
            return out
        order = list(range(len(calls)))
        if sizes is not None:
            order.sort(key=lambda i: -sizes[i])  # stable: ties keep call order
        results: list[Any] = [None] * len(calls)

        def finish(i: int, get: Callable[[], Any]) -> None:
            results[i] = _result(i, get, self._ray)
            if on_done is not None:
                on_done(i, results[i])

        if self._ray is None:
            self._in_processes(fn, calls, order, finish)
        else:
            self._on_ray(fn, calls, order, finish)
        return results

    def _in_processes(
        self,
        fn: Callable[..., Any],
        calls: Sequence[tuple[Any, ...]],
        order: list[int],
        finish: Callable[[int, Callable[[], Any]], None],
    ) -> None:
        if self._local is None:
            # spawn: no threads (BLAS, torch) or locks inherited half-held from this process;
            # the processes stay for the pool's life, so a training run spawns them once
            ctx = multiprocessing.get_context("spawn")
            self._local = ProcessPoolExecutor(self.workers, mp_context=ctx)
        # queued in order: the executor's processes take the next call as they finish one
        running = {self._local.submit(_call, _pack(fn, calls[i])): i for i in order}
        try:
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=running.get):
                    if self._local is not None and isinstance(
                        future.exception(), BrokenProcessPool
                    ):
                        # a process died (killed, out of memory): the next map starts afresh
                        self._local.shutdown(cancel_futures=True)
                        self._local = None
                    finish(running.pop(future), future.result)
        finally:
            for future in running:
                future.cancel()

    def _on_ray(
        self,
        fn: Callable[..., Any],
        calls: Sequence[tuple[Any, ...]],
        order: list[int],
        finish: Callable[[int, Callable[[], Any]], None],
    ) -> None:
        ray = self._ray
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1, max_retries=1)(fn)
        todo = order[::-1]
        pending: dict[Any, int] = {}
        while todo or pending:
            while todo and len(pending) < self.workers:
                i = todo.pop()
                pending[remote.remote(*self._for_ray(calls[i]))] = i
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                finish(pending.pop(ref), lambda ref=ref: ray.get(ref))

    def _for_ray(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        out = []
        for a in args:
            if isinstance(a, Shared):
                if a.ref is None:
                    a.ref = self._ray.put(a.value)
                a = a.ref
            out.append(a)
        return tuple(out)

    def close(self) -> None:
        """Stop the pool's processes and leave a cluster this pool joined (a Ray the process
        already ran is left alone)."""
        if self._local is not None:
            self._local.shutdown(cancel_futures=True)
            self._local = None
        if self._started and self._ray is not None:
            self._ray.shutdown()
        self._started = False
        self._ray = None

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.value if isinstance(a, Shared) else a for a in args)


def _pack(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """A call for a pool process, pickled with cloudpickle: arguments may hold closures, such
    as a problem's factory, which the standard pickle refuses."""
    import cloudpickle

    return cloudpickle.dumps((fn, _plain(args)))


def _call(packed: bytes) -> Any:
    import cloudpickle

    fn, args = cloudpickle.loads(packed)
    return fn(*args)


def _result(i: int, get: Callable[[], Any], ray: Any) -> Any:
    """The result of call ``i``; a failure raised as this process would raise it (timerl's own
    errors as they are, any other named with its call)."""
    try:
        return get()
    except TimerlError:
        raise
    except Exception as err:  # noqa: BLE001 - raised in another process or on Ray
        cause = err
        if ray is not None and isinstance(err, ray.exceptions.RayTaskError):
            cause = getattr(err, "cause", None) or err
        if isinstance(cause, TimerlError):
            raise cause from err
        raise GraphError(
            f"graphopt worker task {i} failed: {type(cause).__name__}: {cause}"
        ) from err
