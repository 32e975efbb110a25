"""The verdict schema, validation of answers, the score, and the token budget."""

from __future__ import annotations

import json

import jsonschema
import pytest

from refsight.inputs.rubric import Criterion, parse_rubric
from refsight.judge.verdict import (
    CriterionVerdict,
    VerdictParseError,
    extract_json,
    parse_verdicts,
    score_verdicts,
    token_budget,
    uncertain_verdicts,
    verdict_schema,
)

CRITERIA = parse_rubric([{"text": "is a cat", "required": True}, {"text": "orange fur", "weight": 3}, "pointed ears"]).criteria


def answer(*entries, wrap=True):
    items = [
        {"criterion": c, "verdict": v, "confidence": conf, "evidence": ev} for c, v, conf, ev in entries
    ]
    return json.dumps({"criteria": items}) if wrap else items


GOOD = answer(("is a cat", "match", 0.9, "cat"), ("orange fur", "mismatch", 0.4, "grey"), ("pointed ears", "uncertain", 0, ""))


def test_schema_is_valid_draft_2020_12_and_fixes_the_criteria():
    schema = verdict_schema(CRITERIA)
    jsonschema.Draft202012Validator.check_schema(schema)
    items = schema["properties"]["criteria"]
    assert [i["properties"]["criterion"]["const"] for i in items["prefixItems"]] == ["is a cat", "orange fur", "pointed ears"]
    assert items["items"] is False and items["minItems"] == items["maxItems"] == 3


def test_valid_answer_parses_in_order():
    verdicts = parse_verdicts(GOOD, CRITERIA)
    assert [v.verdict for v in verdicts] == ["match", "mismatch", "uncertain"]
    assert verdicts[0] == CriterionVerdict("is a cat", "match", 0.9, "cat", "vlm")


def test_answer_inside_prose_or_a_code_fence_is_found():
    assert len(parse_verdicts(f"Sure!\n```json\n{GOOD}\n```\nDone.", CRITERIA)) == 3


@pytest.mark.parametrize(
    "text, reason",
    [
        ("I think it matches.", "no JSON object"),
        ('{"criteria": [', "malformed JSON"),
        (answer(("is a cat", "match", 0.9, "x")), "schema violation"),  # missing criteria
        (answer(("orange fur", "match", 1, ""), ("is a cat", "match", 1, ""), ("pointed ears", "match", 1, "")), "schema violation"),
        (answer(("is a cat", "yes", 1, ""), ("orange fur", "match", 1, ""), ("pointed ears", "match", 1, "")), "schema violation"),
        (answer(("is a cat", "match", 1.5, ""), ("orange fur", "match", 1, ""), ("pointed ears", "match", 1, "")), "schema violation"),
        (answer(("is a cat", "match", "high", ""), ("orange fur", "match", 1, ""), ("pointed ears", "match", 1, "")), "schema violation"),
        (answer(("is a cat", "match", 1, "x" * 161), ("orange fur", "match", 1, ""), ("pointed ears", "match", 1, "")), "schema violation"),
        ('{"verdicts": []}', "schema violation"),
        ("[" * 100_000, "no JSON object"),
        ("{" + '"a":[' * 100_000, "malformed JSON|nested too deeply"),
    ],
)
def test_invalid_answers_raise_verdict_parse_error(text, reason):
    with pytest.raises(VerdictParseError, match=reason):
        parse_verdicts(text, CRITERIA)


def test_extra_keys_are_rejected():
    data = json.loads(GOOD)
    data["criteria"][0]["score"] = 1
    with pytest.raises(VerdictParseError, match="schema violation"):
        parse_verdicts(json.dumps(data), CRITERIA)


def test_escaped_quotes_and_newlines_in_free_form_evidence_are_fine():
    text = answer(("is a cat", "match", 1, 'said "cat"\n'))
    assert parse_verdicts(text, CRITERIA[:1])[0].evidence == 'said "cat"\n'


def test_score_is_the_weighted_fraction_of_matches():
    v = parse_verdicts(GOOD, CRITERIA)
    assert score_verdicts(CRITERIA, v) == pytest.approx(1 / 5)  # weights 1, 3, 1; only the first matches
    all_match = [CriterionVerdict(c.text, "match", 1, "") for c in CRITERIA]
    assert score_verdicts(CRITERIA, all_match) == 1.0


def test_uncertain_counts_as_not_matched():
    verdicts = [CriterionVerdict(c.text, "uncertain", 0.5, "") for c in CRITERIA]
    assert score_verdicts(CRITERIA, verdicts) == 0.0
    verdicts[1] = CriterionVerdict("orange fur", "match", 1, "")
    assert score_verdicts(CRITERIA, verdicts) == pytest.approx(3 / 5)


def test_required_mismatch_zeroes_the_score_but_required_uncertain_does_not():
    verdicts = [CriterionVerdict(c.text, "match", 1, "") for c in CRITERIA]
    verdicts[0] = CriterionVerdict("is a cat", "mismatch", 1, "")
    assert score_verdicts(CRITERIA, verdicts) == 0.0
    verdicts[0] = CriterionVerdict("is a cat", "uncertain", 0, "")
    assert score_verdicts(CRITERIA, verdicts) == pytest.approx(4 / 5)


def test_score_needs_a_verdict_per_criterion():
    with pytest.raises(ValueError, match="no verdict"):
        score_verdicts(CRITERIA, [CriterionVerdict("is a cat", "match", 1, "")])


def test_uncertain_verdicts_carry_the_reason_and_invent_nothing():
    verdicts = uncertain_verdicts(CRITERIA, 'bad "json"\nhere')
    assert {v.verdict for v in verdicts} == {"uncertain"}
    assert all(v.confidence == 0 and v.evidence == "bad 'json' here" for v in verdicts)
    jsonschema.validate(
        {"criteria": [{k: d[k] for k in ("criterion", "verdict", "confidence", "evidence")} for d in map(CriterionVerdict.to_dict, verdicts)]},
        verdict_schema(CRITERIA),
    )


@pytest.mark.parametrize("evidence_chars", [0, 5, 160])
def test_token_budget_covers_the_longest_valid_answer(evidence_chars):
    criteria = [Criterion('quote " back \\ slash é 猫'), Criterion("b" * 300)]
    longest = json.dumps(
        {
            "criteria": [
                {"criterion": c.text, "verdict": "uncertain", "confidence": 0.123456, "evidence": "😀" * evidence_chars}
                for c in criteria
            ]
        },
        ensure_ascii=False,
    )
    jsonschema.validate(json.loads(longest), verdict_schema(criteria, evidence_max_chars=evidence_chars))
    # A byte-level tokenizer spends at most one token per byte, plus one stop token.
    assert token_budget(criteria, evidence_max_chars=evidence_chars) >= len(longest.encode()) + 1


def test_extract_json_returns_the_first_object():
    assert extract_json('x {"a": 1} {"b": 2}') == {"a": 1}
