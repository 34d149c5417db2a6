import numpy as np
import pytest

from timerl.graphopt.decoders import Problem
from timerl.graphopt.exact import exact_peak_memory
from timerl.graphopt.perfmodel import PeakMemory, validate_order
from timerl.graphopt.random_graph import random_graph


@pytest.mark.parametrize("seed", range(12))
def test_exact_equals_brute_force_minimum(seed, all_orders):
    g = random_graph(4 + seed % 5, seed=seed, view_prob=0.3, output_prob=0.2)
    pm = PeakMemory(g)
    brute = min(pm.peak(np.array(o)) for o in all_orders(g))
    res = exact_peak_memory(Problem(g), time_limit=10)
    validate_order(g, res.solution.order)
    assert res.value == brute == res.bound
    assert pm.peak(res.solution.order) == brute


def test_exact_anytime_reports_a_valid_bound():
    g = random_graph(60, seed=11)
    res = exact_peak_memory(Problem(g), time_limit=1.0)
    validate_order(g, res.solution.order)
    assert res.bound is not None and res.bound <= res.value
