"""A pool without a Ray cluster runs its calls in processes of its own: results in call order,
failures named, closures carried, and no Ray started."""

from __future__ import annotations

import os
import sys
import time

import pytest

from timerl.errors import GraphError
from timerl.graphopt.parallel import TaskPool


def _pid_of_square(x) -> tuple[int, int]:
    time.sleep(0.05)
    x = x() if callable(x) else x
    if x < 0:
        raise ValueError(f"negative {x}")
    return x * x, os.getpid()


def _started_at(k: int) -> tuple[int, float]:
    start = time.time()
    time.sleep(0.3)
    return k, start


def _die(k: int) -> int:
    if k == 1:
        os._exit(3)  # a process killed mid-call
    return k


def _ray_started() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray and ray.is_initialized())


@pytest.fixture
def no_ray(monkeypatch):
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # another module's Ray in this test process
        ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_two_workers_run_in_two_processes_of_the_pool(no_ray):
    seen = []
    with TaskPool(2) as pool:
        shared = pool.put(lambda: 3)  # a closure, as a problem's factory is
        calls = [(shared,)] + [(k,) for k in range(8)]
        got = pool.map(_pid_of_square, calls, on_done=lambda i, r: seen.append(i))
        assert [v for v, _ in got] == [9] + [k * k for k in range(8)]
        assert sorted(seen) == list(range(9))
        pids = {pid for _, pid in got}
        assert os.getpid() not in pids and len(pids) == 2
        # the processes stay for the pool's life: a second map reuses them
        assert {pid for _, pid in pool.map(_pid_of_square, [(k,) for k in range(6)])} == pids
        with pytest.raises(GraphError, match="task 1 failed.*negative -1"):
            pool.map(_pid_of_square, [(1,), (-1,)])
    assert not _ray_started()


def test_the_largest_calls_start_first_and_results_keep_call_order(no_ray):
    with TaskPool(2) as pool:
        pool.map(_started_at, [(0,), (0,)])  # processes up before the clock matters
        got = pool.map(_started_at, [(k,) for k in range(5)], sizes=[1, 2, 3, 4, 5])
    assert [k for k, _ in got] == list(range(5))
    start = dict(got)
    # the two largest run first, the smallest only once two calls have finished
    assert max(start[4], start[3]) + 0.25 < start[0]


def test_a_dead_process_is_named_and_the_next_map_starts_afresh(no_ray):
    with TaskPool(2) as pool:
        with pytest.raises(GraphError, match=r"task \d failed: BrokenProcessPool"):
            pool.map(_die, [(0,), (1,), (2,)])
        assert pool.map(_die, [(0,), (2,)]) == [0, 2]


def test_two_workers_need_no_ray_but_an_address_does(no_ray, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with TaskPool(2) as pool:
        assert pool.map(_pid_of_square, [(3,)])[0][0] == 9
    with pytest.raises(GraphError, match=r"--ray-address HOST:6379 needs ray.*timerl\[ray\]"):
        TaskPool(2, ray_address="HOST:6379")
    monkeypatch.setenv("RAY_ADDRESS", "HOST:6379")  # Ray's own variable names a cluster too
    with pytest.raises(GraphError, match="HOST:6379"):
        TaskPool(2)
    with pytest.raises(GraphError, match="at least 1"):
        TaskPool(0)


def test_eval_and_train_in_processes_match_one_worker(
    no_ray, tiny_corpus, tmp_path, eval_records, trained_params
):
    import numpy as np

    argv = ["graphopt", "eval", "--corpus", str(tiny_corpus), "--split", "train"]
    argv += ["--budget", "100", "--methods", "portfolio", "brkga", "learned"]
    # the runtime objective's problem factory is a closure: it must reach the processes
    argv += ["--devices", "2", "--host", "--memory-fraction", "0.7", "--objective", "runtime"]
    records = [eval_records(argv, w, tmp_path / f"w{w}.json") for w in (1, 2)]
    assert len(records[0]) == 3 and records[0] == records[1]
    pytest.importorskip("torch")
    weights = [trained_params(tiny_corpus, w, tmp_path / f"p{w}.npz") for w in (1, 2)]
    for k in weights[0]:
        np.testing.assert_array_equal(weights[0][k], weights[1][k], err_msg=k)
    assert not _ray_started()
