"""``POST /v1/compare`` with ``use_kv_cache`` and the ``refsight_prefix_*`` metrics, on a real tiny model."""

from __future__ import annotations

from live_server import b64, photo_png

RUBRIC_A = "pointed ears"
RUBRIC_B = "same colour"


def test_server_compare_takes_use_kv_cache_and_metrics_count_prefixes(make_server):
    def png(name: str, size) -> str:
        return b64(photo_png(name, size))

    server = make_server(model="tiny-qwen2-vl")
    with server.client() as c:
        assert c.post("/v1/references", json={"image": png("chelsea", (64, 48)), "id": "chelsea"}).status_code == 201
        body = {"candidate": png("astronaut", (56, 56)), "criteria": RUBRIC_B, "ref_ids": ["chelsea"], "force_vlm": True}
        kv = c.post("/v1/compare", json=body, timeout=300)
        fresh = c.post("/v1/compare", json={**body, "use_kv_cache": False}, timeout=300)
        again = c.post("/v1/compare", json={**body, "criteria": RUBRIC_A}, timeout=300)
        assert kv.status_code == fresh.status_code == again.status_code == 200, kv.text
        assert kv.json()["results"] == fresh.json()["results"]
        bad = c.post("/v1/compare", json={**body, "use_kv_cache": "sometimes"})
        assert bad.status_code == 400 or bad.status_code == 422
        metrics = c.get("/metrics").text
    values = {
        line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("refsight_prefix")
    }
    assert values["refsight_prefix_misses_total"] == 1 and values["refsight_prefix_hits_total"] == 1
    assert values["refsight_prefix_bytes"] > 0 and values["refsight_prefix_ms_saved_total"] > 0
