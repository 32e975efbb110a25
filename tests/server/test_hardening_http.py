"""Issue 18 (hardening), the HTTP rows, against the real server on loopback.

Every refusal is asserted with its status and code, the store is compared before and
after (a refused request writes nothing), and the rows whose old failure was time or
memory (5, 16) are bounded in both.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hardening_helpers import ServeProcess, small_tmpfs, store_snapshot
from live_server import assert_error, b64, photo_png

KEY, OTHER_KEY = "hardening-key-000111", "hardening-key-000222"


def _deep(depth: int) -> str:
    """JSON text nested ``depth`` arrays deep (as text: json.dumps itself recurses too)."""
    return "[" * depth + '"leaf"' + "]" * depth


def _post_json(client: httpx.Client, path: str, text: str, content_type: str | None = "application/json") -> httpx.Response:
    headers = {"content-type": content_type} if content_type else {}
    return client.post(path, content=text.encode(), headers=headers)


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def seeded(server):
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
        yield server, c


# -- row 2: deep JSON ------------------------------------------------------------------------
def test_deep_json_is_400_invalid_input_wherever_it_comes(seeded):
    server, c = seeded
    root = server.service.engine.store.root
    before = store_snapshot(root)
    deep = _deep(1500)
    candidate = json.dumps(b64(photo_png(flip=True)))
    start = time.monotonic()
    cases = [
        _post_json(c, "/v1/references", f'{{"image": {candidate}, "id": "dog", "metadata": {{"x": {deep}}}}}'),
        c.post("/v1/references", files={"image": ("d.png", photo_png(flip=True), "image/png")},
               data={"id": "dog", "metadata": f'{{"x": {deep}}}'}),
        _post_json(c, "/v1/compare", f'{{"candidate": {candidate}, "criteria": {deep}, "ref_ids": ["cat"]}}'),
        c.post("/v1/compare", files={"candidate": ("c.png", photo_png(flip=True), "image/png")},
               data={"criteria": deep, "ref_ids": "cat"}),
        c.post("/v1/compare", json={"candidate": b64(photo_png(flip=True)), "criteria": deep, "ref_ids": ["cat"]}),
        _post_json(c, "/v1/search", f'{{"text": "cat", "extra": {deep}}}'),
        _post_json(c, "/v1/chat/completions", f'{{"model": "toy", "messages": [{{"role": "user", "content": "hi"}}], "x": {deep}}}'),
        _post_json(c, "/v1/search", f'{{"text": "cat", "x": {deep}}}', content_type=None),  # FastAPI reads it as JSON
    ]
    for response in cases:
        error = assert_error(response, 400, "invalid_input")
        assert "64 levels" in error["message"], error
    assert time.monotonic() - start < 10
    # 64 levels are fine.
    ok = _post_json(c, "/v1/references", f'{{"image": {candidate}, "id": "dog", "metadata": {{"x": {_deep(60)}}}}}')
    assert ok.status_code == 201, ok.text
    after = store_snapshot(root)
    assert [r for r in after["references"] if r[1] != "dog"] == before["references"]


# -- row 3: where with many keys -----------------------------------------------------------
def test_where_over_the_key_limit_is_400_before_any_model_work(seeded):
    server, c = seeded
    before = store_snapshot(server.service.engine.store.root)
    start = time.monotonic()
    error = assert_error(c.post("/v1/search", json={"text": "cat", "where": {f"k{i}": i for i in range(999)}}),
                         400, "invalid_input")
    assert "999 keys, over the limit of 32" in error["message"]
    assert time.monotonic() - start < 5
    assert store_snapshot(server.service.engine.store.root) == before


def test_the_library_enforces_the_where_limit_too(tmp_path):
    from refsight import InvalidInputError
    from refsight.retrieval.vectors import MAX_WHERE_KEYS, VectorDB, validate_where

    assert len(validate_where({f"k{i}": i for i in range(MAX_WHERE_KEYS)})) == MAX_WHERE_KEYS
    with pytest.raises(InvalidInputError, match="over the limit of 32"):
        validate_where({f"k{i}": i for i in range(MAX_WHERE_KEYS + 1)})
    db = VectorDB(tmp_path / "vectors.sqlite")
    try:
        with pytest.raises(InvalidInputError, match="over the limit"):
            db.filtered_labels("e", "default", {f"k{i}": i for i in range(999)})
    finally:
        db.close()


# -- row 4: an invalid response_format schema ----------------------------------------------
def test_an_invalid_json_schema_is_400_naming_the_problem(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                          "properties": {"a": {"type": "bogus"}}}}}
    error = assert_error(client.post("/v1/chat/completions", json={
        "model": "toy", "messages": [{"role": "user", "content": "hi"}], "response_format": fmt}), 400, "invalid_input")
    assert error["message"].startswith("response_format.json_schema.schema.properties.a.type: must name"), error
    # A valid schema passes the check; the toy model (no decoder to constrain) then says so, by name.
    fmt["json_schema"]["schema"]["properties"]["a"]["type"] = "string"
    error = assert_error(client.post("/v1/chat/completions", json={
        "model": "toy", "messages": [{"role": "user", "content": "hi"}], "response_format": fmt}), 400, "invalid_input")
    assert error["message"] == "json_schema: toy does not support constrained decoding", error


# -- row 5: the prompt-token limit ----------------------------------------------------------
def test_a_huge_prompt_is_refused_at_once_and_holds_no_worker(make_server):
    live = make_server(workers=1, max_prompt_tokens=200)
    huge = {"model": "toy", "max_tokens": 1, "messages": [{"role": "user", "content": "word " * 60_000}]}
    peak = _vm_hwm_mb()
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: httpx.post(f"{live.url}/v1/chat/completions", json=huge, timeout=30), range(4)))
        normal = httpx.post(f"{live.url}/v1/chat/completions", timeout=30,
                            json={"model": "toy", "messages": [{"role": "user", "content": "hello"}]})
    assert time.monotonic() - start < 10
    assert _vm_hwm_mb() - peak < 300  # four 300 KB prompts are never tokenized or copied much
    for response in responses:
        error = assert_error(response, 400, "invalid_input")
        assert "over the limit of 200 prompt tokens" in error["message"] and "characters" in error["message"]
    assert normal.status_code == 200, normal.text

    # Under the character bound, the backend's token count decides (toy: ~4 bytes a token).
    counted = assert_error(httpx.post(f"{live.url}/v1/chat/completions", timeout=30, json={
        "model": "toy", "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 1000}]}]}),
        400, "invalid_input")
    assert "250 text tokens" in counted["message"]


def test_max_prompt_tokens_is_a_validated_setting():
    from refsight import InvalidInputError
    from refsight.server import ServerConfig, create_app

    with pytest.raises(InvalidInputError, match="max_prompt_tokens"):
        create_app(ServerConfig(model="toy", keys={}, max_prompt_tokens=0))


# -- row 10: a full disk is 503 store_unavailable ------------------------------------------------
def test_a_full_disk_is_503_and_loses_nothing(make_server, tmp_path):
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        live = make_server(store=disk.path / "store")
        with live.client() as c:
            assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
            before = store_snapshot(disk.path / "store")
            disk.fill()
            response = c.post("/v1/references", json={"image": b64(photo_png(flip=True)), "id": "dog"})
            error = assert_error(response, 503, "store_unavailable")
            assert "no space left on device" in error["message"] and response.headers["retry-after"]
            assert [r["ref_id"] for r in c.get("/v1/references").json()["references"]] == ["cat"]
            assert store_snapshot(disk.path / "store")["references"] == before["references"]
            disk.free()
            assert c.post("/v1/references", json={"image": b64(photo_png(flip=True)), "id": "dog"}).status_code == 201


# -- rows 11 and 16: keys never logged, unauthenticated bodies never read -----------------------------
@pytest.fixture
def served_with_keys(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}=team\n{OTHER_KEY}=other\n")
    process = ServeProcess(tmp_path / "store", keys=keys).wait_ready()
    yield process
    process.stop()


def _raw_upload(url: str, path: str, length: int, sent: int, headers: str = "") -> tuple[str, float]:
    """Declare a body of ``length`` bytes, send only ``sent`` of them, and read the answer."""
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {length}\r\n{headers}\r\n").encode())
        chunk = b"A" * 65536
        for _ in range(sent // len(chunk)):
            sock.sendall(chunk)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _content_length(answer):
            more = sock.recv(65536)
            if not more:
                break
            answer += more
    return answer.decode("latin-1"), time.monotonic() - start


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def test_unauthenticated_uploads_are_refused_before_their_bodies_are_read(served_with_keys, tmp_path):
    server = served_with_keys
    before = store_snapshot(tmp_path / "store")
    baseline = server.peak_rss_mb()
    results: list[tuple[str, float]] = []
    lock = threading.Lock()

    def upload(i: int) -> None:
        # 32 MiB declared (the body limit), 1 MiB actually sent: the answer must not wait for the rest.
        result = _raw_upload(server.url, "/v1/references", 32 * 1024 * 1024, 1 << 20,
                             headers="Authorization: Basic Zm9vOmJhcg==\r\n" if i % 3 == 0 else "")
        with lock:
            results.append(result)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(24)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert time.monotonic() - start < 30
    assert len(results) == 24
    for answer, seconds in results:
        assert answer.startswith("HTTP/1.1 401"), answer[:200]
        assert '"code":"unauthorized"' in answer.replace(" ", "")
        assert seconds < 20
    # 24 x 32 MiB would be 768 MiB if buffered; the server grew by far less than one body.
    assert server.peak_rss_mb() - baseline < 64, (baseline, server.peak_rss_mb())
    assert store_snapshot(tmp_path / "store") == before


def test_a_key_in_the_query_string_never_reaches_the_log(served_with_keys):
    server = served_with_keys
    response = httpx.get(f"{server.url}/v1/stats?api_key={KEY}&x=1", timeout=10)
    assert_error(response, 401, "unauthorized")
    assert httpx.get(f"{server.url}/v1/stats", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).status_code == 200
    server.stop()
    assert "/v1/stats?[redacted]" in server.log, server.log  # the request is logged ...
    assert KEY not in server.log  # ... without the key


# -- row 14: ambiguous credentials -----------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({"Authorization": f"Basic {KEY}"}, "'Basic' scheme is not accepted"),
        ({"Authorization": f"Bearer {KEY}", "X-API-Key": OTHER_KEY}, "different keys"),
        ({"Authorization": "Bearer"}, "needs a key"),
        ({"Authorization": "Bearer nope-nope-nope"}, "invalid API key"),
        ({}, "missing API key"),
    ],
)
def test_ambiguous_or_wrong_credentials_are_401(make_server, headers, needle):
    live = make_server(keys={KEY: "team", OTHER_KEY: "other"})
    before = store_snapshot(live.service.engine.store.root)
    response = httpx.post(f"{live.url}/v1/references", json={"image": b64(photo_png()), "id": "cat"},
                          headers=headers, timeout=30)
    error = assert_error(response, 401, "unauthorized")
    assert needle in error["message"] and KEY not in error["message"]
    assert store_snapshot(live.service.engine.store.root) == before
    same = httpx.get(f"{live.url}/v1/references", headers={"Authorization": f"Bearer {KEY}", "X-API-Key": KEY})
    assert same.status_code == 200  # the same key in both headers is not ambiguous


def test_two_image_parts_or_repeated_keys_are_400(seeded):
    server, c = seeded
    before = store_snapshot(server.service.engine.store.root)
    two = c.post("/v1/references", files=[("image", ("a.png", photo_png(flip=True), "image/png")),
                                          ("image", ("b.png", photo_png(size=(40, 40)), "image/png"))])
    assert "image: given 2 times" in assert_error(two, 400, "invalid_input")["message"]
    dup = c.post("/v1/references", content=b'{"image": "%s", "id": "a", "id": "b"}' % b64(photo_png(flip=True)).encode(),
                 headers={"content-type": "application/json"})
    assert "'id' appears twice" in assert_error(dup, 400, "invalid_input")["message"]
    query_only = c.post("/v1/compare", json={"candidate": b64(photo_png()), "criteria": "fur", "ref_ids": ["cat"],
                                             "query": "a cat"})
    assert "needs top_k" in assert_error(query_only, 400, "invalid_input")["message"]
    assert store_snapshot(server.service.engine.store.root) == before


# -- rows 12 and 13: one code for one mistake, HTTP words for HTTP errors -------------------------------
def test_an_invalid_reference_id_has_one_code_in_bodies_and_paths(seeded):
    server, c = seeded
    before = store_snapshot(server.service.engine.store.root)
    candidate = b64(photo_png(flip=True))
    for bad in ("a..b", "a" * 300, "x\x1b[31m", "-leading-dash"):
        responses = [
            c.post("/v1/references", json={"image": candidate, "id": bad}),
            c.post("/v1/compare", json={"candidate": candidate, "criteria": "fur", "ref_ids": [bad]}),
            c.post("/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": f"refsight://ref/{bad}"}}]}]}),
            c.get(f"/v1/references/{quote(bad)}"),
            c.delete(f"/v1/references/{quote(bad)}"),
            c.get(f"/v1/references/{quote(bad)}/thumbnail"),
        ]
        for response in responses:
            assert_error(response, 400, "invalid_reference_id")
    assert store_snapshot(server.service.engine.store.root) == before


def test_http_errors_use_http_words(server):
    with server.client() as c:  # an empty store: top_k recalls nothing, and the error says why and how to fill it
        error = assert_error(c.post("/v1/compare", json={"candidate": b64(photo_png()), "criteria": "fur", "top_k": 2},
                                    timeout=300), 400, "invalid_input")
    assert "--" not in error["message"] and "POST /v1/references" in error["message"], error


def test_http_wording_translates_flags():
    from refsight.server.edge.http_errors import http_wording

    assert http_wording("no reference to compare with: name --ref IDs or use --top-k") == (
        "no reference to compare with: name ref_ids IDs or use top_k")
    assert http_wording("--where a=b and --k 3, but --keys stays") == "where a=b and k 3, but --keys stays"


# -- row 9 at the HTTP level: SIGKILL during concurrent adds, then refsight gc ---------------------
def test_sigkill_during_concurrent_adds_leaves_nothing_gc_cannot_clean(tmp_path):
    from refsight.cli import main
    from refsight.store import open_store

    store = tmp_path / "store"
    server = ServeProcess(store).wait_ready()
    images = [photo_png(name, size=(48 + i, 40)) for i, name in enumerate(["chelsea", "coffee", "astronaut"] * 6)]

    def add(i: int) -> None:
        try:
            httpx.post(f"{server.url}/v1/references", json={"image": b64(images[i]), "id": f"r{i}"}, timeout=30)
        except httpx.HTTPError:
            pass  # killed mid-request

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(add, i) for i in range(len(images))]
        time.sleep(0.3)
        server.kill()
        for future in futures:
            future.result()

    assert main(["--store", str(store), "--json", "gc", "--grace", "0"]) == 0
    assert not list(store.rglob(".tmp-*"))
    with open_store(store) as opened:
        conn = opened._db.connection()
        unlinked = conn.execute("SELECT COUNT(*) FROM packages p WHERE NOT EXISTS "
                                "(SELECT 1 FROM reference_packages r WHERE r.package_key = p.key)").fetchone()[0]
        unreferenced = conn.execute('SELECT COUNT(*) FROM images i WHERE NOT EXISTS '
                                    '(SELECT 1 FROM "references" r WHERE r.image_sha256 = i.sha256)').fetchone()[0]
        assert unlinked == unreferenced == 0
        indexed = set(opened.local.keys())
        on_disk = {p.name.removesuffix(".safetensors") for p in (store / "packages").glob("*/*/*.safetensors")}
        assert on_disk == indexed
        for ref in opened.catalog.list_references():
            assert all(opened.packages.get(key) is not None for key in ref.packages.values())
    assert main(["--store", str(store), "verify"]) == 0


# -- issue 25 item 2, the read side: a stored value that is not valid Unicode ----------------------
def test_a_stored_value_that_is_not_valid_unicode_never_makes_a_reply_500(seeded):
    """A row written before intake refused such text (or by another writer): the JSON reply shows U+FFFD."""
    import sqlite3

    server, c = seeded
    with sqlite3.connect(server.service.engine.store.root / "refsight.db") as db:
        db.execute("""UPDATE "references" SET metadata = '{"note": "\\ud800", "\\udfff": 1}' WHERE ref_id = 'cat'""")
    for path in ("/v1/references", "/v1/references/cat"):
        response = c.get(path)
        assert response.status_code == 200, response.text
        assert "\ufffd" in response.text and response.content.decode("utf-8")  # valid UTF-8 JSON
