"""``timerl eval``: run a trained policy from a checkpoint and report its return.

The acting network is the one the program records in each checkpoint's header (``acting``:
layer records run in numpy by :mod:`timerl.rl.train.acting`: MLPs, CNNs, recurrent cells),
or, for a checkpoint without the record, an MLP rebuilt from its parameters' names:
``<net>.<k>.weight`` and ``<net>.<k>.bias`` for layer ``k``, with ``<net>`` one of
:data:`ACTING_NETS` (the first found) and the activation the compiled program declared
(``Program.activations``, stored in the header as ``activations``). What the network's
output means follows from the environment and its size:

- discrete actions: logits (or Q-values); deterministic acting takes the argmax, stochastic
  acting samples the softmax (Q-networks, named ``q``, always act greedily);
- continuous actions, output of the action size: a Gaussian mean, with the state-independent
  ``policy.log_std`` parameter as its spread when present;
- continuous actions, output twice the action size: mean and log-std of a tanh-squashed
  Gaussian (SAC-style), scaled to the action bounds; the log-std output is squashed into
  [LOG_STD_MIN, LOG_STD_MAX] with tanh.

A recurrent network's state starts at zero and is zeroed where an episode ends, as in
training. A program that normalises the policy's input (PPO's ``norm_obs``) records it in
the header (``obs_norm``: the names of the running statistics in the checkpoint's state and
the epsilon and clip of the formula); the network then acts on ``clip((obs - mean) /
sqrt(var + eps), -clip, clip)`` with the checkpoint's statistics, as the program's next
iteration would.

Inference runs in numpy: evaluation needs no compiler and no program.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from timerl.errors import CheckpointError, EnvError
from timerl.rl.algos.naming import arg_ref
from timerl.rl.envs.ids import env_id_of, restore_env
from timerl.rl.train.acting import (
    ACTIVATIONS,
    Layer,
    check_layers,
    forward,
    mlp_layers,
    state_widths,
    walk,
)
from timerl.rl.train.checkpoint import BEST, Checkpoint, checkpoint_dir, load_latest
from timerl.rl.train.checkpoint import load_checkpoint as _load

# networks that choose actions, in the order they are looked for
ACTING_NETS = ("actor", "policy", "pi", "q", "q_net", "qnet")
GREEDY_NETS = ("q", "q_net", "qnet")
# a squashed Gaussian's log-std output is itself squashed into this range (the SAC convention)
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def load_run_checkpoint(
    run_dir: str | Path, which: str = "latest", notice: Callable[[str], None] | None = None
) -> Checkpoint:
    """``which``: 'latest' (the newest intact one: a damaged newer one is passed over, and
    ``notice`` told so), 'best', or a checkpoint file path."""
    run_dir = Path(run_dir)
    if which == "latest":
        if not run_dir.is_dir():
            raise CheckpointError(f"no run directory {run_dir}")
        return load_latest(run_dir, notice=notice)
    if which == "best":
        path = checkpoint_dir(run_dir) / BEST
        if not path.exists():
            raise CheckpointError(
                f"no {path}: a best checkpoint is written once an episode has finished"
            )
        return _load(path)
    return _load(Path(which))


@dataclass
class ObsNormalizer:
    """The policy input a program with running observation statistics feeds its network."""

    mean: np.ndarray
    var: np.ndarray
    eps: float
    clip: float

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        scale = np.sqrt(self.var.astype(np.float32) + np.float32(self.eps))
        out = (np.asarray(obs, dtype=np.float32) - self.mean.astype(np.float32)) / scale
        return np.clip(out, -self.clip, self.clip).astype(np.float32)


def obs_normalizer(header: dict[str, Any], state: dict[str, np.ndarray]) -> ObsNormalizer | None:
    """The normalisation a checkpoint's header declares, with its statistics; None if none."""
    spec = header.get("obs_norm")
    if not spec:
        return None
    missing = [spec[k] for k in ("mean", "var") if spec[k] not in state]
    if missing:
        raise CheckpointError(
            f"the run normalises observations but the checkpoint holds no {', '.join(missing)} "
            "(state/<name>): it cannot be acted with"
        )
    return ObsNormalizer(
        state[spec["mean"]], state[spec["var"]], float(spec["eps"]), float(spec["clip"])
    )


@dataclass
class PolicySpec:
    """An acting network (layer records and parameters by name, see
    :mod:`timerl.rl.train.acting`) and how its output becomes an action: enough to act
    without timerl's compiler. A recurrent network's state advances one step per
    :meth:`forward`; :meth:`reset` zeroes it and :meth:`episode_ended` zeroes ended envs'.
    ``layers`` are fixed once made: the cells' state widths are read from them once."""

    net: str
    layers: list[Layer]
    params: dict[str, np.ndarray]
    kind: str  # "categorical", "greedy", "gaussian" or "squashed"
    log_std: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    normalizer: ObsNormalizer | None = None
    state: list[np.ndarray] = field(default_factory=list)
    _widths: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        self._widths = tuple(state_widths(self.layers))

    @property
    def state_widths(self) -> list[int]:
        return list(self._widths)

    def reset(self, batch: int) -> None:
        self.state = [np.zeros((batch, w), np.float32) for w in self._widths]

    def episode_ended(self, done: np.ndarray) -> None:
        for s in self.state:
            s[np.asarray(done, dtype=bool)] = 0.0

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """The network's raw output for a batch of (raw) observations."""
        x = np.asarray(obs)
        if self.normalizer is not None:
            x = self.normalizer(x)
        if [s.shape for s in self.state] != [(len(x), w) for w in self._widths]:
            self.reset(len(x))
        out, self.state = forward(self.layers, self.params, x, self.state)
        return out

    def act(
        self, obs: np.ndarray, deterministic: bool = True, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        """Actions for a batch of observations."""
        out = self.forward(obs)
        rng = rng or np.random.default_rng()
        if self.kind == "greedy" or (self.kind == "categorical" and deterministic):
            return out.argmax(-1)
        if self.kind == "categorical":
            z = out - out.max(-1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(-1, keepdims=True)
            return np.array([rng.choice(len(row), p=row) for row in p])
        if self.kind == "gaussian":
            if deterministic or self.log_std is None:
                return out
            return out + np.exp(self.log_std) * rng.standard_normal(out.shape).astype(np.float32)
        half = out.shape[-1] // 2
        mean = out[..., :half]
        squashed = (np.tanh(out[..., half:]) + 1.0) * 0.5
        log_std = LOG_STD_MIN + squashed * (LOG_STD_MAX - LOG_STD_MIN)
        u = mean if deterministic else mean + np.exp(log_std) * rng.standard_normal(mean.shape)
        return self._scale(np.tanh(u))

    def _scale(self, y: np.ndarray) -> np.ndarray:
        if self.low is None or self.high is None:
            return y
        return self.low + (y + 1.0) * 0.5 * (self.high - self.low)


def policy_spec(
    params: dict[str, np.ndarray],
    env: Any,
    activation: str | dict[str, str] = "tanh",
    normalizer: ObsNormalizer | None = None,
    layers: list[Layer] | None = None,
) -> PolicySpec:
    """The acting network among ``params`` for ``env`` (a timerl VectorEnv or Env):
    ``layers`` as the program recorded them, or else an MLP found by name (one of
    :data:`ACTING_NETS`) with ``activation`` (one for every net, or per net name; missing
    ones: tanh); ``normalizer``: what the network's input is, when not the raw observation."""
    vec = getattr(env, "vec", env)
    if layers is None:
        net = next((n for n in ACTING_NETS if f"{n}.0.weight" in params), None)
        if net is None:
            raise CheckpointError(
                "found no acting network in the checkpoint: expected parameters named "
                f"<net>.<k>.weight with <net> one of {', '.join(ACTING_NETS)}; "
                f"it has {', '.join(sorted(params)[:8])}"
            )
        if isinstance(activation, dict):
            activation = activation.get(net, "tanh")
        if activation not in ACTIVATIONS:
            raise CheckpointError(f"unknown activation {activation!r} in the run's config")
        layers = mlp_layers(params, net, activation, len(vec.obs_shape))
    else:
        net = next((r["param"] for r in reversed(layers) if r["op"] == "linear"), "policy")
    check_layers(layers, params)
    if normalizer is not None and normalizer.mean.shape != tuple(vec.obs_shape):
        raise EnvError(
            f"{vec.env_id}: observations have shape {tuple(vec.obs_shape)} but the "
            f"observation statistics have shape {normalizer.mean.shape}"
        )
    out = _output_size(layers, params, vec, net)
    low = high = log_std = None
    if vec.discrete:
        if out != vec.num_actions:
            raise EnvError(f"{vec.env_id}: {vec.num_actions} actions, but {net} outputs {out}")
        kind = "greedy" if net in GREEDY_NETS else "categorical"
    else:
        size = int(np.prod(vec.action_shape))
        if out == size:
            kind = "gaussian"
            log_std = params.get("policy.log_std")
        elif out == 2 * size:
            kind = "squashed"
            low, high = vec.action_low, vec.action_high
        else:
            raise EnvError(
                f"{vec.env_id}: actions have {size} dims, but {net} outputs {out} "
                f"(expected {size} or {2 * size})"
            )
    return PolicySpec(net, layers, params, kind, log_std, low, high, normalizer)


def _output_size(layers: list[Layer], params: dict[str, np.ndarray], vec: Any, net: str) -> int:
    """The network's output width, found by running it on one zero observation: a network
    that does not fit the environment's observations is an error naming both."""
    obs = np.zeros((1, *vec.obs_shape), np.float32)
    state = [np.zeros((1, w), np.float32) for w in state_widths(layers)]
    try:
        out, _ = forward(layers, params, obs, state)
    except ValueError as err:
        first = next((r["param"] for r in walk(layers) if "param" in r), net)
        raise EnvError(
            f"{vec.env_id}: observations of shape {tuple(vec.obs_shape)} do not fit the "
            f"acting network (first layer {first}: {err})"
        ) from None
    return int(out.shape[-1])


def checkpoint_policy(ckpt: Checkpoint, env: Any) -> PolicySpec:
    """The acting policy of a checkpoint: its network, activations and input normalisation."""
    header = ckpt.header
    normalizer = obs_normalizer(header, ckpt.state)
    layers = header.get("acting")
    activations = checkpoint_activations(header)
    return policy_spec(ckpt.params, env, activations, normalizer, layers)


def checkpoint_activations(header: dict[str, Any]) -> dict[str, str] | str:
    """The activations recorded at training time (or the config's, or tanh)."""
    return header.get("activations") or header["config"].get("activation", "tanh")


def _make_env(header: dict[str, Any], seed: int, env: Any = None, **extra: Any) -> Any:
    """The run's environment, one copy: made again from the run's record of it (its module
    imported, its gymnasium registration redone), or ``env`` given instead (an id,
    ``"module:EnvId"``, a class or a factory), with the run's ``env_kwargs`` either way."""
    from timerl.rl.envs.vector import make_env

    cfg = header["config"]
    if env is None:
        restore_env(header.get("env") or {"id": cfg["env_id"]})
        env = cfg["env_id"]
    else:
        env = env_id_of(env, arg_ref("env", "--env"))
    return make_env(env, num_envs=1, seed=seed, **cfg.get("env_kwargs", {}), **extra)


def format_return(value: float, spread: float | None = None) -> str:
    """A return (and its spread) to four significant digits of the larger, at least one
    decimal: ``500.0``, ``4564.3 ± 65.2``, ``0.9312 ± 0.0021`` (rewards of order 0.01
    summed over an episode), never ``0.9 ± 0.0``."""
    if not math.isfinite(value):
        return str(value)
    scale = max(abs(value), abs(spread) if spread is not None else 0.0)
    decimals = 1 if scale == 0 else min(8, max(1, 3 - math.floor(math.log10(scale))))
    text = f"{value:.{decimals}f}"
    return text if spread is None else f"{text} ± {spread:.{decimals}f}"


@dataclass
class EvalReport:
    env_id: str
    checkpoint: str
    iteration: int  # numbered from 0, as in metrics.csv and the checkpoint's file name
    returns: list[float]
    deterministic: bool
    video: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. a damaged checkpoint passed over

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def summary(self) -> str:
        """The report as printed; notes (a checkpoint passed over) come first."""
        mode = "deterministic" if self.deterministic else "stochastic"
        text = (
            f"{self.env_id}: return {format_return(self.mean, self.std)} over "
            f"{len(self.returns)} episodes ({mode} policy, {self.checkpoint}, after iteration "
            f"{self.iteration})"
        )
        if self.video:
            text += f"\nvideo of the first episode: {self.video}"
        return "\n".join([*self.notes, text])


def evaluate_run(
    run_dir: str | Path,
    *,
    episodes: int = 10,
    deterministic: bool = False,
    checkpoint: str = "latest",
    seed: int = 1000,
    video: str | Path | None = None,
    max_steps: int = 100_000,
    env: Any = None,
) -> EvalReport:
    """Run ``episodes`` episodes of the trained policy; the first one can be saved as a GIF.

    ``env``: the environment to run instead of the one the run records (an id,
    ``"module:EnvId"``, a ``gymnasium.Env`` subclass or a factory)."""
    if episodes < 1:
        raise CheckpointError(
            f"{arg_ref('episodes', '--episodes')} must be at least 1, got {episodes}"
        )
    notes: list[str] = []
    ckpt = load_run_checkpoint(run_dir, checkpoint, notice=notes.append)
    header = ckpt.header
    env_given = env
    env = _make_env(header, seed, env_given)
    spec = checkpoint_policy(ckpt, env)
    rng = np.random.default_rng(seed)
    returns = run_episodes(env, spec, episodes, deterministic, rng, max_steps)
    env.close()
    written = None
    if video is not None:
        written = str(_record(header, spec, deterministic, seed, Path(video), max_steps, env_given))
    return EvalReport(
        env.env_id,
        str(ckpt.path),
        ckpt.iteration,
        returns,
        deterministic,
        written,
        notes,
    )


def run_episodes(
    env: Any,
    spec: PolicySpec,
    episodes: int,
    deterministic: bool,
    rng: np.random.Generator,
    max_steps: int = 100_000,
) -> list[float]:
    """Returns of ``episodes`` complete episodes on a one-env VectorEnv."""
    obs = env.reset()
    env.completed_returns()
    spec.reset(len(obs))
    returns: list[float] = []
    steps = 0
    while len(returns) < episodes:
        obs, _, done = env.step(spec.act(obs, deterministic, rng))
        spec.episode_ended(done)
        returns.extend(float(r) for r in env.completed_returns())
        steps += 1
        if steps > max_steps * episodes:
            raise EnvError(f"{env.env_id}: no episode ended within {max_steps} steps")
    return returns[:episodes]


def _record(
    header: dict[str, Any],
    spec: PolicySpec,
    deterministic: bool,
    seed: int,
    path: Path,
    max_steps: int,
    env_given: Any = None,
) -> Path:
    try:
        from PIL import Image
    except ImportError:
        raise CheckpointError(
            "--video needs Pillow, which is not installed: pip install 'timerl[train]'"
        ) from None
    try:
        env = _make_env(header, seed, env_given, render_mode="rgb_array")
    except Exception as err:
        raise EnvError(
            f"{header['config']['env_id']}: cannot render this environment for --video ({err})"
        ) from None
    rng = np.random.default_rng(seed)
    obs = env.reset()
    spec.reset(len(obs))

    def frame() -> np.ndarray:
        try:
            return env.render_first()
        except Exception as err:  # e.g. gymnasium's DependencyNotInstalled for pygame
            env.close()
            raise EnvError(
                f"{header['config']['env_id']}: cannot render for --video: {err}"
            ) from None

    frames = [frame()]
    for _ in range(max_steps):
        obs, _, done = env.step(spec.act(obs, deterministic, rng))
        if done[0]:
            break
        frames.append(frame())
    env.close()
    if frames[0].ndim != 3:
        raise EnvError(f"{header['config']['env_id']}: render() gave no RGB frames")
    images = [Image.fromarray(f.astype(np.uint8)) for f in frames]
    path.parent.mkdir(parents=True, exist_ok=True)
    fps = 30
    images[0].save(
        path,
        save_all=True,
        append_images=images[1:],
        duration=max(1, math.floor(1000 / fps)),
        loop=0,
    )
    return path
