"""The public surface: a light import, an honest ``__all__``, and one error tree."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

import pytest

import refsight
from refsight import errors

#: Modules that must never be loaded by ``import refsight`` alone (seconds and GBs to import).
HEAVY_MODULES = ("torch", "transformers", "tokenizers", "torchvision", "sentence_transformers", "safetensors.torch")

#: Public modules whose ``__all__`` must list only names that exist.
PUBLIC_MODULES = ("refsight", "refsight.errors", "refsight.inputs.images", "refsight.package", "refsight.store.base")


def test_import_refsight_does_not_import_heavy_modules():
    # Also list two modules refsight does load, so the check is seen to work at all.
    probe = HEAVY_MODULES + ("refsight.inputs.images", "PIL.Image")
    code = f"import json, sys, refsight\nprint(json.dumps(sorted(m for m in {probe!r} if m in sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["PIL.Image", "refsight.inputs.images"]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_name_in_all_exists(module_name):
    module = importlib.import_module(module_name)
    names = module.__all__
    assert len(names) == len(set(names)), "duplicate names in __all__"
    missing = [name for name in names if not hasattr(module, name)]
    assert missing == []


def test_star_import_gives_exactly_all():
    namespace: dict = {}
    exec("from refsight import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(refsight.__all__)


def test_top_level_reexports_are_the_same_objects():
    from refsight.inputs import images
    from refsight import sampling

    assert refsight.ImageInput is images.ImageInput
    assert refsight.Sampling is sampling.Sampling
    assert refsight.ImageError is errors.ImageError


def _error_classes():
    return [getattr(errors, name) for name in errors.__all__]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_every_public_error_subclasses_refsight_error(cls):
    assert inspect.isclass(cls) and issubclass(cls, errors.RefsightError)
    assert cls.__doc__ and cls.__doc__.strip()
    assert getattr(refsight, cls.__name__) is cls


def test_every_error_class_defined_is_public():
    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }
    assert defined == set(errors.__all__)


def test_error_tree_shape():
    assert issubclass(errors.InvalidInputError, ValueError)
    assert issubclass(errors.NotFoundError, KeyError)
    for cls in (errors.ImageError, errors.InvalidReferenceIdError, errors.RubricError):
        assert issubclass(cls, errors.InvalidInputError)
    for cls in (errors.ReferenceNotFoundError, errors.PackageNotFoundError, errors.UnknownModelError):
        assert issubclass(cls, errors.NotFoundError)
    for cls in (errors.ModelLoadError, errors.GenerationError):
        assert issubclass(cls, errors.BackendError)


def test_errors_carry_their_data():
    image_error = errors.ImageError("cat.jpg", "empty file (0 bytes)")
    assert (image_error.input, image_error.reason) == ("cat.jpg", "empty file (0 bytes)")
    assert str(image_error) == "cat.jpg: empty file (0 bytes)"
    assert str(errors.ImageError(b"\x00" * 5, "x")) == "<5 bytes>: x"
    corrupt = errors.CorruptPackageError("k" * 64, "checksum mismatch")
    assert corrupt.key == "k" * 64 and "checksum mismatch" in str(corrupt)
    unknown = errors.UnknownModelError("nope", ["b", "a"])
    assert unknown.known == ["a", "b"] and str(unknown) == "unknown model 'nope'; known models: a, b"
    near = errors.UnknownModelError("tiny-qwen2vl", [f"tiny-{i}" for i in range(20)] + ["tiny-qwen2-vl"])
    assert str(near) == "unknown model 'tiny-qwen2vl'; did you mean 'tiny-qwen2-vl'? ('refsight models' lists all 21)"
    many = errors.UnknownModelError("zzz", [f"model-{i}" for i in range(20)])
    assert str(many) == "unknown model 'zzz'; 'refsight models' lists the 20 known models"
    assert str(errors.ReferenceNotFoundError("cat")) == "reference not found: 'cat' ('refsight list' shows the store's references)"
    assert str(errors.ReferenceNotFoundError("cat", close=["cats", "car"])).startswith(
        "reference not found: 'cat'; did you mean 'cats' or 'car'? ")


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_names_have_docstrings(module_name):
    module = importlib.import_module(module_name)
    assert module.__doc__ and module.__doc__.strip()
    undocumented = [
        name
        for name in module.__all__
        if (inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name)))
        and not (getattr(module, name).__doc__ or "").strip()
    ]
    assert undocumented == []
