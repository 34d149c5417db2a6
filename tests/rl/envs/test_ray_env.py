"""Envs split over Ray actors: the same trajectories as one process, and training that
survives a worker dying mid-rollout."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys

import numpy as np
import pytest
from core_helpers import rollout_beside_recurrence

from timerl.errors import CheckpointError, EnvError
from timerl.rl.envs import make_env as make_vector_env

ray = pytest.importorskip("ray", reason='needs the ray extra: pip install "timerl[ray]"')

from timerl.rl.envs import ray_env  # noqa: E402
from timerl.rl.envs.ray_env import RayVectorEnv  # noqa: E402
from timerl.rl.train import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("local_ray")  # tests/conftest.py


def _actions(env, rng: np.random.Generator) -> np.ndarray:
    if env.discrete:
        return rng.integers(env.num_actions, size=env.num_envs)
    return rng.uniform(-1, 1, size=(env.num_envs, *env.action_shape)).astype(np.float32)


def _trajectory(env, steps: int, seed: int = 7) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "r", "d", "term", "final")}
    out["obs"].append(env.reset())
    for _ in range(steps):
        obs, r, d = env.step(_actions(env, rng))
        out["obs"].append(obs)
        out["r"].append(r)
        out["d"].append(d)
        out["term"].append(env.terminated.copy())
        out["final"].append(obs if env.final_obs is None else env.final_obs)
    out["returns"] = [env.completed_returns()]
    out["lengths"] = [env.completed_lengths()]
    return out


@pytest.mark.parametrize("direct", [True, False], ids=["socket", "calls"])
@pytest.mark.parametrize(
    "env_id, kwargs", [("CartPole-v1", {}), ("Synthetic-v0", {"episode_length": 7})]
)
def test_two_workers_step_exactly_the_single_process_batch(env_id, kwargs, direct):
    single = make_vector_env(env_id, num_envs=5, seed=3, **kwargs)
    split = RayVectorEnv(env_id, num_envs=5, seed=3, workers=2, direct=direct, **kwargs)
    assert split.workers == 2 and len(set(split.worker_pids())) == 2
    assert split.worker_pids()[0] != os.getpid()
    want, got = _trajectory(single, 40), _trajectory(split, 40)
    assert split.direct == [direct, direct]
    split.close()
    assert sum(d.sum() for d in want["d"]) > 0  # episodes ended (and auto-reset) on the way
    for key in want:
        for a, b in zip(want[key], got[key], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{env_id}: {key}")


def test_packed_steps_unpack_to_the_arrays_value_for_value():
    rng = np.random.default_rng(0)
    obs = [rng.normal(size=(n, 2, 3)).astype(np.float32) for n in (2, 3)]
    reward = [rng.normal(size=n).astype(np.float32) for n in (2, 3)]
    term = [np.array([True, False]), np.array([False, False, True])]
    trunc = [np.array([False, True]), np.array([False, False, False])]
    final = [obs[0] + 1, None]  # one slice had an episode end, the other did not
    parts = [ray_env.pack_step(*x) for x in zip(obs, reward, term, trunc, final, strict=True)]
    assert [p.shape for p in parts] == [(2, 15), (3, 9)] and parts[0].dtype == np.float32
    o, r, te, tr, f = ray_env.unpack_steps(parts, obs_size=6)
    np.testing.assert_array_equal(o, np.concatenate(obs).reshape(5, 6))
    np.testing.assert_array_equal(r, np.concatenate(reward))
    np.testing.assert_array_equal(te, np.concatenate(term))
    np.testing.assert_array_equal(tr, np.concatenate(trunc))
    np.testing.assert_array_equal(f, np.concatenate([final[0], obs[1]]).reshape(5, 6))
    assert ray_env.unpack_steps(parts[1:], obs_size=6)[4] is None


@pytest.mark.parametrize("direct", [True, False], ids=["socket", "calls"])
def test_a_killed_worker_restarts_and_its_envs_start_over(direct):
    env = RayVectorEnv("CartPole-v1", num_envs=4, seed=1, workers=2, direct=direct)
    first = env.reset()
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.step(_actions(env, rng))
    env.completed_returns()
    before = env.last_obs.copy()
    pid = env.worker_pids()[1]
    os.kill(pid, signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="worker 1 .*envs 2..3"):
        obs, reward, done = env.step(_actions(env, rng))
    assert [k for k, _ in env.recoveries] == [1]
    # the restarted worker's envs were re-created from their seeds: their first observations
    np.testing.assert_array_equal(obs[2:], first[2:])
    assert done[2:].all() and not env.terminated[2:].any() and (reward[2:] == 0).all()
    np.testing.assert_array_equal(env.final_obs[2:], before[2:])
    assert env.completed_returns().size == int(done[:2].sum())  # cut episodes not counted
    assert env.worker_pids()[1] != pid
    env.step(_actions(env, rng))  # and it keeps stepping
    assert env.direct == [direct, direct]  # the restarted worker serves a new socket
    env.close()


@pytest.mark.parametrize("direct", [True, False], ids=["socket", "calls"])
def test_the_live_worker_neither_skips_nor_repeats_the_step_a_worker_died_in(direct):
    kwargs = {"episode_length": 50, "obs_shape": [3]}
    single = make_vector_env("Synthetic-v0", num_envs=4, seed=5, **kwargs)
    env = RayVectorEnv("Synthetic-v0", num_envs=4, seed=5, workers=2, direct=direct, **kwargs)
    rng = np.random.default_rng(1)
    single.reset(), env.reset()
    for step in range(8):
        actions = _actions(env, rng)
        if step == 3:
            os.kill(env.worker_pids()[0], signal.SIGKILL)
            with pytest.warns(RuntimeWarning, match="worker 0"):
                obs, reward, done = env.step(actions)
            assert done[:2].all() and not done[2:].any()
        else:
            obs, reward, done = env.step(actions)
        want_obs, want_reward, _ = single.step(actions)
        # worker 1 (envs 2, 3) runs every step exactly once, the kill notwithstanding
        np.testing.assert_array_equal(obs[2:], want_obs[2:])
        np.testing.assert_array_equal(reward[2:], want_reward[2:])
    assert [k for k, _ in env.recoveries] == [0]
    env.close()


def test_a_worker_that_cannot_serve_a_socket_steps_by_plain_calls(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no sockets here")

    monkeypatch.setattr(ray_env, "Client", refuse)
    single = make_vector_env("Synthetic-v0", num_envs=5, seed=3, episode_length=7)
    split = RayVectorEnv("Synthetic-v0", num_envs=5, seed=3, workers=2, episode_length=7)
    with pytest.warns(RuntimeWarning, match="worker 0 cannot step over a socket.*no sockets"):
        got = _trajectory(split, 12)
    assert split.direct == [False, False]
    want = _trajectory(single, 12)
    split.close()
    for key in want:
        for a, b in zip(want[key], got[key], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=key)


def test_an_env_that_raises_in_a_socket_step_is_named_and_every_socket_dropped():
    env = RayVectorEnv("Synthetic-v0", num_envs=4, seed=0, workers=2, episode_length=7)
    actions = np.zeros((4, *env.action_shape), np.float32)
    env.reset()
    env.step(actions)
    assert env.direct == [True, True]
    # worker 1's socket now answers from a worker in this process whose env raises
    local = ray_env._Worker("Synthetic-v0", 2, 0, "gymnasium", {"episode_length": 7})

    def explode(actions):
        raise ValueError("simulator exploded")

    local.step = explode
    _, path = local.serve(env._authkey, env._action_dtype.str)
    env._drop(1)
    env._conns[1] = ray_env.Client(path, family="AF_UNIX", authkey=env._authkey)
    with pytest.raises(EnvError, match="worker 1 failed in step: ValueError: simulator exploded"):
        env.step(actions)
    # worker 0's reply was left unread: its socket must not answer a later step
    assert env._conns == [None, None]
    env.close()


def test_a_started_step_is_the_step_and_a_program_overlaps_it():
    from timerl.schedule.program import Start

    single = make_vector_env("Synthetic-v0", num_envs=4, seed=3, episode_length=7)
    split = RayVectorEnv("Synthetic-v0", num_envs=4, seed=3, workers=2, episode_length=7)
    rng = np.random.default_rng(0)
    single.reset(), split.reset()
    for _ in range(9):
        a = _actions(single, rng)
        split.step_async(a)
        for got, want in zip(split.step(a), single.step(a), strict=True):
            np.testing.assert_array_equal(got, want)
    split.step_async(a)
    with pytest.raises(EnvError, match="other actions.*call reset"):
        split.step(a + 0.5)
    with pytest.raises(EnvError, match="reset"):
        split.step(a)
    np.testing.assert_array_equal(split.reset(), single.reset())  # the sockets are clean
    for got, want in zip(split.step(a), single.step(a), strict=True):
        np.testing.assert_array_equal(got, want)
    split.close()  # its actors hold both of the local Ray's CPUs

    kw = {"episode_length": 7, "obs_shape": (4,), "action_dim": 1}
    prog_env = RayVectorEnv("Synthetic-v0", 4, seed=3, workers=2, **kw)
    ctx, reward, acc = rollout_beside_recurrence(prog_env)
    prog = ctx.compile(bounds={"T": 12}, outputs=[reward, acc])
    assert any(isinstance(s, Start) for s in prog.schedule.statements())
    prog.run()
    ctx, reward1, acc1 = rollout_beside_recurrence(make_vector_env("Synthetic-v0", 4, seed=3, **kw))
    ref = ctx.compile(bounds={"T": 12}, outputs=[reward1, acc1])
    ref.run()
    np.testing.assert_array_equal(prog.value(reward), ref.value(reward1))
    np.testing.assert_array_equal(prog.value(acc), ref.value(acc1))
    prog_env.close()


def _ppo(**extra):
    config = {
        "env_id": "Synthetic-v0",
        "env_kwargs": {"episode_length": 8, "obs_shape": [4]},
        "num_envs": 4,
        "num_steps": 8,
        "hidden": (8,),
        "epochs": 1,
        "minibatches": 1,
    }
    return train("ppo", config, progress=False, echo=lambda line: None, **extra)


def test_training_with_workers_gives_the_same_returns():
    plain = _ppo(iterations=3)
    spread = _ppo(iterations=3, workers=2)
    assert plain.returns == spread.returns
    assert np.isfinite(plain.returns).all()


def _wait_until_gone(pid: int, seconds: float = 30.0) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still runs {seconds:g} s after ray.kill")


def test_a_state_taken_right_after_a_worker_died_waits_for_its_restart():
    env = RayVectorEnv("Synthetic-v0", num_envs=4, seed=0, workers=2, episode_length=7)
    env.reset()
    env.step(np.zeros((4, *env.action_shape), np.float32))
    pid = env.worker_pids()[0]
    os.kill(pid, signal.SIGKILL)
    _wait_until_gone(pid)
    slices = env.state_dict()["sim"]["slices"]
    assert slices[0]["needs_reset"]  # the restarted worker's envs await a reset
    assert not slices[1]["needs_reset"]
    env.close()


def test_training_continues_when_a_worker_dies_mid_rollout(tmp_path, monkeypatch):
    step = RayVectorEnv._step_batch
    seen: list[RayVectorEnv] = []
    calls = [0]

    def killing(self, actions):
        calls[0] += 1
        if calls[0] == 12:  # iteration 1, halfway through its 8-step rollout
            seen.append(self)
            pid = self.worker_pids()[0]
            ray.kill(self._actors[0], no_restart=False)
            _wait_until_gone(pid)  # dead before this step, not some steps later
        return step(self, actions)

    monkeypatch.setattr(RayVectorEnv, "_step_batch", killing)
    with pytest.warns(RuntimeWarning, match="env worker 0"):
        result = _ppo(iterations=4, workers=2, log_dir=tmp_path, checkpoint_every=1)
    assert seen and [k for k, _ in seen[0].recoveries] == [0]
    assert result.iterations == 4 and np.isfinite(result.returns[-1])
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["iteration"]) for r in rows] == [0, 1, 2, 3]
    monkeypatch.setattr(RayVectorEnv, "_step_batch", step)
    # the checkpoints hold the split envs' state: the run resumes on two workers
    more = _ppo(iterations=5, workers=2, log_dir=tmp_path, resume=True)
    assert more.first_iteration == 4 and len(more.returns) == 5
    with pytest.raises(CheckpointError, match="resume with workers=2"):
        _ppo(iterations=6, log_dir=tmp_path, resume=True)


def test_uint8_frames_stay_uint8_images_through_a_worker():
    """Atari's frames: the program sees bytes (a CNN policy, a uint8 rollout) as in one
    process, though the socket carries float32."""
    pytest.importorskip("envpool")
    single = make_vector_env("Pong-v5", num_envs=2, seed=0)
    split = RayVectorEnv("Pong-v5", num_envs=2, seed=0, workers=1)
    assert split.obs_dtype == single.obs_dtype == np.uint8
    assert split.image_layout == single.image_layout
    want, got = _trajectory(single, 5), _trajectory(split, 5)
    for a, b in zip(want["obs"], got["obs"], strict=True):
        assert b.dtype == np.uint8
        np.testing.assert_array_equal(a, b)
    split.close()
    single.close()


def test_bad_requests_fail_early_and_name_the_problem():
    with pytest.raises(EnvError, match="3 workers for 2 envs"):
        RayVectorEnv("CartPole-v1", num_envs=2, workers=3)
    with pytest.raises(EnvError, match="cannot be split"):
        RayVectorEnv("CartPole-v1", num_envs=2, workers=2, backend="envpool")
    with pytest.raises(EnvError, match="unknown environment id"):
        RayVectorEnv("NoSuchEnv-v0", num_envs=2, workers=2)
    with pytest.raises(EnvError, match="need 4 CPUs"):
        RayVectorEnv("CartPole-v1", num_envs=4, workers=4)


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(EnvError, match=r"timerl\[ray\]"):
        ray_env.require_ray()


def test_scaling_bench_runs_and_reports_the_ratios(tmp_path, capsys):
    from bench import ray_scaling

    out = tmp_path / "scaling.json"
    argv = ["--envs", "4", "--step-cost-us", "50", "--seconds", "0.2", "--json", str(out)]
    assert ray_scaling.main(argv) == 0
    text = capsys.readouterr().out
    assert "no Ray" in text and "2 workers / 1 worker" in text
    doc = json.loads(out.read_text())
    assert set(doc["steps_per_second"]) == {"no Ray", "1 worker", "2 workers"}
    assert all(v > 0 for v in doc["steps_per_second"].values())
    assert ray.is_initialized()  # the bench leaves the Ray it did not start


def test_joining_another_cluster_while_ray_runs_is_an_error_naming_both():
    running = ray.get_runtime_context().gcs_address
    port = running.rpartition(":")[2]
    with pytest.raises(EnvError, match=rf"cluster at {running}.*cannot also join 10\.9\.8\.7:1"):
        RayVectorEnv("CartPole-v1", num_envs=2, seed=0, workers=1, ray_address="10.9.8.7:1")
    # the running cluster, by its address, as this machine, or "auto": used as it is
    for address in (running, f"localhost:{port}", "auto"):
        assert ray_env.ensure_ray(1, address) is False


def test_a_restarting_worker_is_waited_for_in_time_not_in_refusals(monkeypatch):
    # Ray refuses calls to an actor while it restarts, at once and as often as asked: on a
    # loaded machine a restart outlasted any fixed number of tries
    class Unavailable(Exception):
        pass

    class ActorError(Exception):
        pass

    class FakeRay:
        class exceptions:
            ActorUnavailableError = Unavailable
            RayActorError = ActorError

        refusals = 200

        def get(self, ref):
            if self.refusals:
                self.refusals -= 1
                raise Unavailable("restarting")
            return ref

    class Actor:
        class reset:
            @staticmethod
            def remote():
                return "reset done"

    env = RayVectorEnv.__new__(RayVectorEnv)
    env.env_id, env._ray, env._bounds, env._actors = "Synthetic-v0", FakeRay(), [(0, 2)], [Actor()]
    monkeypatch.setattr(ray_env.time, "sleep", lambda s: None)
    assert env._once_back(0, "reset") == "reset done"
    env._ray.refusals = 10**9
    clock = iter(range(0, 10**6, 10))  # 10 s a refusal: past RESTART_SECONDS after a few
    monkeypatch.setattr(ray_env.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(EnvError, match=r"worker 0 \(envs 0..1\) did not come back within 60 s"):
        env._once_back(0, "reset")
