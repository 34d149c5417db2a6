"""gymnax's MinAtar games: ``--env gymnax:Breakout-MinAtar`` alone picks the env inside the
program, the jax backend, the jitted-JAX MinAtar PPO recipe and the MinAtar CNN over the
(H, W, C) planes; ``--policy auto`` picks the CNN by the env's image layout and size."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import timerl as tl
from timerl.api.nn import MinAtarCNN, NatureCNN
from timerl.errors import EnvError
from timerl.rl.algos.policy_gradient import (
    CNNPolicy,
    Policy,
    PPOConfig,
    default_backend,
    default_config,
    make_policy,
    ppo,
)

TINY = {"num_envs": 4, "num_steps": 8, "minibatches": 2, "epochs": 1}
BREAKOUT = "gymnax:Breakout-MinAtar"


def test_minatar_ids_get_the_jax_recipe_and_backend_others_keep_theirs():
    cfg = default_config("ppo", BREAKOUT)
    want = {
        "env_backend": "jax",
        "num_envs": 64,
        "num_steps": 128,
        "epochs": 4,
        "minibatches": 8,
        "lr": 5e-4,
        "anneal_lr": True,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip": 0.2,
        "ent_coef": 0.05,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
    }
    assert cfg == want
    assert default_backend("ppo", "gymnax:SpaceInvaders-MinAtar") == "jax"
    assert default_backend("ppo", "Pong-v5") == "torch"  # torch is installed with the tests
    for algo, env_id in (("ppo", "gymnax:CartPole-v1"), ("ppo", "CartPole-v1"), ("dqn", BREAKOUT)):
        assert default_backend(algo, env_id) == "numpy"
    assert default_config("ppo", "gymnax:CartPole-v1") == {}
    assert default_config("reinforce", BREAKOUT) == {}


def _fake_env(obs_shape, layout, discrete=True):
    """What make_policy reads of an env: no simulator needed to pick the network."""
    vec = SimpleNamespace(env_id="fake")
    return SimpleNamespace(
        obs_shape=obs_shape, image_layout=layout, discrete=discrete, num_actions=3, vec=vec
    )


@pytest.mark.parametrize(
    ("obs_shape", "layout", "trunk"),
    [
        ((10, 10, 4), "HWC", MinAtarCNN),  # MinAtar: small planes, channels last
        ((4, 84, 84), "CHW", NatureCNN),  # Atari: uint8 frames, channels first
        ((4, 36, 36), "CHW", NatureCNN),  # the smallest frame NatureCNN fits
        ((4, 35, 35), "CHW", MinAtarCNN),
    ],
)
def test_policy_auto_picks_the_cnn_by_image_layout_and_size(obs_shape, layout, trunk):
    with tl.Context(dims=("i", "t")) as ctx:
        policy = make_policy(PPOConfig(), _fake_env(obs_shape, layout), (ctx.dims[0],))
    assert isinstance(policy, CNNPolicy) and isinstance(policy.trunk, trunk)
    assert policy.channels_last == (layout == "HWC")
    want = 128 if trunk is MinAtarCNN else 512
    assert tuple(policy.actor.weight.shape) == (want, 3)


def test_the_acting_records_of_a_channels_last_cnn_policy_give_its_logits():
    """What eval and export run: the (H, W, C) observation transposed, the trunk, the actor."""
    from timerl.rl.train.acting import forward

    obs = np.random.default_rng(3).integers(0, 2, (5, 10, 10, 4)).astype(np.float32)
    with tl.Context(dims=("i", "t")):
        policy = make_policy(PPOConfig(), _fake_env((10, 10, 4), "HWC"), ())
        logits = tl.evaluate(policy.actor(policy.features(tl.from_numpy(obs))))
        params = {p.name: tl.evaluate(p) for p in policy.parameters()}
        layers = policy.acting()
    assert layers[0] == {"op": "permute", "axes": [2, 0, 1]}
    got, _ = forward(layers, params, obs, [])
    np.testing.assert_allclose(got, logits, rtol=1e-4, atol=1e-5)


def test_policy_auto_keeps_the_mlp_without_a_declared_image_and_cnn_is_refused_for_flat_obs():
    with tl.Context(dims=("i", "t")) as ctx:
        dom = (ctx.dims[0],)
        # float "images" of no declared layout (Synthetic-v0's) are an MLP's features
        mlp = make_policy(PPOConfig(), _fake_env((3, 4, 4), None), dom)
        assert type(mlp) is Policy
        mlp = make_policy(PPOConfig(policy="mlp"), _fake_env((10, 10, 4), "HWC"), dom)
        assert type(mlp) is Policy
        forced = make_policy(PPOConfig(policy="cnn"), _fake_env((3, 4, 4), None), dom)
        assert isinstance(forced.trunk, MinAtarCNN) and not forced.channels_last
        with pytest.raises(EnvError, match=r"fake: the CNN policy needs image.*\(H, W, C\)"):
            make_policy(PPOConfig(policy="cnn"), _fake_env((40,), "HWC"), dom)
        with pytest.raises(EnvError, match="fake: the CNN policy supports discrete actions"):
            make_policy(PPOConfig(policy="cnn"), _fake_env((10, 10, 4), "HWC", False), dom)


gymnax = pytest.importorskip("gymnax")


def _config(**overrides):
    return PPOConfig(env_id=BREAKOUT, **{**default_config("ppo", BREAKOUT), **TINY, **overrides})


def test_breakout_gets_the_minatar_cnn_and_mlp_overrides_it():
    algo = ppo(_config())
    assert algo.env.obs_shape == (10, 10, 4) and algo.env.image_layout == "HWC"
    names = [p.name for p in algo.params]
    assert names[:4] == ["minatar.0.weight", "minatar.0.bias", "minatar.1.weight", "minatar.1.bias"]
    assert not any(
        n.startswith("minatar") for n in (p.name for p in ppo(_config(policy="mlp")).params)
    )


def test_the_cnn_program_on_jax_agrees_with_the_numpy_reference():
    """Two iterations of the CNN PPO program: one XLA program per iteration on jax, the trunk's
    backward pass once per update, the same metrics and observations as the unoptimised numpy
    run."""
    got = {}
    for backend, optimize in (("numpy", False), ("jax", True)):
        ap = ppo(_config())
        dims = {b.name: b for b in ap.ctx.bounds}
        bounds = {dims["I"]: 2, **{dims[k]: v for k, v in ap.bounds.items()}}
        outs = [*ap.metrics.values(), ap.rollout["obs"]]
        prog = ap.ctx.compile(
            bounds=bounds, backend=backend, outputs=outs, seed=0, optimize=optimize
        )
        prog.run()
        got[backend] = [np.asarray(prog.value(m), dtype=np.float64) for m in outs]
        if backend == "jax":
            assert "-> one XLA program per iteration" in prog.explain()
            # actor and critic share the trunk's features: one backward pass through it
            prims = [op.prim for op in prog.ops]
            assert prims.count("conv2d_weight_grad") == 1, prims.count("conv2d_weight_grad")
    for want, have in zip(got["numpy"], got["jax"], strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)


def test_train_ppo_on_breakout_without_extra_flags_runs_on_jax_quietly(tmp_path, capsys):
    """The command line with only --env (and a tiny batch): jax backend, the env in the
    program, the MinAtar CNN, and none of gymnax's bool-scatter FutureWarnings."""
    import json

    from timerl.cli import main

    argv = ["train", "ppo", "--env", BREAKOUT, "--steps", "64", "--no-progress"]
    argv += ["--num-envs", "4", "--num-steps", "8", "--minibatches", "2", "--epochs", "1"]
    argv += ["--log-dir", str(tmp_path / "run")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0
    scatter = [w for w in caught if "scatter inputs have incompatible types" in str(w.message)]
    assert not scatter
    assert f"ppo on {BREAKOUT}: 2 iterations, 64 env steps" in capsys.readouterr().out
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["backend"] == "jax" and saved["config"]["env_backend"] == "jax"
    assert saved["config"]["lr"] == 5e-4 and saved["config"]["clip"] == 0.2
