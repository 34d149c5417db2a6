"""REINFORCE on CartPole, written out in full: copy this file and change what you study.

The whole training run is one program over two dims: ``i`` counts iterations (policy
updates), ``t`` the steps of each rollout. Every line below is a recurrence equation; timerl
compiles the lot into loops, runs the environment in time order and frees every buffer after
its last use.

Run: python examples/reinforce.py   (about 150 iterations, well under a minute)
"""

from __future__ import annotations

import numpy as np

import timerl as tl
from timerl.rl import discounted_returns, make_env
from timerl.rl.algos import normalized_advantage

ENVS, STEPS, ITERATIONS = 8, 128, 150
GAMMA, LR = 0.99, 2.5e-3


def build():
    """The program: (context, bounds, outputs), also what ``timerl show`` renders."""
    env = make_env("CartPole-v1", num_envs=ENVS, seed=0)
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (I, T) = ctx.dims, ctx.bounds
    with ctx:
        # Parameters are recurrent over i: policy.at(i) is the policy of iteration i.
        policy = tl.nn.MLP([4, 64, 64, 2], out_gain=0.01, domain=(i,), seed=1, name="policy")
        pi = policy.at(i)

        # Rollout: obs[i, t + 1] follows from the action at (i, t); episodes auto-reset and
        # continue into the next iteration.
        obs = tl.RecurrentTensor.placeholder((ENVS, 4), "float32", (i, t), name="obs")
        obs[0, 0] = env.reset()
        action = tl.distributions.Categorical(pi(obs)).sample().named("action")
        next_obs, reward, done = env.step(action)
        obs[i, t + 1] = next_obs
        obs[i + 1, 0] = next_obs[i, T - 1]

        # Monte Carlo returns, a backward recurrence over t that stops at episode ends.
        ret = discounted_returns(reward, done, GAMMA)

        # One full-batch update per iteration: stack the rollout (T, ENVS) -> (T * ENVS).
        def batch(x):
            data = x[i, 0:T].detach()
            return data.reshape(STEPS * ENVS, *data.view.shape[2:])

        b_obs, b_act, b_ret = batch(obs), batch(action), batch(ret)
        adv = normalized_advantage(b_ret)  # mean 0, std 1 over the batch
        loss = -(tl.distributions.Categorical(pi(b_obs)).log_prob(b_act) * adv).mean()
        loss.backward(inputs=policy.parameters())
        tl.optim.Adam(policy.parameters(), lr=LR, max_grad_norm=0.5).step()

        def report(value, point):
            episodes = env.vec.completed_returns()
            if point["i"] % 10 == 0 and len(episodes):
                print(
                    f"iteration {point['i']:4d}  loss {float(value):8.4f}  "
                    f"mean episode return {np.mean(episodes):6.1f}"
                )

        tl.sink(loss, report)
    return ctx, {I: ITERATIONS, T: STEPS}, [loss]


if __name__ == "__main__":
    ctx, bounds, _ = build()
    prog = ctx.compile(bounds=bounds)
    prog.run()
    print(f"peak live tensor memory: {prog.stats()['peak_bytes'] / 2**20:.1f} MiB")
