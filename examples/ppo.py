"""PPO on CartPole, written out in full: copy this file and change what you study.

Three dims: ``i`` counts iterations, ``t`` the steps of each rollout and ``u`` the update
epochs within an iteration. The epochs are a recurrence too: ``learner = actor.unroll(u)``
gives parameters over ``(i, u)`` that start from the iteration's policy, and Adam advances them
along ``u``; the last epoch's parameters become the next iteration's policy. (The library's
``tl.rl.algos.ppo`` adds minibatches, continuous actions and a learning-rate schedule.)

Run: python examples/ppo.py   (about 60 iterations, well under a minute)
"""

from __future__ import annotations

import numpy as np

import timerl as tl
from timerl.rl import gae, make_env
from timerl.rl.algos import normalized_advantage

ENVS, STEPS, EPOCHS, ITERATIONS = 8, 128, 4, 60
GAMMA, LAMBDA, CLIP, LR = 0.99, 0.95, 0.2, 2.5e-3


def build():
    """The program: (context, bounds, outputs), also what ``timerl show`` renders."""
    env = make_env("CartPole-v1", num_envs=ENVS, seed=0)
    ctx = tl.Context(dims=("i", "t", "u"))
    (i, t, u), (I, T, U) = ctx.dims, ctx.bounds
    with ctx:
        actor = tl.nn.MLP([4, 64, 64, 2], out_gain=0.01, domain=(i,), seed=1, name="actor")
        critic = tl.nn.MLP([4, 64, 64, 1], out_gain=1.0, domain=(i,), seed=2, name="critic")

        # Rollout with the iteration's parameters.
        obs = tl.RecurrentTensor.placeholder((ENVS, 4), "float32", (i, t), name="obs")
        obs[0, 0] = env.reset()
        dist = tl.distributions.Categorical(actor.at(i)(obs))
        action = dist.sample().named("action")
        logp = dist.log_prob(action)
        value = critic.at(i)(obs).squeeze(-1)
        next_obs, reward, done = env.step(action)
        obs[i, t + 1] = next_obs
        obs[i + 1, 0] = next_obs[i, T - 1]
        last_value = critic.at(i)(next_obs[i, T - 1]).squeeze(-1)

        # Generalised advantage estimation: a backward recurrence over t.
        adv = gae(reward, done, value, GAMMA, LAMBDA, last_value)
        ret = adv + value

        def batch(x):
            data = x[i, 0:T].detach()
            return data.reshape(STEPS * ENVS, *data.view.shape[2:])

        b_obs, b_act, b_logp, b_adv, b_ret = map(batch, (obs, action, logp, adv, ret))
        b_adv = normalized_advantage(b_adv)  # mean 0, std 1 over the batch

        # EPOCHS full-batch updates: parameters over (i, u), starting from actor[i].
        actor_u, critic_u = actor.unroll(u), critic.unroll(u)
        new_dist = tl.distributions.Categorical(actor_u(b_obs))
        ratio = (new_dist.log_prob(b_act) - b_logp).exp()
        surrogate = tl.maximum(-b_adv * ratio, -b_adv * ratio.clamp(1 - CLIP, 1 + CLIP))
        v_loss = ((critic_u(b_obs).squeeze(-1) - b_ret) ** 2.0).mean()
        loss = surrogate.mean() + 0.5 * v_loss - 0.01 * new_dist.entropy().mean()
        params = actor_u.parameters() + critic_u.parameters()
        loss.backward(inputs=params)
        tl.optim.Adam(params, lr=LR, eps=1e-5, max_grad_norm=0.5).step()

        def report(value, point):
            episodes = env.vec.completed_returns()
            if point["i"] % 5 == 0 and len(episodes):
                print(
                    f"iteration {point['i']:4d}  loss {float(value):8.4f}  "
                    f"mean episode return {np.mean(episodes):6.1f}"
                )

        final_loss = loss[i, U - 1]
        tl.sink(final_loss, report)
    return ctx, {I: ITERATIONS, T: STEPS, U: EPOCHS}, [final_loss]


if __name__ == "__main__":
    ctx, bounds, _ = build()
    prog = ctx.compile(bounds=bounds)
    prog.run()
    print(f"peak live tensor memory: {prog.stats()['peak_bytes'] / 2**20:.1f} MiB")
