"""The vllm backend's factory and registry entries, checked without a vLLM server.

Options are validated before the server is contacted, so these run in the main
test job (no ``vllm`` marker).
"""

from __future__ import annotations

import pytest


def test_vllm_prefix_resolves_to_the_vllm_factory():
    from refsight.backends.registry import resolve_factory
    from refsight.backends.vllm.loading import load_vllm_backend

    assert resolve_factory("vllm:http://127.0.0.1:1") is load_vllm_backend


def test_tiny_vllm_models_are_registered():
    from refsight.backends.registry import available_models

    assert {"tiny-qwen2-vl-vllm", "tiny-qwen2.5-vl-vllm", "tiny-qwen3-vl-vllm"} <= set(available_models())


@pytest.mark.parametrize("option", ["min_pixels", "max_pixels", "processor_kwargs", "mmproj", "no_such_option"])
def test_unsupported_options_are_refused_by_name(option):
    from refsight.backends.registry import get_backend
    from refsight.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as info:
        get_backend("vllm:http://127.0.0.1:1", **{option: 1})
    assert info.value.input == option


@pytest.mark.parametrize("name", ["vllm:localhost:8000", "vllm:ftp://x"])
def test_a_url_without_http_is_refused(name):
    from refsight.backends.registry import get_backend
    from refsight.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="vllm:http://HOST:PORT"):
        get_backend(name)


def test_tiny_vllm_model_folder_has_what_vllm_loads(model_cache):
    """Chat template, processor and video-processor configs, and text heads of 32."""
    import json

    from refsight.builtin_models.vllm_qwen import ensure_vllm_model_dir

    for name, system in (("tiny-qwen2-vl-vllm", True), ("tiny-qwen3-vl-vllm", False)):
        folder = ensure_vllm_model_dir(name)
        for file in ("chat_template.jinja", "processor_config.json", "video_preprocessor_config.json"):
            assert (folder / file).is_file(), file
        assert ("You are a helpful assistant." in (folder / "chat_template.jinja").read_text()) is system
        text = json.loads((folder / "config.json").read_text())["text_config"]
        assert (text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]) >= 32


def test_vllm_commands_are_in_the_cli():
    from refsight.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["vllm-serve", "tiny-qwen2-vl-vllm", "--port", "8123", "--image-limit", "0", "--json"])
    assert (args.model_name, args.port, args.image_limit) == ("tiny-qwen2-vl-vllm", 8123, 0)
    assert parser.parse_args(["vllm-env", "/tmp/x", "--json"]).dir == "/tmp/x"


def test_sampling_maps_onto_vllm_fields_and_greedy_is_the_default():
    from refsight.backends.base import Sampling
    from refsight.sampling import SAMPLING_FIELDS
    from refsight.backends.vllm.backend import VLLMBackend
    from refsight.backends.vllm.messages import sampling_fields

    assert VLLMBackend.sampling_fields == frozenset(SAMPLING_FIELDS)
    assert VLLMBackend.supports_streaming
    assert sampling_fields(Sampling()) == {"temperature": 0.0}
    sampling = Sampling(temperature=0.7, top_p=0.9, seed=5, stop=("END", "\n\n"), frequency_penalty=0.5, presence_penalty=-0.25)
    assert sampling_fields(sampling) == {
        "temperature": 0.7, "top_p": 0.9, "seed": 5, "stop": ["END", "\n\n"],
        "frequency_penalty": 0.5, "presence_penalty": -0.25,
    }


def test_sampling_edges_reach_vllm_as_values_it_serves():
    """A tiny temperature is greedy (vLLM would raise it to 0.01 and sample); a tiny top_p is never rounded to 0."""
    from refsight.backends.base import Sampling
    from refsight.sampling import TOP_P_FLOOR
    from refsight.backends.vllm.messages import sampling_fields

    assert sampling_fields(Sampling(temperature=1e-300))["temperature"] == 0.0
    assert sampling_fields(Sampling(temperature=2, top_p=1e-300)) == {"temperature": 2.0, "top_p": TOP_P_FLOOR}


class _SSEStub:
    """A local HTTP server answering POST with a scripted SSE stream (only the wire is faked)."""

    def __init__(self, script):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.release = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                script(self, stub)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _sse_headers(handler, status=200):
    handler.send_response(status)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def _sse_send(handler, line: str) -> None:
    data = (line + "\n\n").encode()
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


def _delta(text):
    import json

    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "token_ids": [1]}]})


def _stream(script, stop_event=None):
    from refsight.backends.vllm.client import VLLMClient

    stub = _SSEStub(script)
    try:
        chunks = []
        client = VLLMClient("vllm:stub", stub.url, timeout=30)
        cancelled = client.chat_stream({"stream": True}, chunks.append, stop_event)
        return cancelled, chunks, stub.url
    finally:
        stub.close()


def test_stream_reads_events_until_done():
    def script(handler, stub):
        _sse_headers(handler)
        for piece in ("a", "b"):
            _sse_send(handler, _delta(piece))
        _sse_send(handler, "data: [DONE]")
        handler.wfile.write(b"0\r\n\r\n")

    cancelled, chunks, _ = _stream(script)
    assert cancelled is False
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["a", "b"]


def test_stop_event_closes_a_stalled_stream_at_once():
    """The server sends one delta and then nothing: setting the event still ends the read."""
    import threading
    import time

    def script(handler, stub):
        _sse_headers(handler)
        _sse_send(handler, _delta("a"))
        stub.release.wait(30)

    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    began = time.monotonic()
    cancelled, chunks, _ = _stream(script, stop)
    assert cancelled is True
    assert len(chunks) == 1
    assert time.monotonic() - began < 5


@pytest.mark.parametrize("case", ["http_400", "error_event", "no_done"])
def test_stream_failures_are_generation_errors_naming_the_server(case):
    import json

    from refsight.errors import GenerationError

    def script(handler, stub):
        if case == "http_400":
            data = json.dumps({"error": {"message": "bad grid", "code": 400}}).encode()
            handler.send_response(400)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        _sse_headers(handler)
        _sse_send(handler, _delta("a"))
        if case == "error_event":
            _sse_send(handler, "data: " + json.dumps({"error": {"message": "engine died", "code": 500}}))
        handler.wfile.write(b"0\r\n\r\n")

    with pytest.raises(GenerationError) as info:
        _stream(script)
    message = str(info.value)
    assert "127.0.0.1" in message
    assert {"http_400": "HTTP 400: bad grid", "error_event": "engine died", "no_done": "without [DONE]"}[case] in message
