"""Architecture guard: small modules with one concern, functions that read top to bottom."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from architecture_helpers import MODULES


#: No module in src/ is longer (lines), and no function or method (decorators not counted, its
#: docstring and nested functions counted).
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of every function and method under ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def test_the_function_finder_sees_methods_and_nested_functions():
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\n\ndef h():\n    pass\n")
    assert [name for name, _ in _functions(tree)] == ["A.f", "A.f.g", "h"]


def test_no_module_in_src_is_over_450_lines():
    long = {module: n for module, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them along their jobs): {long}"


def test_no_function_in_src_is_over_60_lines():
    long = [
        f"{module}.{name} ({node.end_lineno - node.lineno + 1} lines)"
        for module, path in MODULES.items()
        for name, node in _functions(ast.parse(path.read_text(), str(path)))
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (cut them into steps): {long}"
