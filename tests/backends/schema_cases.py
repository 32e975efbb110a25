"""JSON schemas for the constrained-decoding tests of every runtime (a uniquely named module).

:data:`BROKEN` pairs schemas no grammar compiler takes with the path the refusal must name;
:func:`schemas` is a hypothesis strategy mixing valid keywords with broken ones (wrong
types, dangling and recursive references, unordered bounds, bad patterns ...), so that
a few hundred examples reach every branch of the shared check and of each compiler.
"""

from __future__ import annotations

from hypothesis import strategies as st

#: (schema, the path the InvalidInputError must name)
BROKEN = [
    ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "json_schema.properties.a.$ref"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}}, "json_schema.properties.a.$ref"),
    ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
     "json_schema.$defs.n.properties.next.$ref"),
    ({"$ref": "http://example.com/schema.json"}, "json_schema.$ref"),
    ({"type": "objekt"}, "json_schema.type"),
    ({"type": "object", "properties": {"a": True}}, "json_schema.properties.a"),
    ({"type": "object", "properties": {"a": "string"}}, "json_schema.properties.a"),
    ({"type": "array", "items": 5}, "json_schema.items"),
    ({"type": "object", "required": "a"}, "json_schema.required"),
    ({"enum": []}, "json_schema.enum"),
    ({"anyOf": []}, "json_schema.anyOf"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "json_schema.minimum"),
    ({"type": "string", "minLength": 5, "maxLength": 1}, "json_schema.minLength"),
    ({"type": "string", "maxLength": 10**9}, "json_schema.maxLength"),
    ({"type": "string", "pattern": "(ab"}, "json_schema.pattern"),
    ({"type": "number", "multipleOf": 0}, "json_schema.multipleOf"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": 5}]}}}, "json_schema.properties.a.anyOf[1].type"),
    # Grammar size (issue 49, group 2): every repeat count and every place a pattern may stand.
    ({"type": "object", "properties": {"name": {"type": "string", "pattern": "^a{100000000}$"}}},
     "json_schema.properties.name.pattern"),
    ({"type": "string", "pattern": "^(a{1000}){1000}$"}, "json_schema.pattern"),
    ({"type": "string", "pattern": "^a{ 100000000 }$"}, "json_schema.pattern"),
    ({"type": "object", "patternProperties": {"^[a-z]{5000}$": {"type": "string"}}}, "json_schema.patternProperties.^[a-z]{5000}$"),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]{5000}$"}}, "json_schema.propertyNames.pattern"),
    ({"$ref": "#/components/x", "components": {"x": {"type": "string", "pattern": "^a{5000}$"}}}, "json_schema.components.x.pattern"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(101)}}, "json_schema"),
]

_TYPES = ["object", "array", "string", "number", "integer", "boolean", "null"]
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False) | st.text("ab", max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab", max_size=2), inner, max_size=2),
    max_leaves=5,
)
_names = st.sampled_from(["a", "b", "c"])
_refs = st.sampled_from(["#", "#/$defs/x", "#/$defs/y", "#/$defs/nowhere", "#/properties/a", "http://x", "#/$defs/x/properties/a"])
_patterns = st.sampled_from(["^[a-z]+$", "^(yes|no)$", "[a-z]", "(", "^a{2,3}$", "^\\d+$", "^a{100000000}$",
                             "^(a{100}){100}$", "^[a-z]{1000,}$", "^a{ 9 }$", "^[]a{9}]$"])


def _node(children: st.SearchStrategy) -> st.SearchStrategy:
    """One schema object whose keywords are sometimes right and sometimes wrong."""
    count = st.integers(-1, 12) | st.sampled_from([10**6]) | _json
    bound = st.integers(-5, 5) | st.floats(-5, 5, allow_nan=False) | _json
    return st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(_TYPES) | st.lists(st.sampled_from(_TYPES), max_size=3) | _json,
        "properties": st.dictionaries(_names, children, max_size=3) | _json,
        "required": st.lists(_names, max_size=3) | _json,
        "additionalProperties": st.booleans() | children | _json,
        "items": children | _json,
        "prefixItems": st.lists(children, max_size=2),
        "enum": st.lists(_json, max_size=3) | _json,
        "const": _json,
        "anyOf": st.lists(children, max_size=2),
        "oneOf": st.lists(children, max_size=2),
        "allOf": st.lists(children, max_size=2),
        "$ref": _refs | _json,
        "$defs": st.dictionaries(st.sampled_from(["x", "y"]), children, max_size=2),
        "minimum": bound, "maximum": bound, "exclusiveMinimum": bound,
        "minLength": count, "maxLength": count, "minItems": count, "maxItems": count,
        "pattern": _patterns | _json,
        "patternProperties": st.dictionaries(_patterns, children, max_size=2) | _json,
        "propertyNames": children | st.booleans() | _json,
        "not": children | st.booleans() | _json,
        "format": st.sampled_from(["date", "email", "uuid"]) | _json,
    })


def schemas() -> st.SearchStrategy:
    """Nested schemas, valid and broken, and now and then something that is not a schema at all."""
    tree = st.recursive(st.just({}) | _node(st.just({})), _node, max_leaves=6)
    return tree | _json
