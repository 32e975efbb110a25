"""Architecture guards: the import rules of DESIGN.md, checked on the source, and the frozen package key.

The import rules are read from the AST of every module under ``src/refsight`` (no import is
executed), so they hold for function-local imports too and cost no model load.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from refsight.package import PACKAGE_FORMAT_VERSION, EncoderFingerprint, package_key

SRC = Path(__file__).resolve().parents[1] / "src" / "refsight"

#: Packages that may import a model runtime (torch, transformers).
RUNTIME_OWNERS = ("refsight.backends", "refsight.models")
RUNTIMES = ("torch", "transformers")
#: Modules outside RUNTIME_OWNERS allowed to import a runtime, each with the reason.
RUNTIME_EXCEPTIONS = {
    # The package codec builds torch tensors as zero-copy views of a mapped file: a visual
    # package *is* torch tensors, and the store must not import backends/ or models/.
    "refsight.store._safetensors": "visual packages are torch tensors; the store decodes them",
    # The connector runs inside vLLM's own process (never imported by refsight): it hands vLLM
    # torch tensors. It sits outside backends/ so the store's quota can read its index module.
    "refsight.vllm_connector.refsight_ec_connector": "runs inside vLLM, whose encoder outputs are torch tensors",
}
#: What cli.py and server/ may import: the public API ...
PUBLIC_API = (
    "refsight", "refsight.errors", "refsight.results", "refsight.config", "refsight.report", "refsight.settings",
    "refsight.requests", "refsight.deprecation", "refsight.extras",
)
#: ... the hostile-input primitives every front end applies (refsight/inputs/) ...
FRONT_END_TOOLS = ("refsight.inputs",)
#: ... plus their own subpackage (for the CLI: the entry points its `serve`, `demo`, `vllm-*` and `ingest` commands hand over to).
OWN = {
    "refsight.cli": (
        "refsight.server", "refsight.demo", "refsight.backends.vllm.env", "refsight.backends.vllm.serve", "refsight.ingest.cli",
    ),
    "refsight.server": ("refsight.server",),
}


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


IMPORTS = _imports()


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _report(violations: list[Import], rule: str) -> str:
    return f"{rule}; violations:\n  " + "\n  ".join(map(str, violations))


def test_the_collector_sees_the_modules_and_their_imports():
    assert {"refsight", "refsight.cli", "refsight.backends.registry", "refsight.models.registry"} <= set(MODULES)
    # a known function-local import and a known module-level one
    assert any(i.module == "refsight.models.conse" and i.target == "refsight.models.efficientnet_lite"
               and not i.module_level for i in IMPORTS)
    assert any(i.module == "refsight.retrieval.retriever" and i.target == "refsight.models.embedders"
               and i.module_level for i in IMPORTS)


def test_only_backends_and_models_import_torch_or_transformers():
    violations = [
        i for i in IMPORTS
        if i.target.split(".")[0] in RUNTIMES
        and not _under(i.module, *RUNTIME_OWNERS)
        and i.module not in RUNTIME_EXCEPTIONS
    ]
    assert not violations, _report(violations, "only backends/ and models/ import torch or transformers")


def test_retrieval_and_judge_never_import_the_engine():
    violations = [
        i for i in IMPORTS
        if _under(i.module, "refsight.retrieval", "refsight.judge")
        and (_under(i.target, "refsight.engine") or (i.target == "refsight" and "Engine" in i.names))
    ]
    assert not violations, _report(violations, "retrieval/ and judge/ never import the engine")


#: The pipelines take their parts, never the engine that builds them.
PIPELINES = ("refsight.compare", "refsight.ingest")
#: ... except a front end that lives beside its pipeline (the `refsight ingest` command holds an engine, as cli.py does).
PIPELINE_FRONT_ENDS = ("refsight.ingest.cli",)


def test_pipelines_never_import_or_name_the_engine():
    """compare/ and ingest/ know no Engine: not imported (at any level, TYPE_CHECKING included), not named."""
    imports = [
        str(i) for i in IMPORTS
        if _under(i.module, *PIPELINES) and i.module not in PIPELINE_FRONT_ENDS
        and (_under(i.target, "refsight.engine") or any(n in ("Engine", "engine") for n in i.names))
    ]
    names = []
    for module, path in MODULES.items():
        if not _under(module, *PIPELINES) or module in PIPELINE_FRONT_ENDS:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            name = (
                node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.arg if isinstance(node, ast.arg) else None
            )
            if name in ("Engine", "engine"):
                names.append(f"{module}:{node.lineno} names {name}")
    assert not imports + names, "the pipelines take their parts, not the engine:\n  " + "\n  ".join(imports + names)


def test_store_and_retrieval_never_import_backends_and_backends_never_import_store_cli_or_server():
    violations = [
        i for i in IMPORTS
        if (_under(i.module, "refsight.store", "refsight.retrieval") and _under(i.target, "refsight.backends"))
        or (_under(i.module, "refsight.backends")
            and _under(i.target, "refsight.store", "refsight.cli", "refsight.server", "refsight.engine"))
    ]
    assert not violations, _report(violations, "store/ and retrieval/ never import backends/; backends/ never import store/, cli, server, engine")


def test_cli_and_server_use_only_the_public_api():
    violations = []
    for i in IMPORTS:
        owner = "refsight.cli" if _under(i.module, "refsight.cli") else "refsight.server" if _under(i.module, "refsight.server") else None
        if owner is None or not _under(i.target, "refsight"):
            continue
        allowed = i.target in PUBLIC_API or _under(i.target, *FRONT_END_TOOLS, *OWN[owner])
        if owner == "refsight.cli" and _under(i.target, "refsight.cli"):
            allowed = True  # the cli package's own modules
        elif owner == "refsight.cli" and i.target in OWN[owner]:
            allowed = True  # the package itself, not its internals
        elif owner == "refsight.cli" and _under(i.target, *OWN[owner]):
            allowed = False
        if not allowed:
            violations.append(i)
    assert not violations, _report(
        violations, f"cli.py and server/ import only the public API {PUBLIC_API} and their own subpackage"
    )


def _cycles(edges: dict[str, set[str]]) -> Iterator[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = 0

    def connect(v: str) -> Iterator[list[str]]:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                yield from connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                yield sorted(component)

    for v in sorted(edges):
        if v not in index:
            yield from connect(v)


def test_cycle_finder_finds_a_cycle():
    assert list(_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})) == [["a", "b", "c"]]
    assert list(_cycles({"a": {"b"}, "b": set()})) == []


def test_no_import_cycles_between_modules_at_module_level():
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if i.module_level and i.target in MODULES and i.target != i.module:
            edges.setdefault(i.module, set()).add(i.target)
    cycles = list(_cycles(edges))
    detail = [
        str(i) for i in IMPORTS
        if i.module_level and any(i.module in c and i.target in c for c in cycles)
    ]
    assert not cycles, "module-level import cycles: " + "; ".join(" <-> ".join(c) for c in cycles) + (
        "\n  " + "\n  ".join(detail)
    )


# -- floors: every import runs down or sideways, never back up -----------------------------------------

#: The rooms of ``src/refsight`` (a top-level module or subpackage; ``refsight`` is the package's face),
#: floor by floor from the ground up. An import (function-local ones included) may reach its own floor
#: or one below, never one above; a new room takes its place here.
FLOORS = (
    ("errors", "results", "version", "deprecation", "atomic", "timing", "locks", "threads", "samples", "plugins",
     "inputs", "package", "config", "images", "report", "extras", "prompt_size", "vllm_connector"),
    ("store", "backends"),
    ("models", "settings", "drift"),
    ("retrieval", "context"),
    ("package_cache", "prefixes"),
    ("judge", "references", "rerank"),
    ("requests", "compare", "ingest", "maintenance"),
    ("engine",),
    ("refsight",),
    ("demo", "server"),
    ("cli",),
)
FLOOR = {room: n for n, rooms in enumerate(FLOORS) for room in rooms}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _room_arrows(imports: list[Import] | None = None) -> dict[tuple[str, str], list[Import]]:
    """(importing room, imported room) → the imports that draw that arrow."""
    arrows: dict[tuple[str, str], list[Import]] = {}
    for i in IMPORTS if imports is None else imports:
        if i.target == "refsight" or i.target.startswith("refsight."):
            a, b = _room(i.module), _room(i.target)
            if a != b:
                arrows.setdefault((a, b), []).append(i)
    return arrows


def test_the_room_arrows_see_an_arrow_back_up_and_a_two_way_pair():
    # the two-way import this rule ended: retrieval/__init__ -> models.registry, models.clip -> retrieval.embedders
    pair = [Import("refsight.retrieval", "refsight.models.registry", ("default_embedder",), 13, True),
            Import("refsight.models.clip", "refsight.retrieval.embedders", ("Embedder",), 17, True)]
    arrows = _room_arrows(pair)
    assert set(arrows) == {("retrieval", "models"), ("models", "retrieval")}
    assert FLOOR["retrieval"] > FLOOR["models"]  # so the second one runs back up


def test_every_room_has_one_floor():
    placed = [room for rooms in FLOORS for room in rooms]
    assert len(placed) == len(set(placed)), "a room placed twice"
    assert {_room(module) for module in MODULES} == set(placed), "place each room of src/refsight on a floor"


def test_no_import_runs_back_up():
    up = [i for (a, b), imports in _room_arrows().items() if FLOOR[b] > FLOOR[a] for i in imports]
    assert not up, _report(up, "an import runs back up a floor (FLOORS): move the code it needs down")


def test_no_two_rooms_import_each_other():
    arrows = _room_arrows()
    both = [i for (a, b), imports in arrows.items() if a < b and (b, a) in arrows for i in imports + arrows[(b, a)]]
    assert not both, _report(both, "two rooms import each other")


# -- one word per idea: the glossary's retired words are no names in src/ --------------------------------

ARCHITECTURE_DOC = SRC.parents[1] / "docs" / "architecture.md"
#: Deprecation aliases: where a retired word is still taken (each warns, naming the word that replaced it).
DEPRECATION_ALIASES = {
    "refsight.engine": {"use_kv_cache"},
    "refsight.server.config": {"share_encodes"},
    "refsight.config": {"default_cache_url"},
}


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
        if name in retired and name not in DEPRECATION_ALIASES.get(module, ())
    )
    assert not found, f"retired words (glossary of docs/architecture.md) used as names; say it in one word: {found}"


# -- test hygiene ------------------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent


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


# -- the package key is frozen --------------------------------------------------------------------

#: The key derivation as of PACKAGE_FORMAT_VERSION 1. Stored packages are found by these keys:
#: a change that moves them silently orphans every store on disk.
GOLDEN_FORMAT_VERSION = 1
GOLDEN_IMAGE_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
GOLDEN_KEY = "0eba6105f4d0a46cb5bd3c2ab31fd9834b1978627dc9bb2c630bfea9c788544c"
GOLDEN_SCOPED_KEY = "689fbaf00a38502c660f357c2212ea3c7037a68859e93e6bd15348d688a3911f"  # scope "tenant-a"


def _golden_fingerprint() -> EncoderFingerprint:
    return EncoderFingerprint(
        backend="hf",
        model_id="Qwen/Qwen2-VL-2B-Instruct",
        revision="895c3a49bc3fa70a340399125c650a463535e71c",
        dtype="bfloat16",
        preprocessing={"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
                       "image_mean": [0.48145466, 0.4578275, 0.40821073]},
    )


def test_package_key_derivation_is_frozen():
    keys = (
        package_key(GOLDEN_IMAGE_SHA256, _golden_fingerprint()),
        package_key(GOLDEN_IMAGE_SHA256, _golden_fingerprint(), "tenant-a"),
    )
    if PACKAGE_FORMAT_VERSION != GOLDEN_FORMAT_VERSION:
        # A bumped format version must give new keys (old packages are then re-encoded, not misread).
        assert keys[0] != GOLDEN_KEY and keys[1] != GOLDEN_SCOPED_KEY, (
            f"PACKAGE_FORMAT_VERSION is {PACKAGE_FORMAT_VERSION} but the keys equal those of version "
            f"{GOLDEN_FORMAT_VERSION}: the version no longer reaches the key"
        )
        pytest.skip(
            f"PACKAGE_FORMAT_VERSION moved from {GOLDEN_FORMAT_VERSION} to {PACKAGE_FORMAT_VERSION}: record the new "
            f"keys here (GOLDEN_FORMAT_VERSION = {PACKAGE_FORMAT_VERSION}, GOLDEN_KEY = {keys[0]!r}, "
            f"GOLDEN_SCOPED_KEY = {keys[1]!r})"
        )
    assert keys == (GOLDEN_KEY, GOLDEN_SCOPED_KEY), (
        "package_key() no longer derives the frozen keys, so every stored package would be orphaned. "
        "If the change is intended, bump PACKAGE_FORMAT_VERSION in src/refsight/package.py "
        f"(then record the new keys here); got {keys}"
    )


# -- strict mode: every skip of a runtime goes through tests/runtimes.py -------------------------

#: Files whose ``pytest.skip`` is not about a runtime (it stays a skip under ``CI=true``), with the reason.
NON_RUNTIME_SKIPS = {
    "test_architecture.py": "a moved PACKAGE_FORMAT_VERSION asks for its new golden keys to be recorded",
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


# -- size rules: small modules with one concern, functions that read top to bottom ----------------

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
