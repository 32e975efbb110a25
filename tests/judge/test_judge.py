"""Judge orchestration with a scripted backend: retry once, then "uncertain"; batching; counting.

The scripted backend's answers are the test input; whether real models produce valid JSON
is proven in test_constrained.py and test_tiny_e2e.py.
"""

from __future__ import annotations

import json

import pytest

from refsight.errors import BackendError, InvalidInputError, RubricError
from refsight.judge import Judge
from refsight.inputs.rubric import parse_rubric
from refsight.judge.verdict import CriterionVerdict

from judge_helpers import ScriptedBackend, fake_package

RUBRIC = parse_rubric([{"text": "is a cat", "required": True}, {"text": "orange fur", "weight": 3}])


def criteria_of(request) -> list[str]:
    """The criteria a request asks about, read back from its prompt."""
    lines = request.segments[-1].split("\n")
    start = lines.index("Criteria:") + 1
    out = []
    for line in lines[start:]:
        if not line[:1].isdigit():
            break
        out.append(json.loads(line.split(". ", 1)[1]))
    return out


def good_answer(request, verdict="match") -> str:
    return json.dumps(
        {
            "criteria": [
                {"criterion": c, "verdict": verdict, "confidence": 0.8, "evidence": "looks alike"}
                for c in criteria_of(request)
            ]
        }
    )


def refs(n=2):
    return [(f"ref{i}", fake_package(f"r{i}"), None) for i in range(n)]


def test_valid_answers_give_verdicts_and_scores():
    backend = ScriptedBackend(good_answer)
    judge = Judge(backend)
    results = judge.judge(refs(2), fake_package("cand"), RUBRIC)
    assert [r.ref_id for r in results] == ["ref0", "ref1"]
    assert all(r.score == 1.0 for r in results)
    d = results[0].to_dict()
    assert set(d) == {"ref_id", "score", "criteria"}
    assert d["criteria"][0] == {
        "criterion": "is a cat", "verdict": "match", "confidence": 0.8, "evidence": "looks alike", "source": "vlm"
    }
    assert judge.vlm_calls == 2 and judge.vlm_retries == 0
    # one reference per request, the unconstrained backend gets no schema
    assert all(len(r.packages) == 2 and r.json_schema is None for r in backend.requests)


def test_invalid_json_is_retried_once_then_uncertain_with_the_reason():
    backend = ScriptedBackend(lambda r: "The cat matches, I am sure!")
    judge = Judge(backend)
    [result] = judge.judge(refs(1), fake_package("cand"), RUBRIC)
    assert judge.vlm_calls == 2 and judge.vlm_retries == 1 and result.vlm_requests == 2
    assert [v.verdict for v in result.criteria] == ["uncertain", "uncertain"]
    assert all(v.confidence == 0 and "no JSON object" in v.evidence and v.source == "vlm" for v in result.criteria)
    assert result.score == 0.0
    # the retry prompt said what was wrong, after the unchanged prefix
    first, retry = backend.requests
    assert retry.segments[:-1] == first.segments[:-1]
    assert "previous answer was rejected (no JSON object in the answer)" in retry.segments[-1]


def test_a_schema_violation_then_a_valid_retry_is_accepted():
    answers = iter(['{"criteria": [{"criterion": "is a cat", "verdict": "yes"}]}', None])

    def script(request):
        text = next(answers)
        return text if text is not None else good_answer(request, "mismatch")

    judge = Judge(ScriptedBackend(script))
    [result] = judge.judge(refs(1), fake_package("cand"), RUBRIC)
    assert [v.verdict for v in result.criteria] == ["mismatch", "mismatch"]
    assert result.score == 0.0  # "is a cat" is required
    assert judge.vlm_calls == 2 and judge.vlm_retries == 1


def test_only_the_failed_references_are_retried():
    calls = {"n": 0}

    def script(request):
        calls["n"] += 1
        # the second reference's first answer is truncated JSON
        return good_answer(request)[:20] if calls["n"] == 2 else good_answer(request)

    judge = Judge(ScriptedBackend(script))
    results = judge.judge(refs(3), fake_package("cand"), RUBRIC)
    assert judge.vlm_calls == 4 and [r.vlm_requests for r in results] == [1, 2, 1]
    assert all(r.score == 1.0 for r in results)


def test_requests_are_batched_by_the_backend_batch_size():
    backend = ScriptedBackend(good_answer, batch_size=2)
    Judge(backend).judge(refs(5), fake_package("cand"), RUBRIC)
    assert backend.batches == [2, 2, 1]


def test_constrained_backends_get_the_schema_and_the_token_budget():
    backend = ScriptedBackend(good_answer, constrained=True)
    Judge(backend, evidence_max_chars=20).judge(refs(1), fake_package("cand"), RUBRIC)
    [request] = backend.requests
    items = request.json_schema["properties"]["criteria"]["prefixItems"]
    assert [i["properties"]["criterion"]["const"] for i in items] == ["is a cat", "orange fur"]
    assert items[0]["properties"]["evidence"]["maxLength"] == 20
    from refsight.judge.verdict import token_budget

    assert request.max_new_tokens == token_budget(RUBRIC.criteria, evidence_max_chars=20)
    backend2 = ScriptedBackend(good_answer, constrained=True)
    Judge(backend2, max_new_tokens=7).judge(refs(1), fake_package("cand"), RUBRIC)
    assert backend2.requests[0].max_new_tokens == 7


def test_rubric_may_be_given_as_text_and_errors_surface_as_rubric_errors():
    judge = Judge(ScriptedBackend(good_answer))
    [result] = judge.judge(refs(1), fake_package("cand"), "is a cat; orange fur")
    assert [v.criterion for v in result.criteria] == ["is a cat", "orange fur"]
    with pytest.raises(RubricError, match="empty"):
        judge.judge(refs(1), fake_package("cand"), "  ")
    assert judge.vlm_calls == 1


@pytest.mark.parametrize(
    "references, candidate, match",
    [
        ([], "pkg", "at least one"),
        ("ref0", "pkg", "at least one"),
        ([("a", "not an image", None)], "pkg", "must be a VisualPackage"),
        ([("a", "pkg", None), ("a", "pkg", None)], "pkg", "reference given twice"),
        ([("", "pkg", None)], "pkg", "ref_id must be a non-empty string"),
        ([("a", "pkg", ["not", "a", "mapping"])], "pkg", "attributes must be a mapping"),
        ([("a",)], "pkg", "tuple"),
        ([("a", "pkg", None)], "not an image", "candidate"),
    ],
)
def test_bad_references_and_candidates(references, candidate, match):
    def fill(x):
        return fake_package() if x == "pkg" else x

    if isinstance(references, list):
        references = [tuple(fill(x) for x in entry) for entry in references]
    judge = Judge(ScriptedBackend(good_answer))
    with pytest.raises(InvalidInputError, match=match):
        judge.judge(references, fill(candidate), RUBRIC)
    assert judge.vlm_calls == 0


def test_a_backend_returning_the_wrong_number_of_results_is_a_backend_error():
    class Short(ScriptedBackend):
        def generate(self, requests, *, return_logits=False):
            return super().generate(requests)[:-1]

    with pytest.raises(BackendError, match="returned 1 results for 2 requests"):
        Judge(Short(good_answer)).judge(refs(2), fake_package("cand"), RUBRIC)


@pytest.mark.parametrize("kw", [{"max_new_tokens": 0}, {"max_new_tokens": 1.5}, {"evidence_max_chars": 0}])
def test_bad_judge_settings(kw):
    with pytest.raises(InvalidInputError):
        Judge(ScriptedBackend(good_answer), **kw)


class KeywordEncoder:
    """A stand-in text encoder: one axis per keyword, zero otherwise (orchestration only; real MiniLM in test_attributes)."""

    KEYS = ("cat", "fur length")

    def encode(self, texts):
        import numpy as np

        out = np.zeros((len(texts), len(self.KEYS)), np.float32)
        for i, t in enumerate(texts):
            hits = [k for k, key in enumerate(self.KEYS) if key in t]
            if hits:
                out[i, hits[0]] = 1.0
        return out


def test_settled_criteria_skip_the_vlm_and_force_vlm_sends_them_back():
    attrs = {"imagenet_top5": [{"label": "tabby", "score": 0.7}, {"label": "tiger cat", "score": 0.2}]}
    backend = ScriptedBackend(good_answer)
    judge = Judge(backend, text_encoder=KeywordEncoder())
    rubric = parse_rubric("cat; orange fur")
    [result] = judge.judge([("r", fake_package(), attrs)], fake_package("c"), rubric, candidate_attrs=attrs)
    assert [(v.criterion, v.source) for v in result.criteria] == [("cat", "attributes"), ("orange fur", "vlm")]
    assert result.criteria[0].verdict == "match" and result.score == 1.0
    assert criteria_of(backend.requests[0]) == ["orange fur"]

    everything = Judge(ScriptedBackend(good_answer), text_encoder=KeywordEncoder(), force_vlm=True)
    [forced] = everything.judge([("r", fake_package(), attrs)], fake_package("c"), rubric, candidate_attrs=attrs)
    assert {v.source for v in forced.criteria} == {"vlm"} and everything.vlm_calls == 1

    settled_all = Judge(ScriptedBackend(good_answer), text_encoder=KeywordEncoder())
    [only_attrs] = settled_all.judge([("r", fake_package(), attrs)], fake_package("c"), "cat", candidate_attrs=attrs)
    assert settled_all.vlm_calls == 0 and only_attrs.vlm_requests == 0
    assert only_attrs.criteria == [
        CriterionVerdict("cat", "match", only_attrs.criteria[0].confidence, only_attrs.criteria[0].evidence, "attributes")
    ]
