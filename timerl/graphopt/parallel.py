"""Independent searches and evaluations spread over Ray tasks (``pip install "timerl[ray]"``).

graphopt's expensive work (one graph's methods in ``eval``, one sampled search in ``train``)
is a pure function of its arguments, so it can run anywhere: :class:`TaskPool` runs such calls
in this process (``workers=1``) or as Ray tasks, at most ``workers`` at a time, and returns
the results in call order, so results do not depend on the number of workers. Kept apart from
the RL layer's Ray code because graphopt stands alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from timerl.errors import GraphError, TimerlError


class TaskPool:
    """Runs ``fn(*args)`` calls locally or on Ray, keeping ``workers`` of them in flight."""

    def __init__(self, workers: int = 1, ray_address: str | None = None) -> None:
        if int(workers) < 1:
            raise GraphError(f"--workers must be at least 1, got {workers}")
        self.workers = int(workers)
        self._ray: Any = None
        self._started = False
        self._remote: dict[Callable[..., Any], Any] = {}
        if self.workers > 1 or ray_address:
            try:
                import ray
            except ModuleNotFoundError:
                raise GraphError(
                    'graphopt --workers N needs ray: pip install "timerl[ray]"'
                ) from None
            if not ray.is_initialized():
                if ray_address:
                    ray.init(address=ray_address, logging_level=logging.WARNING)
                else:
                    ray.init(
                        num_cpus=max(self.workers, os.cpu_count() or 1),
                        include_dashboard=False,
                        logging_level=logging.WARNING,
                    )
                self._started = True
            self._ray = ray

    def put(self, value: Any) -> Any:
        """Share a large argument once (Ray's object store); a plain value without Ray."""
        return value if self._ray is None else self._ray.put(value)

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
                out.append(fn(*args))
                if on_done is not None:
                    on_done(i, out[-1])
            return out
        ray = self._ray
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1, max_retries=1)(fn)
        results: list[Any] = [None] * len(calls)
        pending: dict[Any, int] = {}
        todo = list(enumerate(calls))
        if sizes is not None:
            todo.sort(key=lambda item: -sizes[item[0]])  # stable: ties keep call order
        todo.reverse()
        while todo or pending:
            while todo and len(pending) < self.workers:
                i, args = todo.pop()
                pending[remote.remote(*args)] = i
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None) or err
                if isinstance(cause, TimerlError):
                    raise cause from None  # timerl's own error, as one process would raise it
                raise GraphError(
                    f"graphopt worker task {i} failed: {type(cause).__name__}: {cause}"
                ) from err
            if on_done is not None:
                on_done(i, results[i])
        return results

    def close(self) -> None:
        """Shut down the local Ray this pool started (a joined or outer one is left alone)."""
        if self._started and self._ray is not None:
            self._ray.shutdown()
        self._started = False
        self._ray = None

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
