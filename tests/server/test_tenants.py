"""Tenants: keys map to namespaces; nobody reads, lists, infers or evicts another tenant's references."""

from __future__ import annotations

import logging
import subprocess
import sys

import httpx
import pytest

from live_server import assert_error, b64, data_url, photo_png
from refsight import InvalidInputError
from refsight.server import ServerConfig, create_app
from refsight.server.edge.tenants import Tenants, load_keys, parse_key_pairs

KEY_A = "key-alpha-0123456789"
KEY_B = "key-bravo-9876543210"
KEY_OPS = "key-operator-424242"
KEYS = {KEY_A: "alpha", KEY_B: "bravo", KEY_OPS: "@operator"}


@pytest.fixture
def tenant_server(make_server):
    return make_server(keys=KEYS)


def test_missing_or_wrong_key_is_401_without_echoing_it(tenant_server):
    with tenant_server.client() as anonymous:
        error = assert_error(anonymous.get("/v1/references"), 401, "unauthorized")
        assert anonymous.get("/v1/references").headers["www-authenticate"] == "Bearer"
    wrong = KEY_A[:-1] + "X"
    with tenant_server.client(wrong) as c:
        error = assert_error(c.get("/v1/references"), 401, "unauthorized")
        assert wrong not in error["message"]
        assert_error(c.post("/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": "hi"}]}),
                     401, "unauthorized")
    with tenant_server.client(KEY_A) as a:
        assert a.get("/v1/references").status_code == 200
        assert a.get("/v1/references", headers={"Authorization": "", "X-API-Key": KEY_A}).status_code == 200


def test_another_tenants_id_reads_exactly_like_an_absent_one(tenant_server):
    png = photo_png()
    with tenant_server.client(KEY_A) as a, tenant_server.client(KEY_B) as b:
        assert a.post("/v1/references", json={"image": b64(png), "id": "secret", "metadata": {"owner": "alpha"}}).status_code == 201
        assert b.get("/v1/references").json() == {"references": []}
        host = tenant_server.url.removeprefix("http://")  # this server's own reference URLs
        for method, path, body in [
            ("GET", "/v1/references/{}", None),
            ("GET", "/v1/references/{}/thumbnail", None),
            ("DELETE", "/v1/references/{}", None),
            ("POST", "/v1/chat/completions",
             {"model": "toy", "messages": [{"role": "user", "content": [
                 {"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": "refsight://ref/{}"}}]}]}),
            ("POST", "/v1/chat/completions",
             {"model": "toy", "messages": [{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": "http://" + host + "/v1/references/{}/image"}}]}]}),
            ("GET", "/v1/references/{}/image", None),
        ]:
            def call(ref_id):
                import json
                payload = json.loads(json.dumps(body).replace("{}", ref_id)) if body else None
                return b.request(method, path.format(ref_id), json=payload)

            other, absent = call("secret"), call("never-existed")
            assert_error(other, 404, "reference_not_found")
            # Identical apart from the id the caller itself chose.
            assert other.json() == {"error": {**absent.json()["error"],
                                              "message": absent.json()["error"]["message"].replace("never-existed", "secret")}}
            assert other.headers.get("content-length") is not None
        # B's delete did nothing: A still has its reference.
        assert a.get("/v1/references/secret").json()["metadata"] == {"owner": "alpha"}
        # Same id in both namespaces, different images: independent.
        assert b.post("/v1/references", json={"image": b64(photo_png(flip=True)), "id": "secret"}).status_code == 201
        assert a.get("/v1/references/secret").json()["image_sha256"] != b.get("/v1/references/secret").json()["image_sha256"]
        b.delete("/v1/references/secret")
        assert a.get("/v1/references/secret").status_code == 200


def test_cache_flags_do_not_reveal_another_tenants_images(tenant_server):
    png = photo_png("coffee")
    with tenant_server.client(KEY_A) as a, tenant_server.client(KEY_B) as b:
        first = a.post("/v1/references", json={"image": b64(png), "id": "cup"}).json()
        seen_by_b = b.post("/v1/references", json={"image": b64(png), "id": "mine"}).json()
        # B learns nothing: its add IS the first-ever encode of this image in B's scope ...
        assert seen_by_b["cached"] is False and seen_by_b["encode_ms"] > 0
        assert seen_by_b["bytes"] == first["bytes"] and seen_by_b["package_key"] != first["package_key"]
        # ... but once B holds the image itself, its own repeat is a cache hit.
        assert b.post("/v1/references", json={"image": b64(png), "id": "mine2"}).json()["cached"] is True
        # Chat with raw bytes of an image only A holds: no cache flag for C... here B now holds it, so use a new one.
        only_a = photo_png("astronaut")
        a.post("/v1/references", json={"image": b64(only_a), "id": "astro"})
        chat = b.post("/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(only_a)}}]}]}).json()
        assert chat["refsight"]["references_cached"] == [False]
        mine = a.post("/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(only_a)}}]}]}).json()
        assert mine["refsight"]["references_cached"] == [True]
        # Stats are per namespace; the store-wide counters are not shown to tenants.
        stats_b = b.get("/v1/stats").json()
        assert stats_b["references"] == 2 and stats_b["packages"] == 1 and stats_b["hits"] is None


def test_metrics_need_an_operator_key_when_tenants_exist(tenant_server):
    with tenant_server.client() as anonymous:
        assert_error(anonymous.get("/metrics"), 401, "unauthorized")
    with tenant_server.client(KEY_A) as a:
        assert_error(a.get("/metrics"), 403, "forbidden")
    with tenant_server.client(KEY_OPS) as ops:
        assert "refsight_cache_hits_total" in ops.get("/metrics").text
        assert_error(ops.get("/v1/references"), 403, "forbidden")
    with tenant_server.client() as anonymous:
        assert anonymous.get("/healthz").json()["status"] == "ok"  # liveness needs no key


def test_keys_never_reach_logs_or_responses(make_server, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    live = make_server(keys=KEYS)
    with live.client(KEY_A) as a, live.client("wrong-" + KEY_B) as wrong:
        a.post("/v1/references", json={"image": "!!", "id": "x"})
        a.get("/v1/references/absent")
        wrong.get("/v1/references")
        bodies = a.get("/openapi.json").text + a.get("/").text
    out, err = capfd.readouterr()
    everything = caplog.text + out + err + bodies
    for key in KEYS:
        assert key not in everything
    assert repr(Tenants(KEYS)) == "Tenants(3 keys)"


def test_key_files_and_env(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# tenants\nkey-one-abcdefgh = one\n\nkey-two-abcdefgh=two  # trailing comment\n")
    assert load_keys(path) == {"key-one-abcdefgh": "one", "key-two-abcdefgh": "two"}
    assert load_keys(None, {"REFSIGHT_API_KEYS": "k-env-12345678=env, k-env-87654321=ops"}) == {
        "k-env-12345678": "env", "k-env-87654321": "ops"}
    assert load_keys(None, {}) == {}
    path.write_text("key-one-abcdefgh=one\nsupersecretkey-no-namespace\n")
    with pytest.raises(InvalidInputError) as info:
        load_keys(path)
    assert "line 2" in str(info.value) and "supersecret" not in str(info.value)
    with pytest.raises(InvalidInputError, match="at least 8"):
        parse_key_pairs("short=ns", source="test", lines=False)
    with pytest.raises(InvalidInputError, match="namespace"):
        parse_key_pairs("long-enough-key=../x", source="test", lines=False)


def test_without_keys_only_loopback_may_be_bound(tmp_path):
    with pytest.raises(InvalidInputError, match="loopback"):
        create_app(ServerConfig(store=tmp_path, model="toy", host="0.0.0.0", keys={}))
    create_app(ServerConfig(store=tmp_path, model="toy", host="::1", keys={}))
    create_app(ServerConfig(store=tmp_path, model="toy", host="0.0.0.0", keys={KEY_A: "alpha"}))
    # The CLI says so and exits 1 before opening any socket.
    run = subprocess.run(
        [sys.executable, "-m", "refsight.cli", "--store", str(tmp_path), "serve", "--host", "0.0.0.0", "--model", "toy"],
        capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "REFSIGHT_API_KEYS": ""},
    )
    assert run.returncode == 1 and "loopback" in run.stderr and "Traceback" not in run.stderr


def test_a_keys_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """Issue 18 rows 6-7 for the keys file: a FIFO or a device never blocks or fills memory."""
    import os

    from refsight.server.edge.tenants import load_keys

    fifo = tmp_path / "keys-fifo"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInputError, match="FIFO"):
        load_keys(fifo)
    with pytest.raises(InvalidInputError, match="character device"):
        load_keys("/dev/zero")


def test_keys_from_the_environment_that_are_not_valid_unicode_are_refused_without_echoing_them():
    from refsight import InvalidInputError
    from refsight.server.edge.tenants import load_keys

    secret = "s3cret-key-\udcff-000"  # undecodable bytes in the environment arrive as lone surrogates
    with pytest.raises(InvalidInputError) as refused:
        load_keys(environ={"REFSIGHT_API_KEYS": f"good-key-0000001=a {secret}=b"})
    assert str(refused.value) == "$REFSIGHT_API_KEYS pair 2: is not valid Unicode text"
    with pytest.raises(InvalidInputError, match="pair 1: is not valid Unicode"):
        load_keys(environ={"REFSIGHT_API_KEYS": "good-key-0000001=t\udcffeam"})


@pytest.mark.parametrize("share", [False, True], ids=["isolated-tenants", "shared-encodes"])
def test_a_thumbnail_another_tenant_fetched_is_rendered_afresh(make_server, share):
    """Issue 25 item 6: the thumbnail cache was keyed by image and size for everyone, so a tenant's
    thumbnail of an image another tenant holds came back faster at the sizes the other had fetched."""
    live = make_server(keys=KEYS, share_packages=share)
    png = photo_png("chelsea")
    thumbnails = live.service.thumbnails
    with live.client(KEY_A) as a, live.client(KEY_B) as b:
        assert a.post("/v1/references", json={"image": b64(png), "id": "cat"}).status_code == 201
        assert b.post("/v1/references", json={"image": b64(png), "id": "kitty"}).status_code == 201
        first = a.get("/v1/references/cat/thumbnail", params={"size": 64})
        assert first.status_code == 200 and (thumbnails.renders, thumbnails.hits) == (1, 0)
        assert a.get("/v1/references/cat/thumbnail", params={"size": 64}).content == first.content
        assert (thumbnails.renders, thumbnails.hits) == (1, 1)  # the tenant's own repeat is a hit
        other = b.get("/v1/references/kitty/thumbnail", params={"size": 64})
        assert other.content == first.content  # the same picture either way ...
    # ... but isolated, B's first fetch does B's own work: nothing about A's fetch shows in its time.
    assert (thumbnails.renders, thumbnails.hits) == ((1, 2) if share else (2, 1))


def test_the_image_cookie_authenticates_a_reference_image_read_and_nothing_else(make_server):
    """The page's ``refsight_key`` cookie (its thumbnails are plain <img>): accepted for a GET of one
    reference's thumbnail only; never for a listing, a write, a wrong key or beside a header."""
    live = make_server(keys={"cookie-key-000001": "alpha", "cookie-key-000002": "beta"})
    with live.client("cookie-key-000001") as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
    with httpx.Client(base_url=live.url, timeout=60) as anonymous:
        def get(path, key, **kwargs):
            return anonymous.request(kwargs.pop("method", "GET"), path, headers={"Cookie": f"refsight_key={key}"}, **kwargs)

        thumb = get("/v1/references/cat/thumbnail?size=64", "cookie-key-000001")
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
        assert "Cookie" in thumb.headers["vary"]
        assert get("/v1/references/cat/thumbnail", "cookie-key-000002").status_code == 404  # beta's view: no such ref
        assert get("/v1/references/cat/thumbnail", "wrong").status_code == 401
        assert get("/v1/references", "cookie-key-000001").status_code == 401
        assert get("/v1/references/cat", "cookie-key-000001").status_code == 401
        assert get("/v1/references/cat", "cookie-key-000001", method="DELETE").status_code == 401
        both = anonymous.get("/v1/references/cat/thumbnail", headers={
            "Cookie": "refsight_key=cookie-key-000001", "Authorization": "Bearer wrong"})
        assert both.status_code == 401  # a header, when given, is what counts
    with live.client("cookie-key-000001") as c:
        assert [r["ref_id"] for r in c.get("/v1/references").json()["references"]] == ["cat"]
