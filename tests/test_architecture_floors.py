"""Architecture guard: the floors of ``src/refsight`` (every import runs down or sideways, never back up)."""

from __future__ import annotations

from architecture_helpers import IMPORTS, MODULES, Import, report, under


#: The rooms of ``src/refsight`` (a top-level module or subpackage; ``refsight`` is the package's face),
#: floor by floor from the ground up. An import (function-local ones included) may reach its own floor
#: or one below, never one above; a new room takes its place here.
FLOORS = (
    ("errors", "results", "version", "support", "samples", "inputs", "package", "report", "vllm_connector", "sampling",
     "requests", "families", "tools"),
    ("store", "builtin_models"),
    ("backends",),
    ("embedders", "settings"),
    ("retrieval", "context"),
    ("cache",),
    ("judge", "references"),
    ("compare", "ingest", "maintenance", "ranking"),
    ("engine",),
    ("refsight",),
    ("demo", "server"),
    ("cli",),
)
FLOOR = {room: n for n, rooms in enumerate(FLOORS) for room in rooms}

#: The rooms of ``src/refsight/server`` (a folder, or a module at its root; ``server`` is the package's face,
#: ``serve``), held to the same rule: the HTTP edge, what the routes send back, what they read, the service and
#: its parts, what a route is handed, the routes, the app.
SERVER_FLOORS = (
    ("edge",),
    ("replies",),
    ("intake",),
    ("config", "model_facts"),
    ("connections", "service"),
    ("deps",),
    ("routes",),
    ("app",),
    ("http_reference",),  # the docs' HTTP reference, read off the app's route table
    ("server",),
)
SERVER_FLOOR = {room: n for n, rooms in enumerate(SERVER_FLOORS) for room in rooms}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _server_room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else parts[1]


def _room_arrows(imports: list[Import] | None = None, room=_room) -> dict[tuple[str, str], list[Import]]:
    """(importing room, imported room) → the imports that draw that arrow."""
    arrows: dict[tuple[str, str], list[Import]] = {}
    for i in IMPORTS if imports is None else imports:
        if i.target == "refsight" or i.target.startswith("refsight."):
            a, b = room(i.module), room(i.target)
            if a != b:
                arrows.setdefault((a, b), []).append(i)
    return arrows


def test_the_room_arrows_see_an_arrow_back_up_and_a_two_way_pair():
    # the two-way import this rule ended: retrieval/__init__ -> embedders.registry, embedders.clip -> retrieval.embedders
    pair = [Import("refsight.retrieval", "refsight.embedders.registry", ("default_embedder",), 13, True),
            Import("refsight.embedders.clip", "refsight.retrieval.embedders", ("Embedder",), 17, True)]
    arrows = _room_arrows(pair)
    assert set(arrows) == {("retrieval", "embedders"), ("embedders", "retrieval")}
    assert FLOOR["retrieval"] > FLOOR["embedders"]  # so the second one runs back up


def test_every_room_has_one_floor():
    placed = [room for rooms in FLOORS for room in rooms]
    assert len(placed) == len(set(placed)), "a room placed twice"
    assert {_room(module) for module in MODULES} == set(placed), "place each room of src/refsight on a floor"


def test_no_import_runs_back_up():
    up = [i for (a, b), imports in _room_arrows().items() if FLOOR[b] > FLOOR[a] for i in imports]
    assert not up, report(up, "an import runs back up a floor (FLOORS): move the code it needs down")


def test_no_two_rooms_import_each_other():
    arrows = _room_arrows()
    both = [i for (a, b), imports in arrows.items() if a < b and (b, a) in arrows for i in imports + arrows[(b, a)]]
    assert not both, report(both, "two rooms import each other")


def _server_arrows() -> dict[tuple[str, str], list[Import]]:
    inside = [i for i in IMPORTS if under(i.module, "refsight.server") and under(i.target, "refsight.server")]
    return _room_arrows(inside, _server_room)


def test_every_server_room_has_one_floor():
    placed = [room for rooms in SERVER_FLOORS for room in rooms]
    assert len(placed) == len(set(placed)), "a server room placed twice"
    rooms = {_server_room(module) for module in MODULES if under(module, "refsight.server")}
    assert rooms == set(placed), "place each room of src/refsight/server on a floor (SERVER_FLOORS)"


def test_no_import_in_the_server_runs_back_up_or_both_ways():
    arrows = _server_arrows()
    up = [i for (a, b), imports in arrows.items() if SERVER_FLOOR[b] > SERVER_FLOOR[a] for i in imports]
    both = [i for (a, b), imports in arrows.items() if a < b and (b, a) in arrows for i in imports + arrows[(b, a)]]
    assert not up + both, report(up + both, "a server import runs back up a floor (SERVER_FLOORS) or two rooms import each other")
