"""Shared fixtures for the Python test suite."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture
def collect():
    """Run a full garbage collection (objects freed between build and check)."""

    def run() -> None:
        for _ in range(3):
            gc.collect()

    return run
