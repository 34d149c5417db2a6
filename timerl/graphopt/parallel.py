"""Independent searches and evaluations spread over Ray tasks (``pip install "timerl[ray]"``).

graphopt's expensive work (one graph's methods in ``eval``, one sampled search in ``train``)
is a pure function of its arguments, so it can run anywhere: :class:`TaskPool` runs such calls
in this process (``workers=1``) or as Ray tasks, at most ``workers`` at a time, and returns
the results in call order, so results do not depend on the number of workers. Kept apart from
the RL layer's Ray code because graphopt stands alone.

Starting a local Ray takes seconds (about 7 s on a 2-core machine: its servers, then the
raylet's registration), as long as several whole searches. When the pool starts Ray itself,
it first spawns ``workers`` processes of its own (no Ray in them) that take the first calls
while Ray comes up; once Ray is up, one slot stays with them and the others are Ray tasks.
``ray.init`` cannot run on a thread beside the work (it must be called from the main
thread), hence the processes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from timerl.errors import GraphError, TimerlError


class Shared:
    """A large argument shared by many calls: put into Ray's object store once, the first time
    a Ray task needs it; the value itself for a call that runs without Ray."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.ref: Any = None


class TaskPool:
    """Runs ``fn(*args)`` calls locally or on Ray, keeping ``workers`` of them in flight."""

    def __init__(self, workers: int = 1, ray_address: str | None = None) -> None:
        if int(workers) < 1:
            raise GraphError(f"--workers must be at least 1, got {workers}")
        self.workers = int(workers)
        self._address = ray_address
        self._ray: Any = None
        self._started = False  # this pool started Ray (and shuts it down)
        self._starting = False  # Ray is to be started by the first map, beside the work
        self._local: ProcessPoolExecutor | None = None
        self._remote: dict[Callable[..., Any], Any] = {}
        if self.workers > 1 or ray_address:
            try:
                import ray
            except ModuleNotFoundError:
                raise GraphError(
                    'graphopt --workers N needs ray: pip install "timerl[ray]"'
                ) from None
            self._ray = ray
            if not ray.is_initialized():
                if ray_address:
                    ray.init(address=ray_address, logging_level=logging.WARNING)
                    self._started = True
                else:
                    self._starting = True

    def put(self, value: Any) -> Shared:
        """Share a large argument between calls (see :class:`Shared`)."""
        return Shared(value)

    def _start_ray(self) -> None:
        self._ray.init(
            num_cpus=max(self.workers, os.cpu_count() or 1),
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
        self._started, self._starting = True, False

    def _for_ray(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        out = []
        for a in args:
            if isinstance(a, Shared):
                if a.ref is None:
                    a.ref = self._ray.put(a.value)
                a = a.ref
            out.append(a)
        return tuple(out)

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
        ``fn`` must be a module-level function (Ray workers import it by name)."""
        if self._ray is None:
            out = []
            for i, args in enumerate(calls):
                out.append(fn(*_plain(args)))
                if on_done is not None:
                    on_done(i, out[-1])
            return out
        results: list[Any] = [None] * len(calls)
        todo = list(enumerate(calls))
        if sizes is not None:
            todo.sort(key=lambda item: -sizes[item[0]])  # stable: ties keep call order
        todo.reverse()
        local: dict[Future, int] = {}  # calls in the pool's own processes

        def to_own() -> None:
            i, args = todo.pop()
            local[self._local.submit(_call, _pack(fn, args))] = i

        if self._starting:
            # every slot works in a process of the pool's own while Ray starts
            ctx = multiprocessing.get_context("spawn")  # no inherited threads or Ray state
            self._local = ProcessPoolExecutor(self.workers, mp_context=ctx)
            while todo and len(local) < self.workers:
                to_own()
            self._start_ray()
        ray = self._ray
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1, max_retries=1)(fn)
        pending: dict[Any, int] = {}
        own = 1 if self._local is not None else 0  # slots kept by own processes, once Ray is up

        def finish(i: int, get: Callable[[], Any]) -> None:
            try:
                results[i] = get()
            except ray.exceptions.RayTaskError as err:
                raise _failure(i, getattr(err, "cause", None) or err) from err
            except TimerlError:
                raise  # timerl's own error, as one process would raise it
            except Exception as err:  # noqa: BLE001 - raised in the pool's own process
                raise _failure(i, err) from err
            if on_done is not None:
                on_done(i, results[i])

        while todo or pending or local:
            while todo and len(local) < own and len(local) + len(pending) < self.workers:
                to_own()
            while todo and len(local) + len(pending) < self.workers:
                i, args = todo.pop()
                pending[remote.remote(*self._for_ray(args))] = i
            done = [f for f in local if f.done()]
            if done or (local and not pending):
                if not done:
                    done = list(wait(local, return_when=FIRST_COMPLETED).done)
                for future in done:
                    finish(local.pop(future), future.result)
                continue
            # with own calls in flight, look at them every few milliseconds
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.005 if local else None)
            for ref in ready:
                finish(pending.pop(ref), lambda ref=ref: ray.get(ref))
        return results

    def close(self) -> None:
        """Shut down the pool's own process and the local Ray this pool started (a joined or
        outer one is left alone)."""
        if self._local is not None:
            self._local.shutdown(cancel_futures=True)
            self._local = None
        if self._started and self._ray is not None:
            self._ray.shutdown()
        self._started = self._starting = False
        self._ray = None

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.value if isinstance(a, Shared) else a for a in args)


def _pack(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """A call for the pool's own process, pickled as Ray pickles a task (with the cloudpickle
    Ray brings: arguments may hold closures, such as a problem's factory)."""
    from ray import cloudpickle

    return cloudpickle.dumps((fn, _plain(args)))


def _call(packed: bytes) -> Any:
    from ray import cloudpickle

    fn, args = cloudpickle.loads(packed)
    return fn(*args)


def _failure(i: int, cause: BaseException) -> Exception:
    if isinstance(cause, TimerlError):
        return cause
    return GraphError(f"graphopt worker task {i} failed: {type(cause).__name__}: {cause}")
