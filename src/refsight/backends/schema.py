"""The one check every JSON schema passes before a grammar is made of it (all three runtimes).

A request's ``json_schema`` becomes a grammar in each runtime: xgrammar for the
transformers backends and vLLM, llama-cpp-python's converter for llama.cpp. Those
compilers fail deep inside, with messages that name no place in the schema (or, for a
recursive reference, not at all), so :func:`check_json_schema` walks the schema first
and refuses, as :class:`~refsight.errors.InvalidInputError` naming the schema path
(``json_schema.properties.a.$ref``), everything outside the subset both compilers take:

* every schema is an object (``true``/``false`` only as ``additionalProperties``, and
  ``"items": false`` beside ``prefixItems``: a fixed-length list);
* ``type`` names JSON types; ``properties``/``$defs``/``definitions`` map names to schemas;
  ``items`` is a schema, ``prefixItems``/``anyOf``/``oneOf``/``allOf`` non-empty lists of them;
  ``required`` lists names; ``enum`` is a non-empty list; ``pattern`` is a regular expression;
* numbers are finite, bounds are ordered, counts (``maxLength`` ...) are integers in
  0..:data:`MAX_SCHEMA_COUNT` (a grammar repeats a rule that many times);
* ``$ref`` is a local JSON pointer (``#/$defs/name``) that resolves, and no reference
  leads back into itself (llama.cpp's converter has no recursive rules);
* the schema is at most :data:`~refsight.inputs.jsonlimits.MAX_JSON_DEPTH` levels deep and
  :data:`MAX_SCHEMA_NODES` values large, walked without recursion.

What passes is then compiled by the runtime (``Backend.compile_schema``); a compiler that
still refuses it is reported as an ``InvalidInputError`` on ``json_schema`` too, never as
a model failure. Unknown keywords (``title``, ``description`` ...) are left to the compiler.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidInputError
from ..inputs.jsonlimits import MAX_JSON_DEPTH

__all__ = ["check_json_schema", "modern_json_schema", "MAX_SCHEMA_NODES", "MAX_SCHEMA_COUNT", "MAX_SCHEMA_REFS", "SCHEMA_TYPES"]

#: Most values (objects, lists, scalars) a schema may hold.
MAX_SCHEMA_NODES = 10_000
#: Largest ``maxLength`` / ``minItems`` ... a schema may ask for.
MAX_SCHEMA_COUNT = 1_000
#: Most ``$ref`` a schema may hold.
MAX_SCHEMA_REFS = 256
#: The JSON types ``type`` may name.
SCHEMA_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

_MAPS = ("properties", "$defs", "definitions")
_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def modern_json_schema(schema: Any) -> Any:
    """``schema`` with draft-04..07's tuple form written as 2020-12's: ``"items": [A, B]`` becomes
    ``"prefixItems": [A, B]`` and ``additionalItems`` becomes ``items`` (what llama-server and the
    grammar compilers take). Other values are returned as they are; the caller's object is not changed.
    Nesting deeper than :data:`MAX_JSON_DEPTH` is left as it is (the check then refuses it)."""
    return _modern(schema, 0)


def _modern(node: Any, depth: int) -> Any:
    if depth > MAX_JSON_DEPTH:
        return node
    if isinstance(node, list):
        return [_modern(item, depth + 1) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _modern(value, depth + 1) for key, value in node.items()}
    if isinstance(out.get("items"), list) and "prefixItems" not in out:
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    return out


def check_json_schema(schema: Any, name: str = "json_schema") -> None:
    """Raise :class:`InvalidInputError` naming the first place of ``schema`` no runtime could compile."""
    if not isinstance(schema, dict):
        raise InvalidInputError(name, f"a JSON schema must be an object, not {type(schema).__name__}")
    _check_values(schema, name)
    refs: list[tuple[tuple[Any, ...], str]] = []
    for node, path in _schemas(schema):
        _check_keywords(node, path, name)
        if "$ref" in node:
            refs.append((path, node["$ref"]))
    _check_refs(schema, refs, name)


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
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InvalidInputError(_where(name, path), f"object keys must be strings, not {key!r}")
                stack.append((item, (*path, key)))
        elif isinstance(value, (list, tuple)):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(_where(name, path), f"{value} is not a JSON number")
        elif not isinstance(value, (str, int, float, bool)) and value is not None:
            raise InvalidInputError(_where(name, path), f"{type(value).__name__} is not a JSON value")


def _schemas(root: dict[str, Any]) -> Iterator[tuple[dict[str, Any], tuple[Any, ...]]]:
    """Every subschema with its path, the root first (nodes that are not objects are yielded for refusal)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        yield node, path
        if not isinstance(node, dict):
            continue
        for key in _MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((child, (*path, key, k)) for k, child in node[key].items())
        for key in _LISTS:
            if isinstance(node.get(key), list):
                stack.extend((child, (*path, key, i)) for i, child in enumerate(node[key]))
        if "items" in node and not (node["items"] is False and "prefixItems" in node):
            stack.append((node["items"], (*path, "items")))
        if isinstance(node.get("additionalProperties"), dict):
            stack.append((node["additionalProperties"], (*path, "additionalProperties")))


def _check_keywords(node: Any, path: tuple[Any, ...], name: str) -> None:
    where = _where(name, path)
    if not isinstance(node, dict):
        raise InvalidInputError(where, f"a schema must be an object, not {type(node).__name__}")
    _check_type(node, path, name)
    _check_structure(node, path, name)
    _check_numbers(node, path, name)
    if "pattern" in node:
        _check_pattern(node["pattern"], _where(name, (*path, "pattern")))
    if "$ref" in node and (not isinstance(node["$ref"], str) or not node["$ref"].startswith("#")):
        raise InvalidInputError(_where(name, (*path, "$ref")), "only local references (#/$defs/NAME) are supported")


def _check_type(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    if "type" not in node:
        return
    kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
    if not kinds or len(set(map(repr, kinds))) != len(kinds) or any(k not in SCHEMA_TYPES for k in kinds):
        raise InvalidInputError(
            _where(name, (*path, "type")), f"must name one or more distinct JSON types ({', '.join(SCHEMA_TYPES)})"
        )


def _check_structure(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
    for key in _MAPS:
        if key in node and not isinstance(node[key], dict):
            raise InvalidInputError(_where(name, (*path, key)), "must map names to schemas")
    for key in _LISTS:
        if key in node and (not isinstance(node[key], list) or not node[key]):
            raise InvalidInputError(_where(name, (*path, key)), "must be a non-empty list of schemas")
    extra = node.get("additionalProperties", True)
    if not isinstance(extra, (bool, dict)):
        raise InvalidInputError(_where(name, (*path, "additionalProperties")), "must be true, false or a schema")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required) or len(set(required)) != len(required):
        raise InvalidInputError(_where(name, (*path, "required")), "must be a list of distinct property names")
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise InvalidInputError(_where(name, (*path, "enum")), "must be a non-empty list of values")
    if "format" in node and not isinstance(node["format"], str):
        raise InvalidInputError(_where(name, (*path, "format")), "must be a string")


def _check_numbers(node: dict[str, Any], path: tuple[Any, ...], name: str) -> None:
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
    for key in _COUNTS:
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SCHEMA_COUNT):
            raise InvalidInputError(_where(name, (*path, key)), f"must be an integer from 0 to {MAX_SCHEMA_COUNT}")
    for low_key, high_key in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties")):
        if node.get(low_key) is not None and node.get(high_key) is not None and node[low_key] > node[high_key]:
            raise InvalidInputError(_where(name, (*path, low_key)), f"is greater than {high_key}")


def _check_pattern(pattern: Any, where: str) -> None:
    if not isinstance(pattern, str):
        raise InvalidInputError(where, "must be a regular expression (a string)")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise InvalidInputError(where, f"is not a regular expression: {e}") from None


def _resolve(root: dict[str, Any], pointer: str) -> tuple[Any, ...] | None:
    """The path a local JSON pointer names inside ``root``, or None when it names nothing (or not a schema)."""
    if pointer == "#":
        return ()
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
    return tuple(path) if isinstance(node, dict) else None


def _check_refs(root: dict[str, Any], refs: list[tuple[tuple[Any, ...], str]], name: str) -> None:
    """Every ``$ref`` resolves, and following references never comes back to a schema already being expanded."""
    if len(refs) > MAX_SCHEMA_REFS:
        raise InvalidInputError(name, f"a JSON schema may hold at most {MAX_SCHEMA_REFS} references")
    targets: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for path, pointer in refs:
        target = _resolve(root, pointer)
        if target is None:
            raise InvalidInputError(_where(name, (*path, "$ref")), f"{pointer!r} does not resolve to a schema in this document")
        targets[path] = target
    # Expanding the schema at T expands every reference inside T's subtree: an edge T -> its target.
    edges = {
        start: [(where, target) for where, target in targets.items() if where[: len(start)] == start]
        for start in {(), *targets.values()}
    }
    _refuse_cycle(edges, name)


def _refuse_cycle(edges: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], tuple[Any, ...]]]], name: str) -> None:
    """Depth-first search without recursion; a reference to a schema on the current path is a cycle."""
    state: dict[tuple[Any, ...], int] = {}  # 1: on the current path, 2: done
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
                stack.pop()
                continue
            where, target = step
            if state.get(target) == 1:
                raise InvalidInputError(_where(name, (*where, "$ref")), "recursive references are not supported")
            if not state.get(target):
                state[target] = 1
                stack.append((target, iter(edges[target])))
