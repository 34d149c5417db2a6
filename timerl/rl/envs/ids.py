"""What an environment id names, and how a later process finds the same environment again.

An environment is given as
- an id registered with gymnasium (``"CartPole-v1"``, or one the user registered with
  ``gymnasium.register``), or one of timerl's own (``"Synthetic-v0"``);
- gymnasium's ``"module:EnvId"``: the module is imported first (it registers ``EnvId``, as
  with ``gymnasium.make``); where it registers nothing by that name, ``"module:Name"`` names
  a ``gymnasium.Env`` subclass or a function returning a new env in that module;
- from Python, a ``gymnasium.Env`` subclass or a function returning a new env: it is known
  by ``"module:qualname"`` from then on, which is what the run directory records.

A training run stores :func:`env_record` of its env (``config.json`` and every checkpoint),
so ``timerl eval``, ``export`` and ``train --resume``, in a fresh process, import the module
again (from the folder it was found in) or register the id again before making the env
(:func:`restore_env`).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from timerl.errors import EnvError
from timerl.rl.envs.jax_envs import is_gymnax_id

# "module:qualname" -> the class or factory given from Python in this process (a factory in
# the training script itself, ``__main__``, can only be found here)
_GIVEN: dict[str, Callable[..., Any]] = {}

_SPEC_ID = re.compile(r"[^\w:.-]")  # what gymnasium's EnvSpec ids may not hold


def env_id_of(env: Any, what: str = "env_id") -> str:
    """The id of an environment given as an id, a ``gymnasium.Env`` subclass or a factory.

    ``what`` is how the caller's error names the parameter."""
    if isinstance(env, str):
        if not env:
            raise EnvError(f"{what}: an environment id must not be empty")
        return env
    if _is_env_object(env):
        cls = type(env).__name__
        raise EnvError(
            f"{what}: got an environment object ({cls}); timerl runs num_envs copies of an "
            f"environment, so pass its class ({what}={cls}) or a function that returns a new "
            "one each call"
        )
    if not callable(env):
        raise EnvError(
            f"{what} must be an environment id (a string: 'CartPole-v1', or 'module:EnvId' "
            "for one of your own), a gymnasium.Env subclass, or a function returning a new "
            f"env; got {type(env).__name__} {env!r}"
        )
    module = getattr(env, "__module__", None) or "__main__"
    qualname = getattr(env, "__qualname__", None) or getattr(env, "__name__", None)
    if not qualname:
        qualname = f"{type(env).__name__}_{id(env):x}"
    name = f"{module}:{qualname}"
    _GIVEN[name] = env
    return name


def _is_env_object(value: Any) -> bool:
    if isinstance(value, type):
        return False
    try:
        import gymnasium as gym
    except ImportError:  # pragma: no cover - gymnasium is a base dependency
        return False
    return isinstance(value, gym.Env)


def gym_target(env_id: str, path: str | None = None) -> Any:
    """What ``gymnasium.make`` is given for ``env_id``: a registered id, or an ``EnvSpec``
    whose entry point is the class or factory ``env_id`` names. ``path``: a folder to import
    the id's module from when it is not importable as things stand (the run's record)."""
    import gymnasium as gym

    if env_id in _GIVEN:
        return _spec_for(env_id, _GIVEN[env_id])
    if env_id in gym.registry:
        return env_id
    if ":" not in env_id:
        return None
    module_name, _, name = env_id.partition(":")
    module = import_user_module(module_name, env_id, path)
    if name in gym.registry:
        return name
    target: Any = module
    for part in name.split("."):
        target = getattr(target, part, None)
    if target is None and module_name == "__main__":
        raise EnvError(
            f"{env_id}: the run's environment is a class or function of the training script "
            "itself, which another process cannot import; define it in a module of its own "
            "(then 'module:Name' finds it anywhere), or give the environment again "
            "(timerl eval/export --env, or env= from Python)"
        )
    if target is None or not callable(target):
        raise EnvError(
            f"{env_id}: module {module_name!r} was imported, but it registers no "
            f"environment {name!r} with gymnasium and defines no class or function {name!r}"
            f"{_registered_by(module_name)}"
        )
    _GIVEN[env_id] = target
    return _spec_for(env_id, target)


def _registered_by(module_name: str) -> str:
    """The ids a module's import registered, for the error that found none by its name."""
    import gymnasium as gym

    mine = [k for k, spec in gym.registry.items() if _entry_module(spec) == module_name]
    return f" (it registers {', '.join(sorted(mine)[:5])})" if mine else ""


def _entry_module(spec: Any) -> str | None:
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry.partition(":")[0]
    return getattr(entry, "__module__", None)


def _spec_for(env_id: str, factory: Callable[..., Any]) -> Any:
    from gymnasium.envs.registration import EnvSpec

    return EnvSpec(id=_SPEC_ID.sub("_", env_id), entry_point=factory)


def import_user_module(module_name: str, what: str, path: str | None = None) -> Any:
    """Import a module of the user's, as ``python`` would from the current folder: the
    ``timerl`` command's own folder is first on ``sys.path``, not the one it runs in."""
    importlib.invalidate_caches()  # a module written since the folder was last listed
    tried = []
    for extra in (None, os.getcwd(), path):
        if extra is not None:
            if extra in sys.path:
                continue
            sys.path.insert(0, extra)
            tried.append(extra)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            missing = err.name or ""
            if not (module_name == missing or module_name.startswith(missing + ".")):
                raise EnvError(f"{what}: importing {module_name} failed: {err}") from err
            if extra is not None:
                sys.path.remove(extra)
        except Exception as err:
            raise EnvError(
                f"{what}: importing {module_name} failed: {type(err).__name__}: {err}"
            ) from err
    where = f" (also looked in {', '.join(tried)})" if tried else ""
    raise EnvError(
        f"{what}: cannot import module {module_name!r}{where}; run from the folder that holds "
        "it, or add that folder to PYTHONPATH"
    )


def env_record(env_id: str) -> dict[str, Any]:
    """What a fresh process needs to make ``env_id`` again: the id, the folder its module
    was imported from, and for an id registered at run time its registration."""
    import gymnasium as gym

    record: dict[str, Any] = {"id": env_id}
    if is_gymnax_id(env_id):  # gymnax's registry knows it: nothing to import
        return record
    module_name = env_id.partition(":")[0] if ":" in env_id else None
    if module_name is None and env_id in gym.registry:
        spec = gym.registry[env_id]
        entry = _entry_point_text(spec.entry_point)
        if entry is not None and not entry.startswith(("gymnasium.", "ale_py", "shimmy")):
            record["entry_point"] = entry
            settings = {
                "max_episode_steps": spec.max_episode_steps,
                "reward_threshold": spec.reward_threshold,
                "nondeterministic": spec.nondeterministic,
                "kwargs": dict(spec.kwargs),
            }
            if _is_json(settings):
                record["registration"] = settings
            module_name = entry.partition(":")[0]
    folder = _import_root(module_name) if module_name else None
    if folder is not None:
        record["path"] = folder
    return record


def _entry_point_text(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    module, qualname = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{module}:{qualname}"
    return None


def _import_root(module_name: str) -> str | None:
    """The ``sys.path`` entry a loaded module was imported from."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file or module_name == "__main__":
        return str(Path(file).resolve().parent) if file else None
    depth = module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return str(Path(file).resolve().parents[depth])


def _is_json(value: Any) -> bool:
    import json

    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def restore_env(record: Mapping[str, Any] | None) -> None:
    """Make a recorded env id resolvable again in this process (see :func:`env_record`)."""
    if not record:
        return
    import gymnasium as gym

    env_id = record["id"]
    if is_gymnax_id(env_id):  # made by gymnax itself (an older run may hold a path)
        return
    if ":" in env_id:  # its module is imported, from the folder it was found in if need be
        gym_target(env_id, record.get("path"))
        return
    entry = record.get("entry_point")
    if entry is None or env_id in gym.registry:
        return
    module_name, _, name = entry.partition(":")
    if module_name == "__main__" and not _has_attr_path(sys.modules.get("__main__"), name):
        raise EnvError(
            f"{env_id}: the run registered it with entry point {entry}, a class or function "
            "of the training script itself, which another process cannot import; move it "
            "into a module (then give 'module:EnvId'), or pass the env again (--env / env=)"
        )
    module = import_user_module(module_name, env_id, record.get("path"))
    if env_id in gym.registry:  # importing the module registered it
        return
    target: Any = module
    for part in name.split("."):
        target = getattr(target, part, None)
    if target is None:
        raise EnvError(f"{env_id}: entry point {entry} is not in module {module_name}")
    gym.register(env_id, entry_point=target, **record.get("registration", {}))


def _has_attr_path(obj: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True
