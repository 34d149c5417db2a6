"""Deep RL on recurrent tensors, a library on ``timerl.api``: environments (``envs``),
algorithms and return estimators (``algos``), training runs (``train``), and graphopt's
policy trained as a program (``graph_policy``)."""

from timerl.rl import algos
from timerl.rl.algos.returns import discounted_returns, gae, n_step_returns, td_lambda
from timerl.rl.envs.program import Env, make_env

__all__ = ["Env", "algos", "discounted_returns", "gae", "make_env", "n_step_returns", "td_lambda"]
