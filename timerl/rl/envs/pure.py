"""A JAX-native environment inside the program: reset and step as pure ops over a carried state.

With ``env_backend="jax"`` the env is one of :mod:`timerl.rl.envs.jax_envs` (pure reset/step
functions over a state pytree). Its state is then an ordinary recurrent tensor per leaf of
that pytree, carried over the rollout like the observations are::

    state[0, 0], obs[0, 0] = reset()
    state[i, t + 1], obs[i, t + 1], reward[i, t], done[i, t] = step(state[i, t], action[i, t])
    state[i + 1, 0] = state[i, T - 1]   # episodes continue across iterations

Reset and step are pure calls (``timerl.api.calls.pure_call``): no effect, so the passes treat them
like any other op and the jax backend traces them into the rollout loop (one XLA loop when
the rest of the body traces too); the numpy and torch backends evaluate the same function on
the host (jitted by jax, on numpy arrays). Seeds and auto-reset are jax_envs': the reset key is
``jax.random.key(seed)`` (Synthetic-v0 takes the integer seed itself, so its trajectories are
those of the numpy env with that seed).

Typed PRNG keys (CartPole's) become their raw ``uint32`` key data in the program and are
wrapped again inside the function. Episode returns, which the training driver reports, are
summed on the host from each iteration's rewards and dones (one small host call per
iteration, after the rollout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from timerl.api.calls import Result, host_call, pure_call
from timerl.api.symbols import Dim
from timerl.api.tensor import RecurrentTensor
from timerl.errors import EnvError
from timerl.rl.envs.jax_envs import make_jax_env
from timerl.rl.envs.protocol import EpisodeTally


class PureFn:
    """The ``fn`` of a ``pure_call`` op: ``self(*xs)`` traced by jax, ``host`` on numpy arrays.

    Both run the function with jax's default (32-bit) types, as jax_envs, gymnax and the JAX
    baseline do; 64-bit inputs are narrowed first (jax would truncate them with a warning on
    every call)."""

    def __init__(self, fn: Callable[..., tuple], name: str) -> None:
        self.fn = fn
        self.name = name
        self._jitted: Callable[..., tuple] | None = None

    def __call__(self, *xs: Any) -> tuple:
        import jax

        # traced with jax's default types, as ``host`` runs it: an env written for them
        # (gymnax's) mixes int32 state with 64-bit literals otherwise
        xs = tuple(_narrow(x) for x in xs)
        with jax.enable_x64(False):
            return self.fn(*xs)

    def host(self, *xs: Any) -> tuple[np.ndarray, ...]:
        import jax

        if self._jitted is None:
            self._jitted = jax.jit(self.fn)
        args = [_narrow(np.asarray(x)) for x in xs]
        with jax.enable_x64(False):
            return tuple(np.asarray(o) for o in self._jitted(*args))

    def __repr__(self) -> str:
        return f"PureFn({self.name})"


def _narrow(x: Any) -> Any:
    """``x`` (a numpy array or a traced jax value) in 32 bits where it is in 64."""
    if x.dtype == np.int64:
        return x.astype(np.int32)
    if x.dtype == np.float64:
        return x.astype(np.float32)
    return x


class EpisodeReturns:
    """Host-side episode bookkeeping for a pure env (what a ``VectorEnv`` counts as it steps)."""

    def __init__(self, env_id: str, num_envs: int) -> None:
        self.env_id = env_id
        self.num_envs = num_envs
        self.episodes = EpisodeTally(num_envs)

    def record(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Add one iteration's ``(T, num_envs)`` rewards and dones."""
        self.episodes.add_steps(np.asarray(reward), np.asarray(done, dtype=bool))
        return np.zeros((), bool)

    def completed_returns(self) -> np.ndarray:
        return self.episodes.completed_returns()

    def completed_lengths(self) -> np.ndarray:
        return self.episodes.completed_lengths()

    def state_dict(self) -> dict[str, Any]:
        return {"env_id": self.env_id, **self.episodes.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("env_id") != self.env_id:
            raise EnvError(f"{self.env_id}: saved env state is for {state.get('env_id')!r}")
        self.episodes.load_state_dict(state)

    def close(self) -> None:
        pass


class PureEnv:
    """A :mod:`timerl.rl.envs.jax_envs` env whose reset and step are pure ops of the program."""

    pure = True

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> None:
        import jax
        import jax.numpy as jnp

        jenv = make_jax_env(env_id, num_envs, seed, **kwargs)
        self.jenv = jenv
        self.env_id = env_id
        self.num_envs = num_envs
        self.seed = seed
        self.obs_shape = tuple(jenv.obs_shape)
        self.discrete = jenv.discrete
        self.num_actions = jenv.num_actions
        self.action_shape = tuple(jenv.action_shape)
        self.image_layout = jenv.image_layout
        self.vec = EpisodeReturns(env_id, num_envs)
        params = jenv.params

        def reset_key() -> Any:
            # Synthetic-v0 takes the integer seed itself (its numpy env's trajectories); the
            # others a key made from it
            return seed if env_id == "Synthetic-v0" else jax.random.key(seed)

        with jax.enable_x64(False):
            state, _ = jax.eval_shape(lambda: jenv.reset(reset_key(), params))
        leaves, treedef = jax.tree_util.tree_flatten(state)
        keyed = [jnp.issubdtype(x.dtype, jax.dtypes.prng_key) for x in leaves]
        with jax.enable_x64(False):
            raw = [
                jax.eval_shape(jax.random.key_data, x) if k else x
                for x, k in zip(leaves, keyed, strict=True)
            ]
        # (shape, dtype) of each leaf as the program holds it
        self.state_spec = [(tuple(x.shape), np.dtype(x.dtype)) for x in raw]
        spec = self.state_spec
        n = len(spec)

        def flat(state: Any) -> list[Any]:
            out = jax.tree_util.tree_leaves(state)
            out = [jax.random.key_data(x) if k else x for x, k in zip(out, keyed, strict=True)]
            return [jnp.asarray(x).astype(d) for x, (_, d) in zip(out, spec, strict=True)]

        def unflat(xs: tuple) -> Any:
            leaves = [
                jax.random.wrap_key_data(x) if k else x for x, k in zip(xs, keyed, strict=True)
            ]
            return jax.tree_util.tree_unflatten(treedef, leaves)

        def reset() -> tuple:
            state, obs = jenv.reset(reset_key(), params)
            return (*flat(state), jnp.asarray(obs).astype(jnp.float32))

        def step(*xs: Any) -> tuple:
            state = unflat(xs[:n])
            state, obs, reward, done = jenv.step(state, xs[n], params)
            return (
                *flat(state),
                jnp.asarray(obs).astype(jnp.float32),
                jnp.asarray(reward).astype(jnp.float32),
                jnp.asarray(done).astype(bool),
            )

        self._reset = PureFn(reset, f"{env_id}.reset")
        self._step = PureFn(step, f"{env_id}.step")

    @property
    def batch_obs_shape(self) -> tuple[int, ...]:
        return (self.num_envs, *self.obs_shape)

    def state_placeholders(self, domain: tuple[Dim, ...]) -> list[RecurrentTensor]:
        """One recurrent tensor per leaf of the env's state, over ``domain``."""
        return [
            RecurrentTensor.placeholder(shape, dtype.name, domain, name=f"env_state{k}")
            for k, (shape, dtype) in enumerate(self.state_spec)
        ]

    def _results(self, parts: list[tuple[tuple[int, ...], np.dtype, str]]) -> list[Result]:
        return [Result(shape, dtype, f"{self.env_id}.{what}") for shape, dtype, what in parts]

    def _state_parts(self) -> list[tuple[tuple[int, ...], np.dtype, str]]:
        return [(s, d, f"state{k}") for k, (s, d) in enumerate(self.state_spec)]

    def reset_state(self) -> tuple[list[RecurrentTensor], RecurrentTensor]:
        """``(state leaves, obs)`` of fresh episodes (a pure op over no dims)."""
        parts = [*self._state_parts(), (self.batch_obs_shape, np.dtype("float32"), "obs")]
        *state, obs = pure_call(
            self._reset, results=self._results(parts), name=f"{self.env_id}.reset"
        )
        return state, obs

    def step_state(
        self, state: list[RecurrentTensor], action: RecurrentTensor
    ) -> tuple[list[RecurrentTensor], RecurrentTensor, RecurrentTensor, RecurrentTensor]:
        """``(next state leaves, next_obs, reward, done)``; ended episodes auto-reset."""
        want = (self.num_envs, *self.action_shape)
        if tuple(action.shape) != want:
            raise EnvError(
                f"{self.env_id}.step: actions must have shape {want}, got {tuple(action.shape)}"
            )
        if len(state) != len(self.state_spec):
            raise EnvError(
                f"{self.env_id}.step: the state has {len(self.state_spec)} leaves, got {len(state)}"
            )
        parts = [
            *self._state_parts(),
            (self.batch_obs_shape, np.dtype("float32"), "obs"),
            ((self.num_envs,), np.dtype("float32"), "reward"),
            ((self.num_envs,), np.dtype(bool), "done"),
        ]
        *nxt, obs, reward, done = pure_call(
            self._step, *state, action, results=self._results(parts), name=f"{self.env_id}.step"
        )
        return nxt, obs, reward, done

    def track(self, reward: RecurrentTensor, done: RecurrentTensor) -> None:
        """Count finished episodes on the host from one iteration's ``(T, B)`` slices."""
        host_call(
            self.vec.record, reward, done, result=Result((), bool), name=f"{self.env_id}.episodes"
        )

    # the host env's interface, for algorithms that step an env outside the program's state
    def reset(self) -> RecurrentTensor:
        raise EnvError(self._unsupported())

    def step(self, action: RecurrentTensor, *, full: bool = False) -> tuple:
        raise EnvError(self._unsupported())

    def _unsupported(self) -> str:
        return (
            f'{self.env_id} with env backend "jax" keeps its state in the program: only '
            "algorithms that carry it (ppo, reinforce, a2c) can use it; choose env backend "
            '"gymnasium" for this one'
        )

    def state_dict(self) -> dict[str, Any]:
        return self.vec.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.vec.load_state_dict(state)

    def close(self) -> None:
        pass
