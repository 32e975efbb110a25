"""The embedder registry: names resolve lazily, instances are shared, failures become refsight errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from refsight.errors import ModelLoadError, UnknownModelError
from refsight.embedders import registry
from refsight.embedders import available_embedders, default_embedder, get_embedder, register_embedder
from refsight.retrieval import Embedder
from refsight.retrieval import default_embedder as retrieval_default


@pytest.fixture
def clean_registry():
    """Run-time registrations and built instances are restored after the test."""
    registered, instances = dict(registry._registered), dict(registry._instances)
    yield
    registry._registered.clear()
    registry._registered.update(registered)
    registry._instances.clear()
    registry._instances.update(instances)


class Constant(Embedder):
    """A two-dimensional embedder with no model: every input maps to (1, 0)."""

    name = "constant"

    @property
    def dim(self) -> int:
        return 2

    def fingerprint(self):
        return {"embedder": "constant/v1"}

    def _embed_images(self, images):
        return np.tile([1.0, 0.0], (len(images), 1))

    def _embed_texts(self, texts, instruction):
        return np.tile([1.0, 0.0], (len(texts), 1))


def test_importing_the_registry_imports_no_torch():
    code = (
        "import sys, refsight.embedders, refsight.retrieval;"
        "names = refsight.embedders.available_embedders();"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported';"
        "print(names)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['clip:PATH', 'conse', 'vlm:MODEL']"


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UnknownModelError) as info:
        get_embedder("no-such-embedder")
    assert info.value.known == sorted(available_embedders())
    with pytest.raises(UnknownModelError):
        get_embedder("clip:")  # a family prefix needs its argument


def test_registered_factories_are_built_once_and_replaced_on_registration(clean_registry):
    calls = []
    register_embedder("constant", lambda name: calls.append(name) or Constant())
    first = get_embedder("constant")
    assert get_embedder("constant") is first and calls == ["constant"]
    assert "constant" in available_embedders()
    register_embedder("constant", lambda name: Constant())
    assert get_embedder("constant") is not first


def test_a_factory_that_fails_at_runtime_raises_model_load_error(clean_registry):
    def broken(name):
        raise RuntimeError("weights are corrupt")

    register_embedder("broken", broken)
    with pytest.raises(ModelLoadError, match="weights are corrupt"):
        get_embedder("broken")
    register_embedder("unimportable", "refsight.embedders.no_such_module:factory")
    with pytest.raises(ModelLoadError, match="cannot import embedder"):
        get_embedder("unimportable")


def test_clip_family_on_a_missing_directory_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError):
        get_embedder(f"clip:{tmp_path / 'nope'}")


def test_vlm_family_names_a_backend():
    with pytest.raises(UnknownModelError):
        get_embedder("vlm:no-such-backend")


def test_default_is_the_shared_conse_instance():
    assert registry.DEFAULT_EMBEDDER == "conse"
    assert default_embedder() is get_embedder("conse") is retrieval_default()
    assert type(default_embedder()).__name__ == "EfficientNetConSEEmbedder"
