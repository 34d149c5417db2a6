"""Trained policies out of checkpoints: by name, evaluated, exported to run without timerl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import timerl as tl
from timerl.api.functional import sink
from timerl.cli import main
from timerl.errors import CheckpointError
from timerl.rl.envs import make_env
from timerl.rl.envs.program import make_env as make_program_env
from timerl.rl.train import build
from timerl.rl.train.checkpoint import latest_checkpoint, load_checkpoint
from timerl.rl.train.evaluation import checkpoint_policy, policy_spec

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--num-envs", "4", "--num-steps", "32", "--hidden", "16", "--epochs", "1"]
TINY += ["--minibatches", "1", "--no-progress", "--log-every", "0"]


class _FramesEnv(gym.Env):
    """Five-step episodes whose rgb_array frames encode the step number."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    observation_space = gym.spaces.Box(-1, 1, (3,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None) -> None:
        self.render_mode, self.n = render_mode, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.n += 1
        return np.full(3, 0.1 * self.n, np.float32), 1.0, self.n >= 5, False, {}

    def render(self):
        return np.full((8, 8, 3), 40 * self.n, np.uint8)


if "TimerlRLTest/Frames-v0" not in gym.registry:
    gym.register("TimerlRLTest/Frames-v0", entry_point=_FramesEnv)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    log = tmp_path_factory.mktemp("run")
    argv = ["train", "ppo", "--env", "CartPole-v1", "--steps", "384", *TINY]
    assert main([*argv, "--log-dir", str(log), "--checkpoint-every", "1"]) == 0
    return log


@pytest.fixture(scope="module")
def norm_run(tmp_path_factory):
    """A Gaussian policy trained on normalised observations: eval and export must normalise."""
    log = tmp_path_factory.mktemp("norm_run")
    argv = ["train", "ppo", "--env", "Pendulum-v1", "--steps", "384", *TINY]
    argv += ["--norm-obs", "true", "--norm-reward", "true"]
    assert main([*argv, "--log-dir", str(log), "--checkpoint-every", "1"]) == 0
    return log


# each run with the env it was trained on and raw observations (wide: some reach the clip)
RUNS = {
    "run": ("CartPole-v1", lambda rng, n: rng.uniform(-0.5, 0.5, (n, 4))),
    "norm_run": ("Pendulum-v1", lambda rng, n: rng.uniform(-1.0, 1.0, (n, 3)) * [1, 1, 60]),
}


def _checkpoint_actions(run_dir, env_id, obs):
    """The actions timerl's own policy takes on raw ``obs``: the program's acting network
    rebuilt from the checkpoint, statistics included (checked against the program itself in
    tests/rl/algos/test_normalize.py)."""
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    spec = checkpoint_policy(ckpt, make_env(env_id))
    assert (spec.normalizer is not None) == (ckpt.header.get("obs_norm") is not None)
    return spec.act(obs, deterministic=True)


def test_a_normalised_run_acts_on_its_checkpoints_statistics(norm_run, capsys):
    ckpt = load_checkpoint(latest_checkpoint(norm_run))
    spec = checkpoint_policy(ckpt, make_env("Pendulum-v1"))
    norm = spec.normalizer
    assert norm is not None
    np.testing.assert_array_equal(norm.mean, ckpt.state["obs_mean"])
    obs = RUNS["norm_run"][1](np.random.default_rng(5), 32).astype(np.float32)
    by_hand = np.clip((obs - norm.mean) / np.sqrt(norm.var + np.float32(1e-8)), -10, 10)
    raw = policy_spec(ckpt.params, make_env("Pendulum-v1"), "tanh")
    np.testing.assert_allclose(spec.forward(obs), raw.forward(by_hand), rtol=1e-6, atol=1e-7)
    assert not np.allclose(spec.forward(obs), raw.forward(obs), atol=1e-3)
    assert main(["eval", str(norm_run), "--episodes", "1", "--deterministic"]) == 0
    assert "Pendulum-v1: return" in capsys.readouterr().out


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_numpy_policy_computes_what_the_timerl_policy_module_computes(env_id):
    """The acting network rebuilt from named parameters equals algos.Policy's own forward."""
    from timerl.rl.algos import Policy

    env = make_env(env_id, num_envs=1, seed=0)
    obs = np.random.default_rng(0).standard_normal((5, *env.obs_shape)).astype(np.float32)
    with tl.Context(dims=("t",)):
        policy = Policy(make_program_env(env_id), (16, 8), (), 3)
        out = policy.actor(policy.flat(tl.from_numpy(obs)))
        params = {p.name: tl.evaluate(p) for p in policy.parameters()}
        expected = tl.evaluate(out)
    spec = policy_spec(params, env)
    np.testing.assert_allclose(spec.forward(obs), expected, rtol=1e-5, atol=1e-6)
    actions = spec.act(obs, deterministic=True)
    if env.discrete:
        np.testing.assert_array_equal(actions, expected.argmax(-1))
        assert spec.kind == "categorical"
    else:
        np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-6)
        assert spec.kind == "gaussian" and spec.log_std is not None


def test_checkpointed_parameters_are_the_ones_the_next_iteration_uses():
    """carried_state(after iteration i) == the parameters iteration i + 1 reads, for all i."""
    cfg = {"num_envs": 2, "num_steps": 8, "hidden": [8], "epochs": 2, "minibatches": 2}
    program = build("ppo", cfg)
    used: dict[int, dict[str, np.ndarray]] = {}
    with program.ctx:
        for p in program.params:
            sink(p, lambda v, pt, n=p.name: used.setdefault(pt["i"], {}).__setitem__(n, v))
    prog = program.ctx.compile(bounds={"I": 4, **program.bounds})
    ex = prog.executor()
    carried = {}

    def after(i):
        carried[i] = prog.carried_state(ex.snapshot(), i)

    ex.run(on_iteration=after)
    for i in range(3):
        for p in program.params:
            np.testing.assert_array_equal(carried[i][p.name], used[i + 1][p.name], err_msg=p.name)
        assert not np.array_equal(used[i]["actor.0.weight"], used[i + 1]["actor.0.weight"])
    moments = {n for n in carried[0] if n.startswith(("adam_m(", "adam_v("))}
    assert {"adam_m(actor.0.weight)", "adam_v(critic.1.bias)"} <= moments


def test_eval_reports_mean_and_std_of_the_trained_policy(run, capsys):
    assert main(["eval", str(run), "--episodes", "4", "--deterministic"]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1: return" in out and "over 4 episodes" in out
    assert "deterministic policy" in out and "after iteration 2" in out
    mean, std = (float(x) for x in out.split("return ")[1].split(" over")[0].split(" ± "))
    # the same episodes again, by hand: the checkpoint's weights acting greedily
    ckpt = load_checkpoint(latest_checkpoint(run))
    env = make_env("CartPole-v1", num_envs=1, seed=1000)
    spec = policy_spec(ckpt.params, env)
    from timerl.rl.train.evaluation import run_episodes

    returns = run_episodes(env, spec, 4, True, np.random.default_rng(1000))
    assert mean == pytest.approx(np.mean(returns), abs=0.05)
    assert std == pytest.approx(np.std(returns), abs=0.05)
    assert main(["eval", str(run), "--episodes", "2", "--checkpoint", "best"]) == 0
    assert "best.npz" in capsys.readouterr().out


def test_eval_of_a_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_eval_video_writes_the_first_episode_as_a_gif(tmp_path, capsys):
    pil = pytest.importorskip("PIL.Image")  # Pillow comes with matplotlib (the train extra)
    log = tmp_path / "run"
    argv = ["train", "ppo", "--env", "TimerlRLTest/Frames-v0", "--steps", "128", *TINY]
    assert main([*argv, "--log-dir", str(log)]) == 0
    gif = tmp_path / "ep.gif"
    assert main(["eval", str(log), "--episodes", "2", "--video", str(gif)]) == 0
    assert f"video of the first episode: {gif}" in capsys.readouterr().out
    with pil.open(gif) as img:
        assert img.n_frames == 5  # the reset frame and the four steps before the episode ends
        img.seek(2)
        assert np.asarray(img.convert("RGB"))[0, 0, 0] == 80


_RUN_WITHOUT_TIMERL = r"""
import json, sys
import numpy as np
sys.modules["timerl"] = None  # importing timerl now fails: the file must not need it
import torch
policy = torch.export.load(sys.argv[1]).module()
obs = torch.from_numpy(np.load(sys.argv[2]))
print(json.dumps(policy(obs).tolist()))
"""


@pytest.mark.parametrize("which", list(RUNS))
def test_export_torch_runs_without_timerl_and_acts_like_timerl(which, request, tmp_path, capsys):
    pytest.importorskip("torch")
    run = request.getfixturevalue(which)
    env_id, draw = RUNS[which]
    out = tmp_path / "policy.pt2"
    assert main(["export", str(run), "--format", "torch", "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    obs = draw(np.random.default_rng(1), 64).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    env = dict(os.environ, PYTHONPATH="")
    done = subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT_TIMERL, str(out), str(tmp_path / "obs.npy")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    exported = np.array(json.loads(done.stdout))
    expected = _checkpoint_actions(run, env_id, obs)
    if env_id == "CartPole-v1":
        np.testing.assert_array_equal(exported, expected)
    else:
        np.testing.assert_allclose(exported, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("which", list(RUNS))
def test_export_onnx_acts_like_timerl_or_names_the_extra(which, request, tmp_path, capsys):
    pytest.importorskip("torch")
    run = request.getfixturevalue(which)
    env_id, draw = RUNS[which]
    out = tmp_path / "policy.onnx"
    code = main(["export", str(run), "--format", "onnx", "--out", str(out)])
    try:
        import onnx
        import onnxscript  # noqa: F401
    except ImportError:
        assert code == 2
        assert "timerl[onnx]" in capsys.readouterr().err
        return
    assert code == 0
    from onnx.reference import ReferenceEvaluator

    obs = draw(np.random.default_rng(2), 16).astype(np.float32)
    (action,) = ReferenceEvaluator(onnx.load(str(out))).run(None, {"obs": obs})
    expected = _checkpoint_actions(run, env_id, obs)
    if env_id == "CartPole-v1":
        np.testing.assert_array_equal(action, expected)
    else:
        np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_without_an_acting_network_is_a_clear_error():
    with pytest.raises(CheckpointError, match="no acting network.*encoder.0.weight"):
        policy_spec({"encoder.0.weight": np.zeros((4, 2))}, make_env("CartPole-v1"))


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
def test_activation_is_read_off_the_program_and_used_to_act(activation):
    """A relu actor (as DQN/SAC-style programs use) acts with relu, which the compiled
    program reports."""
    obs = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32)
    ctx = tl.Context(dims=("i",))
    (i,) = ctx.dims
    with ctx:
        net = tl.nn.MLP([4, 8, 8, 2], activation=activation, domain=(i,), seed=2, name="actor")
        out = net.at(i)(tl.from_numpy(obs))
        params = net.parameters()
        (out**2.0).mean().backward(inputs=params)
        tl.optim.SGD(params, lr=0.1).step()
        seen = {}
        tl.sink(out, lambda v, pt: seen.__setitem__(pt["i"], v))
        for p in params:
            tl.sink(p, lambda v, pt, n=p.name: seen.__setitem__((pt["i"], n), v))
    prog = ctx.compile(bounds={"I": 2})
    prog.run()
    found = prog.activations()
    assert found == {"actor": activation}
    weights = {p.name: seen[(1, p.name)] for p in params}
    spec = policy_spec(weights, make_env("CartPole-v1"), found)
    np.testing.assert_allclose(spec.forward(obs), seen[1], rtol=1e-5, atol=1e-6)


def test_a_squashed_gaussian_acts_within_the_action_bounds():
    """Output twice the action size: tanh(mean) scaled to [low, high] (Pendulum: [-2, 2])."""
    rng = np.random.default_rng(4)
    params = {"actor.0.weight": rng.standard_normal((3, 2)).astype(np.float32) * 3}
    env = make_env("Pendulum-v1")
    spec = policy_spec(params, env)
    assert spec.kind == "squashed"
    obs = rng.standard_normal((50, 3)).astype(np.float32)
    mean = (obs @ params["actor.0.weight"])[:, :1]
    expected = 2.0 * np.tanh(mean)
    np.testing.assert_allclose(spec.act(obs, deterministic=True), expected, rtol=1e-5, atol=1e-6)
    sampled = spec.act(obs, deterministic=False, rng=rng)
    assert sampled.shape == (50, 1) and np.all(np.abs(sampled) <= 2.0)
    assert not np.allclose(sampled, 2.0 * np.tanh(mean))
