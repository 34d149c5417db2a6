"""Fixtures shared across the test packages."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs for one test module. Another module's Ray may still be up in
    this test process (xdist runs modules side by side in one worker): start our own."""
    ray = pytest.importorskip("ray", reason='needs the ray extra: pip install "timerl[ray]"')
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()
