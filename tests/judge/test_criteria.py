"""Rubric parsing: every accepted form, and a clear RubricError for every kind of bad rubric."""

from __future__ import annotations

import json

import pytest

from refsight.errors import InvalidInputError, RubricError
from refsight.inputs.rubric import Criterion, Rubric, parse_rubric


def texts(rubric: Rubric) -> list[str]:
    return [c.text for c in rubric]


@pytest.mark.parametrize(
    "text",
    [
        "is a cat\nhas orange fur\npointed ears",
        "- is a cat\n- has orange fur\n- pointed ears",
        "* is a cat\n*  has orange fur\n* pointed ears\n",
        "• is a cat\n• has orange fur\n• pointed ears",
        "1. is a cat\n2. has orange fur\n3) pointed ears",
        "a) is a cat\nb) has orange fur\nc) pointed ears",
        "is a cat; has orange fur; pointed ears",
        "is a cat, has orange fur, pointed ears",
        "  is a cat ,  has   orange fur,pointed ears, ",
    ],
)
def test_free_text_forms_give_the_same_criteria(text):
    assert texts(parse_rubric(text)) == ["is a cat", "has orange fur", "pointed ears"]


def test_lines_are_not_split_on_commas():
    rubric = parse_rubric("white paws, like socks\nsame ear shape")
    assert texts(rubric) == ["white paws, like socks", "same ear shape"]


def test_semicolons_win_over_commas_on_one_line():
    assert texts(parse_rubric("orange, striped fur; pointed ears")) == ["orange, striped fur", "pointed ears"]


def test_json_list_of_strings_and_objects():
    data = ["is a cat", {"text": "orange fur", "weight": 2, "required": True}]
    rubric = parse_rubric(json.dumps(data))
    assert rubric.criteria == (Criterion("is a cat"), Criterion("orange fur", 2.0, True))
    assert parse_rubric(json.dumps({"criteria": data})) == rubric
    assert parse_rubric(data) == rubric  # already decoded data
    assert parse_rubric({"criteria": data}) == rubric


def test_yaml_forms():
    text = "criteria:\n  - text: is a cat\n    required: true\n  - text: orange fur\n    weight: 0.5\n  - pointed ears\n"
    rubric = parse_rubric(text)
    assert rubric.criteria == (Criterion("is a cat", 1.0, True), Criterion("orange fur", 0.5), Criterion("pointed ears"))
    assert parse_rubric("- text: is a cat\n  weight: 3\n").criteria == (Criterion("is a cat", 3.0),)
    assert parse_rubric("---\n- is a cat\n- orange fur\n") == parse_rubric("is a cat\norange fur")


def test_rubric_round_trips_and_digest_tracks_content():
    rubric = parse_rubric([{"text": "is a cat", "weight": 2.5, "required": True}, "orange fur"])
    assert parse_rubric(rubric.to_dict()) == rubric
    assert parse_rubric(rubric) == rubric
    assert parse_rubric(json.dumps(rubric.to_dict())).digest == rubric.digest
    assert parse_rubric("orange fur; is a cat").digest != parse_rubric("is a cat; orange fur").digest
    assert parse_rubric("is a cat").digest != parse_rubric([{"text": "is a cat", "weight": 2}]).digest
    assert len(rubric) == 2 and rubric[0].text == "is a cat" and rubric.texts == ["is a cat", "orange fur"]


def test_whitespace_inside_a_criterion_is_collapsed():
    assert texts(parse_rubric("is   a\tcat")) == ["is a cat"]


# -- errors: each names the input and the reason --------------------------------------------------


@pytest.mark.parametrize("source", ["", "   \n\t ", ",;", "- \n* \n", "[]", "{\"criteria\": []}", [], {"criteria": None}])
def test_empty_rubric(source):
    with pytest.raises(RubricError, match="empty"):
        parse_rubric(source)


@pytest.mark.parametrize(
    "source",
    ["is a cat\nIs A  Cat", "is a cat; IS A CAT", ["orange fur", {"text": " Orange   fur "}]],
)
def test_duplicate_criteria(source):
    with pytest.raises(RubricError, match="duplicate of criterion 1") as info:
        parse_rubric(source)
    assert info.value.input.startswith("criterion 2")


@pytest.mark.parametrize("weight", [0, -1, -0.5, float("nan"), float("inf"), "2", True, None, [1]])
def test_weights_must_be_positive_finite_numbers(weight):
    with pytest.raises(RubricError, match="weight must be a positive") as info:
        parse_rubric([{"text": "is a cat", "weight": weight}])
    assert "criterion 1" in info.value.input


def test_nan_weight_in_json_text():
    with pytest.raises(RubricError, match="positive finite"):
        parse_rubric('[{"text": "is a cat", "weight": NaN}]')


def test_required_must_be_boolean():
    with pytest.raises(RubricError, match="required must be true or false"):
        parse_rubric([{"text": "is a cat", "required": "yes"}])


def test_too_many_criteria():
    with pytest.raises(RubricError, match="more than 32 criteria, over the limit of 32"):
        parse_rubric("\n".join(f"criterion number {i}" for i in range(33)))
    assert len(parse_rubric("\n".join(f"c{i}" for i in range(5)), max_criteria=5)) == 5


def test_too_many_characters():
    with pytest.raises(RubricError, match="over the 8000-character limit"):
        parse_rubric("x" * 8001)
    with pytest.raises(RubricError, match="criteria hold .* over the 100-character limit"):
        parse_rubric([f"{'long criterion ' * 3}{i}" for i in range(3)], max_chars=100)


def test_criterion_too_long():
    with pytest.raises(RubricError, match="301 characters, over the 300-character limit per criterion"):
        parse_rubric("y" * 301)


@pytest.mark.parametrize(
    "text, reason",
    [
        ('["is a cat", ', "malformed JSON at line 1"),
        ('{"criteria": ["a",]}', "malformed JSON"),
        ("criteria:\n  - text: [unclosed\n", "malformed YAML at line"),
        ("criteria: [a, b\n", "malformed YAML"),
    ],
)
def test_malformed_json_and_yaml(text, reason):
    with pytest.raises(RubricError, match=reason) as info:
        parse_rubric(text)
    assert info.value.input == "rubric"


@pytest.mark.parametrize(
    "source, reason",
    [
        ([{"text": "a", "wieght": 2}], r"unknown key\(s\) \['wieght'\]"),
        ({"critera": ["a"]}, "unknown key"),
        ({"criteria": "is a cat"}, "criteria must be a list"),
        ([{"weight": 2}], "needs a 'text'"),
        ([{"text": ""}], "text is empty"),
        ([{"text": 5}], "text must be a string"),
        ([3], "must be a string or a mapping"),
        ('"just a string"', None),  # plain text, a valid one-criterion rubric
        (42, "a rubric must be text, a list or a mapping"),
    ],
)
def test_malformed_structures(source, reason):
    if reason is None:
        assert texts(parse_rubric(source)) == ['"just a string"']
        return
    with pytest.raises(RubricError, match=reason):
        parse_rubric(source)


def test_rubric_error_is_an_invalid_input_value_error():
    with pytest.raises(InvalidInputError):
        parse_rubric("")
    with pytest.raises(ValueError):
        parse_rubric("")
