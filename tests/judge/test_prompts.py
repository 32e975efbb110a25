"""Prompt layout: references first, candidate next, criteria and instructions last."""

from __future__ import annotations

import pytest

from refsight.inputs.images import ImageInput
from refsight.inputs.rubric import parse_rubric
from refsight.judge.prompts import JUDGE_PREAMBLE, build_attribute_request, build_judge_request, reference_prefix
from refsight.judge.verdict import verdict_schema
from refsight.package import VisualPackage

from judge_helpers import fake_package, photo


def request(refs, candidate, rubric_text, **kw):
    criteria = parse_rubric(rubric_text).criteria
    return build_judge_request(refs, candidate, criteria, evidence_max_chars=50, max_new_tokens=99, **kw)


def test_reference_part_is_an_identical_prefix_across_rubrics():
    refs = [fake_package("a"), photo("coffee", (32, 24))]
    candidate = photo("chelsea", (32, 24))
    r1 = request(refs, candidate, "is a cat; orange fur")
    r2 = request(refs, candidate, [{"text": "pointed ears", "weight": 2, "required": True}])
    r3 = request(refs, photo("astronaut", (32, 32)), "same colours", retry_reason="bad JSON")
    prefix = reference_prefix(refs)
    for r in (r1, r2, r3):
        assert r.segments[: len(prefix)] == prefix
    # ... and the references themselves are the very same objects, in order
    assert [s for s in r1.segments if isinstance(s, (VisualPackage, ImageInput))][:2] == refs
    # what follows differs with the rubric
    assert r1.segments[len(prefix):] != r2.segments[len(prefix):]


def test_order_is_references_candidate_criteria():
    ref, candidate = fake_package("a"), photo("chelsea", (32, 24))
    r = request([ref], candidate, "is a cat; orange fur")
    assert r.segments[0] == JUDGE_PREAMBLE + "\n"
    assert r.segments[1:4] == ["Reference 1:", ref, "\n"]
    assert r.segments[4:7] == ["Candidate:", candidate, "\n"]
    tail = r.segments[-1]
    assert tail.startswith("Criteria:\n1. \"is a cat\"\n2. \"orange fur\"") and "JSON only" in tail
    assert r.packages == [ref] and r.fresh_images == [candidate] and r.max_new_tokens == 99


def test_labels_number_every_reference():
    refs = [fake_package("a"), fake_package("b"), fake_package("c")]
    prefix = reference_prefix(refs)
    assert [s for s in prefix if isinstance(s, str) and s.startswith("Reference")] == [
        "Reference 1:", "Reference 2:", "Reference 3:"
    ]


def test_retry_reason_goes_last_and_schema_is_passed_through():
    criteria = parse_rubric("is a cat").criteria
    schema = verdict_schema(criteria)
    r = request([fake_package()], fake_package("c"), "is a cat", json_schema=schema, retry_reason="missing key")
    assert r.json_schema is schema
    assert r.segments[-1].endswith("Your previous answer was rejected (missing key). Reply with the JSON object only.")


@pytest.mark.parametrize(
    "refs, candidate, error",
    [([], "pkg", ValueError), (["not an image"], "pkg", TypeError), (["pkg"], "not an image", TypeError)],
)
def test_bad_inputs(refs, candidate, error):
    refs = [fake_package() if r == "pkg" else r for r in refs]
    candidate = fake_package("c") if candidate == "pkg" else candidate
    with pytest.raises(error):
        request(refs, candidate, "is a cat")


def test_attribute_request_lists_the_attributes():
    r = build_attribute_request(
        fake_package(), {"fur_length": ("short", "long"), "facial_markings": None}, value_max_chars=30, max_new_tokens=80
    )
    text = r.segments[-1]
    assert '"fur_length": one of "short", "long", or "unknown"' in text
    assert '"facial_markings": at most 30 characters' in text
