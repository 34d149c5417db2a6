"""A :class:`VectorEnv` whose envs are split across Ray actors (``pip install "timerl[ray]"``).

Only the environment is distributed: the compiled program still calls ``env.step(actions)``
once per time step and sees one batch. Here that call sends each actor its slice of the
actions, all at once, then gathers every slice's result together, so the actors step
concurrently. Each actor answers with one packed float32 array (obs, reward, terminated,
truncated and, when an episode ended, the final obs, side by side), never one object per env.

The per-step cost of Ray, not the env, is what limits the speed-up of a few workers on a
small machine: an ordinary actor call (submit, schedule, object store, ``ray.get``) costs a few
milliseconds a step. So by default the actors' ``step`` is run as a Ray Compiled Graph
(``ray.dag``, compiled once, on the first step): its actors loop waiting on shared-memory
channels, and one step costs a channel write and read per actor. ``compiled=False`` (or a
Ray that cannot compile the graph) uses plain actor calls.

Each actor holds an ordinary ``make_env`` batch built with the seeds its envs have in the
single-process batch (gymnasium ids: ``seed + first index``; ``Synthetic-v0``: the same seed,
envs numbered from the first index), so the same seed gives the same trajectories with 0, 1 or
N workers.

Faults: actors are created with ``max_restarts``; when one dies, Ray restarts it, which
re-creates its envs from their seeds. The step that was lost is not replayed: the dead
actor's envs end their episodes there (``done``, truncated, reward 0, ``final_obs`` the last
observation seen) and start fresh ones, so the program keeps running and no episode mixes two
simulators. Those cut episodes are left out of the episode statistics. A compiled graph does
not survive the death of one of its actors: it is torn down, the live actors' results of that
step are fetched by plain calls (each actor keeps its last result and counts its steps, so a
step is never run twice nor skipped), and the graph is compiled again on the next step.

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
# What a restarted actor answers to step: its envs were never reset, the driver starts them over.
_RESTARTED = np.empty((0, 0), dtype=np.float32)


def pack_step(
    obs: np.ndarray,
    reward: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    final_obs: np.ndarray | None,
) -> np.ndarray:
    """One float32 array ``(n, D + 3 [+ D])`` for a slice's step: one object to serialise and
    send instead of five. Lossless: obs and rewards are float32 already, flags are 0/1."""
    n = len(reward)
    cols = [
        np.asarray(obs, np.float32).reshape(n, -1),
        np.asarray(reward, np.float32).reshape(n, 1),
        np.asarray(terminated, np.float32).reshape(n, 1),
        np.asarray(truncated, np.float32).reshape(n, 1),
    ]
    if final_obs is not None:
        cols.append(np.asarray(final_obs, np.float32).reshape(n, -1))
    return np.concatenate(cols, axis=1)


def unpack_steps(
    parts: list[np.ndarray], obs_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The whole batch's ``(obs, reward, terminated, truncated, final_obs)`` from the slices'
    packed arrays (in batch order); obs are flat rows, the caller reshapes them."""
    d = obs_size
    finals = any(p.shape[1] > d + 3 for p in parts)
    if finals:  # a slice without ended episodes stands in its obs for the final obs
        parts = [p if p.shape[1] > d + 3 else np.concatenate([p, p[:, :d]], axis=1) for p in parts]
    # a copy: the arrays a compiled graph returns may live in a buffer it reuses
    batch = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
    return (
        batch[:, :d],
        batch[:, d],
        batch[:, d + 1] != 0,
        batch[:, d + 2] != 0,
        batch[:, d + 3 :] if finals else None,
    )


class _Worker:
    """One actor: an ordinary vector env over a slice of the batch.

    It counts its steps since the last reset and keeps the last result, so that after a
    compiled graph breaks the driver can tell whether this actor ran the lost step."""

    def __init__(
        self, env_id: str, num_envs: int, seed: int, backend: str, kwargs: dict[str, Any]
    ) -> None:
        self.env = make_vector_env(env_id, num_envs=num_envs, seed=seed, backend=backend, **kwargs)
        self.steps = 0
        self.last = _RESTARTED

    def pid(self) -> int:
        return os.getpid()

    def reset(self) -> np.ndarray:
        self.steps, self.last = 0, _RESTARTED
        return self.env.reset()

    def step(self, actions: np.ndarray) -> np.ndarray:
        """One step of the slice, packed (:func:`pack_step`); ``_RESTARTED`` (no rows) when
        its envs were never reset: this actor is a restart after a crash."""
        env = self.env
        if env._needs_reset:
            return _RESTARTED
        obs, reward, _ = env.step(actions)
        self.steps += 1
        self.last = pack_step(obs, reward, env.terminated, env.truncated, env.final_obs)
        return self.last

    def last_step(self) -> tuple[int, np.ndarray]:
        """(steps since the last reset, the last step's packed result)."""
        return self.steps, self.last

    def state_dict(self) -> dict[str, Any]:
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; True when episodes continue (False: they restart at the next reset)."""
        self.env.load_state_dict(state)
        self.steps, self.last = 0, _RESTARTED
        return self.env._needs_reset == bool(state["needs_reset"])

    def close(self) -> None:
        self.env.close()


class RayVectorEnv(VectorEnv):
    """``num_envs`` envs of ``env_id`` split as evenly as possible over ``workers`` actors;
    ``compiled`` steps them through a Ray Compiled Graph (False: plain actor calls)."""

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
        compiled: bool = True,
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
        self._dag: Any = None
        self._compiled = bool(compiled)
        self._sent = [0] * int(workers)  # steps sent to each worker since its last reset
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

    @property
    def compiled(self) -> bool:
        """Whether steps go through a compiled graph (False: plain actor calls, as asked or
        because this Ray could not compile one)."""
        return self._compiled

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
        self._sent = [0] * len(self._actors)
        return np.concatenate([self._recover(k) if o is _DEAD else o for k, o in outs])

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        self._sent = [n + 1 for n in self._sent]
        slices = [actions[lo:hi] for lo, hi in self._bounds]
        if self._graph() is not None:
            outs = self._step_compiled(slices)
        else:
            outs = self._gather(
                [a.step.remote(x) for a, x in zip(self._actors, slices, strict=True)], what="step"
            )
        parts = []
        lost = []
        for k, out in outs:
            lo, hi = self._bounds[k]
            if out is _DEAD or len(out) == 0:  # the worker died (or was restarted)
                first = self._recover(k, "died during step" if out is _DEAD else "restarted")
                n = hi - lo
                last = self.last_obs[lo:hi] if self.last_obs is not None else first
                zeros = np.zeros(n, np.float32)
                out = pack_step(first, zeros, zeros, np.ones(n, np.float32), last)
                lost.extend(range(lo, hi))
            parts.append(out)
        self._lost = np.asarray(lost, dtype=np.int64)
        return unpack_steps(parts, int(np.prod(self.obs_shape, dtype=np.int64)))

    # -- the compiled graph ------------------------------------------------------------
    def _graph(self) -> Any:
        """The compiled graph of the actors' step (compiled on first use), or None for
        plain calls: not wanted, or this Ray could not compile it."""
        if self._dag is None and self._compiled:
            try:
                from ray.dag import InputNode, MultiOutputNode

                with InputNode() as inp:
                    outs = [a.step.bind(inp[k]) for k, a in enumerate(self._actors)]
                    dag = MultiOutputNode(outs)
                self._dag = dag.experimental_compile()
            except Exception as err:  # noqa: BLE001 - any failure: the plain calls still work
                self._compiled = False
                warnings.warn(
                    f"{self.env_id}: Ray could not compile the env workers' step "
                    f"({type(err).__name__}: {err}); stepping with plain actor calls",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return self._dag

    def _drop_graph(self) -> None:
        dag, self._dag = getattr(self, "_dag", None), None
        if dag is not None:
            with contextlib.suppress(Exception):
                dag.teardown()

    def _step_compiled(self, slices: list[np.ndarray]) -> list[tuple[int, Any]]:
        """One step through the compiled graph; when it breaks, the step by plain calls
        for exactly the actors that did not run it."""
        ray = self._ray
        k = 0
        try:
            refs = self._dag.execute(*slices)
            out = []
            for k, ref in enumerate(refs):
                # no time limit, as a plain ray.get: an env step may take long
                out.append((k, ref.get(timeout=-1)))
            return out
        except ray.exceptions.RayTaskError as err:  # the env itself failed
            self._drop_graph()
            raise self._task_failure(k, "step", err) from None
        except Exception:  # noqa: BLE001 - an actor died: the graph is broken, find out who
            self._drop_graph()
        done: dict[int, Any] = {}
        for k, a in enumerate(self._actors):
            try:
                steps, last = ray.get(a.last_step.remote())
            except ray.exceptions.RayActorError:
                continue  # dead or restarting: its plain step call below says which
            if steps == self._sent[k]:
                done[k] = last  # it ran this step before the graph broke
        todo = [k for k in range(len(self._actors)) if k not in done]
        redo = self._gather([self._actors[k].step.remote(slices[k]) for k in todo], what="step")
        done.update((todo[i], out) for i, out in redo)
        return sorted(done.items(), key=lambda item: item[0])

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
                raise self._task_failure(k, what, err) from None
        return out

    def _task_failure(self, k: int, what: str, err: Exception) -> EnvError:
        """The error to raise for an exception inside worker ``k``: the env's own EnvError as
        one process would raise it, any other named with the worker."""
        cause = getattr(err, "cause", None) or err
        if isinstance(cause, EnvError):
            return cause
        return EnvError(
            f"{self.env_id}: env worker {k} failed in {what}: {type(cause).__name__}: {cause}"
        )

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
        self._drop_graph()  # a graph over the dead actor cannot run again
        for _ in range(self._max_restarts + 1):
            try:
                first = ray.get(self._actors[k].reset.remote())
            except ray.exceptions.ActorUnavailableError:
                continue  # still restarting
            except ray.exceptions.RayActorError as err:
                raise EnvError(
                    f"{self.env_id}: env worker {k} (envs {lo}..{hi - 1}) died and could not be "
                    f"restarted (its restarts are used up): {err}"
                ) from err
            self._sent[k] = 0
            return first
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
        self._sent = [0] * len(self._actors)
        return all(exact)

    def close(self) -> None:
        """Stop the actors (and the local Ray this module started, once no env needs it)."""
        ray = getattr(self, "_ray", None)
        if ray is not None:
            self._drop_graph()
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
