"""Issue 25 item 1: structured input (YAML and JSON rubrics, attribute schema files) costs no more
than its size: anchors and aliases (the alias bomb), deep nesting and huge documents are refused
while parsing, naming the input and the reason."""

from __future__ import annotations

import json

import pytest

from refsight.errors import InvalidInputError, RubricError
from refsight.inputs.jsonlimits import MAX_NODES, json_nodes, load_json, load_yaml
from refsight.judge import load_attribute_schema
from refsight.inputs.rubric import parse_rubric


def alias_bomb(levels: int = 8) -> str:
    """The issue's rubric: nine strings, then eight levels of nine aliases each (9**9 strings, ~400 bytes)."""
    lines = ["criteria:", "- &a0 [" + ",".join(["lol"] * 9) + "]"]
    lines += [f"- &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(30)  # a guard only: the walk of the expanded tree took 36 s per request
def test_the_alias_bomb_is_refused_at_its_first_anchor():
    bomb = alias_bomb()
    assert len(bomb) <= 410
    with pytest.raises(InvalidInputError) as e:
        parse_rubric(bomb)
    assert e.value.input == "rubric" and "anchors and aliases" in e.value.reason and "line 2, column 3" in e.value.reason


@pytest.mark.parametrize("text", ["criteria:\n - &x a\n - b\n", "criteria:\n - a\n - *x\n", "- text: &t a\n- text: b\n"])
def test_any_anchor_or_alias_is_refused(text):
    with pytest.raises(InvalidInputError, match="anchors and aliases"):
        parse_rubric(text)


def test_deep_and_huge_yaml_and_json_are_refused_before_they_are_built():
    with pytest.raises(InvalidInputError, match="nested more than 64 levels"):
        load_yaml("a: " + "[" * 65 + "]" * 65, "doc")
    with pytest.raises(InvalidInputError, match=f"more than {MAX_NODES} values"):
        load_yaml("[" + "1," * MAX_NODES + "1]", "doc")
    with pytest.raises(InvalidInputError, match=f"more than {MAX_NODES} values"):
        parse_rubric("[" + "0," * 12000 + "0]", max_chars=10**6)  # a JSON rubric is bounded the same way
    with pytest.raises(InvalidInputError, match="values"):
        load_json("[" + "1," * 50 + "1]", "doc", max_nodes=10)
    assert json_nodes('{"a": [1, 2], "b": "x,[{"}') == 5  # brackets and commas inside strings do not count


def test_plain_yaml_still_loads_and_malformed_yaml_names_the_place():
    assert load_yaml("criteria:\n - a\n - {text: b, weight: 2}\n", "doc") == {"criteria": ["a", {"text": "b", "weight": 2}]}
    assert parse_rubric("criteria:\n - is a cat\n - text: same fur\n   required: true\n").texts == ["is a cat", "same fur"]
    with pytest.raises(RubricError, match="malformed YAML at line 3"):
        parse_rubric("criteria:\n  - text: [unclosed\n")


def test_a_rubric_given_as_a_huge_list_is_refused_without_reading_it_all():
    with pytest.raises(RubricError, match="more than 32 criteria"):
        parse_rubric([f"criterion {i}" for i in range(1_000_000)])


def test_an_attribute_schema_file_is_bounded_like_every_yaml_input(tmp_path):
    bomb = tmp_path / "schema.yaml"
    bomb.write_text("fur: &a [short, long]\nears: *a\n")
    with pytest.raises(InvalidInputError) as e:
        load_attribute_schema(bomb)
    assert e.value.input == str(bomb) and "anchors and aliases" in e.value.reason
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"fur": ["x" * 100] * 1000}))
    with pytest.raises(InvalidInputError, match="over the 65536-byte limit"):
        load_attribute_schema(huge)
    fine = tmp_path / "fine.yaml"
    fine.write_text("fur_length: [short, long]\nmarkings: null\n")
    assert load_attribute_schema(fine).names == ["fur_length", "markings"]
