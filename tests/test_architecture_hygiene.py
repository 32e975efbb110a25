"""Test hygiene: fake backends leave the registry as they found it, one session cache of tiny
models, and every skip of a runtime goes through tests/runtimes.py (so strict mode sees it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from architecture_helpers import TESTS


# -- test hygiene ------------------------------------------------------------------------------------

def test_tests_that_register_backends_restore_the_registry():
    """A fake model registered in the process-wide registry must not outlive its test."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "conftest.py" and path.parent == TESTS:
            continue  # defines backend_registry itself
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = any(
                isinstance(c, ast.Call) and getattr(c.func, "id", getattr(c.func, "attr", None)) == "register_backend"
                for c in ast.walk(node)
            )
            if calls and "backend_registry" not in [a.arg for a in node.args.args]:
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno} {node.name}")
    assert not offenders, "these call register_backend without the backend_registry fixture: " + ", ".join(offenders)


def test_tiny_models_are_built_in_one_session_cache():
    """Only tests/conftest.py points REFSIGHT_MODEL_CACHE somewhere: one build per model per session."""
    others = [
        str(path.relative_to(TESTS)) for path in TESTS.rglob("conftest.py")
        if path.parent != TESTS and "REFSIGHT_MODEL_CACHE" in path.read_text("utf-8")
    ]
    assert not others, f"per-folder model caches rebuild the tiny models: {others}"


# -- strict mode: every skip of a runtime goes through tests/runtimes.py -------------------------

#: Files whose ``pytest.skip`` is not about a runtime (it stays a skip under ``CI=true``), with the reason.
NON_RUNTIME_SKIPS = {
    "test_architecture_package_key.py": "a moved PACKAGE_FORMAT_VERSION asks for its new golden keys to be recorded",
    "hardening_helpers.py": "no tmpfs can be mounted for the full-disk tests: a privilege of the machine, not a runtime",
    "server/test_llama_server_live_flags.py": "no IPv6 loopback to bind --host 127.0.0.1,::1: the machine's network, not a runtime",
}


def _skip_calls(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, name)`` of every ``pytest.skip`` / ``pytest.importorskip`` call or import in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "pytest":
            yield from ((node.lineno, a.name) for a in node.names if a.name in ("skip", "importorskip"))
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"
            and node.func.attr in ("skip", "importorskip")
        ):
            yield node.lineno, node.func.attr


def test_runtime_skips_go_through_require_runtime():
    """Strict mode (CI=true) turns runtime skips into failures only if it sees them: no test skips one itself."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(TESTS).as_posix()
        if relative == "runtimes.py":
            continue
        for line, name in _skip_calls(path):
            if name == "importorskip" or relative not in NON_RUNTIME_SKIPS:
                found.append(f"{relative}:{line} pytest.{name}")
    assert not found, (
        "skip a missing runtime with runtimes.require_runtime / require_module (they fail under CI=true), "
        f"or list a skip that is not about a runtime in NON_RUNTIME_SKIPS: {found}"
    )
