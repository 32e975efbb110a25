"""Shared fixtures: the session's model cache and tiny models, registry hygiene, real photos, bad files.

``REFSIGHT_MODEL_CACHE`` points at one session-private directory for the whole run (set
before any model is built, inherited by the subprocesses tests start): each tiny model is
built on disk once per session, whichever folder's tests ask for it first, and never in the
user's cache.
"""

from __future__ import annotations

import json

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from fault_handler import FaultHandlerGuard
from image_corpus import build_bad_image_corpus, load_photo
# Real PostgreSQL and Redis servers (throwaway, loopback) for the tests that need them.
from services import postgres, postgres_server, private_postgres, redis_server, s3_server  # noqa: F401
# The vLLM venv and a session pool of real vLLM servers (tests marked vllm, backends and benchmarks).
from vllm_servers import vllm_python, vllm_servers  # noqa: F401


@pytest.fixture
def real_photo() -> Callable[..., Image.Image]:
    """Factory: ``real_photo("coffee", size=(64, 48))`` returns a small real RGB photo."""
    return load_photo


#: The real photos :func:`photo_files` writes (four of ``refsight.samples``: different subjects and colours).
PHOTO_FILES = ("chelsea", "coffee", "rocket", "astronaut")


@pytest.fixture
def photo_files(tmp_path: Path) -> dict[str, Path]:
    """The :data:`PHOTO_FILES` as PNGs in the test's directory (``{"chelsea": path, ...}``, ``real_photo``'s size)."""
    paths = {}
    for name in PHOTO_FILES:
        paths[name] = tmp_path / f"{name}.png"
        load_photo(name).save(paths[name])
    return paths


@pytest.fixture
def bad_image_corpus(tmp_path: Path) -> dict[str, Path]:
    """:func:`build_bad_image_corpus` written into a fresh temporary directory."""
    return build_bad_image_corpus(tmp_path / "corpus")


@pytest.fixture(scope="session", autouse=True)
def model_cache() -> Iterator[Path]:
    """The session-private ``REFSIGHT_MODEL_CACHE`` (subprocesses inherit it).

    Not under pytest's basetemp: a concurrent pytest run prunes old basetemp
    directories, which would pull the models out from under this session.
    """
    with tempfile.TemporaryDirectory(prefix="refsight-models-") as path, pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFSIGHT_MODEL_CACHE", path)
        yield Path(path)


_tiny_loaded: dict[tuple, Any] = {}


@pytest.fixture(scope="session")
def load(model_cache) -> Callable[..., Any]:
    """``load(name, **options)`` -> the tiny backend ``name``, built and loaded once per session."""
    from refsight.backends.builtin import load_tiny

    def tiny(name: str, **options: Any) -> Any:
        # Options may hold mappings (processor_kwargs): key by their JSON text.
        key = (name, json.dumps(options, sort_keys=True))
        if key not in _tiny_loaded:
            _tiny_loaded[key] = load_tiny(name, **options)
        return _tiny_loaded[key]

    return tiny


@pytest.fixture
def backend_registry() -> Iterator[None]:
    """For tests that call ``register_backend``: the global registry is restored afterwards.

    Names registered during the test are dropped and backends built under them are closed,
    so no fake model leaks into a later test (or shadows a real name).
    """
    from refsight.backends import registry

    registered, instances = dict(registry._registered), dict(registry._instances)
    yield
    with registry._lock:
        built = [b for key, b in registry._instances.items() if instances.get(key) is not b]
        registry._registered.clear()
        registry._registered.update(registered)
        registry._instances.clear()
        registry._instances.update(instances)
    for backend in built:
        backend.close()


def pytest_configure(config):
    """Keep Python's fault handler armed for the whole run, whatever native library replaces it (:mod:`fault_handler`)."""
    config.pluginmanager.register(FaultHandlerGuard(), "refsight-fault-handler")


# CI time in plain sight (issue 64 item 5): durations_record times every test and module/session fixture and
# writes the record (JSON, and a table at the end of the log); slow_set marks `slow` every test of a module whose
# measured duration (tests/module_durations.json) is over its threshold, or that was never measured. Both replace
# the hand-kept tests/slow_modules.txt: a new module needs no list entry (it is slow until measured).
pytest_plugins = ["durations_record", "slow_set"]
