"""A first tour of recurrent tensors: recurrences in both directions, slices, and gradients.

Run: python examples/recurrences.py
"""

from __future__ import annotations

import numpy as np

import timerl as tl


def build():
    """The program of this tour (also used by ``timerl show examples/recurrences.py``)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        # A forward recurrence: x[0] = 0, x[t+1] = 0.5 x[t] + 1   (converges to 2)
        x = tl.RecurrentTensor.placeholder(shape=(), domain=(t,), name="x")
        x[0] = tl.zeros(())
        x[t + 1] = x[t] * 0.5 + 1.0

        # Rewards, and discounted returns by a *backward* recurrence: ret[t] = r[t] + 0.9 ret[t+1]
        r = tl.from_numpy(np.arange(8.0), domain=(t,), name="reward")
        ret = tl.RecurrentTensor.placeholder(shape=(), domain=(t,), name="ret")
        ret[t.eq(T - 1)] = r
        ret[True] = r + ret[t + 1] * 0.9

        # Temporal slices become a leading spatial dim; its size may change from point to point.
        running_mean = r[0 : t + 1].mean(0).named("running_mean")  # mean of r[0..t]
        future_sum = r[t:T].sum(0).named("future_sum")  # sum of r[t..T-1]
        window = r[tl.max(t - 2, 0) : t + 1].sum(0).named("window")  # last three rewards
    return ctx, {T: 8}, [x, ret, running_mean, future_sum, window]


def main() -> None:
    ctx, bounds, outputs = build()
    prog = ctx.compile(bounds=bounds, outputs=outputs)
    prog.run()
    np.set_printoptions(precision=3, suppress=True)
    for tensor in outputs:
        print(f"{tensor.name:>13} = {prog.value(tensor)}")

    print("\nThe schedule timerl derived (loops, their direction, and when buffers are freed):")
    print(prog.schedule.dump())

    # Gradients flow through time: d(sum_t x[t]^2)/dw for x[t+1] = tanh(w * x[t]) + 0.1.
    ctx2 = tl.Context(dims=("t",))
    (t,), (T,) = ctx2.dims, ctx2.bounds
    with ctx2:
        w = tl.from_numpy(np.float32(0.8), requires_grad=True, name="w")
        y = tl.RecurrentTensor.placeholder(shape=(), domain=(t,), name="y")
        y[0] = tl.ones(())
        y[t + 1] = (y[t] * w).tanh() + 0.1
        loss = (y[0:T] ** 2.0).sum()
        loss.backward()
    grad = tl.evaluate(w.grad, bounds={T: 20})
    print(f"\nbackpropagation through 20 steps: d loss / d w = {float(grad):.4f}")
    print(f"peak live memory of the first program: {prog.stats()['peak_bytes']} bytes")


if __name__ == "__main__":
    main()
