"""First-iteration reuse: an update's first forward pass reads the rollout's rows, same values."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import BACKENDS, against_reference, close

import timerl as tl
from timerl.api.tensor import RecurrentTensor


def _rand(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def _program(start_scale: float = 1.0, rows: str = "all"):
    """A rollout ``h[i, t] = tanh(x[i, t] @ w)`` and an update loop whose weights start at
    ``w * start_scale`` and whose forward pass runs over the rollout's rows ``rows``."""
    ctx = tl.Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    big_i, big_t, big_u = ctx.bounds
    with ctx:
        x = tl.from_numpy(_rand(2, 5, 4, 3, seed=1), domain=(i, t))
        w = tl.from_numpy(_rand(3, 6, seed=2))
        h = (x @ w).tanh().named("h")
        acted = h[i, 0:big_t].sum().named("acted")
        wu = RecurrentTensor.placeholder((3, 6), domain=(i, u), name="wu")
        wu[i, 0] = w * start_scale
        if rows == "all":
            batch = x[i, 0:big_t].detach().reshape(20, 3)
        elif rows == "part":
            batch = x[i, 0 : big_t - 1].detach().reshape(16, 3)
        else:  # env-major: the same rows in another order
            batch = x[i, 0:big_t].permute(1, 0, 2).reshape(20, 3)
        hu = (batch @ wu).tanh().named("hu")
        out = (hu * hu).sum().named("out")
        wu[i, u + 1] = wu / (1.0 + out)  # the next update depends on this one (a recurrence)
        total = out[i, 0:big_u].sum().named("total")
    return [acted, total]


def _compiled(outputs, backend, bounds):
    return against_reference(outputs, bounds, backend, rtol=1e-5)


def _reused(prog):
    return [n for n in prog.report.notes if n.startswith("reused ")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("updates", [1, 3])
def test_first_update_reads_the_rollouts_rows(backend, updates):
    prog = _compiled(_program(), backend, {"U": updates})
    assert _reused(prog) == ["reused hu at u = 0: the rows of h over t (same weights and inputs)"]
    hu = next(op for op in prog.compiled.spec.ops if op.name == "hu")
    # the update computes its own forward pass only after its weights have moved (with one
    # update per iteration: never)
    assert str(hu.guard) == "u >= 1"


@pytest.mark.parametrize("case", [{"start_scale": 2.0}, {"rows": "part"}, {"rows": "env-major"}])
def test_other_weights_or_other_rows_are_not_reused(case):
    prog = _compiled(_program(**case), "numpy", {"U": 2})
    assert _reused(prog) == []


def test_switched_off_without_optimisation():
    outputs = _program()
    prog = outputs[0].ctx.compile(outputs=outputs, bounds={"U": 1}, optimize=False)
    assert _reused(prog) == []


def test_switch_turns_the_pass_off():
    outputs = _program()
    prog = outputs[0].ctx.compile(
        outputs=outputs, bounds={"U": 1}, options=tl.CompileOptions(reuse=False)
    )
    assert _reused(prog) == []


def _algo_metrics(name, backend, optimize):
    from timerl.rl import algos
    from timerl.rl.algos import a2c

    build = {"ppo": algos.ppo, "reinforce": algos.reinforce, "a2c": a2c}[name]
    extra = {"epochs": 1, "minibatches": 1} if name == "ppo" else {}
    algo = build(num_envs=2, num_steps=8, hidden=(8, 8), **extra)
    outputs = list(algo.metrics.values())
    prog = algo.ctx.compile(
        bounds={"I": 3, **algo.bounds}, outputs=outputs, backend=backend, optimize=optimize
    )
    prog.run()
    return prog, [prog.value(m) for m in outputs]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ppo_one_update_per_iteration_reuses_the_rollouts_forward_pass(backend):
    prog, got = _algo_metrics("ppo", backend, True)
    notes = "\n".join(_reused(prog))
    assert notes.count("reused tanh") == 4  # both hidden layers of actor and critic
    assert notes.count("reused add") >= 1  # the critic's output layer
    _, want = _algo_metrics("ppo", backend, False)
    for g, w in zip(got, want, strict=True):
        close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["reinforce", "a2c"])
def test_full_batch_updates_read_the_rollouts_forward_pass(algo, backend):
    # one update per iteration, outside any loop: the batch's forward pass is the rollout's
    prog, got = _algo_metrics(algo, backend, True)
    notes = _reused(prog)
    assert sum(n.startswith("reused tanh") for n in notes) >= 2
    assert all(" at " not in n.split(":")[0] for n in notes)  # no first-point definition
    _, want = _algo_metrics(algo, backend, False)
    for g, w in zip(got, want, strict=True):
        close(g, w, rtol=1e-4, atol=1e-5)


# --- random chains: the pass is exact whatever row-wise chain both loops compute -------------

_STEPS = {
    "tanh": lambda x, w, b: x.tanh(),
    "matmul": lambda x, w, b: x @ w,
    "bias": lambda x, w, b: x + b,
    "scale": lambda x, w, b: x * 0.5,
    "sumlast": lambda x, w, b: x.sum(-1, keepdim=True) * b,
    "exp": lambda x, w, b: (x * 0.1).exp(),
}


def _chain_program(rng: np.random.RandomState):
    names = [rng.choice(sorted(_STEPS)) for _ in range(rng.randint(1, 5))]
    other = list(names)
    differ = rng.rand() < 0.3
    if differ:  # the update computes something else at one step
        k = rng.randint(len(other))
        other[k] = rng.choice([n for n in sorted(_STEPS) if n != other[k]])
    ctx = tl.Context(dims=("i", "t", "u"))
    i, t, u = ctx.dims
    big_i, big_t, big_u = ctx.bounds
    with ctx:
        x = tl.from_numpy(_rand(2, 3, 4, 5, seed=rng.randint(1 << 16)), domain=(i, t))
        w = tl.from_numpy(_rand(5, 5, seed=rng.randint(1 << 16)) * 0.5)
        b = tl.from_numpy(_rand(5, seed=rng.randint(1 << 16)))
        h = x @ w  # both chains start from the weights, so the update's runs over u
        for n in names:
            h = _STEPS[n](h, w, b)
        acted = h[i, 0:big_t].sum().named("acted")
        wu = RecurrentTensor.placeholder((5, 5), domain=(i, u), name="wu")
        wu[i, 0] = w
        hu = x[i, 0:big_t].detach().reshape(12, 5) @ wu
        for n in other:
            hu = _STEPS[n](hu, wu, b)
        out = (hu * hu).sum().named("out")
        wu[i, u + 1] = wu / (1.0 + out)
        total = out[i, 0:big_u].sum().named("total")
    return [acted, total], names, differ


@pytest.mark.parametrize("seed", range(40))
def test_random_row_wise_chains_match_the_reference(seed):
    outputs, names, differ = _chain_program(np.random.RandomState(seed))
    prog = _compiled(outputs, "numpy", {"U": 2})
    if not differ:
        assert _reused(prog), names  # the same chain on both sides: its end is read, not redone
