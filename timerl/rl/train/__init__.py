"""Training runs: the driver behind ``timerl train`` (``driver``), the algorithms it knows
(``registry``), checkpoints, evaluation and export of a trained policy, metrics (``tblog``,
``plotting``) and the ``train``/``eval``/``export``/``plot`` commands (``cli``)."""

from timerl.rl.train.driver import METRICS, TrainResult, build, make_config, train

__all__ = ["METRICS", "TrainResult", "build", "make_config", "train"]
