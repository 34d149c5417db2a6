"""Acting networks as layer records: numpy and torch run what the program's modules compute,
and CNN and LSTM runs evaluate and export."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import timerl as tl
from timerl.cli import main
from timerl.errors import CheckpointError, EnvError
from timerl.rl.envs import make_env
from timerl.rl.train.acting import forward, state_widths
from timerl.rl.train.checkpoint import latest_checkpoint, load_checkpoint
from timerl.rl.train.evaluation import checkpoint_policy, policy_spec

RNG = np.random.default_rng(7)


def _program_and_records(build, x, state=None):
    """The module's output on ``x`` computed by a compiled program, its parameters by name,
    and its layer records."""
    with tl.Context(dims=("t",)):
        module = build()
        xs = tl.from_numpy(x)
        if state is None:
            out = module(xs)
        elif isinstance(module, tl.nn.LSTMCell):
            out = module.packed(xs, tl.from_numpy(state))
        else:
            out = module(xs, tl.from_numpy(state))
        params = {p.name: tl.evaluate(p) for p in module.parameters()}
        return tl.evaluate(out), params, module.describe()


MODULES = {
    "mlp": (lambda: tl.nn.MLP([6, 8, 3], activation="relu", seed=1, name="m"), (5, 6)),
    "nature": (lambda: tl.nn.NatureCNN(2, 36, 16, seed=2), (3, 2, 36, 36)),
    "impala": (lambda: tl.nn.ImpalaCNN(3, 12, (4, 6), 8, seed=3), (2, 3, 12, 12)),
    "minatar": (lambda: tl.nn.MinAtarCNN(4, 10, 12, seed=5), (3, 4, 10, 10)),
    "conv_padded": (lambda: tl.nn.Conv2d(3, 4, (3, 2), (2, 1), (1, 2), seed=4), (2, 3, 7, 5)),
    "pool": (lambda: tl.nn.MaxPool2d(3, 2, 1), (2, 3, 7, 6)),
}


def test_a_permute_record_moves_the_axes_after_the_batch_axis():
    x = RNG.standard_normal((2, 5, 6, 3)).astype(np.float32)
    layers = [{"op": "permute", "axes": [2, 0, 1]}]
    got, _ = forward(layers, {}, x, [])
    np.testing.assert_array_equal(got, x.transpose(0, 3, 1, 2))
    torch = pytest.importorskip("torch")
    from timerl.rl.train.export import _classes

    out, _ = _classes()["Net"](layers, {})(torch.from_numpy(x), [])
    np.testing.assert_array_equal(out.numpy(), got)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_numpy_and_torch_run_what_the_module_computes(name):
    build, shape = MODULES[name]
    image = name in ("nature", "impala")
    x = RNG.integers(0, 256, shape).astype(np.uint8) if image else RNG.standard_normal(shape)
    x = x if image else x.astype(np.float32)
    expected, params, layers = _program_and_records(build, x)
    got, state = forward(layers, params, x, [])
    assert state == []
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    torch = pytest.importorskip("torch")
    from timerl.rl.train.export import _classes

    net = _classes()["Net"](layers, params)
    with torch.no_grad():
        out, _ = net(torch.from_numpy(x).float(), [])
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_cell_record_carries_the_state_the_module_returns(cell):
    make = tl.nn.LSTMCell if cell == "lstm" else tl.nn.GRUCell
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    width = (2 if cell == "lstm" else 1) * 6
    state = RNG.standard_normal((4, width)).astype(np.float32)
    expected, params, layers = _program_and_records(lambda: make(5, 6, seed=5, name="c"), x, state)
    assert state_widths(layers) == [width]
    h, (nxt,) = forward(layers, params, x, [state])
    np.testing.assert_allclose(nxt, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, expected[:, :6], rtol=1e-5, atol=1e-6)
    torch = pytest.importorskip("torch")
    from timerl.rl.train.export import _classes

    net = _classes()["Net"](layers, params)
    with torch.no_grad():
        out, (got,) = net(torch.from_numpy(x), [torch.from_numpy(state)])
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_policy_spec_reads_its_state_widths_once_and_steps_as_its_cell_does(monkeypatch):
    """The cells' state widths are read from the layers when the spec is made, not at every
    step; its steps still carry the state as ``forward`` does, and another batch size
    starts a fresh state of the same widths."""
    from timerl.rl.train import evaluation

    with tl.Context(dims=("t",)):
        cell = tl.nn.LSTMCell(4, 6, seed=5, name="c")
        head = tl.nn.Linear(6, 2, seed=6, name="actor")
        params = {p.name: tl.evaluate(p) for p in [*cell.parameters(), *head.parameters()]}
    layers = [*cell.describe(), *head.describe()]
    calls = []
    monkeypatch.setattr(evaluation, "state_widths", lambda ls: calls.append(ls) or state_widths(ls))
    spec = policy_spec(params, make_env("CartPole-v1"), layers=layers)
    made = len(calls)
    assert made >= 1 and spec.state_widths == [12]
    state = [np.zeros((3, 12), np.float32)]
    for _ in range(4):
        obs = RNG.standard_normal((3, 4)).astype(np.float32)
        want, state = forward(layers, params, obs, state)
        np.testing.assert_array_equal(spec.forward(obs), want)
    obs = RNG.standard_normal((5, 4)).astype(np.float32)
    want, _ = forward(layers, params, obs, [np.zeros((5, 12), np.float32)])
    np.testing.assert_array_equal(spec.forward(obs), want)
    assert [s.shape for s in spec.state] == [(5, 12)]
    assert len(calls) == made


def test_an_unknown_layer_or_a_missing_parameter_is_a_clear_error():
    env = make_env("CartPole-v1")
    w = {"a.weight": np.zeros((4, 2), np.float32)}
    with pytest.raises(CheckpointError, match="unknown layer 'attention'"):
        policy_spec(w, env, layers=[{"op": "attention"}])
    with pytest.raises(CheckpointError, match="needs the parameter 'b.weight'"):
        policy_spec(w, env, layers=[{"op": "linear", "param": "b"}])
    wide = {"a.weight": np.zeros((5, 2), np.float32)}
    with pytest.raises(EnvError, match=r"shape \(4,\) do not fit the acting network.*a"):
        policy_spec(wide, env, layers=[{"op": "linear", "param": "a"}])


TINY = ["--num-steps", "16", "--hidden", "8", "--no-progress", "--log-every", "0"]


@pytest.fixture(scope="module", params=["ppo", "a2c"])
def lstm_run(request, tmp_path_factory):
    log = tmp_path_factory.mktemp(f"lstm_{request.param}")
    argv = ["train", request.param, "--env", "CartPoleNoVel-v1", "--policy", "lstm"]
    argv += ["--num-envs", "2", "--steps", "96", *TINY, "--log-dir", str(log)]
    if request.param == "ppo":
        argv += ["--epochs", "1", "--minibatches", "2"]
    assert main(argv) == 0
    return log


def test_an_lstm_run_acts_with_the_actors_cell_and_resets_it_where_an_episode_ends(lstm_run):
    ckpt = load_checkpoint(latest_checkpoint(lstm_run))
    assert [r["op"] for r in ckpt.header["acting"]][-3:] == ["tanh", "lstm", "linear"]
    spec = checkpoint_policy(ckpt, make_env("CartPoleNoVel-v1"))
    assert spec.state_widths == [16] and spec.kind == "categorical"
    obs = RNG.standard_normal((3, 2)).astype(np.float32)
    first = spec.forward(obs)
    second = spec.forward(obs)  # the state moved on: another output for the same input
    assert not np.allclose(first, second)
    spec.episode_ended(np.array([True, False, False]))
    third = spec.forward(obs)
    spec.reset(3)
    np.testing.assert_allclose(third[0], spec.forward(obs)[0], rtol=1e-6)
    assert main(["eval", str(lstm_run), "--episodes", "2"]) == 0


def test_an_exported_lstm_policy_takes_and_returns_its_state(lstm_run, tmp_path):
    torch = pytest.importorskip("torch")
    out = tmp_path / "p.pt2"
    assert main(["export", str(lstm_run), "--out", str(out)]) == 0
    module = torch.export.load(str(out)).module()
    spec = checkpoint_policy(
        load_checkpoint(latest_checkpoint(lstm_run)), make_env("CartPoleNoVel-v1")
    )
    spec.reset(4)
    state = torch.zeros(4, 16)
    for _ in range(5):
        obs = RNG.standard_normal((4, 2)).astype(np.float32)
        action, state = module(torch.from_numpy(obs), state)
        np.testing.assert_array_equal(action.numpy(), spec.act(obs, deterministic=True))
        np.testing.assert_allclose(state.numpy(), spec.state[0], rtol=1e-5, atol=1e-6)


def test_a_cnn_checkpoint_acts_and_exports(tmp_path):
    """A run's header as a CNN policy writes it: the numpy policy equals the exported one on
    uint8 frames."""
    torch = pytest.importorskip("torch")
    from timerl.rl.train.export import torch_module

    with tl.Context(dims=("t",)):
        trunk = tl.nn.NatureCNN(2, 36, 16, seed=2)
        head = tl.nn.Linear(16, 3, seed=3, name="actor")
        params = {p.name: tl.evaluate(p) for p in [*trunk.parameters(), *head.parameters()]}
    layers = [*trunk.describe(), *head.describe()]
    env = SimpleNamespace(env_id="Frames-v0", obs_shape=(2, 36, 36), discrete=True, num_actions=3)
    ckpt = SimpleNamespace(header={"acting": layers, "config": {}}, params=params, state={})
    spec = checkpoint_policy(ckpt, env)
    frames = RNG.integers(0, 256, (5, 2, 36, 36)).astype(np.uint8)
    module = torch_module(spec).eval()
    with torch.no_grad():
        exported = module(torch.from_numpy(frames)).numpy()
    np.testing.assert_array_equal(exported, spec.act(frames, deterministic=True))
    assert Path(tmp_path).exists()
