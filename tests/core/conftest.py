"""Fixtures for the core tests."""

from __future__ import annotations

import pytest
from core_helpers import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param
