"""Slow senders and HEAD, on real sockets against a live server (issue 25 item 8).

A client that sends its request too slowly (slowloris: a header byte at a time; or a body
declared and never finished) is answered 408 and closed within the deadline, other clients
are served meanwhile, and no more than ``max_incomplete_requests`` connections may be half
sent at once. HEAD on a GET route answers like GET, without a body.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
from hardening_helpers import ServeProcess
from live_server import b64, photo_png

#: Far above every deadline used here: the old server kept these connections open for ever.
GIVE_UP_S = 20.0
HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
BODY = b"POST /v1/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"


def _drip(port: int, prefix: bytes, drop: bytes, pause: float = 0.2) -> tuple[bytes, float]:
    """Send ``prefix``, then ``drop`` every ``pause`` s until the server closes; (what it answered, seconds)."""
    start = time.monotonic()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=pause) as sock:
        sock.sendall(prefix)
        while time.monotonic() - start < GIVE_UP_S:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                try:
                    sock.sendall(drop)
                except OSError:
                    break
                continue
            except OSError:
                break
            if not data:
                break
            answer += data
    return answer, time.monotonic() - start


def _in_threads(count: int, target, *args) -> tuple[list, list[threading.Thread]]:
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(target(*args))) for _ in range(count)]
    for thread in threads:
        thread.start()
    return results, threads


def test_a_slow_head_or_body_is_408_within_the_deadline_and_others_are_served(make_server):
    live = make_server(header_timeout_s=1.0, request_timeout_s=2.0)
    heads, head_threads = _in_threads(4, _drip, live.port, HEAD, b"X")
    bodies, body_threads = _in_threads(2, _drip, live.port, BODY, b" ")
    time.sleep(0.3)
    with live.client() as client:  # meanwhile, ordinary clients are answered at once
        for _ in range(5):
            assert client.get("/healthz").status_code == 200
    assert any(t.is_alive() for t in head_threads + body_threads)  # ... while the slow ones still drip
    for thread in head_threads + body_threads:
        thread.join(GIVE_UP_S + 5)
    for answer, seconds in heads + bodies:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"request_timeout"' in answer
        assert seconds < 10, seconds  # 1 s (head) and 2 s (whole request), with room for a loaded machine
    assert all(seconds >= 0.9 for _, seconds in heads)  # not before the deadline either


def test_a_slow_second_request_on_a_kept_alive_connection_has_its_own_deadline(make_server):
    live = make_server(header_timeout_s=1.0, request_timeout_s=2.0)
    start = time.monotonic()
    answer = b""
    with socket.create_connection(("127.0.0.1", live.port), timeout=GIVE_UP_S) as sock:
        sock.sendall(HEAD + b"\r\n")  # one whole request, answered, the connection kept alive
        while b'"status":"ok"' not in answer:
            answer += sock.recv(65536)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # then the head of the next, never finished
        rest = sock.recv(65536)
    assert rest.startswith(b"HTTP/1.1 408"), rest[:200]
    assert time.monotonic() - start < 10


def test_at_most_so_many_connections_are_half_sent_at_once_the_oldest_goes(make_server):
    # Deadlines far away: what closes connections here is the bound on half-sent requests alone.
    live = make_server(header_timeout_s=30.0, request_timeout_s=60.0, max_incomplete_requests=4)
    socks = [socket.create_connection(("127.0.0.1", live.port), timeout=10) for _ in range(10)]
    try:
        for sock in socks:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            time.sleep(0.05)  # an order the server sees
        start = time.monotonic()
        for sock in socks[:6]:
            assert sock.recv(65536).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - start < 10  # at once, not at the 30 s deadline
        for sock in socks[6:]:
            sock.settimeout(0.3)
            try:
                assert sock.recv(65536) == b"", "a newer half-sent request was closed"
            except socket.timeout:
                pass  # still open, as it should be
        with httpx.Client(base_url=live.url, timeout=10) as client:
            assert client.get("/healthz").status_code == 200
    finally:
        for sock in socks:
            sock.close()


def test_refsight_serve_closes_a_slow_head_too(tmp_path):
    server = ServeProcess(tmp_path / "store").wait_ready()
    try:
        answer, seconds = _drip(server.port, HEAD, b"X", pause=0.5)
    finally:
        server.stop()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert 9 < seconds < GIVE_UP_S  # the default head deadline is 10 s


def test_head_on_get_routes_answers_like_get_without_a_body(server):
    with server.client() as client:
        assert client.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
        for path in ("/healthz", "/v1/references", "/v1/references/cat", "/v1/references/cat/thumbnail", "/v1/stats",
                     "/v1/models", "/"):
            got, head = client.get(path), client.head(path)
            assert (head.status_code, head.content) == (200, b""), (path, head.status_code)
            assert head.headers["content-type"] == got.headers["content-type"], path
            assert int(head.headers["content-length"]) > 0, path
            if path in ("/healthz", "/", "/v1/references/cat/thumbnail"):  # the same bytes each time
                assert head.headers["content-length"] == str(len(got.content)), path
        refused = client.head("/v1/compare")
        assert refused.status_code == 405 and refused.content == b""
