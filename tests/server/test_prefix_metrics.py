"""``POST /v1/compare`` with ``prefix_states`` and the ``refsight_prefix_*`` metrics,
on a real tiny model."""

from __future__ import annotations

from live_server import b64, photo_png

RUBRIC_A = "pointed ears"
RUBRIC_B = "same colour"


def test_server_compare_takes_prefix_states_and_metrics_count_prefixes(make_server):
    def png(name: str, size) -> str:
        return b64(photo_png(name, size))

    server = make_server(model="tiny-qwen2-vl")
    with server.client() as c:
        assert c.post("/v1/references", json={"image": png("chelsea", (64, 48)), "id": "chelsea"}).status_code == 201
        body = {"candidate": png("astronaut", (56, 56)), "criteria": RUBRIC_B, "ref_ids": ["chelsea"], "force_vlm": True}
        kv = c.post("/v1/compare", json=body, timeout=300)
        fresh = c.post("/v1/compare", json={**body, "prefix_states": False}, timeout=300)
        again = c.post("/v1/compare", json={**body, "criteria": RUBRIC_A}, timeout=300)
        assert kv.status_code == fresh.status_code == again.status_code == 200, kv.text
        assert kv.json()["results"] == fresh.json()["results"]
        assert c.post("/v1/compare", json={**body, "prefix_states": "sometimes"}).status_code in (400, 422)
        metrics = c.get("/metrics").text
    values = {
        line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("refsight_prefix")
    }
    assert values["refsight_prefix_misses_total"] == 1 and values["refsight_prefix_hits_total"] == 1
    assert values["refsight_prefix_bytes"] > 0 and values["refsight_prefix_ms_saved_total"] > 0


def test_openai_chat_starting_with_stored_references_reuses_their_state(make_server):
    import httpx

    server = make_server(model="tiny-qwen2-vl")
    with server.client() as c:
        for name in ("chelsea", "coffee"):
            image = b64(photo_png(name, (64, 48)))
            assert c.post("/v1/references", json={"image": image, "id": name}).status_code == 201

        def ask(question: str) -> dict:
            content = [
                {"type": "text", "text": "Reference 1:"}, {"type": "image_url", "image_url": {"url": "refsight://ref/chelsea"}},
                {"type": "text", "text": "Reference 2:"}, {"type": "image_url", "image_url": {"url": "refsight://ref/coffee"}},
                {"type": "text", "text": question},
            ]
            response = c.post("/v1/chat/completions", json={
                "model": "tiny-qwen2-vl", "max_tokens": 4, "messages": [{"role": "user", "content": content}],
            }, timeout=300)
            assert response.status_code == 200, response.text
            return response.json()

        first, second = ask("Same animal?"), ask("Same colour?")
        assert first["choices"][0]["message"]["content"] is not None and second["usage"]["prompt_tokens"] > 0
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = {
        line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("refsight_prefix")
    }
    assert values["refsight_prefix_misses_total"] == 1 and values["refsight_prefix_hits_total"] == 1
