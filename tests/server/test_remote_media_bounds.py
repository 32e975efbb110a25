"""Images by URL under one deadline and one decoded-size cap (issue 49, items 3 and 4), against real HTTP
servers on 127.0.0.1: content encodings undone layer by layer and counted as decoded (a ``gzip, gzip``
bomb stops at the cap, in a real ``refsight serve`` too, RSS measured), and one deadline for DNS, connect,
headers and body of all of a request's images, that also ends when the client leaves."""

from __future__ import annotations

import contextlib
import gzip
import select
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from hardening_helpers import ServeProcess
from live_server import LiveServer, photo_png
from refsight.server.edge.http_errors import ApiError
from refsight.server.intake.remote_media import RemoteMedia

pytestmark = pytest.mark.slow  # real servers, deadlines of seconds, and one `refsight serve` measured

CAT = photo_png("chelsea", (32, 32))
#: Allowed by name, and by address (localhost resolves to loopback, refused unless listed).
ALLOWED = ("localhost", "127.0.0.1")


def _gzipped(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``chunks`` as one gzip member, compressed as they come (nothing held but the output)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for chunk in chunks:
        yield packer.compress(chunk)
    yield packer.flush()


def _bomb(mib: int) -> bytes:
    """``mib`` MiB of zeros gzipped twice (``Content-Encoding: gzip, gzip``): a few hundred bytes on the wire."""
    zeros = bytes(1 << 20)
    inner = b"".join(_gzipped(zeros for _ in range(mib)))  # ~1 KB a MiB
    return b"".join(_gzipped([inner]))


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


#: Path: (body, Content-Encoding). All but the last five decode to CAT.
ENCODED = {
    "/gzip.png": (gzip.compress(CAT), "gzip"),
    "/x-gzip.png": (gzip.compress(CAT), "x-gzip"),
    "/deflate.png": (zlib.compress(CAT), "deflate"),
    "/raw-deflate.png": (_raw_deflate(CAT), "Deflate"),
    "/two.png": (gzip.compress(zlib.compress(CAT)), "deflate, gzip"),
    "/identity.png": (gzip.compress(CAT), "identity, gzip"),
    "/members.png": (gzip.compress(CAT[:100]) + gzip.compress(CAT[100:]), "gzip"),
    "/caf%C3%A9%20cat.png?size=1%202": (CAT, ""),  # "/café cat.png?size=1 2" as it is sent
    "/three.png": (gzip.compress(gzip.compress(gzip.compress(CAT))), "gzip, gzip, gzip"),
    "/br.png": (CAT, "br"),
    "/cut.png": (gzip.compress(CAT)[:-30], "gzip"),
    "/corrupt.png": (b"\x1f\x8b" + bytes(40), "gzip"),
    "/after-end.png": (zlib.compress(CAT) + b"more", "deflate"),
}
REFUSED = {
    "/three.png": "gzip, gzip, gzip: 3 layers, at most 2",
    "/br.png": "'br' is not supported",
    "/cut.png": "ends before its end",
    "/corrupt.png": "does not decode",
    "/after-end.png": "bytes after the end",
}


class _Encoded(BaseHTTPRequestHandler):
    """The image in each content encoding of :data:`ENCODED`, and the bomb at ``/bomb.png``."""

    bomb = b""

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        body, encoding = (self.bomb, "gzip, gzip") if self.path == "/bomb.png" else ENCODED.get(self.path, (b"", ""))
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def encoded_host() -> Iterator[int]:
    _Encoded.bomb = _bomb(256)  # 256 MiB decoded: 12 times the 20 MiB cap (the was 1 GiB)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Encoded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class Trickle:
    """An image host that answers its status line, then one header line every ``interval`` seconds (``lines``
    of them), then ``body`` (an image, or nothing); it notes when each connection opened and when the other
    side closed it."""

    def __init__(self, interval: float, lines: int, body: bytes = b"") -> None:
        self.interval, self.lines, self.body = interval, lines, body
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.opened: list[float] = []
        self.closed: list[float] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, name: str = "slow.png") -> str:
        return f"http://localhost:{self.port}/{name}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            while True:
                conn, _ = self.listener.accept()
                self.opened.append(time.monotonic())
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            request = b""
            while b"\r\n\r\n" not in request:
                piece = conn.recv(4096)
                if not piece:
                    return
                request += piece
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n")
            for i in range(self.lines):
                if self._peer_closed(conn, self.interval):
                    return
                conn.sendall(f"X-Trickle-{i}: {i}\r\n".encode())
            conn.sendall(f"Content-Length: {len(self.body)}\r\n\r\n".encode() + self.body)
            self._peer_closed(conn, 30)

    def _peer_closed(self, conn: socket.socket, seconds: float) -> bool:
        """Wait up to ``seconds`` for the fetcher to close ``conn``; note when it did."""
        if not select.select([conn], [], [], seconds)[0]:
            return False
        try:
            closed = conn.recv(1) == b""
        except OSError:  # reset
            closed = True
        if closed:
            self.closed.append(time.monotonic())
        return closed

    def close(self) -> None:
        self.listener.close()


def _chat(live: LiveServer, *urls: str, timeout: float = 60, stream: bool = False):
    with live.client(timeout=timeout) as c:
        return c.post("/v1/chat/completions", json={"stream": stream, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it?"}, *({"type": "image_url", "image_url": {"url": u}} for u in urls)]}]})


@pytest.fixture
def trickle() -> Iterator:
    """Factory: ``trickle(interval, lines, body=b"")`` starts a :class:`Trickle` host."""
    hosts: list[Trickle] = []

    def start(interval: float, lines: int, body: bytes = b"") -> Trickle:
        hosts.append(Trickle(interval, lines, body))
        return hosts[-1]

    yield start
    for host in hosts:
        host.close()


def _wait_closed(host: Trickle, count: int = 1, within: float = 10.0) -> float | None:
    """When the host saw its ``count``-th connection closed by the fetcher (None: not within ``within`` s)."""
    deadline = time.monotonic() + within
    while len(host.closed) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return host.closed[count - 1] if len(host.closed) >= count else None


def test_content_encodings_are_undone_layer_by_layer(encoded_host):
    media = RemoteMedia(ALLOWED)
    for path in sorted(set(ENCODED) - set(REFUSED)):
        assert media.fetch(f"http://localhost:{encoded_host}{path}", "image") == CAT, path
    assert media.fetch(f"http://localhost:{encoded_host}/café cat.png?size=1 2", "image") == CAT
    for path, why in REFUSED.items():
        url = f"http://localhost:{encoded_host}{path}"
        with pytest.raises(ApiError) as info:
            media.fetch(url, "image")
        assert why in info.value.message and url in info.value.message, (path, info.value.message)
        assert info.value.status == 400 and info.value.code == "media_unavailable", path


def test_a_nested_gzip_bomb_stops_at_the_decoded_cap_holding_about_the_cap(encoded_host):
    """256 MiB behind ``gzip, gzip`` against a 1 MiB cap: refused at the cap, and Python's allocations
    (the decoded pieces, the bytes kept) stay near the cap, never near the decoded size."""
    url = f"http://localhost:{encoded_host}/bomb.png"
    tracemalloc.start()
    try:
        with pytest.raises(ApiError) as info:
            RemoteMedia(ALLOWED, max_bytes=1 << 20).fetch(url, "image")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "larger than 1048576 bytes (decoded)" in info.value.message and url in info.value.message
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB allocated to refuse a 1 MiB cap"


def test_the_bomb_leaves_a_real_server_s_memory_alone(encoded_host, tmp_path):
    """The issue's measure: ``refsight serve`` fetching the bomb (12x its 20 MiB cap decoded) on the chat route.
    Before the fix its peak RSS rose 2 GB for a 1 GiB bomb (512 MB for this one); now by about the cap."""
    server = ServeProcess(tmp_path / "store", "--allowed-media-domains", *ALLOWED).wait_ready()
    chat = {"model": "toy", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"http://localhost:{encoded_host}/absent.png"}}]}]}
    try:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            assert c.post("/v1/chat/completions", json=chat).status_code == 400  # the route's one-off costs
            idle = server.peak_rss_mb()
            chat["messages"][0]["content"][0]["image_url"]["url"] = bomb = f"http://localhost:{encoded_host}/bomb.png"
            reply = c.post("/v1/chat/completions", json=chat)
        peak = server.peak_rss_mb()
    finally:
        server.stop()
    print(f"gzip,gzip bomb of 256 MiB: peak RSS {idle:.0f} MB before, {peak:.0f} MB after (+{peak - idle:.0f} MB)")
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert bomb in message and "larger than 20971520 bytes (decoded)" in message, message
    assert peak - idle < 120, f"peak RSS rose {peak - idle:.0f} MB to refuse a 20 MiB cap"


def test_headers_trickled_past_the_deadline_are_cut_off_there(make_server, trickle):
    """A header line every 0.25 s for 50 s: the request's 1.5 s deadline ends it (a read timeout never would),
    a 400 naming the URL, and the image host sees its connection closed."""
    host = trickle(0.25, 200)
    live = make_server(allowed_media_domains=ALLOWED, media_timeout_s=1.5)
    started = time.monotonic()
    reply = _chat(live, host.url())
    took = time.monotonic() - started
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert host.url() in message and "took more than 1.5 s" in message, message
    assert took < 15, f"{took:.1f} s: the trickle (50 s) was not cut at the 1.5 s deadline"
    assert _wait_closed(host) is not None, "the fetch did not close its connection"


def test_one_deadline_covers_every_image_of_a_request(make_server, trickle):
    """Six images that each take 1.5 s (headers trickled, then a real image) under a 2.5 s deadline: each
    alone is in time, together they are not (a deadline per image would take 9 s and answer 200)."""
    host = trickle(0.3, 5, CAT)
    live = make_server(allowed_media_domains=ALLOWED, media_timeout_s=2.5)
    started = time.monotonic()
    reply = _chat(live, *(host.url(f"{i}.png") for i in range(6)))
    took = time.monotonic() - started
    assert reply.status_code == 400 and "took more than 2.5 s" in reply.json()["error"]["message"], reply.text
    assert len(host.opened) < 6 and took < 8, (len(host.opened), took)


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_a_fetch_stops_when_its_client_leaves(make_server, trickle, stream):
    """The client gives up after 1 s of a 50 s trickle under a 60 s deadline: the fetch stops with the
    request (the image host sees its connection closed within seconds), not at the deadline; a streamed
    request too, though nothing was written to it yet."""
    host = trickle(0.25, 200)
    live = make_server(allowed_media_domains=ALLOWED, media_timeout_s=60)
    with pytest.raises(httpx.ReadTimeout):
        _chat(live, host.url(), timeout=1.0, stream=stream)
    left = time.monotonic()
    closed = _wait_closed(host, within=20)
    assert closed is not None, "the fetch went on after the client left"
    assert closed - left < 6, f"the fetch stopped {closed - left:.1f} s after the client left"
    assert len(host.opened) == 1


def test_dns_and_connect_are_under_the_deadline_too():
    """A host whose accept queue is full never completes a connect, one that accepts never completes a TLS
    handshake: each cut at the deadline; a name that does not resolve is a 400 naming it."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    queued = _fill_accept_queue(port)
    try:
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            RemoteMedia(ALLOWED, timeout_s=1.0).fetch(f"http://localhost:{port}/cat.png", "image")
        took = time.monotonic() - started
    finally:
        for sock in queued:
            sock.close()
        listener.close()
    assert "took more than 1 s" in info.value.message and took < 8, (info.value.message, took)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, then never answers the TLS handshake
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            RemoteMedia(ALLOWED, timeout_s=1.0).fetch(f"https://localhost:{silent.getsockname()[1]}/", "image")
        took = time.monotonic() - started
    assert "took more than 1 s" in info.value.message and took < 8, (info.value.message, took)
    with pytest.raises(ApiError) as info:  # (a resolver that is not there fails slowly: a long deadline)
        RemoteMedia(("absent.invalid",), timeout_s=60).fetch("http://absent.invalid/cat.png", "image")
    assert "absent.invalid does not resolve" in info.value.message


def _fill_accept_queue(port: int) -> list[socket.socket]:
    """Connections to a listener that never accepts, until one no longer completes: its queue is full, the
    kernel now drops new SYNs (the connecting side waits and retries, as with a host that does not answer)."""
    queued: list[socket.socket] = []
    while len(queued) < 64:
        sock = socket.socket()
        sock.settimeout(0.5)
        try:
            sock.connect(("127.0.0.1", port))
        except TimeoutError:
            sock.close()
            return queued
        queued.append(sock)
    raise AssertionError("the listener's accept queue never filled")
