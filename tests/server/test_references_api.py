"""References over HTTP: add (JSON and multipart), list, show, thumbnail, delete, stats, errors."""

from __future__ import annotations

import io

from PIL import Image

from live_server import assert_error, b64, data_url, photo_png

CLI_ADD_FIELDS = {"ref_id", "image_sha256", "package_key", "model", "cached", "encode_ms", "bytes"}


def test_add_json_base64_returns_the_cli_add_fields(client):
    response = client.post("/v1/references", json={"image": b64(photo_png()), "id": "cat", "metadata": {"species": "cat"}})
    assert response.status_code == 201, response.text
    data = response.json()
    assert set(data) == CLI_ADD_FIELDS
    assert data["ref_id"] == "cat" and data["model"] == "toy" and data["cached"] is False and data["bytes"] > 0


def test_add_multipart_and_the_same_image_again_is_cached(client):
    png = photo_png("coffee")
    first = client.post("/v1/references", files={"image": ("coffee.png", png, "image/png")},
                        data={"id": "coffee", "metadata": '{"kind": "drink"}'})
    assert first.status_code == 201, first.text
    second = client.post("/v1/references", json={"image": data_url(png), "id": "coffee-again"})
    assert second.status_code == 201, second.text
    assert first.json()["cached"] is False and second.json()["cached"] is True
    assert second.json()["package_key"] == first.json()["package_key"]
    assert second.json()["encode_ms"] == 0.0


def test_list_show_thumbnail_delete(client):
    client.post("/v1/references", json={"image": b64(photo_png("rocket", (80, 120))), "id": "rocket", "metadata": {"n": 1}})
    listed = client.get("/v1/references").json()["references"]
    assert [r["ref_id"] for r in listed] == ["rocket"]
    assert listed[0]["metadata"] == {"n": 1} and listed[0]["cached"] is True
    shown = client.get("/v1/references/rocket").json()
    assert shown["image_sha256"] == listed[0]["image_sha256"]

    thumb = client.get("/v1/references/rocket/thumbnail", params={"size": 32})
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    image = Image.open(io.BytesIO(thumb.content))
    assert max(image.size) == 32 and image.size[1] > image.size[0]  # aspect kept (portrait)

    assert client.delete("/v1/references/rocket").json() == {"removed": "rocket"}
    assert_error(client.get("/v1/references/rocket"), 404, "reference_not_found")
    assert client.get("/v1/references").json() == {"references": []}


def test_stats_have_the_cli_shape_and_count_hits(client):
    png = photo_png("astronaut")
    client.post("/v1/references", json={"image": b64(png), "id": "a1"})
    client.post("/v1/references", json={"image": b64(png), "id": "a2"})
    stats = client.get("/v1/stats").json()
    assert {"references", "packages", "bytes", "hits", "misses", "evictions", "encode_ms_saved"} <= set(stats)
    assert stats["references"] == 2 and stats["packages"] == 1 and stats["misses"] == 1 and stats["hits"] == 1


def test_bad_image_is_a_400_naming_the_input_and_stores_nothing(client):
    client.post("/v1/references", json={"image": b64(photo_png()), "id": "keep"})
    before = client.get("/v1/stats").json()
    truncated = photo_png()[:200]
    error = assert_error(client.post("/v1/references", json={"image": b64(truncated), "id": "bad"}), 400, "invalid_image")
    assert "image" in error["message"] and "truncated" in error["message"]
    error = assert_error(client.post("/v1/references", json={"image": "not base64!!", "id": "bad"}), 400, "invalid_image")
    assert error["message"].startswith("image:")
    text = client.post("/v1/references", files={"image": ("x.jpg", b"hello, not a photo", "image/jpeg")})
    assert "text" in assert_error(text, 400, "invalid_image")["message"]
    assert client.get("/v1/stats").json() == before
    assert [r["ref_id"] for r in client.get("/v1/references").json()["references"]] == ["keep"]


def test_bad_ids_and_conflicts_are_400(client):
    assert_error(client.post("/v1/references", json={"image": b64(photo_png()), "id": "../etc"}), 400, "invalid_reference_id")  # one code for one mistake (issue 18 row 12)
    assert_error(client.get("/v1/references/a..b"), 400, "invalid_reference_id")
    client.post("/v1/references", json={"image": b64(photo_png()), "id": "taken"})
    conflict = client.post("/v1/references", json={"image": b64(photo_png(flip=True)), "id": "taken"})
    assert "taken" in assert_error(conflict, 400, "invalid_input")["message"]
    assert client.get("/v1/references/taken").json()["image_sha256"]  # the first one is untouched


def test_framework_errors_are_json_with_stable_codes(client):
    assert_error(client.get("/v1/nope"), 404, "not_found")
    assert_error(client.put("/v1/references"), 405, "method_not_allowed")
    assert_error(client.post("/v1/search", json={"text": "cat", "k": 0}), 422, "validation_error")
    assert_error(client.post("/v1/search", content=b"{not json", headers={"content-type": "application/json"}),
                 422, "validation_error")
    assert_error(client.post("/v1/references", json={"image": b64(photo_png()), "surprise": 1}), 422, "validation_error")
    assert_error(client.post("/v1/references", content=b"raw", headers={"content-type": "text/plain"}),
                 415, "unsupported_media_type")
    assert_error(client.post("/v1/references", content=b"--x\r\nbroken", headers={"content-type": "multipart/form-data; boundary=x"}),
                 422, "validation_error")


def test_healthz_and_openapi(client):
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["model"] == "toy" and health["random_weights"] is True
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/references", "/v1/references/{ref_id}", "/v1/compare", "/v1/search", "/v1/stats",
                 "/v1/chat/completions", "/healthz", "/metrics"):
        assert path in paths
    content = paths["/v1/references"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(content)


def test_metrics_expose_cache_counters_and_latency(client):
    png = photo_png()
    client.post("/v1/references", json={"image": b64(png), "id": "m1"})
    client.post("/v1/references", json={"image": b64(png), "id": "m2"})
    client.get("/v1/references/m1")
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")}
    stats = client.get("/v1/stats").json()
    assert samples["refsight_cache_hits_total"] == stats["hits"] == 1
    assert samples["refsight_cache_misses_total"] == stats["misses"] == 1
    assert samples["refsight_cache_bytes"] == stats["bytes"]
    assert samples["refsight_cache_raw_bytes"] == stats["raw_bytes"] >= stats["bytes"]
    assert "refsight_cache_evictions_total" in samples and "refsight_cache_encode_seconds_saved_total" in samples
    assert samples['refsight_request_seconds_count{method="GET",route="/v1/references/{ref_id}",status="200"}'] == 1
    assert samples['refsight_request_seconds_count{method="POST",route="/v1/references",status="201"}'] == 2
