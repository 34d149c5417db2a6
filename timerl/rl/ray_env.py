"""A :class:`VectorEnv` whose envs are split across Ray actors (``pip install "timerl[ray]"``).

Only the environment is distributed: the compiled program still calls ``env.step(actions)``
once per time step and sees one batch. Here that call sends each actor its slice of the
actions, all at once, then gathers every slice's arrays together (``ray.get`` on all the
futures), so the actors step concurrently; observations travel as one numpy array per actor
through Ray's object store, never one object per env.

Each actor holds an ordinary ``make_env`` batch built with the seeds its envs have in the
single-process batch (gymnasium ids: ``seed + first index``; ``Synthetic-v0``: the same seed,
envs numbered from the first index), so the same seed gives the same trajectories with 0, 1 or
N workers.

Faults: actors are created with ``max_restarts``; when one dies, Ray restarts it, which
re-creates its envs from their seeds. The step that was lost is not replayed: the dead
actor's envs end their episodes there (``done``, truncated, reward 0, ``final_obs`` the last
observation seen) and start fresh ones, so the program keeps running and no episode mixes two
simulators. Those cut episodes are left out of the episode statistics.

``workers=0`` means no Ray at all. :func:`env_workers` sets the number of workers for every
env built inside it (``timerl train --workers N`` uses it around the algorithm's builder).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np

from timerl.errors import EnvError
from timerl.rl.envs import make_env as make_vector_env
from timerl.rl.synthetic import ENV_ID as SYNTHETIC_ID
from timerl.rl.vector_env import _NATIVE, VectorEnv

#: (workers, ray_address) for envs built without explicit ``workers=``.
_PLACEMENT: ContextVar[tuple[int, str | None]] = ContextVar("timerl_env_workers", default=(0, None))
# Ray sessions this module started (shut down when the last env that needed one closes).
_OWNED = {"ray": False, "users": 0}


@contextlib.contextmanager
def env_workers(workers: int = 0, ray_address: str | None = None) -> Iterator[None]:
    """Envs made inside this block (without their own ``workers=``) run on ``workers`` Ray
    actors, joining the cluster at ``ray_address`` (or a local Ray when None)."""
    if int(workers) < 0:
        raise EnvError(f"workers must be 0 (no Ray) or more, got {workers}")
    token = _PLACEMENT.set((int(workers), ray_address))
    try:
        yield
    finally:
        _PLACEMENT.reset(token)


def placement(workers: int | None, ray_address: str | None) -> tuple[int, str | None]:
    """The explicit settings, or the enclosing :func:`env_workers` block's."""
    default_workers, default_address = _PLACEMENT.get()
    w = default_workers if workers is None else int(workers)
    return w, ray_address if ray_address is not None else default_address


def require_ray() -> Any:
    """Import ray, or fail saying which extra installs it."""
    try:
        import ray
    except ModuleNotFoundError:
        raise EnvError(
            'running envs on Ray workers (--workers N) needs ray: pip install "timerl[ray]"'
        ) from None
    return ray


def ensure_ray(cpus: int, address: str | None) -> bool:
    """Start a local Ray (or join ``address``) unless one is running; True if started here."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(
            num_cpus=max(int(cpus), os.cpu_count() or 1),
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    return True


def _slice_spec(
    env_id: str, backend: str, seed: int, first: int, kwargs: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """(seed, kwargs) of the slice of envs starting at index ``first`` of the whole batch."""
    if backend != "gymnasium":
        raise EnvError(
            f"{env_id}: env backend {backend!r} cannot be split over Ray workers "
            "(envpool already steps its batch on threads); use --workers 0"
        )
    if env_id == SYNTHETIC_ID:
        return seed, {**kwargs, "first_env": int(kwargs.get("first_env", 0)) + first}
    if env_id in _NATIVE:
        raise EnvError(f"{env_id}: this timerl env does not say how to split it over workers")
    # gymnasium's vector env seeds env k with seed + k
    return seed + first, dict(kwargs)


_DEAD = object()  # what _gather yields for a worker whose actor died


class _Worker:
    """One actor: an ordinary vector env over a slice of the batch."""

    def __init__(
        self, env_id: str, num_envs: int, seed: int, backend: str, kwargs: dict[str, Any]
    ) -> None:
        self.env = make_vector_env(env_id, num_envs=num_envs, seed=seed, backend=backend, **kwargs)

    def pid(self) -> int:
        return os.getpid()

    def reset(self) -> np.ndarray:
        return self.env.reset()

    def step(self, actions: np.ndarray) -> tuple[Any, ...] | None:
        """One step of the slice; None when its envs were never reset: this actor is a
        restart after a crash, and the driver starts its episodes over."""
        env = self.env
        if env._needs_reset:
            return None
        obs, reward, _ = env.step(actions)
        return obs, reward, env.terminated, env.truncated, env.final_obs

    def state_dict(self) -> dict[str, Any]:
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; True when episodes continue (False: they restart at the next reset)."""
        self.env.load_state_dict(state)
        return self.env._needs_reset == bool(state["needs_reset"])

    def close(self) -> None:
        self.env.close()


class RayVectorEnv(VectorEnv):
    """``num_envs`` envs of ``env_id`` split as evenly as possible over ``workers`` actors."""

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        seed: int = 0,
        backend: str = "gymnasium",
        *,
        workers: int = 1,
        ray_address: str | None = None,
        max_restarts: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(env_id, num_envs, seed)
        if int(workers) < 1:
            raise EnvError(f"{env_id}: a Ray env needs at least 1 worker, got {workers}")
        if int(workers) > self.num_envs:
            raise EnvError(
                f"{env_id}: {workers} workers for {self.num_envs} envs; "
                "use at most one worker per env"
            )
        specs = [
            (int(part[0]), int(part[-1]) + 1)
            for part in np.array_split(np.arange(self.num_envs), int(workers))
        ]
        slices = [
            (lo, hi, *_slice_spec(env_id, backend, self.seed, lo, kwargs)) for lo, hi in specs
        ]
        # Describe the env (and raise a bad id or keyword here, before any Ray process).
        probe = make_vector_env(env_id, num_envs=1, seed=seed, backend=backend, **kwargs)
        for name in (
            "obs_shape",
            "discrete",
            "num_actions",
            "action_shape",
            "action_dtype",
            "action_low",
            "action_high",
        ):
            setattr(self, name, getattr(probe, name))
        probe.close()
        ray = require_ray()
        started = ensure_ray(int(workers), ray_address)
        if started:
            _OWNED["ray"] = True
        if _OWNED["ray"]:
            _OWNED["users"] += 1
        self._owns = _OWNED["ray"]
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < int(workers):
            self.close()
            raise EnvError(
                f"{env_id}: {workers} env workers need {workers} CPUs; the Ray cluster has {cpus:g}"
            )
        self._ray = ray
        self._max_restarts = int(max_restarts)
        self._bounds = [(lo, hi) for lo, hi, _, _ in slices]
        remote = ray.remote(_Worker).options(
            num_cpus=1, max_restarts=int(max_restarts), max_task_retries=0
        )
        self._actors = [remote.remote(env_id, hi - lo, s, backend, kw) for lo, hi, s, kw in slices]
        #: (worker index, error text) of every worker lost and restarted
        self.recoveries: list[tuple[int, str]] = []
        self._lost: np.ndarray | None = None

    @property
    def workers(self) -> int:
        return len(self._actors)

    def worker_pids(self) -> list[int]:
        """Process ids of the actors (for monitoring, and for tests that kill one)."""
        return list(self._ray.get([a.pid.remote() for a in self._actors]))

    # -- the contract ------------------------------------------------------------------
    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`VectorEnv.step`; episodes cut by a lost worker are not counted."""
        self._lost = None
        obs, reward, done = super().step(actions)
        if self._lost is not None and len(self._lost):
            ended = np.flatnonzero(done)
            keep = ~np.isin(ended, self._lost)
            n = len(ended)
            self._done_returns[-n:] = [
                r for r, k in zip(self._done_returns[-n:], keep, strict=True) if k
            ]
            self._done_lengths[-n:] = [
                x for x, k in zip(self._done_lengths[-n:], keep, strict=True) if k
            ]
        return obs, reward, done

    def _reset_batch(self) -> np.ndarray:
        outs = self._gather([a.reset.remote() for a in self._actors], what="reset")
        return np.concatenate([self._recover(k) if o is _DEAD else o for k, o in outs])

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        futures = [
            a.step.remote(actions[lo:hi])
            for a, (lo, hi) in zip(self._actors, self._bounds, strict=True)
        ]
        parts = []
        lost = []
        for k, out in self._gather(futures, what="step"):
            lo, hi = self._bounds[k]
            if out is None or out is _DEAD:  # the worker died (or was restarted)
                first = self._recover(k, "died during step" if out is _DEAD else "restarted")
                n = hi - lo
                last = self.last_obs[lo:hi] if self.last_obs is not None else first
                out = (first, np.zeros(n, np.float32), np.zeros(n, bool), np.ones(n, bool), last)
                lost.extend(range(lo, hi))
            parts.append(out)
        self._lost = np.asarray(lost, dtype=np.int64)
        obs = np.concatenate([p[0] for p in parts])
        final = None
        if any(p[4] is not None for p in parts):
            final = np.concatenate([p[0] if p[4] is None else p[4] for p in parts])
        return (
            obs,
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
            np.concatenate([p[3] for p in parts]),
            final,
        )

    def _gather(self, futures: list[Any], what: str) -> list[tuple[int, Any]]:
        """Every future's value in worker order; ``_DEAD`` for a worker that died."""
        ray = self._ray
        try:
            return list(enumerate(ray.get(futures)))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
            pass  # find out which workers failed, and how
        out = []
        for k, f in enumerate(futures):
            try:
                out.append((k, ray.get(f)))
            except ray.exceptions.RayActorError:
                out.append((k, _DEAD))  # Ray restarts it
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None) or err
                if isinstance(cause, EnvError):
                    raise cause from None  # as the env in one process would raise it
                raise EnvError(
                    f"{self.env_id}: env worker {k} failed in {what}: "
                    f"{type(cause).__name__}: {cause}"
                ) from err
        return out

    def _recover(self, k: int, why: str = "died during reset") -> np.ndarray:
        """Wait for Ray to restart worker ``k`` (new envs from their seeds); reset them."""
        ray = self._ray
        lo, hi = self._bounds[k]
        self.recoveries.append((k, why))
        warnings.warn(
            f"{self.env_id}: env worker {k} (envs {lo}..{hi - 1}) {why}; its episodes start over",
            RuntimeWarning,
            stacklevel=3,
        )
        for _ in range(self._max_restarts + 1):
            try:
                return ray.get(self._actors[k].reset.remote())
            except ray.exceptions.ActorUnavailableError:
                continue  # still restarting
            except ray.exceptions.RayActorError as err:
                raise EnvError(
                    f"{self.env_id}: env worker {k} (envs {lo}..{hi - 1}) died and could not be "
                    f"restarted (its restarts are used up): {err}"
                ) from err
        raise EnvError(f"{self.env_id}: env worker {k} (envs {lo}..{hi - 1}) did not come back")

    # -- state -------------------------------------------------------------------------
    def _sim_state(self) -> dict[str, Any]:
        states = self._ray.get([a.state_dict.remote() for a in self._actors])
        return {"bounds": [list(b) for b in self._bounds], "slices": states}

    def _load_sim_state(self, state: dict[str, Any]) -> bool:
        bounds = [tuple(b) for b in state.get("bounds", [])]
        if bounds != self._bounds:
            saved = f"{len(bounds)} Ray workers" if bounds else "no Ray workers"
            raise EnvError(
                f"{self.env_id}: the env state was saved with {saved}, this env has "
                f"{self.workers}; resume with the same number of workers"
            )
        exact = self._ray.get(
            [
                a.load_state_dict.remote(s)
                for a, s in zip(self._actors, state["slices"], strict=True)
            ]
        )
        return all(exact)

    def close(self) -> None:
        """Stop the actors (and the local Ray this module started, once no env needs it)."""
        ray = getattr(self, "_ray", None)
        if ray is not None:
            for a in self._actors:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
            self._actors = []
        if getattr(self, "_owns", False):
            self._owns = False
            _OWNED["users"] -= 1
            if _OWNED["users"] <= 0 and _OWNED["ray"]:
                _OWNED["ray"] = False
                require_ray().shutdown()
        super().close()
