"""Fixtures shared across the test packages."""

from __future__ import annotations

import json
import logging

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs for one test module. Another module's Ray may still be up in
    this test process (xdist runs modules side by side in one worker): start our own."""
    ray = pytest.importorskip("ray", reason='needs the ray extra: pip install "timerl[ray]"')
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture
def tiny_corpus(tmp_path):
    """A graphopt corpus of three small random training graphs (20, 30, 40 nodes)."""
    from timerl.graphopt.random_graph import random_graph

    root = tmp_path / "corpus"
    entries = []
    for k in range(3):
        g = random_graph(20 + 10 * k, seed=k, view_prob=0.2)
        rel = f"train/rand/g{k}.json"
        (root / "train" / "rand").mkdir(parents=True, exist_ok=True)
        g.save(root / rel)
        entries.append(
            {
                "name": f"g{k}",
                "family": "rand",
                "kind": "synthetic",
                "split": "train",
                "nodes": g.n,
                "path": rel,
            }
        )
    (root / "index.json").write_text(json.dumps({"graphs": entries}))
    return root


@pytest.fixture
def sliced_matmul():
    """A builder of ``x[0:T] @ w`` over a recurrence ``x`` of 256-wide rows: a block read
    whole by a matmul, which a memory budget can stream (a fresh context per call)."""

    def build():
        import numpy as np

        import timerl as tl

        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            w = tl.from_numpy(np.linspace(-1, 1, 256 * 4, dtype=np.float32).reshape(256, 4))
            x = tl.RecurrentTensor.placeholder((256,), domain=(t,))
            x[0] = tl.full((256,), 1.0)
            x[t + 1] = (x[t] * 0.5 + 1.0).tanh()
            out = x[0:T] @ w
        return ctx, out

    return build
