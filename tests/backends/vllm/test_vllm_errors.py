"""Failures of the vLLM server become clear refsight errors that name it.

A server that is down, one that hangs, and real 400s from vLLM (embeddings of the
wrong width, a grid that does not match the embeddings) each raise a
:class:`~refsight.errors.BackendError` / :class:`~refsight.errors.GenerationError`
whose message holds the server's URL; a failed compare leaves the store as it was.
The hanging and failing servers are small local HTTP stubs (only the error path is
faked; every model answer in these tests comes from real vLLM).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"


class _Stub(BaseHTTPRequestHandler):
    root = ""
    mode = "500"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "stub", "root": self.root}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "hang":
            time.sleep(5)
        self._send(500, {"error": {"message": "engine core died", "code": 500}})


@pytest.fixture
def stub(request):
    """A local stub server whose /v1/models names the tiny model; ``request.param`` is its POST mode."""
    from refsight.builtin_models.vllm_qwen import ensure_vllm_model_dir

    handler = type("Handler", (_Stub,), {"root": str(ensure_vllm_model_dir(MODEL)), "mode": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _request(backend, photos, *, package=None):
    from refsight.requests import GenerationRequest

    image = package if package is not None else backend.encode([photos["chelsea"]])[0]
    return GenerationRequest(["Describe", image], max_new_tokens=4)


def test_unreachable_server_is_a_backend_error_naming_it():
    from refsight.backends.registry import get_backend
    from refsight.backends.vllm.serve import free_port
    from refsight.errors import BackendError

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match="not reachable") as info:
        get_backend(f"vllm:{url}")
    assert url in str(info.value)


@pytest.mark.parametrize("stub", ["hang"], indirect=True)
def test_timeout_is_a_generation_error_naming_the_server(stub, photos):
    from refsight.backends.registry import get_backend
    from refsight.errors import GenerationError

    # The image-mode probe at load POSTs a real image too: a hanging server fails there already.
    with pytest.raises(GenerationError, match="did not answer within 1 s") as info:
        backend = get_backend(f"vllm:{stub}", timeout=1)
        backend.generate([_request(backend, photos)])
    assert stub in str(info.value)


@pytest.mark.parametrize("stub", ["500"], indirect=True)
def test_failed_compare_writes_nothing_to_the_store(stub, photos, tmp_path):
    from refsight import Engine
    from refsight.errors import GenerationError

    photos["chelsea"].image.save(tmp_path / "cat.png")
    photos["rocket"].image.save(tmp_path / "rocket.png")
    from refsight.backends.options import BackendOptions

    # embeds mode, given: the server is not probed (the stub answers every POST with a 500).
    with Engine(tmp_path / "store", model=f"vllm:{stub}", backend_options=BackendOptions(vllm_images="embeds")) as engine:
        engine.add(tmp_path / "cat.png", ref_id="cat")  # encoding is refsight's: works without vLLM
        before = engine.stats().to_dict()
        files_before = sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())
        with pytest.raises(GenerationError, match="HTTP 500: engine core died") as info:
            engine.compare(tmp_path / "rocket.png", ref_ids=["cat"], criteria="short fur", force_vlm=True, attributes=())
        after = engine.stats().to_dict()
    assert stub in str(info.value)
    assert {k: after[k] for k in ("references", "packages", "bytes")} == {k: before[k] for k in ("references", "packages", "bytes")}
    files_after = sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert [f for f in files_after if f not in files_before and not f.endswith(("-wal", "-shm"))] == []


@pytest.fixture(scope="module")
def server(vllm_servers):
    """The real tiny Qwen2-VL server (pixels allowed)."""
    return vllm_servers.get(MODEL, 8)


def test_an_encoder_that_does_not_fit_the_served_model_is_refused_before_sending(server, photos):
    """A Qwen3-VL encoder (features + 2 deepstack maps: 3 × 64 wide) against a Qwen2-VL server (64 wide).

    vLLM itself does not check the width (a wrong one kills its engine), so refsight
    compares the served model's config with the encoder's up front.
    """
    from refsight.backends.registry import get_backend
    from refsight.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="192 wide.*64 wide") as info:
        get_backend(f"vllm:{server.url}", encoder="tiny-qwen3-vl-vllm")
    assert server.url in str(info.value)
    _server_still_answers(server, photos)


def test_a_grid_that_does_not_match_the_embeddings_is_refused(server, photos):
    """refsight's own check refuses it before sending, and the server stays up.

    Not forced past that check any more: with the server encoding pixels too, vLLM 0.32's engine
    dies on such a grid (``split_with_sizes`` in the model runner) instead of answering 500, taking
    every later request down with it. refsight's check is what keeps a bad package from it."""
    import dataclasses

    from refsight.backends.registry import get_backend
    from refsight.errors import CorruptPackageError

    backend = get_backend(f"vllm:{server.url}", images="embeds")  # the grid travels with image_embeds only
    package = backend.encode([photos["chelsea"]])[0]
    (t, h, w), = package.metadata["layout"]["image_grid_thw"]
    layout = {**package.metadata["layout"], "image_grid_thw": [[t, h + 2, w]]}
    bad = dataclasses.replace(package, metadata={**package.metadata, "layout": layout})
    with pytest.raises(CorruptPackageError):  # refsight's own check comes first
        backend.generate([_request(backend, photos, package=bad)])
    _server_still_answers(server, photos)


def _server_still_answers(server, photos):
    from refsight.backends.registry import get_backend

    backend = get_backend(f"vllm:{server.url}")
    assert backend.generate([_request(backend, photos)])[0].token_ids
