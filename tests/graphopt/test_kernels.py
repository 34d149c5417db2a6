"""The compiled decoders give the orders the pure-Python ones give."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.graphopt import decoders, kernels
from timerl.graphopt.random_graph import random_graph

pytestmark = pytest.mark.skipif(not kernels.available(), reason="numba (graphopt extra) absent")


@pytest.mark.parametrize("decode", ["decode_order", "decode_postorder"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_and_python_decoders_agree(decode, seed):
    graph = random_graph(60 + 70 * seed, seed=seed)
    rng = np.random.default_rng(seed)
    keys = [rng.random(graph.n) for _ in range(5)]
    keys.append(np.full(graph.n, 0.5))  # every key tied: the order by index decides
    compiled = [getattr(decoders, decode)(graph, k, compiled=True) for k in keys]
    python = [getattr(decoders, decode)(graph, k) for k in keys]
    for c, p in zip(compiled, python, strict=True):
        assert c.dtype == p.dtype == np.int64
        np.testing.assert_array_equal(c, p)
        assert sorted(c.tolist()) == list(range(graph.n))


def test_only_a_large_search_loads_the_kernels():
    """The compiler's searches (hundreds of nodes, 300 decodes) stay in Python: loading numba
    costs more than they take."""
    assert not kernels.worth_it(400, 300)
    assert kernels.worth_it(1000, 5000)
