"""``POST /v1/compare`` and ``POST /v1/search`` over HTTP: the CLI's JSON, JSON or multipart in, clear errors."""

from __future__ import annotations

import pytest

from live_server import assert_error, b64, photo_png

RUBRIC = "striped fur\npointed ears"


@pytest.fixture
def refs_client(server):
    with server.client() as c:
        for name in ("chelsea", "coffee"):
            assert c.post("/v1/references", json={"image": b64(photo_png(name)), "id": name}).status_code == 201
        yield c


def _check_compare_shape(data: dict, ref_ids: list[str], criteria: list[str]) -> None:
    assert {"candidate_sha256", "model", "random_weights", "results", "timings_ms"} <= set(data)
    assert data["model"] == "toy" and data["random_weights"] is True
    assert [r["ref_id"] for r in data["results"]] == ref_ids
    for result in data["results"]:
        assert {"ref_id", "score", "reference_cached", "criteria"} <= set(result)
        assert [c["criterion"] for c in result["criteria"]] == criteria
        for verdict in result["criteria"]:
            assert verdict["verdict"] in ("match", "mismatch", "uncertain")
            assert 0.0 <= verdict["confidence"] <= 1.0 and isinstance(verdict["evidence"], str)
            assert verdict["source"] in ("vlm", "attributes")
    assert {"candidate_encode", "reference_load", "judge"} <= set(data["timings_ms"])


def test_compare_json_and_multipart_give_the_same_verdicts(refs_client):
    candidate = photo_png("chelsea", flip=True)
    by_json = refs_client.post("/v1/compare", json={"candidate": b64(candidate), "criteria": RUBRIC,
                                                    "ref_ids": ["chelsea", "coffee"]})
    assert by_json.status_code == 200, by_json.text
    _check_compare_shape(by_json.json(), ["chelsea", "coffee"], ["striped fur", "pointed ears"])
    assert all(r["reference_cached"] for r in by_json.json()["results"])

    by_form = refs_client.post("/v1/compare", files={"candidate": ("c.png", candidate, "image/png")},
                               data={"criteria": RUBRIC, "ref_ids": "chelsea,coffee", "use_cache": "false"})
    assert by_form.status_code == 200, by_form.text
    assert not any(r["reference_cached"] for r in by_form.json()["results"])
    strip = lambda d: [{k: v for k, v in r.items() if k != "reference_cached"} for r in d["results"]]  # noqa: E731
    assert strip(by_form.json()) == strip(by_json.json())
    assert by_form.json()["candidate_sha256"] == by_json.json()["candidate_sha256"]


def test_compare_errors_name_the_input(refs_client):
    candidate = b64(photo_png(flip=True))
    error = assert_error(refs_client.post("/v1/compare", json={"candidate": candidate, "criteria": "", "ref_ids": ["chelsea"]}),
                         400, "invalid_rubric")
    assert "empty" in error["message"]
    assert_error(refs_client.post("/v1/compare", json={"candidate": candidate, "criteria": "a\nA", "ref_ids": ["chelsea"]}),
                 400, "invalid_rubric")
    assert_error(refs_client.post("/v1/compare", json={"candidate": candidate, "criteria": RUBRIC}), 400, "invalid_input")
    assert_error(refs_client.post("/v1/compare", json={"candidate": candidate, "criteria": RUBRIC, "ref_ids": ["nobody"]}),
                 404, "reference_not_found")
    bad = assert_error(refs_client.post("/v1/compare", json={"candidate": b64(b"GIF89a broken"), "criteria": RUBRIC,
                                                              "ref_ids": ["chelsea"]}), 400, "invalid_image")
    assert bad["message"].startswith("candidate")


def test_compare_cannot_reach_another_tenants_reference(make_server):
    live = make_server(keys={"compare-key-a1": "a", "compare-key-b2": "b"})
    with live.client("compare-key-a1") as a, live.client("compare-key-b2") as b:
        a.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"})
        request = {"candidate": b64(photo_png(flip=True)), "criteria": RUBRIC, "ref_ids": ["cat"]}
        assert_error(b.post("/v1/compare", json=request), 404, "reference_not_found")
        assert a.post("/v1/compare", json=request).status_code == 200


def test_search_shape_and_errors(refs_client):
    found = refs_client.post("/v1/search", json={"text": "a cat", "k": 2})
    assert found.status_code == 200, found.text
    data = found.json()
    assert set(data) >= {"embedder", "results"} and len(data["results"]) == 2
    assert {r["ref_id"] for r in data["results"]} == {"chelsea", "coffee"}
    by_image = refs_client.post("/v1/search", json={"image": b64(photo_png("coffee")), "k": 1}).json()
    assert by_image["results"][0]["ref_id"] == "coffee"
    assert_error(refs_client.post("/v1/search", json={"k": 3}), 400, "invalid_input")
    assert_error(refs_client.post("/v1/search", json={"text": "x", "image": b64(photo_png())}), 400, "invalid_input")


def test_compare_top_k_recalls_then_judges_only_those(refs_client):
    response = refs_client.post("/v1/compare", json={"candidate": b64(photo_png("coffee", flip=True)), "criteria": RUBRIC,
                                                     "top_k": 1, "query": "a cup of coffee"})
    assert response.status_code == 200, response.text
    data = response.json()
    assert [r["ref_id"] for r in data["results"]] == ["coffee"]
    assert [r["ref_id"] for r in data["recalled"]] == ["coffee"] and isinstance(data["recalled"][0]["score"], float)


def test_compare_rerank_fields_and_stage_metrics(refs_client):
    response = refs_client.post("/v1/compare", json={"candidate": b64(photo_png("coffee", flip=True)), "criteria": RUBRIC,
                                                     "top_k": 1, "rerank": 2, "reranker": "embedding", "recall": "image"})
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["stages"] == {"recalled": 2, "filtered": 0, "reranked": 2, "judged": 1}
    assert [r["stage"] for r in data["results"]] == ["judged", "reranked"]
    assert data["results"][0]["ref_id"] == "coffee"
    assert all(isinstance(r["rerank_score"], float) and isinstance(r["recall_score"], float) for r in data["results"])
    assert {"recall", "rerank", "judge"} <= set(data["timings_ms"])
    metrics = refs_client.get("/metrics").text
    for stage in ("recall", "rerank", "judge"):
        assert f'refsight_compare_stage_calls_total{{stage="{stage}"}} 1.0' in metrics
    assert 'refsight_compare_stage_references_total{stage="reranked"} 2.0' in metrics
    assert_error(refs_client.post("/v1/compare", json={"candidate": b64(photo_png()), "criteria": RUBRIC, "rerank": 2}),
                 400, "invalid_input")


def test_the_rules_between_fields_are_the_librarys_and_name_the_field(refs_client):
    """One layer checks each rule (the library); the route maps its error to a 400 naming the field."""
    candidate = b64(photo_png())
    cases = [
        ("/v1/compare", {"candidate": candidate, "criteria": RUBRIC, "rerank": 2}, "rerank: "),
        ("/v1/compare", {"candidate": candidate, "criteria": RUBRIC, "top_k": 1, "recall_k": 2, "rerank": 3}, "recall_k: "),
        ("/v1/compare", {"candidate": candidate, "criteria": RUBRIC}, "ref_ids: "),
        ("/v1/search", {"k": 3}, "query: "),
        ("/v1/search", {"text": "   "}, "text: "),  # the library names the empty text by its value; the route by its field
    ]
    for path, body, prefix in cases:
        error = assert_error(refs_client.post(path, json=body), 400, "invalid_input")
        assert error["message"].startswith(prefix), (body, error)
