"""The graphopt bench scripts, loaded as modules: they are files of bench/, not a package."""

import importlib.util
from pathlib import Path
from types import ModuleType


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module."""
    path = Path(__file__).parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
