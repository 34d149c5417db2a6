"""Environments: what one offers (``protocol``), the host simulators behind ``make_env``
(``vector``: gymnasium, envpool; ``synthetic``; ``ray_env``: Ray workers), pure JAX ones
(``jax_envs``), and their forms inside a program (``program``: host calls, ``pure``: pure
calls). User envs come through gymnasium (``ids``).

``make_env`` here is the host batch; ``timerl.rl.make_env`` the env a program steps.
"""

from timerl.rl.envs.protocol import EnvSpaces, VectorEnv, register_native
from timerl.rl.envs.vector import (
    ENV_BACKENDS,
    EnvpoolVectorEnv,
    GymBatchedCartPole,
    GymVectorEnv,
    available_env_ids,
    make_env,
)

__all__ = [
    "ENV_BACKENDS",
    "EnvSpaces",
    "EnvpoolVectorEnv",
    "GymBatchedCartPole",
    "GymVectorEnv",
    "VectorEnv",
    "available_env_ids",
    "make_env",
    "register_native",
]
