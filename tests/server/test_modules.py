"""The server package keeps the project's habits: honest ``__all__``, a docstring on every public name."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import refsight.server

#: Every module of the server package, found on disk: a new module joins by default.
MODULES = ["refsight.server"] + sorted(
    info.name for info in pkgutil.walk_packages(refsight.server.__path__, prefix="refsight.server.")
)


def test_the_modules_are_found():
    assert {"refsight.server.app", "refsight.server.deps", "refsight.server.routes.references"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_honest_and_documented(name):
    module = importlib.import_module(name)
    assert module.__doc__ and module.__doc__.strip()
    assert len(module.__all__) == len(set(module.__all__))
    for public in module.__all__:
        obj = getattr(module, public)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__ and obj.__doc__.strip(), f"{name}.{public} has no docstring"


def test_importing_the_server_does_not_load_a_model():
    import subprocess
    import sys

    code = "import sys, refsight.server; print(any(m in sys.modules for m in ('torch', 'transformers')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
