"""Fixtures for the core tests; makes ``core_helpers`` importable in any pytest import mode."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from core_helpers import BACKENDS  # noqa: E402


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param
