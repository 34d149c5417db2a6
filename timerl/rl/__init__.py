"""Deep RL on recurrent tensors: environments, return estimators, algorithms, training."""

from timerl.rl import algos
from timerl.rl.environment import Env, make_env
from timerl.rl.returns import discounted_returns, gae, n_step_returns, td_lambda

__all__ = ["Env", "algos", "discounted_returns", "gae", "make_env", "n_step_returns", "td_lambda"]
