"""A server without keys is not reachable from foreign web pages; CORS is opt-in (issue 38, item 2), over loopback.

DNS rebinding sends a foreign ``Host``; a cross-site form POST sends a foreign ``Origin`` and needs no
preflight. Both are refused without keys; with keys nothing changes for API clients. ``--cors-origins``
lists the origins a page may call from, preflights answered 200 before the key check.
"""

from __future__ import annotations

from live_server import assert_error, photo_png

ATTACKER = "https://attacker.example"


def test_a_foreign_host_is_refused_without_keys(server):
    with server.client() as c:
        assert_error(c.get("/v1/references", headers={"Host": "attacker.example:8000"}), 403, "host_not_allowed")
        assert_error(c.get("/v1/stats", headers={"Host": "rebind.attacker.example"}), 403, "host_not_allowed")
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "[::1]", "app.localhost"):
            assert c.get("/v1/references", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_are_served_without_keys(make_server):
    server = make_server(allowed_hosts=("box.lan",))
    with server.client() as c:
        assert c.get("/v1/references", headers={"Host": "box.lan:8000"}).status_code == 200
        assert c.get("/v1/references", headers={"Host": "other.lan"}).status_code == 403


def test_a_cross_site_form_post_changes_nothing_without_keys(server):
    with server.client() as c:
        files = {"image": ("a.png", photo_png(), "image/png")}
        reply = c.post("/v1/references", data={"id": "x"}, files=files, headers={"Origin": ATTACKER})
        assert_error(reply, 403, "origin_not_allowed")
        assert_error(c.post("/v1/references", data={"id": "x"}, files=files, headers={"Origin": "null"}), 403,
                     "origin_not_allowed")
        assert c.get("/v1/references").json()["references"] == []
        # The server's own page (same origin) still works.
        own = c.post("/v1/references", data={"id": "x"}, files=files, headers={"Origin": server.url})
        assert own.status_code == 201, own.text


def test_with_keys_nothing_changes_for_api_clients(make_server):
    server = make_server(keys={"key-a-12345678": "a"})
    with server.client("key-a-12345678") as c:
        headers = {"Host": "api.example.com", "Origin": ATTACKER}
        assert c.get("/v1/references", headers=headers).status_code == 200
        # llama-server's default CORS where keys guard the server: any origin echoed (a page without a key reads
        # refusals only)
        assert c.get("/v1/references", headers=headers).headers["access-control-allow-origin"] == ATTACKER


def test_cors_is_opt_in_and_preflights_come_before_the_key_check(make_server):
    app = "https://app.example"
    server = make_server(keys={"key-a-12345678": "a"}, cors_origins=(app,))
    preflight = {"Origin": app, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    with server.client() as anonymous:
        reply = anonymous.options("/v1/chat/completions", headers=preflight)
        assert reply.status_code == 200
        assert reply.headers["access-control-allow-origin"] == app
        assert "authorization" in reply.headers["access-control-allow-headers"]
        # llama-server's shape and spellings (llama.cpp's tests read the names into a plain dict), the page's headers
        names = dict(reply.headers.raw)
        assert names[b"Access-Control-Allow-Origin"] == app.encode() and names[b"Vary"] == b"Origin"
        assert names[b"Access-Control-Allow-Credentials"] == b"true"
        assert names[b"Access-Control-Allow-Methods"] == b"GET, POST, DELETE, OPTIONS"
        assert names[b"Access-Control-Allow-Headers"] == b"authorization, content-type"
        foreign = anonymous.options("/v1/chat/completions", headers={**preflight, "Origin": ATTACKER})
        assert "access-control-allow-origin" not in foreign.headers
    with server.client("key-a-12345678") as c:
        read = c.get("/v1/references", headers={"Origin": app})
        assert dict(read.headers.raw)[b"Access-Control-Allow-Origin"] == app.encode()


def test_localhost_origins_are_reflected_by_default_as_llama_servers_localhost_mode(make_server):
    """Issue 51 item 3: llama-server's ``--cors-origins localhost`` (refsight's default without keys) reflects a
    loopback origin on any port, parsed (``localhost.evil.com`` and user info are not local); ``""``: none. With keys
    the default is llama-server's own, ``*``: any origin echoed, credentials allowed (issue 61 item 2)."""
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
    server = make_server(keys={"key-a-12345678": "a"}, cors_origins=("localhost",))
    with server.client() as anonymous:
        for origin in ("http://localhost", "http://localhost:8080", "http://127.0.0.1:3000", "http://[::1]:3000",
                       "https://localhost"):
            reply = anonymous.options("/completions", headers={**preflight, "Origin": origin})
            assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == origin, origin
        for origin in ("http://web.mydomain.fr", "http://notlocalhost", "http://localhost.evil.com",
                       "http://127.0.0.1:1@evil.example", "null"):
            reply = anonymous.options("/completions", headers={**preflight, "Origin": origin})
            assert reply.status_code == 200 and "access-control-allow-origin" not in reply.headers, origin
    with server.client("key-a-12345678") as c:
        reply = c.get("/v1/models", headers={"Origin": "http://localhost:5173"})
        assert reply.headers["access-control-allow-origin"] == "http://localhost:5173"
    keyless = make_server()
    with keyless.client() as anonymous:
        for origin, reflected in (("http://localhost:8080", True), ("http://web.mydomain.fr", False)):
            reply = anonymous.options("/completions", headers={**preflight, "Origin": origin})
            assert ("access-control-allow-origin" in reply.headers) is reflected, origin
    keyed = make_server(keys={"key-a-12345678": "a"})
    with keyed.client() as anonymous:
        for origin in ("web.mydomain.fr", "http://evil.example", "localhost"):
            reply = anonymous.options("/completions", headers={**preflight, "Origin": origin})
            assert reply.headers["access-control-allow-origin"] == origin, origin
            assert reply.headers["access-control-allow-credentials"] == "true"
    off = make_server(cors_origins=())
    with off.client() as c:
        assert "access-control-allow-origin" not in c.get("/v1/models", headers={"Origin": "http://localhost"}).headers


def test_a_listed_origin_may_post_to_a_keyless_server(make_server):
    server = make_server(cors_origins=("https://app.example",))
    with server.client() as c:
        files = {"image": ("a.png", photo_png(), "image/png")}
        reply = c.post("/v1/references", data={"id": "x"}, files=files, headers={"Origin": "https://app.example"})
        assert reply.status_code == 201 and reply.headers["access-control-allow-origin"] == "https://app.example"


def test_an_origin_or_host_is_parsed_not_searched(server):
    """Issue 49 item 12: ``http://127.0.0.1:1@evil.example`` is evil.example's origin (user info before the @)."""
    files = {"image": ("a.png", photo_png(), "image/png")}
    with server.client() as c:
        for origin in ("http://127.0.0.1:1@evil.example", f"http://127.0.0.1:{server.port}/path",
                       "http://localhost?x", "http://127.0.0.1 evil.example", "ftp://127.0.0.1"):
            assert_error(c.post("/v1/references", data={"id": "x"}, files=files, headers={"Origin": origin}), 403,
                         "origin_not_allowed")
        assert_error(c.get("/v1/references", headers={"Host": "127.0.0.1:1@evil.example"}), 403, "host_not_allowed")
        assert c.get("/v1/references").json()["references"] == []
        for own in (f"http://127.0.0.1:{server.port}", "http://[::1]:8080", "http://app.localhost"):
            reply = c.post("/v1/references", data={"id": "x"}, files=files, headers={"Origin": own})
            assert reply.status_code == 201, (own, reply.text)
