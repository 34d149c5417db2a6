"""``env_backend="jax"``: a JAX-native env's reset and step are pure ops over a state the
program carries. The numpy reference evaluates the same functions on the host and agrees with
stepping ``rl/envs/jax_envs.py`` by hand; the jax backend traces them into the rollout loop (one XLA
loop) and agrees with the reference; bad combinations fail naming the env and the reason."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.errors import EnvError
from timerl.rl import algos

jax = pytest.importorskip("jax")

from timerl.rl.envs.jax_envs import make_jax_env  # noqa: E402

SMALL = dict(num_envs=4, num_steps=8, epochs=1, minibatches=2, hidden=(8,))


def _compile(ap, backend: str, iterations: int, extra=(), calls: list | None = None):
    """Compile and run; ``calls`` (jax) collects the key of every fused iteration's call."""
    dims = {b.name: b for b in ap.ctx.bounds}
    bounds = {dims["I"]: iterations, **{dims[k]: v for k, v in ap.bounds.items()}}
    outs = [*ap.metrics.values(), *extra]
    prog = ap.ctx.compile(bounds=bounds, backend=backend, outputs=outs, seed=ap.config.seed)
    if calls is not None:
        make = prog.backend.fuse_body

        def fuse_body(key, plan):
            fn = make(key, plan)
            return lambda *args: (calls.append(key), fn(*args))[1]

        prog.backend.fuse_body = fuse_body
    prog.run()
    return prog


def _loops(prog) -> dict[str, str]:
    text = prog.explain()
    # no loop calls the host: nothing runs as numpy kernels, nothing is drawn by numpy
    assert "numpy kernels" not in text and "numpy's generator" not in text
    assert prog.stats().get("numpy_regions", 0) == 0
    part = text.split("loops (one XLA loop each, or why not):\n")[1].split("schedule")[0]
    return dict(line.strip().split(" -> ") for line in part.strip().splitlines())


def test_synthetic_rollout_is_jax_envs_stepped_by_hand():
    """Two iterations on the numpy backend: the observations, rewards and dones are those of
    reset(seed) and step(state, action) called directly with the program's actions, the
    episodes continuing from one iteration into the next."""
    kw = dict(obs_shape=(2, 2), episode_length=5, action_dim=2)
    ap = algos.ppo(env_id="Synthetic-v0", env_backend="jax", env_kwargs=kw, seed=3, **SMALL)
    ro = ap.rollout
    prog = _compile(ap, "numpy", 2, [ro["obs"], ro["action"], ro["reward"], ro["done"]])
    obs, act = prog.value(ro["obs"]), prog.value(ro["action"])
    reward, done = prog.value(ro["reward"]), prog.value(ro["done"])
    env = make_jax_env("Synthetic-v0", 4, 3, **kw)
    with jax.enable_x64(False):
        state, o = env.reset(3, env.params)
        for i in range(2):
            for t in range(8):
                np.testing.assert_allclose(obs[i, t], np.asarray(o), rtol=1e-5, atol=1e-6)
                state, o, r, d = env.step(state, act[i, t], env.params)
                np.testing.assert_allclose(reward[i, t], np.asarray(r), rtol=1e-5, atol=1e-6)
                np.testing.assert_array_equal(done[i, t], np.asarray(d))
    assert done.any()  # episodes of 5 steps end (and auto-reset) inside the rollout


def test_ppo_on_the_jax_backend_fuses_the_rollout_and_agrees_with_numpy():
    env_id = "CartPole-v1"
    ap = algos.ppo(env_id=env_id, env_backend="jax", **SMALL)
    extra = [ap.rollout["obs"], ap.rollout["reward"], ap.rollout["done"]]
    ref = _compile(ap, "numpy", 3, extra)
    calls: list = []
    prog = _compile(ap, "jax", 3, extra, calls)
    for name, m in ap.metrics.items():
        np.testing.assert_allclose(
            prog.value(m), ref.value(m), rtol=2e-4, atol=1e-5, err_msg=f"{env_id}: {name}"
        )
    for x in extra:
        np.testing.assert_allclose(prog.value(x), ref.value(x), rtol=1e-4, atol=1e-5)
    rollout = [
        v for k, v in _loops(prog).items() if k.startswith("for t in 0 .. T-1") and "obs" in k
    ]
    assert rollout == ["one XLA loop, inside the iteration's"]
    # the whole iteration (rollout, GAE, update, the ops between them) is one call
    (outer,) = [v for k, v in _loops(prog).items() if k.startswith("for i in")]
    assert outer == "one XLA program per iteration"
    assert len(calls) == 3 and len(set(calls)) == 1 and prog.stats()["jit_bodies"] == 1
    assert ref.stats()["statements_executed"] == prog.stats()["statements_executed"]
    traces = prog.stats()["jit_traces"]
    prog.run()  # a second run retraces nothing
    assert prog.stats()["jit_traces"] == traces


@pytest.mark.parametrize("minibatches", [1, 2])
def test_fused_iterations_donate_the_state_they_free_and_compute_the_same(minibatches, monkeypatch):
    """Parameters, Adam moments and env state at ``i - 1`` are freed by iteration ``i``:
    from the second iteration on they are donated to its call (``donated_bytes``), and every
    metric of every iteration is bit for bit the run's without donation."""
    from timerl.runtime.jax_backend import JaxBackend

    ap = algos.ppo(env_id="CartPole-v1", env_backend="jax", **{**SMALL, "minibatches": minibatches})
    extra = [ap.rollout["obs"], ap.rollout["reward"]]
    donating = _compile(ap, "jax", 4, extra)
    # one iteration's carried state: 2 layers of 8 units per net, 3 copies (weights, m, v)
    carried = 3 * 4 * ((4 * 8 + 8 + 8 * 2 + 2) + (4 * 8 + 8 + 8 + 1))
    assert donating.stats()["donated_bytes"] >= 3 * carried  # iterations 1, 2 and 3
    monkeypatch.setattr(JaxBackend, "_donating", lambda self, run, plan: self._jitted(run))
    plain = _compile(ap, "jax", 4, extra)
    assert plain.stats()["donated_bytes"] == 0
    for name, m in [*ap.metrics.items(), ("obs", extra[0]), ("reward", extra[1])]:
        np.testing.assert_array_equal(donating.value(m), plain.value(m), err_msg=name)
    assert donating.stats()["peak_bytes"] == plain.stats()["peak_bytes"]
    donating.run()  # a second run: its first iteration donates copies, not the stores' arrays
    np.testing.assert_array_equal(donating.value(extra[1]), plain.value(extra[1]))


def test_resume_on_the_jax_backend_continues_the_run_exactly(tmp_path):
    """Stopped after the checkpoint of iteration 1 and resumed to 4 iterations: the env state
    and parameters the fused iterations carried come back from the checkpoint, and the returns
    and final state equal an uninterrupted run's."""
    from timerl.rl.train import train
    from timerl.rl.train.checkpoint import latest_checkpoint, load_checkpoint

    cfg = {"env_id": "CartPole-v1", "env_backend": "jax", **SMALL, "num_steps": 32}
    run = dict(iterations=4, backend="jax", checkpoint_every=2, progress=False)
    full = train("ppo", cfg, log_dir=tmp_path / "full", **run)

    class Stop(Exception):
        pass

    def stop(record):
        if record["iteration"] == 1:
            raise Stop

    with pytest.raises(Stop):
        train("ppo", cfg, log_dir=tmp_path / "cut", on_iteration=stop, **run)
    assert load_checkpoint(latest_checkpoint(tmp_path / "cut")).iteration == 1
    res = train("ppo", None, log_dir=tmp_path / "cut", resume=True, **run)
    assert res.first_iteration == 2
    np.testing.assert_allclose(res.returns, full.returns, rtol=1e-6)
    a = load_checkpoint(latest_checkpoint(tmp_path / "full"))
    b = load_checkpoint(latest_checkpoint(tmp_path / "cut"))
    assert a.iteration == b.iteration == 3
    for name, value in a.params.items():
        np.testing.assert_allclose(b.params[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_torch_backend_steps_a_jax_env_on_the_host():
    torch = pytest.importorskip("torch")
    assert torch is not None
    ap = algos.ppo(env_id="CartPole-v1", env_backend="jax", **SMALL)
    obs = ap.rollout["obs"]
    ref = _compile(ap, "numpy", 2, [obs])
    prog = _compile(ap, "torch", 2, [obs])
    np.testing.assert_allclose(prog.value(obs), ref.value(obs), rtol=1e-5, atol=1e-6)
    for m in ap.metrics.values():
        np.testing.assert_allclose(prog.value(m), ref.value(m), rtol=2e-4, atol=1e-5)


def test_episode_returns_are_counted_for_the_training_driver():
    ap = algos.ppo(env_id="CartPole-v1", env_backend="jax", **{**SMALL, "num_steps": 64})
    prog = _compile(ap, "numpy", 1, [ap.rollout["reward"], ap.rollout["done"]])
    done = prog.value(ap.rollout["done"])[0]
    returns = ap.env.vec.completed_returns()
    assert len(returns) == int(done.sum()) > 0
    # CartPole pays +1 per step, so an episode's return is its length
    assert np.all(returns == np.round(returns)) and returns.min() >= 1


def test_bad_combinations_name_the_env_and_the_reason():
    with pytest.raises(EnvError, match="no JAX version of environment 'Pendulum-v1'"):
        algos.ppo(env_id="Pendulum-v1", env_backend="jax", **SMALL)
    from timerl.rl.algos.dqn import DQNConfig, dqn

    with pytest.raises(EnvError, match='CartPole-v1 with env backend "jax" keeps its state'):
        dqn(DQNConfig(env_id="CartPole-v1", env_backend="jax"))
    from timerl.rl.envs.program import make_env

    with pytest.raises(EnvError, match="cannot be split over 2 Ray workers"):
        make_env("CartPole-v1", 2, 0, "jax", workers=2)


@pytest.mark.parametrize("loop_from", [1, 10**9], ids=["by steps", "by passes"])
def test_a_tally_of_a_rollout_at_once_equals_its_steps_one_by_one(monkeypatch, loop_from):
    """The driver's episode returns after a pure env's rollout: ``add_steps`` over ``(T, n)``
    rewards and dones gives the very sums, lengths and order of ``T`` calls of ``add``, both
    ways it can sum them."""
    from timerl.rl.envs import protocol
    from timerl.rl.envs.protocol import EpisodeTally

    monkeypatch.setattr(protocol, "STEP_LOOP_FROM_ENVS", loop_from)

    rng = np.random.default_rng(0)
    for trial in range(50):
        steps, n = int(rng.integers(1, 30)), int(rng.integers(1, 7))
        one, many = EpisodeTally(n), EpisodeTally(n)
        for _ in range(3):  # episodes continue from one rollout into the next
            reward = rng.normal(size=(steps, n)).astype(np.float32)
            done = rng.random((steps, n)) < 0.2 * rng.random()
            for t in range(steps):
                one.add(reward[t], done[t])
            many.add_steps(reward, done)
            np.testing.assert_array_equal(many.running_return, one.running_return)
            np.testing.assert_array_equal(many.running_length, one.running_length)
            assert many.done_returns == one.done_returns, trial
            assert many.done_lengths == one.done_lengths, trial


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Synthetic-v0"])
def test_every_form_of_an_env_offers_the_same_spaces(env_id):
    """Host batch, pure functions, and either inside a program: one ``EnvSpaces``."""
    from timerl.rl.envs import EnvSpaces
    from timerl.rl.envs import make_env as make_host_env
    from timerl.rl.envs.program import make_env as make_program_env

    forms = [
        make_host_env(env_id, num_envs=3, seed=0),
        make_jax_env(env_id, num_envs=3, seed=0),
        make_program_env(env_id, num_envs=3, seed=0),
        make_program_env(env_id, num_envs=3, seed=0, backend="jax"),
    ]
    assert [type(f).__name__ for f in forms[1:]] == ["JaxEnv", "Env", "PureEnv"]
    for form in forms:
        assert isinstance(form, EnvSpaces), type(form).__name__
    spaces = {
        (f.env_id, f.num_envs, tuple(f.obs_shape), f.discrete, f.num_actions, tuple(f.action_shape))
        for f in forms
    }
    assert len(spaces) == 1, spaces
