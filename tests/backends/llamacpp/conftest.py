"""Fixtures for the llama.cpp backend: the built-in GGUF models and photos.

Every test module here is skipped, with the reason, when llama-cpp-python is not
installed (``pip install 'refsight[llamacpp]'``: see ``llama_models.require_llama_cpp``), and
fails in strict mode (``CI=true``: ``tests/runtimes.py``). The GGUFs are built once
per session (a tiny random HF checkpoint converted with llama.cpp's converter) into the
session's one model cache (``tests/conftest.py``), keyed by their recipe's hash.
"""

from __future__ import annotations

import pytest
from llama_models import GGUF_FAMILIES  # noqa: F401  (re-exported)


@pytest.fixture(scope="session")
def gguf(model_cache):
    """``gguf(name, **options)`` -> the llama.cpp backend through the registry (built on first use)."""
    from refsight.backends.registry import get_backend

    def load(name: str, **options):
        return get_backend(name, **options)

    return load


@pytest.fixture(scope="session")
def gguf_files(model_cache):
    """``gguf_files(name)`` -> (model GGUF path, mmproj GGUF path) of a built-in model."""
    from refsight.builtin_models.gguf import ensure_gguf

    return ensure_gguf
