"""Architecture guards: the import rules of DESIGN.md (who may import a runtime, the engine, the
backends; what the front doors may import; no import cycles), checked on the source's AST.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from architecture_helpers import IMPORTS, MODULES, report, under

#: Packages that may import a model runtime (torch, transformers): the backends and embedders that run
#: models, and the built-in models' builders that make them.
RUNTIME_OWNERS = ("refsight.backends", "refsight.embedders", "refsight.builtin_models")
RUNTIMES = ("torch", "transformers")
#: Modules outside RUNTIME_OWNERS allowed to import a runtime, each with the reason.
RUNTIME_EXCEPTIONS = {
    # The package codec builds torch tensors as zero-copy views of a mapped file: a visual
    # package *is* torch tensors, and the store must not import backends/ or embedders/.
    "refsight.store._safetensors": "visual packages are torch tensors; the store decodes them",
    # The connector runs inside vLLM's own process (never imported by refsight): it hands vLLM
    # torch tensors. It sits outside backends/ so the store's quota can read its index module.
    "refsight.vllm_connector.refsight_ec_connector": "runs inside vLLM, whose encoder outputs are torch tensors",
}
#: What cli.py and server/ may import: the public API (``refsight`` and the public modules where the names it
#: does not re-export live: the environment's defaults and the extras' install lines, a reference id's and a
#: ``where`` filter's checks, the model registry and family table) ...
PUBLIC_API = (
    "refsight", "refsight.errors", "refsight.results", "refsight.support.environment", "refsight.report",
    "refsight.settings", "refsight.requests", "refsight.tools", "refsight.support.extras", "refsight.store.base",
    "refsight.retrieval.vectors", "refsight.backends.registry", "refsight.backends.family_table",
    "refsight.embedders.registry", "refsight.ranking",
)
#: ... the intake and hostile-input primitives every front end applies (refsight/inputs/: images, rubrics, files,
#: JSON, text) ...
FRONT_END_TOOLS = ("refsight.inputs",)
#: ... plus their own subpackage (for the CLI: the entry points its `serve`, `demo`, `vllm-*` and `ingest` commands hand over to).
OWN = {
    "refsight.cli": (
        "refsight.server", "refsight.demo", "refsight.backends.vllm.env", "refsight.backends.vllm.serve", "refsight.ingest.cli",
    ),
    "refsight.server": ("refsight.server",),
}


def test_the_collector_sees_the_modules_and_their_imports():
    assert {"refsight", "refsight.cli", "refsight.backends.registry", "refsight.embedders.registry"} <= set(MODULES)
    # a known function-local import and a known module-level one
    assert any(i.module == "refsight.embedders.conse" and i.target == "refsight.embedders.efficientnet_lite"
               and not i.module_level for i in IMPORTS)
    assert any(i.module == "refsight.retrieval.retriever" and i.target == "refsight.embedders.base"
               and i.module_level for i in IMPORTS)


def test_only_backends_and_embedders_import_torch_or_transformers():
    violations = [
        i for i in IMPORTS
        if i.target.split(".")[0] in RUNTIMES
        and not under(i.module, *RUNTIME_OWNERS)
        and i.module not in RUNTIME_EXCEPTIONS
    ]
    assert not violations, report(violations, "only backends/, embedders/ and builtin_models/ import torch or transformers")


#: The backends' one way into the built-in models' builders (which never import the backends: FLOORS).
BUILTIN_SEAM = "refsight.backends.builtin"


def test_the_backends_reach_the_builtin_models_through_one_seam():
    violations = [
        i for i in IMPORTS
        if under(i.module, "refsight.backends") and under(i.target, "refsight.builtin_models") and i.module != BUILTIN_SEAM
    ]
    assert not violations, report(violations, f"backends/ reach builtin_models/ only through {BUILTIN_SEAM}")


def test_retrieval_and_judge_never_import_the_engine():
    violations = [
        i for i in IMPORTS
        if under(i.module, "refsight.retrieval", "refsight.judge")
        and (under(i.target, "refsight.engine") or (i.target == "refsight" and "Engine" in i.names))
    ]
    assert not violations, report(violations, "retrieval/ and judge/ never import the engine")


#: The pipelines take their parts, never the engine that builds them.
PIPELINES = ("refsight.compare", "refsight.ingest")
#: ... except a front end that lives beside its pipeline (the `refsight ingest` command holds an engine, as cli.py does).
PIPELINE_FRONT_ENDS = ("refsight.ingest.cli",)


def test_pipelines_never_import_or_name_the_engine():
    """compare/ and ingest/ know no Engine: not imported (at any level, TYPE_CHECKING included), not named."""
    imports = [
        str(i) for i in IMPORTS
        if under(i.module, *PIPELINES) and i.module not in PIPELINE_FRONT_ENDS
        and (under(i.target, "refsight.engine") or any(n in ("Engine", "engine") for n in i.names))
    ]
    names = []
    for module, path in MODULES.items():
        if not under(module, *PIPELINES) or module in PIPELINE_FRONT_ENDS:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            name = (
                node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.arg if isinstance(node, ast.arg) else None
            )
            if name in ("Engine", "engine"):
                names.append(f"{module}:{node.lineno} names {name}")
    assert not imports + names, "the pipelines take their parts, not the engine:\n  " + "\n  ".join(imports + names)


#: The server's one holder of the engine: every route asks it by name (tokenize, render_chat, model_details...).
SERVER_ENGINE_HOLDER = "refsight.server.service"


def test_no_route_reaches_around_the_service_to_its_engine():
    """Outside server/service.py no server module reads an ``.engine`` attribute (``service.engine.backend()``):
    what a dialect needs of the model is a named call on the service."""
    reaches = [
        f"{module}:{node.lineno} reads .engine"
        for module, path in MODULES.items()
        if under(module, "refsight.server") and module != SERVER_ENGINE_HOLDER
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "engine"
    ]
    assert not reaches, "server modules ask the Service, never its engine:\n  " + "\n  ".join(reaches)


def test_store_and_retrieval_never_import_backends_and_backends_never_import_store_cli_or_server():
    violations = [
        i for i in IMPORTS
        if (under(i.module, "refsight.store", "refsight.retrieval") and under(i.target, "refsight.backends"))
        or (under(i.module, "refsight.backends")
            and under(i.target, "refsight.store", "refsight.cli", "refsight.server", "refsight.engine"))
    ]
    assert not violations, report(violations, "store/ and retrieval/ never import backends/; backends/ never import store/, cli, server, engine")


def test_cli_and_server_use_only_the_public_api():
    violations = []
    for i in IMPORTS:
        owner = "refsight.cli" if under(i.module, "refsight.cli") else "refsight.server" if under(i.module, "refsight.server") else None
        if owner is None or not under(i.target, "refsight"):
            continue
        allowed = i.target in PUBLIC_API or under(i.target, *FRONT_END_TOOLS, *OWN[owner])
        if owner == "refsight.cli" and under(i.target, "refsight.cli"):
            allowed = True  # the cli package's own modules
        elif owner == "refsight.cli" and i.target in OWN[owner]:
            allowed = True  # the package itself, not its internals
        elif owner == "refsight.cli" and under(i.target, *OWN[owner]):
            allowed = False
        if not allowed:
            violations.append(i)
    assert not violations, report(
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
