"""graphopt eval and train with --workers N on Ray tasks (the Ray this process runs) give the
same results as one worker."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from timerl.errors import GraphError
from timerl.graphopt.parallel import TaskPool
from timerl.graphopt.random_graph import random_graph

ray = pytest.importorskip("ray", reason='needs the ray extra: pip install "timerl[ray]"')


pytestmark = pytest.mark.usefixtures("local_ray")  # tests/conftest.py


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    (root / "g").mkdir(parents=True)
    entries = []
    for k, n in enumerate([12, 18, 24, 30]):
        g = random_graph(n, seed=k, view_prob=0.2)
        g.save(root / f"g/{k}.json")
        entries.append(
            {"name": f"g{k}", "family": "rand", "kind": "synthetic", "split": "train"}
            | {"nodes": n, "path": f"g/{k}.json"}
        )
    (root / "index.json").write_text(json.dumps({"graphs": entries}))
    return root


def _square(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative {x}")
    return x * x


def test_pool_keeps_call_order_and_names_a_failed_task():
    seen = []
    with TaskPool(2) as pool:
        got = pool.map(_square, [(k,) for k in range(7)], on_done=lambda i, r: seen.append(i))
        assert got == [k * k for k in range(7)] and sorted(seen) == list(range(7))
        with pytest.raises(GraphError, match="task 1 failed.*negative -1"):
            pool.map(_square, [(1,), (-1,)])
    assert ray.is_initialized()  # the pool leaves a Ray it did not start running


def _started_at(k: int) -> tuple[int, float]:
    start = time.time()
    time.sleep(0.3)
    return k, start


def test_pool_starts_the_largest_calls_first_and_keeps_call_order():
    with TaskPool(2) as pool:
        got = pool.map(_started_at, [(k,) for k in range(5)], sizes=[1, 2, 3, 4, 5])
    assert [k for k, _ in got] == list(range(5))  # results in call order
    start = {k: t for k, t in got}
    # the two largest run first, the smallest only once two calls have finished
    assert max(start[4], start[3]) + 0.25 < start[0]


def test_eval_with_two_workers_matches_one(corpus, tmp_path, eval_records):
    argv = ["graphopt", "eval", "--corpus", str(corpus), "--split", "train"]
    argv += ["--budget", "120", "--methods", "program", "portfolio", "local", "brkga"]
    argv += ["learned", "--devices", "2", "--host", "--memory-fraction", "0.7"]
    argv += ["--objective", "runtime"]
    records = [eval_records(argv, w, tmp_path / f"w{w}.json") for w in (1, 2)]
    assert len(records[0]) == 4
    assert records[0] == records[1]


def test_train_with_two_workers_matches_one(corpus, tmp_path, trained_params):
    pytest.importorskip("torch")
    weights = [trained_params(corpus, w, tmp_path / f"p{w}.npz") for w in (1, 2)]
    assert weights[0].keys() == weights[1].keys()
    for k in weights[0]:
        np.testing.assert_array_equal(weights[0][k], weights[1][k], err_msg=k)
