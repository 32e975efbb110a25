"""Fixtures for engine-level tests: a pixel embedder and a CLI-made store (the model cache is the
session's, from tests/conftest.py)."""

from __future__ import annotations

import json

import pytest
from fake_pipeline import PixelEmbedder

from refsight.cli import main


@pytest.fixture
def pixel_embedder() -> PixelEmbedder:
    return PixelEmbedder()


@pytest.fixture
def cli_store(tmp_path, real_photo, capsys):
    """``(store, candidate, added)``: chelsea and coffee added by ``refsight add --model tiny-qwen2-vl --json``
    (``added``: its JSON lines), and a candidate photo file."""
    store = tmp_path / "store"
    paths = []
    for name in ("chelsea", "coffee"):
        path = tmp_path / f"{name}.png"
        real_photo(name, size=(72, 56)).save(path)
        paths.append(str(path))
    assert main(["add", *paths, "--store", str(store), "--model", "tiny-qwen2-vl", "--json"]) == 0
    added = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    candidate = tmp_path / "candidate.png"
    real_photo("astronaut", size=(64, 64)).save(candidate)
    return store, candidate, added
