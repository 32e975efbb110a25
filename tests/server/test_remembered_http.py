"""Remembered images over HTTP: an image a tenant sends inline in a second request is kept (every dialect goes
through the engine's one path), listed at ``/v1/remembered`` and in ``/v1/stats`` apart from references,
forgotten by ``DELETE /v1/remembered``, served to another replica of the store, kept per tenant, and with
``--remember-images off`` never kept."""

from __future__ import annotations

from live_server import b64, data_url, photo_png

KEY_A = "key-alpha-0123456789"
KEY_B = "key-bravo-9876543210"

REFERENCE = photo_png("chelsea")


def _openai(client, candidate: bytes):
    """An OpenAI-SDK-shaped chat: the same reference as a data URL, then a new candidate."""
    content = [{"type": "image_url", "image_url": {"url": data_url(REFERENCE)}},
               {"type": "image_url", "image_url": {"url": data_url(candidate)}}, {"type": "text", "text": "Same?"}]
    reply = client.post("/v1/chat/completions", json={"model": "toy", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": content}]})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _ollama(client, candidate: bytes):
    """An Ollama chat: the same reference as base64, then a new candidate."""
    reply = client.post("/api/chat", json={"model": "toy", "stream": False, "messages": [
        {"role": "user", "content": "Same?", "images": [b64(REFERENCE), b64(candidate)]}]})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_an_image_sent_again_is_remembered_listed_and_forgotten_and_another_replica_hits_it(make_server, tmp_path):
    store = tmp_path / "shared"
    first = make_server(store=store)
    with first.client() as c:
        _openai(c, photo_png("coffee"))
        assert c.get("/v1/remembered").json() == {"remembered": []}  # sent once: nothing kept
        _ollama(c, photo_png("coffee", flip=True))  # another dialect, the same engine path: sent again
        [kept] = c.get("/v1/remembered").json()["remembered"]
        stats = c.get("/v1/stats").json()
        assert (stats["remembered"], stats["references"]) == (1, 0) and stats["remembered_bytes"] == kept["bytes"] > 0
        assert kept["namespace"] == "default" and len(kept["package_key"]) == 64
    # Another replica of the same store: its first request finds the reference's package, no encode.
    second = make_server(store=store)
    with second.client() as c:
        reply = _openai(c, photo_png("astronaut"))
        assert reply["refsight"]["references_cached"][0] is True, reply["refsight"]
        forgotten = c.delete("/v1/remembered").json()
        assert len(forgotten["images"]) == 1 and forgotten["packages"] == 1
        assert c.get("/v1/remembered").json() == {"remembered": []} and c.get("/v1/stats").json()["remembered"] == 0


def test_tenants_remember_their_own_and_off_keeps_nothing(make_server):
    tenants = make_server(keys={KEY_A: "alpha", KEY_B: "bravo"})
    with tenants.client(KEY_A) as a, tenants.client(KEY_B) as b:
        _openai(a, photo_png("coffee"))
        _openai(b, photo_png("rocket"))  # one sighting each: neither tenant sent it twice
        assert a.get("/v1/remembered").json() == b.get("/v1/remembered").json() == {"remembered": []}
        _openai(a, photo_png("horse"))
        assert len(a.get("/v1/remembered").json()["remembered"]) == 1 and a.get("/v1/stats").json()["remembered"] == 1
        assert b.get("/v1/remembered").json() == {"remembered": []} and b.get("/v1/stats").json()["remembered"] == 0
        assert b.delete("/v1/remembered").json()["images"] == []  # nothing of alpha's to forget
    off = make_server(remember_images="off")
    with off.client() as c:
        for candidate in ("coffee", "horse", "rocket"):
            _openai(c, photo_png(candidate))
        assert c.get("/v1/remembered").json() == {"remembered": []} and c.get("/v1/stats").json()["packages"] == 0
