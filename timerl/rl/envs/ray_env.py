"""A :class:`VectorEnv` whose envs are split across Ray actors (``pip install "timerl[ray]"``).

Only the environment is distributed: the compiled program still calls ``env.step(actions)``
once per time step and sees one batch. Here that call sends each actor its slice of the
actions, all at once, then gathers every slice's result together, so the actors step
concurrently. Each actor answers with one packed float32 array (obs, reward, terminated,
truncated and, when an episode ended, the final obs, side by side), never one object per env.

The per-step cost of Ray, not the env, is what limits the speed-up of a few workers on a
small machine: an ordinary actor call (submit, schedule, object store, ``ray.get``) costs a few
milliseconds a step. So each actor on the driver's node also serves its steps over a Unix
socket of its own (authenticated with a key made per env; a blocking read in a thread of the
actor): one step is then a send and a receive per actor, a fraction of a millisecond. The
socket carries raw array bytes, not pickles: the actions as the driver's dtype, the packed step
behind a 4-byte tag (``OK``, or ``ERR`` and a pickled exception); pickling a small array costs
more than sending it. Actors on
other nodes, or ``direct=False``, use plain actor calls (the socket's thread steps the env, so
an env that must run on its process's main thread needs ``direct=False``). (Ray Compiled Graphs cut the round
trip too, but their actors and the driver spin on their channels while they wait, a whole
core each, which on a machine with few cores starves the envs they should run.)

Each actor holds an ordinary ``make_env`` batch built with the seeds its envs have in the
single-process batch (gymnasium ids: ``seed + first index``; ``Synthetic-v0``: the same seed,
envs numbered from the first index), so the same seed gives the same trajectories with 0, 1 or
N workers.

Faults: actors are created with ``max_restarts``; when one dies, Ray restarts it, which
re-creates its envs from their seeds. The step that was lost is not replayed: the dead
actor's envs end their episodes there (``done``, truncated, reward 0, ``final_obs`` the last
observation seen) and start fresh ones, so the program keeps running and no episode mixes two
simulators. Those cut episodes are left out of the episode statistics. A dead actor's
socket closes, which is how the driver learns of the death; the restarted actor serves a
new socket.

``workers=0`` means no Ray at all. :func:`env_workers` sets the number of workers for every
env built inside it (``timerl train --workers N`` uses it around the algorithm's builder).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy as np

from timerl.errors import EnvError
from timerl.rl.envs.protocol import _NATIVE, VectorEnv
from timerl.rl.envs.synthetic import ENV_ID as SYNTHETIC_ID
from timerl.rl.envs.vector import make_env as make_vector_env

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
    """Start a local Ray (or join ``address``) unless one is running; True if started here.

    A Ray already running in this process is used as it is, unless ``address`` names
    another cluster: Ray joins one cluster per process, so that is an error rather than a
    silent run on the wrong one."""
    ray = require_ray()
    if ray.is_initialized():
        running = ray.get_runtime_context().gcs_address
        if address and address != "auto" and not _same_address(address, running):
            raise EnvError(
                f"Ray is already running in this process, on the cluster at {running}; it "
                f"cannot also join {address}: call ray.shutdown() first, or leave the "
                "address out to use the running one"
            )
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


def _same_address(given: str, running: str) -> bool:
    """Whether ``given`` (``host:port``) names the cluster at ``running`` (Ray's GCS address,
    ``node-ip:port``): the same address, or this machine's (``localhost``) at its port."""
    if given == running:
        return True
    host, _, port = given.rpartition(":")
    return host in ("localhost", "127.0.0.1") and port == running.rpartition(":")[2]


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
# how long a worker Ray is restarting may take to serve calls again
RESTART_SECONDS = 60.0
# The tag in front of a socket reply: 4 bytes, so the float32 payload behind it stays aligned.
_OK, _ERR = b"OK\0\0", b"ERR\0"


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
    # a copy: an array from ray.get is a read-only view of the object store
    batch = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
    return (
        batch[:, :d],
        batch[:, d],
        batch[:, d + 1] != 0,
        batch[:, d + 2] != 0,
        batch[:, d + 3 :] if finals else None,
    )


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

    def step(self, actions: np.ndarray) -> np.ndarray:
        """One step of the slice, packed (:func:`pack_step`); ``_RESTARTED`` (no rows) when
        its envs were never reset: this actor is a restart after a crash."""
        env = self.env
        if env._needs_reset:
            return _RESTARTED
        obs, reward, _ = env.step(actions)
        return pack_step(obs, reward, env.terminated, env.truncated, env.final_obs)

    def serve(self, authkey: bytes, action_dtype: str) -> tuple[str, str]:
        """Listen for one driver on a fresh Unix socket; (this node's id, the socket path).

        A thread accepts the driver, removes the socket file (no one else may connect) and
        then answers every actions message (raw bytes of ``action_dtype``) with :meth:`step`'s
        array behind ``_OK``, or ``_ERR`` and the pickled exception."""
        import ray

        folder = tempfile.mkdtemp(prefix="timerl-env-")
        path = os.path.join(folder, "step.sock")
        listener = Listener(path, family="AF_UNIX", authkey=authkey)
        dtype = np.dtype(action_dtype)
        threading.Thread(target=self._serve, args=(listener, folder, dtype), daemon=True).start()
        return ray.get_runtime_context().get_node_id(), path

    def _serve(self, listener: Listener, folder: str, dtype: np.dtype) -> None:
        try:
            conn = listener.accept()
        except OSError:
            return
        finally:
            listener.close()  # unlinks the socket
            shutil.rmtree(folder, ignore_errors=True)
        shape = (self.env.num_envs, *self.env.action_shape)
        with conn:
            while True:
                try:
                    actions = np.frombuffer(conn.recv_bytes(), dtype=dtype).reshape(shape)
                except (EOFError, OSError):
                    return  # the driver closed the env
                try:
                    reply = _OK + self.step(actions).tobytes()
                except Exception as err:  # noqa: BLE001 - the driver raises it
                    try:
                        reply = _ERR + pickle.dumps(err)
                    except Exception:  # noqa: BLE001 - an exception that does not pickle
                        reply = _ERR + pickle.dumps(RuntimeError(f"{type(err).__name__}: {err}"))
                try:
                    conn.send_bytes(reply)
                except (EOFError, OSError):
                    return

    def state_dict(self) -> dict[str, Any]:
        return self.env.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; True when episodes continue (False: they restart at the next step)."""
        self.env.load_state_dict(state)
        restarts = self.env._restart_on_step
        return not restarts and self.env._needs_reset == bool(state["needs_reset"])

    def close(self) -> None:
        self.env.close()


class RayVectorEnv(VectorEnv):
    """``num_envs`` envs of ``env_id`` split as evenly as possible over ``workers`` actors;
    ``direct`` steps the actors on this node over their own sockets (False: plain actor
    calls)."""

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
        direct: bool = True,
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
            "obs_dtype",  # uint8 frames stay uint8 (the float32 transport holds them exactly)
            "image_layout",
        ):
            setattr(self, name, getattr(probe, name))
        probe.close()
        # what _prepare_actions hands to _step_batch, and the socket's actions dtype
        self._action_dtype = np.dtype(np.int64 if self.discrete else self.action_dtype)
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
        self._direct = bool(direct)
        self._authkey = os.urandom(32)
        # per worker: its socket, None (connect at the next step) or False (plain calls)
        self._conns: list[Connection | None | bool] = [None] * int(workers)
        self._bounds = [(lo, hi) for lo, hi, _, _ in slices]
        remote = ray.remote(_Worker).options(
            num_cpus=1, max_restarts=int(max_restarts), max_task_retries=0
        )
        self._actors = [remote.remote(env_id, hi - lo, s, backend, kw) for lo, hi, s, kw in slices]
        #: (worker index, error text) of every worker lost and restarted
        self.recoveries: list[tuple[int, str]] = []
        self._lost: np.ndarray | None = None
        # (actions, what _send_all returned) of a step started by step_async
        self._pending: tuple[np.ndarray, tuple[dict, dict]] | None = None

    @property
    def workers(self) -> int:
        return len(self._actors)

    @property
    def direct(self) -> list[bool]:
        """Per worker, whether its steps go over its socket (False: plain actor calls)."""
        return [bool(c) for c in self._conns]

    def worker_pids(self) -> list[int]:
        """Process ids of the actors (for monitoring, and for tests that kill one)."""
        return list(self._ray.get([a.pid.remote() for a in self._actors]))

    # -- the contract ------------------------------------------------------------------
    def step_async(self, actions: Any) -> None:
        """Send this step's actions to the workers and return at once; the next
        :meth:`step` with the same actions waits for the results. The compiled program calls
        it first when it has work that does not need the step (``schedule/overlap.py``)."""
        if self._needs_reset:
            raise EnvError(f"{self.env_id}: call reset() before step_async()")
        if self._pending is not None:
            raise EnvError(f"{self.env_id}: step_async() twice without a step() between")
        acts = self._prepare_actions(actions)
        self._pending = (acts, self._send_all(self._slices(acts)))

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`VectorEnv.step`; episodes cut by a lost worker are not counted."""
        self._lost = None
        obs, reward, done = super().step(actions)
        if self._lost is not None and len(self._lost):
            ended = np.flatnonzero(done)
            keep = ~np.isin(ended, self._lost)
            n = len(ended)
            tally = self.episodes
            tally.done_returns[-n:] = [
                r for r, k in zip(tally.done_returns[-n:], keep, strict=True) if k
            ]
            tally.done_lengths[-n:] = [
                x for x, k in zip(tally.done_lengths[-n:], keep, strict=True) if k
            ]
        return obs, reward, done

    def _reset_batch(self) -> np.ndarray:
        if self._pending is not None:  # a started step nobody waited for: drain its replies
            pending, self._pending = self._pending, None
            self._receive_all(*pending[1])
        outs = self._gather({k: a.reset.remote() for k, a in enumerate(self._actors)}, what="reset")
        return np.concatenate([self._recover(k) if o is _DEAD else o for k, o in outs])

    def _step_batch(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        pending, self._pending = self._pending, None
        if pending is not None and not np.array_equal(pending[0], actions):
            # the workers took the started step: its replies must not answer a later one,
            # and the driver's view of the episodes is behind theirs
            self._receive_all(*pending[1])
            self._needs_reset = True
            raise EnvError(
                f"{self.env_id}: step() with other actions than step_async()'s; the workers "
                "stepped with the started ones: call reset() before stepping again"
            )
        sent = pending[1] if pending else self._send_all(self._slices(actions))
        outs = self._receive_all(*sent)
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

    def _slices(self, actions: np.ndarray) -> list[np.ndarray]:
        return [actions[lo:hi] for lo, hi in self._bounds]

    # -- sockets ---------------------------------------------------------------------------
    def _connect(self) -> None:
        """Open a socket to every worker that has none (first step, or restarted)."""
        todo = [k for k, c in enumerate(self._conns) if c is None]
        if not todo:
            return
        if not self._direct:
            for k in todo:
                self._conns[k] = False
            return
        ray = self._ray
        here = ray.get_runtime_context().get_node_id()
        for k in todo:
            try:
                node, path = ray.get(
                    self._actors[k].serve.remote(self._authkey, self._action_dtype.str)
                )
                # another node's socket is out of reach: plain calls for that worker
                self._conns[k] = (
                    Client(path, family="AF_UNIX", authkey=self._authkey) if node == here else False
                )
            except ray.exceptions.RayActorError:
                pass  # it died: the step's plain call finds out and recovers it
            except Exception as err:  # noqa: BLE001 - any failure: the plain calls still work
                self._conns[k] = False
                warnings.warn(
                    f"{self.env_id}: env worker {k} cannot step over a socket "
                    f"({type(err).__name__}: {err}); stepping it with plain actor calls",
                    RuntimeWarning,
                    stacklevel=5,
                )

    def _drop(self, k: int) -> None:
        conn, self._conns[k] = self._conns[k], None
        if conn:
            with contextlib.suppress(OSError):
                conn.close()

    def _send_all(self, slices: list[np.ndarray]) -> tuple[dict[int, Any], dict[int, Any]]:
        """Send every worker its slice of the actions; (results known already: ``_DEAD`` for a
        socket that failed, futures of the plain calls). Returns without waiting."""
        self._connect()
        out: dict[int, Any] = {}
        calls: dict[int, Any] = {}
        for k, conn in enumerate(self._conns):
            if conn:
                try:
                    conn.send_bytes(np.ascontiguousarray(slices[k], dtype=self._action_dtype))
                except OSError:
                    out[k] = _DEAD
                    self._drop(k)
            else:
                calls[k] = self._actors[k].step.remote(slices[k])
        return out, calls

    def _receive_all(self, out: dict[int, Any], calls: dict[int, Any]) -> list[tuple[int, Any]]:
        """Every worker's packed step in worker order (``_DEAD`` for one that died)."""
        for k, conn in enumerate(self._conns):
            if conn and k not in out:
                try:
                    got = conn.recv_bytes()
                except (EOFError, OSError):  # the actor's process is gone
                    out[k] = _DEAD
                    self._drop(k)
                    continue
                if got[:4] == _ERR:  # the env raised: drop every socket (unread results
                    for j in range(len(self._conns)):  # must not answer a later step)
                        self._drop(j)
                    raise self._task_failure(k, "step", pickle.loads(got[4:]))
                lo, hi = self._bounds[k]
                packed = np.frombuffer(got, dtype=np.float32, offset=4)
                out[k] = packed.reshape(hi - lo, -1) if packed.size else _RESTARTED
        if calls:
            out.update(self._gather(calls, what="step"))
        return sorted(out.items(), key=lambda item: item[0])

    def _gather(self, futures: dict[int, Any], what: str) -> list[tuple[int, Any]]:
        """``(worker, value)`` per future (keyed by worker), in that order; ``_DEAD`` for a
        worker that died."""
        ray = self._ray
        try:
            return list(zip(futures, ray.get(list(futures.values())), strict=True))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
            pass  # find out which workers failed, and how
        out = []
        for k, f in futures.items():
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
        lo, hi = self._bounds[k]
        self.recoveries.append((k, why))
        warnings.warn(
            f"{self.env_id}: env worker {k} (envs {lo}..{hi - 1}) {why}; its episodes start over",
            RuntimeWarning,
            stacklevel=3,
        )
        self._drop(k)  # the restarted actor serves a new socket
        return self._once_back(k, "reset")

    def _once_back(self, k: int, method: str) -> Any:
        """Call ``method`` of worker ``k`` once Ray has restarted it; an EnvError when it does
        not come back within ``RESTART_SECONDS``.

        A call to an actor still restarting is refused at once, however many restarts are
        left, so the wait is measured in time, not in refusals: counted, a restart that took
        longer on a loaded machine ran out of tries while Ray was still bringing it back."""
        ray = self._ray
        lo, hi = self._bounds[k]
        deadline = time.monotonic() + RESTART_SECONDS
        pause = 0.01
        while True:
            try:
                return ray.get(getattr(self._actors[k], method).remote())
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)  # still restarting
                pause = min(2 * pause, 0.5)
            except ray.exceptions.RayActorError as err:
                raise EnvError(
                    f"{self.env_id}: env worker {k} (envs {lo}..{hi - 1}) died and could not be "
                    f"restarted (its restarts are used up): {err}"
                ) from err
        raise EnvError(
            f"{self.env_id}: env worker {k} (envs {lo}..{hi - 1}) did not come back within "
            f"{RESTART_SECONDS:.0f} s of its restart"
        )

    # -- state -------------------------------------------------------------------------
    def _sim_state(self) -> dict[str, Any]:
        ray = self._ray
        try:
            states = ray.get([a.state_dict.remote() for a in self._actors])
        except ray.exceptions.RayActorError:
            # one died since its last step: ask each again, a restarted one once it is back
            # (its envs then await a reset, which its state says; resuming restarts them)
            states = [self._once_back(k, "state_dict") for k in range(len(self._actors))]
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
            for k in range(len(self._conns)):
                self._drop(k)
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
