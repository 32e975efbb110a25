"""Architecture guard: one word per idea (the glossary's retired words are no names in src/)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from architecture_helpers import MODULES, SRC


ARCHITECTURE_DOC = SRC.parents[1] / "docs" / "architecture.md"


def _retired_words() -> set[str]:
    """The names in the *retired* column of the glossary in docs/architecture.md (backticked identifiers)."""
    section = ARCHITECTURE_DOC.read_text().split("\n## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return {word for cells in rows[1:] if len(cells) == 3 for word in re.findall(r"`([^`]+)`", cells[2])
            if word.isidentifier()}


def _names(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Every name the code gives or uses: functions, classes, arguments, attributes, keywords, variables, imports."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.lineno
        elif isinstance(node, ast.arg):
            yield node.arg, node.lineno
        elif isinstance(node, ast.Attribute):
            yield node.attr, node.lineno
        elif isinstance(node, ast.Name):
            yield node.id, node.lineno
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg, node.lineno
        elif isinstance(node, ast.alias):
            yield node.asname or node.name.rpartition(".")[2], node.lineno


def test_the_glossary_names_the_retired_words():
    assert {"share_encodes", "use_kv_cache", "reuses_prefix", "PrefixPlan", "Tenant"} <= _retired_words()


def test_retired_words_name_nothing_in_src():
    retired = _retired_words()
    found = sorted(
        f"{module}:{line} {name}"
        for module, path in MODULES.items()
        for name, line in _names(ast.parse(path.read_text(), str(path)))
        if name in retired
    )
    assert not found, f"retired words (glossary of docs/architecture.md) used as names; say it in one word: {found}"
