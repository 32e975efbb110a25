"""Fixtures for the store tests: a fresh store directory per test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from refsight.store import open_store

# The helpers module is shared with the subprocess workers, which run as plain scripts.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path / "store", memory_bytes=1 << 20) as s:
        yield s
