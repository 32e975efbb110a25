"""The live server and request helpers for the server tests (imported by name: unique on purpose)."""

from __future__ import annotations

import base64
import io
import socket
import threading
import time

import httpx
import uvicorn
from PIL import Image

class LiveServer:
    """uvicorn serving ``app`` on a pre-bound loopback socket (no port race), in a daemon thread."""

    def __init__(self, app) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        from refsight.server.connections import uvicorn_options

        # The connection settings of `refsight serve` (request deadlines), from the app's own config.
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2,
                                **uvicorn_options(app.state.config))
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self) -> "LiveServer":
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread died during startup")
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start within 60 s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def client(self, key: str | None = None, **options) -> httpx.Client:
        """An httpx client for this server, sending ``key`` as a bearer token."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=options.pop("timeout", 60), **options)

    @property
    def service(self):
        return self.app.state.service

    @staticmethod
    def in_pool(func, *args):
        """``func(*args)`` as a work pool's job (a pool of its own, on this thread's event loop): the only place the
        service's model work runs."""
        import anyio
        from refsight.server.edge.limits import WorkPool

        return anyio.run(WorkPool(1, 0).run, func, *args)


def photo_png(name: str = "chelsea", size: tuple[int, int] = (64, 48), *, flip: bool = False) -> bytes:
    """A bundled real photo (``refsight.samples``) as PNG bytes (``flip`` mirrors it: a different image)."""
    from refsight.samples import load_sample

    image = load_sample(name).resize(size)
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    """Plain base64 text."""
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    """A ``data:`` URL as the OpenAI SDK examples build them."""
    return f"data:{mime};base64,{b64(data)}"


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    """The response is a JSON error with this status and code; returns the error object."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    # The OpenAI-compatible routes add OpenAI's ``type`` and ``param`` (so the SDK's typed errors work).
    openai_route = response.request.url.path.startswith(("/v1/chat/", "/v1/models"))
    keys = {"code", "message", "type", "param"} if openai_route else {"code", "message"}
    assert set(body) == {"error"} and set(body["error"]) == keys, body
    assert body["error"]["code"] == code, body
    assert "Traceback" not in body["error"]["message"]
    return body["error"]
