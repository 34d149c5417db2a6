"""What a compiled program holds, by role and name: its parameters, the activations of its
networks, the state it carries between iterations, and its structure's fingerprint."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as tl
from timerl.api.nn import parameter, role_of


def _trained(seed: int = 0):
    """An actor MLP (tanh), a critic MLP (relu, no role), a lone scale parameter, all trained
    by SGD over ``i``; an extra network that is built but never applied."""
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    obs = np.random.default_rng(seed).standard_normal((5, 3)).astype(np.float32)
    with ctx:
        actor = tl.nn.MLP([3, 8, 2], domain=(i,), seed=1, name="actor", role="actor")
        critic = tl.nn.MLP([3, 8, 1], activation="relu", domain=(i,), seed=2, name="critic")
        unused = tl.nn.MLP([3, 4, 1], domain=(i,), seed=3, name="unused", role="critic")
        scale = parameter(np.ones(2, np.float32), (i,), "scale", role="actor")
        x = tl.from_numpy(obs)
        out = actor.at(i)(x) * scale[i]
        value = critic.at(i)(x)
        loss = (out**2.0).mean() + (value**2.0).mean()
        params = [*actor.parameters(), scale, *critic.parameters()]
        loss.backward(inputs=params)
        tl.optim.SGD(params, lr=0.1).step()
        tl.sink(loss, lambda v, p: None)
    return ctx, actor, critic, unused, scale


def test_parameters_carry_their_declared_roles_through_unroll_and_copy():
    ctx, actor, critic, unused, scale = _trained()
    with ctx:
        (i,) = ctx.dims
        assert role_of(scale) == "actor"
        assert [p.name for p in actor.parameters(role="actor")] == [
            "actor.0.weight",
            "actor.0.bias",
            "actor.1.weight",
            "actor.1.bias",
        ]
        assert actor.parameters(role="critic") == []
        assert [role_of(p) for p in critic.parameters()] == [None] * 4
        target = unused.copy("target")
        assert [p.name for p in target.parameters(role="critic")][0] == "target.unused.0.weight"
        assert [role_of(p) for p in target.parameters()] == ["critic"] * 4


def test_a_compiled_program_lists_the_parameters_it_holds_with_their_roles():
    ctx, *_ = _trained()
    prog = ctx.compile(bounds={"I": 3})
    held = {p.name: p for p in prog.parameters()}
    assert set(held) == {
        "actor.0.weight",
        "actor.0.bias",
        "actor.1.weight",
        "actor.1.bias",
        "scale",
        "critic.0.weight",
        "critic.0.bias",
        "critic.1.weight",
        "critic.1.bias",
    }, "the never-applied network's parameters are not part of the program"
    assert held["actor.0.weight"].role == "actor" and held["scale"].role == "actor"
    assert held["critic.1.bias"].role is None
    assert held["actor.0.weight"].domain == ("i",)
    assert tuple(held["actor.0.weight"].shape) == (3, 8)
    assert [p.name for p in prog.parameters(role="actor")][-1] == "scale"


def test_activations_are_those_of_the_networks_the_program_applies():
    ctx, *_ = _trained()
    prog = ctx.compile(bounds={"I": 3})
    assert prog.activations() == {"actor": "tanh", "critic": "relu"}


def test_an_unrolled_and_a_copied_network_are_reported_by_their_names():
    ctx = tl.Context(dims=("i", "u"))
    i, u = ctx.dims
    x_np = np.ones((2, 3), np.float32)
    with ctx:
        q = tl.nn.MLP([3, 4, 2], activation="sigmoid", domain=(i,), seed=1, name="q")
        single = tl.nn.MLP([3, 2], domain=(), seed=2, name="single")  # no activation
        target = q.copy("target")
        learner = q.unroll(u)
        x = tl.from_numpy(x_np)
        loss = (learner(x) - target.at(i)(x).detach()).square().mean() + single(x).sum()
        params = learner.parameters()
        loss.backward(inputs=params)
        tl.optim.SGD(params, lr=0.1).step()
        tl.optim.Polyak(target.parameters(), q.parameters(), tau=0.5).step()
        tl.sink(loss[i, u.bound - 1], lambda v, p: None)
    prog = ctx.compile(bounds={"I": 2, "U": 2})
    assert prog.activations() == {"q": "sigmoid", "target.q": "sigmoid"}


def _counter_program():
    """``w[i + 1] = w[i] + g[i]`` with ``g`` a named running sum of what an inner loop over
    ``t`` computes from ``w``, and an unnamed recurrence."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    with ctx:
        w = tl.RecurrentTensor.placeholder((2,), domain=(i,), name="w")
        g = tl.RecurrentTensor.placeholder((2,), domain=(i,), name="g")
        anon = tl.RecurrentTensor.placeholder((), domain=(i,))
        inner = tl.RecurrentTensor.placeholder((2,), domain=(i, t), name="inner")
        w[0] = tl.from_numpy(np.array([1.0, 2.0], np.float32))
        g[0] = tl.zeros((2,))
        anon[0] = tl.zeros(())
        inner[i, 0] = w[i]
        inner[i, t + 1] = inner[i, t] * 0.5
        step = inner[i, t.bound - 1]
        g[i + 1] = g[i] + step
        w[i + 1] = w[i] + g[i]
        anon[i + 1] = anon[i] + 1.0
        tl.sink(w + anon, lambda v, p: None)
    return ctx


def test_carried_state_is_each_named_recurrence_over_the_iteration_dim_after_it():
    ctx = _counter_program()
    prog = ctx.compile(bounds={"I": 5, "T": 2})
    ex = prog.executor()
    carried = {}
    ex.run(on_iteration=lambda k: carried.__setitem__(k, prog.carried_state(ex.snapshot(), k)))
    w, g = np.array([1.0, 2.0]), np.zeros(2)
    for k in range(3):  # g[4] is read by nothing when I = 5: see resume_margin
        w, g = w + g, g + w * 0.5
        assert set(carried[k]) == {"w", "g"}, "unnamed ones and those over (i, t) are left out"
        np.testing.assert_allclose(carried[k]["w"], w, rtol=1e-6)
        np.testing.assert_allclose(carried[k]["g"], g, rtol=1e-6)


def test_the_fingerprint_can_ignore_the_iteration_bound():
    ctx = _counter_program()
    short = ctx.compile(bounds={"I": 5, "T": 2})
    longer = ctx.compile(bounds={"I": 9, "T": 2})
    other = ctx.compile(bounds={"I": 5, "T": 3})
    assert short.fingerprint() != longer.fingerprint()
    assert short.fingerprint(ignore_bounds=("I",)) == longer.fingerprint(ignore_bounds=("I",))
    assert short.fingerprint(ignore_bounds=("I",)) != other.fingerprint(ignore_bounds=("I",))


def test_resume_margin_covers_a_two_step_chain_of_carried_state():
    """``c`` is read only by ``b``'s update, which stops at ``i + 1 < I``: ``c``'s update
    stops one iteration earlier, so a run of ``n`` iterations needs the bound one further."""
    with tl.Context(dims=("i",)) as ctx:
        (i,) = ctx.dims
        b = tl.RecurrentTensor.placeholder((), domain=(i,), name="b")
        c = tl.RecurrentTensor.placeholder((), domain=(i,), name="c")
        b[0] = 0.0
        c[0] = 1.0
        b[i + 1] = b[i] + c[i]
        c[i + 1] = c[i] * 2.0
        out = b * 1.0
        prog = ctx.compile(bounds={"I": 5}, outputs=[out])
    assert prog.resume_margin(4) == 1
    with tl.Context(dims=("i",)) as ctx:
        (i,) = ctx.dims
        b = tl.RecurrentTensor.placeholder((), domain=(i,), name="b")
        b[0] = 0.0
        b[i + 1] = b[i] + 1.0
        prog = ctx.compile(bounds={"I": 5}, outputs=[b * 1.0])
    assert prog.resume_margin(4) == 0


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_program_without_an_iteration_dim_carries_nothing(backend):
    with tl.Context(dims=("t",)) as ctx:
        (t,) = ctx.dims
        x = tl.RecurrentTensor.placeholder((), domain=(t,), name="x")
        x[0] = 1.0
        x[t + 1] = x[t] * 2.0
        prog = ctx.compile(bounds={"T": 3}, backend=backend, outputs=[x])
    prog.run()
    assert prog.parameters() == [] and prog.activations() == {}
