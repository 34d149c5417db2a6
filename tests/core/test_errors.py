"""Bad programs fail at compile time with the right timerl error and a message a user can act on."""

from __future__ import annotations

import os

import numpy as np
import pytest
from core_helpers import ctx_it, ctx_t

import timerl as tl

THIS_FILE = os.path.basename(__file__)


def _ran_nothing(calls):
    """Sinks record calls; none may fire when compilation fails."""
    assert calls == [], "the program started running before the error was reported"


def _compile_error(build, cls, bounds=None):
    """Build a program, compile it (never run), return the error's message."""
    ctx, outputs, calls = build()
    with pytest.raises(cls) as info:
        ctx.compile(bounds=bounds, outputs=outputs)
    _ran_nothing(calls)
    assert isinstance(info.value, tl.TimerlError)
    return str(info.value)


def test_recurrence_without_base_case_is_reported():
    def build():
        ctx, t, T = ctx_t()
        calls = []
        with ctx:
            x = tl.RecurrentTensor.placeholder((), domain=(t,), name="walker")
            x[t + 1] = x[t] + 1.0
            tl.sink(x, lambda v, p: calls.append(p))
        return ctx, [x], calls

    msg = _compile_error(build, (tl.UndefinedPointError, tl.CycleError), bounds={"T": 5})
    assert "walker" in msg
    assert "t=0" in msg  # the point nobody defined
    assert THIS_FILE in msg


def test_read_of_a_point_nobody_defined():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            x = tl.RecurrentTensor.placeholder((), domain=(t,), name="only_one")
            x[1] = 1.0
            y = (x[0] * 2.0).named("twice")
        return ctx, [y], []

    msg = _compile_error(build, tl.UndefinedPointError, bounds={"T": 5})
    assert "only_one" in msg
    assert "t=0" in msg or "t in [0" in msg
    assert "needed because twice" in msg and "reads only_one[0]" in msg  # who reads it


def test_gap_between_branches_is_named():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            x = tl.RecurrentTensor.placeholder((), domain=(t,), name="gappy")
            x[t < 3] = 1.0
            x[t > 5] = 2.0
        return ctx, [x], []

    msg = _compile_error(build, tl.UndefinedPointError, bounds={"T": 10})
    assert "gappy" in msg and "[3, 5]" in msg


def test_placeholder_never_defined():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            x = tl.RecurrentTensor.placeholder((), domain=(t,), name="ghost")
            y = x + 1.0
        return ctx, [y], []

    msg = _compile_error(build, tl.UndefinedPointError, bounds={"T": 4})
    assert "ghost" in msg and THIS_FILE in msg


def test_cycle_without_base_case():
    def build():
        ctx, t, T = ctx_t()
        calls = []
        with ctx:
            x = tl.RecurrentTensor.placeholder((), domain=(t,), name="selfish")
            x[True] = x[t] + 1.0
            tl.sink(x, lambda v, p: calls.append(p))
        return ctx, [x], calls

    msg = _compile_error(build, tl.CycleError, bounds={"T": 5})
    assert "selfish" in msg
    assert THIS_FILE in msg


def test_mutual_cycle_at_the_same_point():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            a = tl.RecurrentTensor.placeholder((), domain=(t,), name="ping")
            b = tl.RecurrentTensor.placeholder((), domain=(t,), name="pong")
            a[True] = b * 2.0
            b[True] = a + 1.0
        return ctx, [a], []

    msg = _compile_error(build, tl.CycleError, bounds={"T": 3})
    assert "ping" in msg and "pong" in msg


def test_out_of_range_read_at_the_last_point():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            u = tl.from_numpy(np.arange(5.0), domain=(t,), name="obs")
            y = (u[t + 1] * 2.0).named("next_obs")
        return ctx, [y], []

    msg = _compile_error(build, tl.OutOfRangeError)
    assert "next_obs" in msg and "obs" in msg
    assert "t + 1" in msg
    assert "t=4" in msg  # the offending point
    assert THIS_FILE in msg


def test_out_of_range_read_before_the_start():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            u = tl.from_numpy(np.arange(6.0), domain=(t,), name="series")
            y = (u[t - 2] + u).named("lagged")
        return ctx, [y], []

    msg = _compile_error(build, tl.OutOfRangeError)
    assert "lagged" in msg and "series" in msg
    assert "t - 2" in msg
    assert "[0, 1]" in msg


def test_out_of_range_slice():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            x = tl.RecurrentTensor.placeholder((), domain=(t,), name="xs")
            x[0] = 0.0
            x[t + 1] = x + 1.0
            y = x[t : t + 3].sum(0)
        return ctx, [y], []

    msg = _compile_error(build, tl.OutOfRangeError, bounds={"T": 6})
    assert "xs" in msg and "t:t + 3" in msg and "[4, 5]" in msg


def test_negative_constant_index_is_rejected_when_written():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(3.0), domain=(t,), name="u")
        with pytest.raises(tl.ProgramError) as info:
            u[-1]
    assert "u" in str(info.value)


def test_shape_mismatch_in_assignment():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((3,), domain=(t,), name="state")
        with pytest.raises(tl.ShapeError) as info:
            x[0] = tl.zeros((4,))
    msg = str(info.value)
    assert "state" in msg and "(4,)" in msg and "(3,)" in msg


def test_shape_mismatch_in_recurrence_body():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((3,), domain=(t,), name="state")
        x[0] = tl.zeros((3,))
        with pytest.raises(tl.ShapeError) as info:
            x[t + 1] = x + tl.ones((2,))
    msg = str(info.value)
    assert "(3,)" in msg and "(2,)" in msg
    assert THIS_FILE in msg


def test_matmul_inner_size_mismatch_names_the_site():
    ctx, t, T = ctx_t()
    with ctx:
        a = tl.zeros((3, 2))
        with pytest.raises(tl.ShapeError) as info:
            a @ tl.zeros((3, 2))
    assert THIS_FILE in str(info.value)


def test_dtype_mismatch_in_assignment():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((3,), dtype="int64", domain=(t,), name="counts")
        with pytest.raises(tl.ShapeError) as info:
            x[0] = tl.zeros((3,))
    msg = str(info.value)
    assert "counts" in msg and "float32" in msg and "int64" in msg


def test_bound_left_without_value():
    def build():
        ctx, t, T = ctx_t()
        with ctx:
            x = tl.RecurrentTensor.placeholder((), domain=(t,), name="unbounded")
            x[0] = 0.0
            x[t + 1] = x + 1.0
        return ctx, [x], []

    msg = _compile_error(build, tl.BoundError)
    assert "T" in msg and "unbounded" in msg


def test_bound_left_without_value_before_any_pass_sizes_its_dim():
    # PPO's iteration bound left out: vectorisation sizes the dims of the update's readers,
    # and once failed there with a bare KeyError instead of naming the bound
    from timerl.rl.train import build

    program = build("ppo", {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 4})
    with pytest.raises(tl.BoundError) as info:
        program.ctx.compile(bounds=program.bounds)
    assert "bound I of dim i" in str(info.value) and "bounds={I: ...}" in str(info.value)


def test_bad_and_conflicting_bound_values():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(5.0), domain=(t,))
    with pytest.raises(tl.BoundError):
        ctx.compile(bounds={T: 0}, outputs=[u])
    with pytest.raises(tl.BoundError) as info:
        ctx.compile(bounds={T: 7}, outputs=[u])
    assert "5" in str(info.value) and "7" in str(info.value)
    with pytest.raises(tl.BoundError):
        ctx.compile(bounds={"Q": 3}, outputs=[u])


def test_wrong_number_of_indices():
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t), name="grid")
        with pytest.raises(tl.ProgramError) as info:
            x[0] = 1.0
        assert "grid" in str(info.value)
        x[True] = 1.0
        with pytest.raises(tl.ProgramError) as info:
            x[t]
        assert "grid" in str(info.value)


def test_left_index_must_be_a_shift_of_its_own_dim():
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i, t), name="skewed")
        with pytest.raises(tl.ProgramError) as info:
            x[i, 2 * t] = 1.0
        assert "skewed" in str(info.value)
        with pytest.raises(tl.ProgramError):
            x[i, i] = 1.0


def test_assignment_into_a_computed_tensor_is_rejected():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(3.0), domain=(t,))
        y = u * 2.0
        with pytest.raises(tl.ProgramError):
            y[0] = 1.0
        with pytest.raises(tl.ProgramError):
            u[0] = 1.0  # from_numpy tensors are sealed


def test_condition_cannot_be_read():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(3.0), domain=(t,), name="u")
        with pytest.raises(tl.ProgramError):
            u[t < 2]


def test_truth_value_of_tensor_or_expression_is_an_error():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(3.0), domain=(t,))
        with pytest.raises(TypeError):
            bool(u > 1.0)
        with pytest.raises(TypeError):
            bool(t < T)


def test_until_needs_a_scalar_bool():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((2,), domain=(t,), name="pos")
        x[0] = tl.zeros((2,))
        x[t + 1] = x + 1.0
        with pytest.raises(tl.ShapeError):
            ctx.until(t, x > 3.0)
        with pytest.raises(tl.ShapeError):
            ctx.until(t, x.sum())


def test_value_of_tensor_that_is_not_an_output():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(3.0), domain=(t,))
        v = u * 2.0
    prog = ctx.compile(outputs=[u])
    with pytest.raises(tl.ProgramError):
        prog.value(u)  # not run yet
    prog.run()
    with pytest.raises(tl.ProgramError):
        prog.value(v)


def test_unknown_backend():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(3.0), domain=(t,))
    with pytest.raises(tl.BackendError):
        ctx.compile(backend="abacus", outputs=[u])


def test_nothing_to_compute():
    ctx, t, T = ctx_t()
    with pytest.raises(tl.ProgramError):
        ctx.compile(bounds={T: 3})


def test_backward_without_leaves():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(3.0), domain=(t,))
        with pytest.raises(tl.ProgramError):
            (u * u).backward()


def test_optimizer_needs_grad_and_iteration_dim():
    ctx, i, t, I, T = ctx_it()
    with ctx:
        w = tl.RecurrentTensor.placeholder((), domain=(i,), name="weight")
        with pytest.raises(tl.ProgramError) as info:
            tl.optim.SGD([w], lr=0.1)
        assert "weight" in str(info.value)
        v = tl.RecurrentTensor.placeholder((), domain=(i,), requires_grad=True, name="vv")
        with pytest.raises(tl.ProgramError):
            tl.optim.SGD([v], lr=0.1).step()  # no backward() yet


def test_errors_are_raised_before_anything_runs():
    """A compile error in one part of the program means no sink of another part fires."""
    ctx, t, T = ctx_t()
    calls = []
    with ctx:
        ok = tl.from_numpy(np.arange(4.0), domain=(t,))
        tl.sink(ok, lambda v, p: calls.append(p))
        bad = tl.RecurrentTensor.placeholder((), domain=(t,), name="broken")
        bad[t + 1] = bad + 1.0
        tl.sink(bad, lambda v, p: calls.append(p))
    with pytest.raises(tl.TimerlError):
        ctx.compile()
    assert calls == []


def test_placeholder_and_from_numpy_domain_checks():
    ctx, i, t, I, T = ctx_it()
    with ctx:
        with pytest.raises(tl.ProgramError):
            tl.RecurrentTensor.placeholder((), domain=(t, i))
        with pytest.raises(tl.ShapeError):
            tl.from_numpy(np.arange(3.0), domain=(i, t))


def _ragged_program(define):
    """A context whose t ends per i (``done[i, t]``), with ``define(i, t, I, T, r)``'s
    outputs."""

    def build():
        ctx, i, t, I, T = ctx_it()
        with ctx:
            r = tl.from_numpy(np.ones((3, 6)), domain=(i, t))
            ctx.until(t, r > 2.0)
            outputs = define(i, t, I, T, r)
        return ctx, outputs, []

    return build


def test_a_read_of_another_outer_point_at_a_per_point_length_is_refused():
    def define(i, t, I, T, r):
        h = tl.RecurrentTensor.placeholder((), domain=(i, t)).named("h")
        h[0, 0] = 0.0
        h[i + 1, 0] = h[i, T - 1]  # which T: i's or i + 1's?
        h[i, t + 1] = h[i, t] + r[i, t]
        return [h]

    msg = _compile_error(_ragged_program(define), tl.BoundError)
    assert "h (defined at" in msg and "h[i - 1, T - 1]" in msg
    assert "at another i than its own" in msg and "last = h[i, T - 1] * 1.0" in msg


def test_an_output_without_the_dim_a_per_point_length_varies_over_is_refused():
    def define(i, t, I, T, r):
        return [tl.full((), T).named("length")]

    msg = _compile_error(_ragged_program(define), tl.BoundError)
    assert msg.startswith("length (defined at")
    assert "depends on a length that ctx.until sets at each point of i" in msg
    assert "a tensor asked for without i" in msg


def test_a_gradient_that_gathers_other_episodes_points_is_refused():
    def build():
        ctx, i, t, I, T = ctx_it()
        with ctx:
            w = tl.from_numpy(np.ones(3), domain=(i,), requires_grad=True, dtype="float64")
            r = tl.from_numpy(np.ones((3, 6)), domain=(i, t), dtype="float64")
            ctx.until(t, r > 2.0)
            y = r * w[tl.max(i - 1, 0)]  # the previous episode's weight, at every t
            y.sum().backward()
        return ctx, [w.grad], []

    msg = _compile_error(build, tl.BoundError)
    assert msg.startswith("a gradient reads vjp(")
    assert "the transpose of a read of another i" in msg


def test_a_read_of_another_outer_point_that_may_have_ended_is_refused():
    def define(i, t, I, T, r):
        return [r[0:I, t].sum(0).named("across")]

    msg = _compile_error(_ragged_program(define), tl.BoundError)
    assert msg.startswith("across (defined at")
    assert "at another i than its own and a point of t that i may not have" in msg
    assert "Only t = 0 exists at every i" in msg


def test_until_checks():
    ctx, i, t, I, T = ctx_it()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(i,))
        x[True] = 0.0
        with pytest.raises(tl.ProgramError):
            ctx.until(t, x > 1.0)  # does not vary over t
        y = tl.RecurrentTensor.placeholder((), domain=(t,))
        y[0] = 0.0
        y[t + 1] = y + 1.0
        ctx.until(t, y > 2.0)
        with pytest.raises(tl.ProgramError):
            ctx.until(t, y > 3.0)


def test_a_stop_condition_that_needs_the_length_it_sets_is_refused_naming_what_reads_it():
    ctx, t, T = ctx_t()
    with ctx:
        u = tl.from_numpy(np.arange(10.0), domain=(t,))
        mean = u[0:T].mean(0).named("mean_over_the_episode")
        ctx.until(t, u >= mean)
    with pytest.raises(tl.BoundError, match="which needs .*which needs T: known only once t"):
        ctx.compile(bounds={T: 10}, outputs=[u * 1.0])


def test_user_exceptions_in_sinks_propagate():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.from_numpy(np.arange(3.0), domain=(t,))

        def boom(value, point):
            raise ValueError("raised by the sink")

        tl.sink(x, boom)
    prog = ctx.compile()
    with pytest.raises(ValueError, match="raised by the sink"):
        prog.run()


def test_building_outside_a_context():
    with pytest.raises(tl.ProgramError):
        tl.zeros((3,))


def test_outputs_that_are_not_tensors_of_this_context_are_named():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,), name="halving")
        x[0] = 1.0
        x[t + 1] = x * 0.5
    with pytest.raises(tl.ProgramError, match=r"outputs\[1\] is a ndarray"):
        ctx.compile(bounds={T: 4}, outputs=[x, np.zeros(3)])
    with pytest.raises(tl.ProgramError, match=r"tensors\[0\] is a float"):
        tl.evaluate([2.0], bounds={T: 4})
    other, _, _ = ctx_t()
    with other:
        y = tl.zeros((2,))
    with pytest.raises(tl.ProgramError, match=r"outputs\[0\] \(halving.*another tl.Context"):
        other.compile(bounds={"T": 4}, outputs=[x])
    with pytest.raises(tl.ProgramError, match=r"tensors\[1\].*another tl.Context"):
        tl.evaluate([x, y], bounds={T: 4})
    np.testing.assert_allclose(tl.evaluate(x, bounds={T: 3}), [1.0, 0.5, 0.25])


@pytest.mark.parametrize(
    "make, named",
    [
        (lambda t: tl.zeros((-2,)), "full"),
        (lambda t: tl.RecurrentTensor.placeholder((2, -3), domain=(t,)), "placeholder"),
        (lambda t: tl.rand((3, -1)), "rand"),
    ],
)
def test_a_negative_size_is_refused_where_the_shape_is_written(make, named):
    ctx, t, T = ctx_t()
    with ctx:
        with pytest.raises(tl.ShapeError, match=rf"{named}: shape .* has a negative size -"):
            make(t)
        # sizes that are index expressions are checked where they are known: at compile time
        assert tl.zeros((t + 1, 2)).shape == (t + 1, 2)


def test_a_sink_that_cannot_be_called_is_refused_where_it_is_given():
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.RecurrentTensor.placeholder((), domain=(t,), name="counter")
        x[0] = 0.0
        x[t + 1] = x + 1.0
        with pytest.raises(tl.ProgramError, match=r"sink\(counter\): fn must be callable"):
            tl.sink(x, 5)


@pytest.mark.parametrize("name", [123, "", None])
def test_a_tensor_name_that_is_not_text_is_refused(name):
    ctx, t, T = ctx_t()
    with ctx:
        x = tl.zeros((3,))
        with pytest.raises(tl.ProgramError, match="name must be a non-empty str"):
            x.named(name)
        if name is not None:  # a placeholder without a name is fine
            with pytest.raises(tl.ProgramError, match="placeholder: a tensor's name"):
                tl.RecurrentTensor.placeholder((2,), domain=(t,), name=name)
