"""Fixtures for the llama.cpp backend: a persistent GGUF cache, the built-in GGUF models, photos.

Every test module here is skipped, with the reason, when llama-cpp-python is not
installed (``pip install 'refsight[llamacpp]'``: see ``llama_models.require_llama_cpp``). The GGUFs are built once (a tiny
random HF checkpoint converted with llama.cpp's converter) into pytest's own cache
directory, keyed by their recipe's hash, so later sessions reuse them; the parent
conftest's session-private model cache is overridden for this directory only.
"""

from __future__ import annotations

import pytest
from llama_models import GGUF_FAMILIES  # noqa: F401  (re-exported)


@pytest.fixture(scope="session", autouse=True)
def model_cache(request):
    """A ``REFSIGHT_MODEL_CACHE`` that outlives the session (converted GGUFs take a minute to build).

    pytest's cache directory; a session temp dir when the cache plugin is off (``-p no:cacheprovider``).
    """
    cache = getattr(request.config, "cache", None)
    path = cache.mkdir("refsight-gguf-models") if cache is not None else request.getfixturevalue("tmp_path_factory").mktemp("gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFSIGHT_MODEL_CACHE", str(path))
        yield path


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
    from refsight.backends.llamacpp.models import ensure_gguf

    return ensure_gguf
