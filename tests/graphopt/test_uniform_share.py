"""BRKGA's ``uniform_share``: the share of drawn chromosomes that stay uniform when a policy's
Beta proposals steer the search."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from timerl.cli import main
from timerl.errors import CheckpointError
from timerl.graphopt import brkga as brkga_module
from timerl.graphopt import learned
from timerl.graphopt.baselines import portfolio_solutions
from timerl.graphopt.brkga import brkga
from timerl.graphopt.decoders import Problem
from timerl.graphopt.evaluate import run_method
from timerl.graphopt.learned import learned_search, load_policy, shipped_weights
from timerl.graphopt.perfmodel import Cluster
from timerl.graphopt.policy import SHIPPED, SHIPPED_RUNTIME, PolicyWeights
from timerl.graphopt.random_graph import random_graph

# Recorded with the code before ``uniform_share`` existed (same problem, proposals and seed
# as ``_runtime_problem`` and ``_proposals`` below): share 0 must keep this random stream, so
# that searches run before the parameter existed stay reproducible.
OLD_UNIFORM_HISTORY = [
    0.07601932942008158,
    0.07369836928863645,
    0.07347444686326836,
    0.07342466793176163,
    0.07339826893167474,
    0.07339826893167474,
    0.07339826893167474,
    0.073349104400168,
    0.07334849000016799,
    0.07334849000016799,
    0.07334849000016799,
    0.07293905219925675,
    0.07293905219925675,
]
OLD_BETA_HISTORY = [
    0.07601932942008158,
    0.07440781025493538,
    0.07401043718784794,
    0.06296022706128454,
    0.06296022706128454,
    0.06296022706128454,
    0.06296022706128454,
    0.06288869298397581,
    0.06282677074962177,
    0.06282677074962177,
    0.06282677074962177,
    0.06282677074962177,
    0.06282677074962177,
]
OLD_BETA_ORDER_HEAD = [0, 8, 1, 4, 7, 2, 3, 5, 22, 13, 14, 15, 29, 6, 9, 10, 38, 16, 11, 17]


def _runtime_problem() -> Problem:
    g = random_graph(40, seed=2)
    return Problem(g, "runtime", Cluster.make(2, memory_limit=200_000, host=True))


def _proposals(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    m = problem.num_keys
    return rng.uniform(0.3, 3.0, m), rng.uniform(0.3, 3.0, m)


def test_share_zero_keeps_the_old_random_stream():
    p = _runtime_problem()
    seeds = list(portfolio_solutions(p).values())
    alpha, beta = _proposals(p)
    uniform = brkga(p, budget=200, seeds=seeds, seed=3, uniform_share=0.0)
    assert uniform.history == OLD_UNIFORM_HISTORY
    steered = brkga(p, budget=200, seeds=seeds, seed=3, alpha=alpha, beta=beta)
    assert steered.history == OLD_BETA_HISTORY
    assert steered.solution.order.tolist()[:20] == OLD_BETA_ORDER_HEAD
    again = brkga(p, budget=200, seeds=seeds, seed=3, alpha=alpha, beta=beta, uniform_share=0)
    assert again.history == OLD_BETA_HISTORY
    # uniform BRKGA ignores the share: every draw is uniform already
    assert brkga(p, budget=200, seeds=seeds, seed=3, uniform_share=0.6).history == (
        OLD_UNIFORM_HISTORY
    )


def test_share_one_is_uniform_brkga():
    p = _runtime_problem()
    seeds = list(portfolio_solutions(p).values())
    alpha, beta = _proposals(p)
    res = brkga(p, budget=200, seeds=seeds, seed=3, alpha=alpha, beta=beta, uniform_share=1.0)
    assert res.history == OLD_UNIFORM_HISTORY


class _RecordingScorer:
    """Stands in for ``Scorer``: keeps every generation's keys, scores each row by its sum."""

    calls: list[np.ndarray] = []

    def __init__(self, problem: Problem, jobs: int) -> None:
        self.problem = problem

    def __enter__(self):
        def score(rows: np.ndarray):
            _RecordingScorer.calls.append(np.array(rows))
            return [(float(r.sum()), object()) for r in rows]

        return score

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_share_is_the_part_of_draws_with_uniform_keys(monkeypatch, share):
    """Proposals concentrated near 0 make uniform rows easy to tell apart: a row drawn from
    them has every key below 0.01, a uniform one almost surely not."""
    monkeypatch.setattr(brkga_module, "Scorer", _RecordingScorer)
    _RecordingScorer.calls = []
    p = _runtime_problem()
    m = p.num_keys
    alpha, beta = np.full(m, 1e-3), np.full(m, 1e3)
    pop, budget = 40, 40 * 30
    brkga(p, budget=budget, population=pop, alpha=alpha, beta=beta, uniform_share=share, seed=1)
    first, *generations = _RecordingScorer.calls
    n_mut = round(0.15 * pop)
    drawn = np.concatenate([first, *(g[:n_mut] for g in generations)])
    flat = drawn.max(axis=1) > 0.01
    assert len(drawn) == pop + n_mut * len(generations)
    if share in (0.0, 1.0):
        assert flat.mean() == share
    else:
        # a binomial share of about 0.3 over 214 draws: 5 standard deviations either side
        sd = math.sqrt(share * (1 - share) / len(drawn))
        assert abs(flat.mean() - share) < 5 * sd


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "half", None])
def test_invalid_share_is_refused(bad):
    p = _runtime_problem()
    with pytest.raises(ValueError, match="uniform_share must be"):
        brkga(p, budget=10, uniform_share=bad)


def test_learned_search_reads_the_share_from_the_weights():
    p = _runtime_problem()
    w = PolicyWeights.random(hidden=8, rounds=1, seed=3)
    assert w.uniform_share == 0.0
    told = PolicyWeights(w.params, 8, 1, {**w.meta, "uniform_share": 0.5})
    by_meta = learned_search(p, told, budget=80, seed=2)
    by_argument = learned_search(p, w, budget=80, seed=2, uniform_share=0.5)
    assert by_meta.history == by_argument.history
    assert learned_search(p, told, budget=80, seed=2, uniform_share=0.0).history == (
        learned_search(p, w, budget=80, seed=2).history
    )


def test_weights_file_keeps_the_share_and_refuses_a_bad_one(tmp_path):
    w = PolicyWeights.random(hidden=8, rounds=1)
    w.meta["uniform_share"] = 0.25
    path = tmp_path / "w.npz"
    w.save(path)
    loaded = PolicyWeights.load(path)
    assert isinstance(loaded, PolicyWeights) and loaded.uniform_share == 0.25
    w.meta["uniform_share"] = 2.0
    w.save(path)
    with pytest.raises(CheckpointError, match=r"w\.npz.*uniform_share must be in \[0, 1\]"):
        PolicyWeights.load(path)


# ---------------------------------------------------------------- the shipped runtime weights


def test_runtime_objective_loads_its_own_shipped_weights():
    assert SHIPPED_RUNTIME.is_file(), "the package ships runtime weights"
    assert SHIPPED_RUNTIME.stat().st_size < 200_000
    rt = load_policy(None, "runtime")
    assert rt.objectives == ("runtime",) and rt.meta["trained"] is True
    assert rt.uniform_share == 0.5  # chosen on the validation split
    assert load_policy().objectives == ("peak-memory",)  # peak memory keeps policy.npz
    assert shipped_weights("runtime") == SHIPPED_RUNTIME
    assert shipped_weights("peak-memory") == SHIPPED


def test_learned_method_steers_the_runtime_objective_with_the_shipped_file():
    p = _runtime_problem()
    res = run_method("learned", p, budget=60, seed=1)
    assert res.method == "learned"  # steered: not the uniform fallback
    want = learned_search(p, PolicyWeights.load(SHIPPED_RUNTIME), budget=60, seed=1)
    assert res.value == want.value and res.history == want.history
    assert res.value <= run_method("portfolio", p).value


def _damaged(tmp_path, damage: str):
    path = tmp_path / "policy-runtime.npz"
    if damage == "missing":
        return path
    w = PolicyWeights.random(hidden=8, rounds=1)
    if damage == "peak-memory only":
        w.meta.update(trained=True, objectives=["peak-memory"])
    w.save(path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "other features":
        z = dict(np.load(path, allow_pickle=False))
        meta = json.loads(z.pop("meta").tobytes().decode())
        meta["feature_version"] = -1
        with open(path, "wb") as f:
            np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **z)
    return path


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("missing", "file not found"),
        ("truncated", "truncated or corrupt"),
        ("other features", "feature version"),
        ("peak-memory only", "shipped for the runtime objective, but trained for peak-memory"),
    ],
)
def test_a_bad_shipped_runtime_file_is_refused_naming_it(monkeypatch, tmp_path, damage, says):
    path = _damaged(tmp_path, damage)
    monkeypatch.setattr(learned, "SHIPPED_RUNTIME", path)
    with pytest.raises(CheckpointError, match=says) as err:
        load_policy(None, "runtime")
    assert str(path) in str(err.value)
    with pytest.raises(CheckpointError, match=says):
        run_method("learned", _runtime_problem(), budget=20)
    assert load_policy().objectives == ("peak-memory",)  # the peak-memory file is unaffected


def test_eval_refuses_a_bad_shipped_runtime_file_before_searching(
    monkeypatch, tmp_path, tiny_corpus, capsys
):
    path = _damaged(tmp_path, "truncated")
    monkeypatch.setattr(learned, "SHIPPED_RUNTIME", path)
    argv = ["graphopt", "eval", "--corpus", str(tiny_corpus), "--split", "train"]
    argv += ["--objective", "runtime", "--devices", "2", "--host", "--budget", "20"]
    argv += ["--methods", "learned", "--no-progress"]
    with monkeypatch.context() as m:
        searched: list[int] = []
        m.setattr(learned, "learned_search", lambda *a, **k: searched.append(1))
        assert main(argv) != 0
        assert not searched
    assert f"policy weights {path}: not a readable .npz archive" in capsys.readouterr().err
    # peak memory still runs with policy.npz
    assert main(argv[:6] + ["--budget", "20", "--methods", "learned", "--no-progress"]) == 0
