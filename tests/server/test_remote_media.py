"""Images by URL, opt-in (issue 37 item 9): ``--allowed-media-domains`` (vLLM) and ``--media-path``
(llama-server's ``file://``), with the SSRF guards, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from live_server import LiveServer, photo_png
from refsight.server.edge.http_errors import ApiError
from refsight.server.intake.remote_media import RemoteMedia

CAT = photo_png("chelsea", (32, 32))


class _Handler(BaseHTTPRequestHandler):
    """The image host: an image, a page, a large file, redirects on and off the list, a trickle."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", kind: str = "image/png", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        port = self.server.server_address[1]
        if self.path == "/cat.png":
            self._send(200, CAT)
        elif self.path == "/page":
            self._send(200, b"<html>hi</html>", "text/html")
        elif self.path == "/fake.png":
            self._send(200, b"not an image at all", "image/png")
        elif self.path == "/big.png":
            self._send(200, CAT + b"\0" * 5000)
        elif self.path == "/to-allowed":
            self._send(302, Location=f"http://localhost:{port}/cat.png")
        elif self.path == "/to-address":
            self._send(302, Location=f"http://127.0.0.1:{port}/cat.png")
        elif self.path == "/loop":
            self._send(302, Location="/loop")
        elif self.path == "/slow.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            for byte in CAT[:40]:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.1)
        else:
            self._send(404, b"", "text/plain")


@pytest.fixture(scope="module")
def host() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _chat(live: LiveServer, url: str):
    with live.client() as c:
        return c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": url}}]}]})


def test_urls_are_refused_by_default(make_server, host, tmp_path):
    live = make_server()
    for url in (f"http://localhost:{host}/cat.png", f"http://127.0.0.1:{host}/cat.png"):
        reply = _chat(live, url)
        assert reply.status_code == 400 and "not fetched" in reply.json()["error"]["message"]
    (tmp_path / "cat.png").write_bytes(CAT)
    assert _chat(live, "file://cat.png").status_code == 400


def test_an_allowed_domain_is_fetched_and_every_trick_refused(make_server, host):
    # localhost resolves to loopback: fetched only because the allow-list names that address; the address
    # itself, written as listed, is fetched too (vLLM's rule), directly or by a redirect.
    live = make_server(allowed_media_domains=("localhost", "127.0.0.1"), max_media_bytes=len(CAT) + 100)
    for url in (f"http://localhost:{host}/cat.png", f"http://LocalHost:{host}/cat.png", f"http://localhost:{host}/to-allowed",
                f"http://127.0.0.1:{host}/cat.png", f"http://localhost:{host}/to-address"):
        reply = _chat(live, url)
        assert reply.status_code == 200, (url, reply.text)
        assert "1 images" in reply.json()["choices"][0]["message"]["content"]
    refused = {
        f"http://2130706433:{host}/cat.png": "numeric",
        f"http://0x7f.1:{host}/cat.png": "numeric",
        f"http://[::1]:{host}/cat.png": "numeric",
        f"http://localhost@127.0.0.1:{host}/cat.png": "user info",
        f"http://user:pw@localhost:{host}/cat.png": "user info",
        f"http://localhost.evil.example:{host}/cat.png": "not an allowed media domain",
        f"http://127.0.0.2:{host}/cat.png": "numeric",  # an address the list does not name
        f"http://localhost:{host}/loop": "redirects",
        f"http://localhost:{host}/page": "not an image",
        f"http://localhost:{host}/big.png": "larger than",
        f"http://localhost:{host}/absent.png": "answered 404",
        "ftp://localhost/cat.png": "",
    }
    for url, why in refused.items():
        reply = _chat(live, url)
        assert reply.status_code == 400, (url, reply.text)
        assert why in reply.json()["error"]["message"], (url, reply.text)
    fake = _chat(live, f"http://localhost:{host}/fake.png")  # an image's label on other bytes: decoded, refused
    assert fake.status_code == 400 and fake.json()["error"]["param"].startswith("messages")


def test_an_allowed_name_that_resolves_to_a_private_address_is_refused_unless_the_address_is_listed(host):
    """Resolved once and checked: a listed name pointing inward (loopback here) is refused, and a listed IP
    lets it through, the connection going to the address that was checked."""
    for listed in (("localhost",), ("localhost", "10.0.0.7")):
        with pytest.raises(ApiError) as info:
            RemoteMedia(listed).fetch(f"http://localhost:{host}/cat.png", "image")
        assert "not a public address" in info.value.message and "127.0.0.1" in info.value.message, listed
    assert RemoteMedia(("localhost", "127.0.0.1")).fetch(f"http://localhost:{host}/cat.png", "image") == CAT
    # A redirect to a listed name is resolved and checked again.
    with pytest.raises(ApiError) as info:
        RemoteMedia(("localhost",)).fetch(f"http://localhost:{host}/to-allowed", "image")
    assert "not a public address" in info.value.message


def test_a_slow_image_host_is_cut_off_at_the_time_limit(host):
    media = RemoteMedia(("localhost", "127.0.0.1"), timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(ApiError) as info:
        media.fetch(f"http://localhost:{host}/slow.png", "image")
    assert "took more than" in info.value.message and time.monotonic() - started < 3


def test_media_path_serves_files_under_it_only(make_server, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "cat.png").write_bytes(CAT)
    (tmp_path / "secret.png").write_bytes(CAT)
    (media / "link.png").symlink_to(tmp_path / "secret.png")
    live = make_server(media_path=media)
    for url in ("file://cat.png", "file:///cat.png", "file://./cat.png"):
        assert _chat(live, url).status_code == 200, url
    for url in ("file://../secret.png", "file:///../../secret.png", "file://link.png", "file://absent.png",
                "file://other-host/cat.png", "file://."):
        reply = _chat(live, url)
        assert reply.status_code == 400 and reply.json()["error"]["code"] in ("media_not_allowed", "media_unavailable"), (
            url, reply.text)
