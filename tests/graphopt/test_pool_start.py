"""A pool that starts Ray itself: its own process works while Ray comes up, and the results
are the same, in call order."""

from __future__ import annotations

import os
import time

import pytest

from timerl.errors import GraphError
from timerl.graphopt.parallel import TaskPool

ray = pytest.importorskip("ray", reason='needs the ray extra: pip install "timerl[ray]"')


def _pid_of_square(x) -> tuple[int, int]:
    time.sleep(0.2)
    x = x() if callable(x) else x
    if x < 0:
        raise ValueError(f"negative {x}")
    return x * x, os.getpid()


def test_a_pool_that_starts_ray_works_in_its_own_process_meanwhile():
    if ray.is_initialized():  # another module's Ray in this test process
        ray.shutdown()
    pool = TaskPool(2)
    assert not ray.is_initialized()  # started by the first map, beside the first call
    shared = pool.put(lambda: 3)  # a closure, as a problem's factory is: Ray pickles it too
    got = pool.map(_pid_of_square, [(shared,)] + [(k,) for k in range(8)])
    assert ray.is_initialized()
    assert [v for v, _ in got] == [9] + [k * k for k in range(8)]
    pids = {pid for _, pid in got}
    assert os.getpid() not in pids
    # both of the pool's own processes took a call while Ray started, then Ray's worker took
    # calls beside the one own process that keeps a slot
    assert len(pids) == 3
    with pytest.raises(GraphError, match="task 1 failed.*negative -1"):
        pool.map(_pid_of_square, [(1,), (-1,)])
    pool.close()
    assert not ray.is_initialized()  # the pool started it, the pool stops it
