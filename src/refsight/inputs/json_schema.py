"""The one check every JSON schema passes before a grammar is made of it (all three runtimes).

A request's ``json_schema`` becomes a grammar in each runtime: xgrammar for the
transformers backends and vLLM, llama-cpp-python's converter for llama.cpp. Those
compilers fail deep inside, with messages that name no place in the schema (or, for a
recursive reference, not at all), so :func:`check_json_schema` walks the schema first
and refuses, as :class:`~refsight.errors.InvalidInputError` naming the schema path
(``json_schema.properties.a.$ref``), everything outside the subset both compilers take:

* every schema is an object (``true``/``false`` only where one schema stands alone:
  ``additionalProperties``, ``not``, ``propertyNames`` ..., and ``"items": false`` beside
  ``prefixItems``: a fixed-length list);
* ``type`` names JSON types; ``properties``/``patternProperties``/``$defs``/``definitions``/
  ``dependentSchemas`` map names to schemas;
  ``items`` is a schema, ``prefixItems``/``anyOf``/``oneOf``/``allOf`` non-empty lists of them;
  ``required`` lists names; ``enum`` is a non-empty list; ``pattern`` is a regular expression;
* numbers are finite, bounds are ordered, counts (``maxLength`` ...) are integers in
  0..:data:`MAX_SCHEMA_COUNT` (a grammar repeats a rule that many times);
* each ``pattern`` and ``patternProperties`` key is a regular expression of at most
  :data:`MAX_PATTERN_SIZE` characters whose repeat counts are at most :data:`MAX_SCHEMA_COUNT`
  and which expands to at most :data:`MAX_PATTERN_SIZE` atoms (nested counts multiply:
  :mod:`.schema_regex`);
* ``$ref`` is a local JSON pointer (``#/$defs/name``) that resolves, and no reference
  leads back into itself (llama.cpp's converter has no recursive rules);
* the whole grammar is at most :data:`MAX_SCHEMA_SIZE` atoms, as written (checked as the walk
  goes, so the work stays bounded) and with each reference written out where it is used
  (:func:`schema_size`);
* the schema is at most :data:`~refsight.inputs.jsonlimits.MAX_JSON_DEPTH` levels deep and
  :data:`MAX_SCHEMA_NODES` values large, walked without recursion.

Every place a schema may stand is walked (``not``, ``if``, ``contains``, ``propertyNames``,
``dependentSchemas`` ... too), and so is every ``$ref`` target, wherever in the document it
points: a compiler reads them all, so none may carry an unchecked pattern.

What passes is then compiled by the runtime (``Backend.compile_schema``); a compiler that
still refuses it is reported as an ``InvalidInputError`` on ``json_schema`` too, never as
a model failure. Unknown keywords (``title``, ``description`` ...) are left to the compiler.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import InvalidInputError
from .jsonlimits import MAX_JSON_DEPTH
from .schema_regex import pattern_size

__all__ = [
    "check_json_schema", "modern_json_schema", "schema_size", "MAX_SCHEMA_NODES", "MAX_SCHEMA_COUNT",
    "MAX_PATTERN_SIZE", "MAX_SCHEMA_SIZE", "MAX_SCHEMA_REFS", "SCHEMA_TYPES",
]

#: Most values (objects, lists, scalars) a schema may hold.
MAX_SCHEMA_NODES = 10_000
#: Largest ``maxLength`` / ``minItems`` ... a schema may ask for, and largest repeat count in a ``pattern``.
MAX_SCHEMA_COUNT = 1_000
#: Most atoms one ``pattern`` (or ``patternProperties`` key) may expand to (:mod:`.schema_regex`).
MAX_PATTERN_SIZE = 10_000
#: Most atoms a whole schema's grammar may expand to (:func:`schema_size`).
MAX_SCHEMA_SIZE = 100_000
#: Most ``$ref`` a schema may hold.
MAX_SCHEMA_REFS = 256
#: The JSON types ``type`` may name.
SCHEMA_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_DEFINITIONS = ("$defs", "definitions")
_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
# Keywords holding one schema (true/false too, which hold nothing to check).
_SINGLES = ("additionalProperties", "additionalItems", "propertyNames", "contains", "not", "if", "then", "else",
            "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_SPANS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"))
# llama.cpp's grammar writes a number bounded on both sides as 101 values (backends/llamacpp/grammar.py).
_GRID_VALUES = 101
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def modern_json_schema(schema: Any) -> Any:
    """``schema`` with draft-04..07's tuple form written as 2020-12's: ``"items": [A, B]`` becomes
    ``"prefixItems": [A, B]`` and ``additionalItems`` becomes ``items`` (what llama-server and the
    grammar compilers take). Other values are returned as they are; the caller's object is not changed.
    Nesting deeper than :data:`MAX_JSON_DEPTH` is left as it is (the check then refuses it). A schema already
    in the modern form is returned itself: nothing is copied."""
    return _modern(schema, 0)


def _modern(node: Any, depth: int) -> Any:
    if depth > MAX_JSON_DEPTH or not isinstance(node, (list, dict)):
        return node
    if isinstance(node, list):
        items = [_modern(item, depth + 1) for item in node]
        return node if _unchanged(items, node) else items
    out = {key: _modern(value, depth + 1) for key, value in node.items()}
    if isinstance(out.get("items"), list) and "prefixItems" not in out:
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
        return out
    return node if _unchanged(out.values(), node.values()) else out


def _unchanged(new: Iterable[Any], old: Iterable[Any]) -> bool:
    """Whether each of ``new`` is the very object of ``old`` in its place: nothing under them was rewritten."""
    return all(a is b for a, b in zip(new, old))


def check_json_schema(schema: Any, name: str = "json_schema") -> Any:
    """Raise :class:`InvalidInputError` naming the first place of ``schema`` no runtime could compile; else the
    schema as it was checked, in the form the compilers get (:func:`modern_json_schema`: the draft-07 tuple form
    written as 2020-12's; ``schema`` itself when it is modern already)."""
    modern = modern_json_schema(schema)
    schema_size(modern, name)
    return modern


def schema_size(schema: Any, name: str = "json_schema") -> int:
    """The atoms ``schema``'s grammar expands to, making every check of :func:`check_json_schema` on the way.

    Each schema counts one, plus its property names and its ``enum`` / ``const`` values by the
    character (a grammar spells them out), what its ``pattern`` and ``patternProperties`` keys
    expand to, its largest count (``maxLength``, or ``minLength`` plus one when open: a compiler
    writes that many copies of a character or an item rule) and a bounded number's 101 grid
    values; a definition counts only where it is used, and a ``$ref`` counts its target again
    wherever it stands (a compiler may write it out there: llama.cpp's ``allOf`` does). Counts
    of schemas add rather than multiply (1,000 items of
    1,000-character strings are one string rule used 1,000 times): all three compilers name a
    rule where it repeats instead of copying it. Only inside a pattern do counts multiply.
    More than :data:`MAX_SCHEMA_SIZE` is an :class:`InvalidInputError` on ``name``.
    """
    if not isinstance(schema, dict):
        raise InvalidInputError(name, f"a JSON schema must be an object, not {type(schema).__name__}")
    _check_values(schema, name)
    walk = _Walk(schema, name)
    walk.visit((), schema)
    targets = walk.follow_refs()
    # Expanding the schema at T expands every reference inside T's subtree: an edge T -> its target.
    edges = {
        start: [(where, target) for where, target in targets.items() if where[: len(start)] == start]
        for start in {(), *targets.values()}
    }
    size = walk.total(targets, _refuse_cycle(edges, name))
    if size > MAX_SCHEMA_SIZE:
        raise _too_large(name, walk.own, "with its references written out")
    return size


def _too_large(name: str, own: dict[tuple[Any, ...], int], how: str) -> InvalidInputError:
    largest = max(own, key=own.__getitem__)
    return InvalidInputError(name, (
        f"its grammar, {how}, is more than {MAX_SCHEMA_SIZE} atoms (names, values, lengths, item counts and "
        f"patterns add up, and a $ref counts its target each time it is used; the largest part: {_where(name, largest)})"))


class _Walk:
    """Every subschema of one document, checked once, with its own size and its parent (for the totals)."""

    def __init__(self, doc: dict[str, Any], name: str) -> None:
        self.doc, self.name = doc, name
        self.own: dict[tuple[Any, ...], int] = {}
        self.parent: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}
        self.refs: dict[tuple[Any, ...], str] = {}
        self.definitions: set[tuple[Any, ...]] = set()  # schemas standing in $defs / definitions
        self.written = 0  # the own sizes so far: every schema once, used or not

    def visit(self, start: tuple[Any, ...], node: Any) -> None:
        """Check the schema at ``start`` and every schema inside it, without recursion."""
        stack: list[tuple[Any, tuple[Any, ...], tuple[Any, ...] | None]] = [(node, start, None)]
        while stack:
            node, path, parent = stack.pop()
            if path in self.own:
                # A reference target walked before from itself turns out to lie inside this schema.
                if self.parent[path] is None and parent is not None:
                    self.parent[path] = parent
                continue
            self.own[path] = _check_node(node, path, self.name)
            self.parent[path] = parent
            self.written += self.own[path]
            if self.written > MAX_SCHEMA_SIZE:  # before more patterns are parsed: the work stays bounded
                raise _too_large(self.name, self.own, "as written")
            if "$ref" in node:
                self.refs[path] = node["$ref"]
            for child, child_path in _children(node, path):
                if len(child_path) == len(path) + 2 and child_path[-2] in _DEFINITIONS:
                    self.definitions.add(child_path)
                stack.append((child, child_path, path))

    def follow_refs(self) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """Each ``$ref``'s target path; a target outside the schemas walked so far is walked too."""
        targets: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        while len(targets) < len(self.refs):
            if len(self.refs) > MAX_SCHEMA_REFS:
                raise InvalidInputError(self.name, f"a JSON schema may hold at most {MAX_SCHEMA_REFS} references")
            for path, pointer in [(p, r) for p, r in self.refs.items() if p not in targets]:
                found = _resolve(self.doc, pointer)
                if found is None:
                    raise InvalidInputError(
                        _where(self.name, (*path, "$ref")), f"{pointer!r} does not resolve to a schema in this document")
                targets[path], node = found
                if targets[path] not in self.own:
                    self.visit(targets[path], node)
        return targets

    def total(self, targets: dict[tuple[Any, ...], tuple[Any, ...]], order: list[tuple[Any, ...]]) -> int:
        """The root's size: each schema's own size and its subschemas', each reference adding its target's
        total; a definition (``$defs``, ``definitions``) counts only where a reference uses it."""
        subtree = dict(self.own)
        for path in sorted(self.own, key=len, reverse=True):  # children (longer paths) before parents
            if self.parent[path] is not None and path not in self.definitions:
                subtree[self.parent[path]] += subtree[path]
        uses: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {start: [] for start in order}
        for where, target in targets.items():
            node: tuple[Any, ...] | None = where
            while node is not None:  # every schema whose grammar holds this reference
                if node in uses:
                    uses[node].append(target)
                if node in self.definitions:
                    break
                node = self.parent[node]
        totals: dict[tuple[Any, ...], int] = {}
        for start in order:  # every target is done before a schema that refers to it
            totals[start] = min(subtree[start] + sum(totals[t] for t in uses[start]), MAX_SCHEMA_SIZE + 1)
        return totals[()]


def _where(name: str, path: tuple[Any, ...]) -> str:
    return name + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _check_values(schema: dict[str, Any], name: str) -> None:
    """JSON values only (string keys, finite numbers), bounded in depth and size, without recursion."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    seen = 0
    while stack:
        value, path = stack.pop()
        seen += 1
        if seen > MAX_SCHEMA_NODES:
            raise InvalidInputError(name, f"a JSON schema may hold at most {MAX_SCHEMA_NODES} values")
        if len(path) > MAX_JSON_DEPTH:
            raise InvalidInputError(_where(name, path[:MAX_JSON_DEPTH]), f"nests deeper than {MAX_JSON_DEPTH} levels")
        stack.extend(_inner_values(value, path, name))


def _inner_values(value: Any, path: tuple[Any, ...], name: str) -> list[tuple[Any, tuple[Any, ...]]]:
    """The values directly inside ``value`` with their paths; a value JSON cannot carry is refused."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise InvalidInputError(_where(name, path), f"object keys must be strings, not {key!r}")
        return [(item, (*path, key)) for key, item in value.items()]
    if isinstance(value, (list, tuple)):
        return [(item, (*path, i)) for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(_where(name, path), f"{value} is not a JSON number")
    if not isinstance(value, (str, int, float, bool)) and value is not None:
        raise InvalidInputError(_where(name, path), f"{type(value).__name__} is not a JSON value")
    return []


def _children(node: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """The subschemas directly inside ``node`` with their paths (values that are not objects too, for refusal)."""
    if not isinstance(node, dict):
        return
    yield from _grouped_children(node, path)
    if "items" in node and not (node["items"] is False and "prefixItems" in node):
        yield node["items"], (*path, "items")
    for key in _SINGLES:
        if key in node and not isinstance(node[key], bool):
            yield node[key], (*path, key)


def _grouped_children(node: dict[str, Any], path: tuple[Any, ...]) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """The subschemas of the keywords that hold several: by name (``properties`` ...) or in a list (``anyOf`` ...)."""
    for key in _MAPS:
        if isinstance(node.get(key), dict):
            yield from ((child, (*path, key, k)) for k, child in node[key].items())
    for key in _LISTS:
        if isinstance(node.get(key), list):
            yield from ((child, (*path, key, i)) for i, child in enumerate(node[key]))


def _check_node(node: Any, path: tuple[Any, ...], name: str) -> int:
    """Refuse what no compiler takes in this one schema; return its own size (see :func:`schema_size`)."""
    where = _where(name, path)
    if not isinstance(node, dict):
        raise InvalidInputError(where, f"a schema must be an object, not {type(node).__name__}")
    _check_type(node, path, name)
    _check_structure(node, path, name)
    _check_numbers(node, path, name)
    if "$ref" in node and (not isinstance(node["$ref"], str) or not node["$ref"].startswith("#")):
        raise InvalidInputError(_where(name, (*path, "$ref")), "only local references (#/$defs/NAME) are supported")
    bounds = {"max_repeat": MAX_SCHEMA_COUNT, "max_size": MAX_PATTERN_SIZE}
    size = 1 + _counted(node)
    if "pattern" in node:
        size += pattern_size(node["pattern"], _where(name, (*path, "pattern")), **bounds)
    for key in node.get("patternProperties", {}):
        size += pattern_size(key, _where(name, (*path, "patternProperties", key)), **bounds)
    return size


def _counted(node: dict[str, Any]) -> int:
    """What a schema's names, values, counts and bounds add to its grammar (checked values only)."""
    # Literal text is written into the grammar character by character: property names, enum and const values.
    size = sum(map(len, node["properties"])) if isinstance(node.get("properties"), dict) else 0
    if isinstance(node.get("enum"), list):
        size += sum(len(json.dumps(value, ensure_ascii=False)) for value in node["enum"])
    if "const" in node:
        size += len(json.dumps(node["const"], ensure_ascii=False))
    for low, high in _SPANS:
        if node.get(high) is not None:
            size += node[high]
        elif node.get(low) is not None:
            size += node[low] + 1
    if node.get("type") == "number" and all(isinstance(node.get(k), (int, float)) for k in ("minimum", "maximum")):
        size += _GRID_VALUES
    return size


def _check_type(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    if "type" not in node:
        return
    kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
    if not kinds or len(set(map(repr, kinds))) != len(kinds) or any(k not in SCHEMA_TYPES for k in kinds):
        raise InvalidInputError(
            _where(name, (*path, "type")), f"must name one or more distinct JSON types ({', '.join(SCHEMA_TYPES)})"
        )


def _check_structure(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    _check_subschemas(node, path, name)
    _check_keywords(node, path, name)


def _check_subschemas(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    """The keywords that hold schemas hold them in the right container."""
    for key in _MAPS:
        if key in node and not isinstance(node[key], dict):
            raise InvalidInputError(_where(name, (*path, key)), "must map names to schemas")
    for key in _LISTS:
        if key in node and (not isinstance(node[key], list) or not node[key]):
            raise InvalidInputError(_where(name, (*path, key)), "must be a non-empty list of schemas")
    extra = node.get("additionalProperties", True)
    if not isinstance(extra, (bool, dict)):
        raise InvalidInputError(_where(name, (*path, "additionalProperties")), "must be true, false or a schema")


def _check_keywords(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    """``required``, ``enum`` and ``format`` hold what they name."""
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required) or len(set(required)) != len(required):
        raise InvalidInputError(_where(name, (*path, "required")), "must be a list of distinct property names")
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise InvalidInputError(_where(name, (*path, "enum")), "must be a non-empty list of values")
    if "format" in node and not isinstance(node["format"], str):
        raise InvalidInputError(_where(name, (*path, "format")), "must be a string")


def _check_numbers(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    _check_bounds(node, path, name)
    _check_counts(node, path, name)


def _check_bounds(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    """A number's bounds are numbers, the lower not above the upper; ``multipleOf`` above 0."""
    def number(key: str) -> float | None:
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InvalidInputError(_where(name, (*path, key)), "must be a number")
        return value

    low = [v for v in (number("minimum"), number("exclusiveMinimum")) if v is not None]
    high = [v for v in (number("maximum"), number("exclusiveMaximum")) if v is not None]
    if low and high and max(low) > min(high):
        raise InvalidInputError(_where(name, (*path, "minimum")), "the lower bound is above the upper bound")
    step = number("multipleOf")
    if step is not None and step <= 0:
        raise InvalidInputError(_where(name, (*path, "multipleOf")), "must be greater than 0")


def _check_counts(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    """Lengths, item and property counts are bounded integers, each minimum not above its maximum."""
    for key in _COUNTS:
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SCHEMA_COUNT):
            raise InvalidInputError(_where(name, (*path, key)), f"must be an integer from 0 to {MAX_SCHEMA_COUNT}")
    for low_key, high_key in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties")):
        if node.get(low_key) is not None and node.get(high_key) is not None and node[low_key] > node[high_key]:
            raise InvalidInputError(_where(name, (*path, low_key)), f"is greater than {high_key}")


def _resolve(root: dict[str, Any], pointer: str) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """(path, schema) a local JSON pointer names inside ``root``, or None when it names nothing (or not a schema)."""
    if pointer == "#":
        return (), root
    if not pointer.startswith("#/"):
        return None
    node: Any = root
    path: list[Any] = []
    for raw in pointer[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
            path.append(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            path.append(int(part))
        else:
            return None
    return (tuple(path), node) if isinstance(node, dict) else None


def _refuse_cycle(
    edges: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], tuple[Any, ...]]]], name: str
) -> list[tuple[Any, ...]]:
    """Depth-first search without recursion; a reference to a schema on the current path is a cycle.

    Returns the schemas in the order they were done: each after every target it refers to.
    """
    state: dict[tuple[Any, ...], int] = {}  # 1: on the current path, 2: done
    done: list[tuple[Any, ...]] = []
    for root in edges:
        if state.get(root):
            continue
        state[root] = 1
        stack = [(root, iter(edges[root]))]
        while stack:
            node, pending = stack[-1]
            step = next(pending, None)
            if step is None:
                state[node] = 2
                done.append(node)
                stack.pop()
                continue
            where, target = step
            if state.get(target) == 1:
                raise InvalidInputError(_where(name, (*where, "$ref")), "recursive references are not supported")
            if not state.get(target):
                state[target] = 1
                stack.append((target, iter(edges[target])))
    return done
