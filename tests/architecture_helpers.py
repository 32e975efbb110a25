"""What the architecture guards (``tests/test_architecture_*.py``) read: the modules of
``src/refsight`` and their imports, from the AST (imported by name: unique on purpose).

No module is executed, so the rules hold for function-local imports too and cost no model load.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: The package under guard, and the tests beside it.
SRC = Path(__file__).resolve().parents[1] / "src" / "refsight"
TESTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Import:
    """One import statement's target as seen from ``module``."""

    module: str  # the importing module, dotted
    target: str  # the imported module (or package, for ``from package import name``)
    names: tuple[str, ...]  # for ``from X import a, b``: the names; () for ``import X``
    line: int
    module_level: bool  # executed when the module is imported (not in a function or TYPE_CHECKING)

    def __str__(self) -> str:
        where = "" if self.module_level else " (function-local)"
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.module}:{self.line} imports {self.target}{names}{where}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


#: Every module of ``src/refsight``, dotted name → file.
MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0  # inside functions or TYPE_CHECKING blocks
        self.found: list[Import] = []

    def _nested(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            self.depth += 1
            for child in node.body:
                self.visit(child)
            self.depth -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append(Import(self.module, alias.name, (), node.lineno, self.depth == 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = tuple(a.name for a in node.names)
        submodules = [n for n in names if f"{target}.{n}" in MODULES]
        for name in submodules:
            self.found.append(Import(self.module, f"{target}.{name}", (), node.lineno, self.depth == 0))
        rest = tuple(n for n in names if n not in submodules)
        if rest:
            self.found.append(Import(self.module, target, rest, node.lineno, self.depth == 0))


def _imports() -> list[Import]:
    found = []
    for module, path in MODULES.items():
        collector = _Collector(module, path.name == "__init__.py")
        collector.visit(ast.parse(path.read_text("utf-8"), str(path)))
        found.extend(collector.found)
    return found


#: Every import statement of every module, read once per session.
IMPORTS = _imports()


def under(module: str, *packages: str) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def report(violations: list[Import], rule: str) -> str:
    """An assertion message: the rule, then one violating import a line."""
    return f"{rule}; violations:\n  " + "\n  ".join(map(str, violations))
