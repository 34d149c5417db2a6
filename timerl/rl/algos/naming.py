"""How an error names a setting: by the flag a command-line user typed, or by the Python
parameter a caller of ``train``, ``evaluate_run`` or ``export_run`` passed.

The same checks serve both faces; the CLI marks its calls with :func:`cli_names`, so an error
tells each user what to change in what they wrote (``--gae-lambda`` or
``config['gae_lambda']``), never a flag a Python caller has no way to give.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_CLI = contextvars.ContextVar("timerl_cli_names", default=False)

# config fields whose flag is not ``--`` + the field's name with dashes
FLAGS = {"env_id": "--env"}


@contextmanager
def cli_names() -> Iterator[None]:
    """Within: errors name command-line flags (the ``timerl`` command's own calls)."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


def from_cli() -> bool:
    return _CLI.get()


def config_ref(name: str) -> str:
    """A config field: ``--gae-lambda`` on the command line, ``config['gae_lambda']`` in Python."""
    if from_cli():
        return FLAGS.get(name, "--" + name.replace("_", "-"))
    return f"config[{name!r}]"


def arg_ref(python: str, flag: str) -> str:
    """An argument of a function the CLI calls: its flag there, its parameter name in Python."""
    return flag if from_cli() else python
