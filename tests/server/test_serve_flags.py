"""``refsight serve`` with the flags llama-server and ``vllm serve`` users type, as a real process on loopback:
``MODEL`` / ``-m``, ``--api-key`` (and ``$REFSIGHT_API_KEY``), ``--served-model-name`` / ``--alias``,
``-c`` / ``--ctx-size`` / ``--max-model-len``, ``-np`` / ``--parallel``, ``-fa`` / ``--flash-attn``; a bad model or option
is one line and exit 1, before any port is bound."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest
from hardening_helpers import cli_env, free_port
from runtimes import require_module

KEY = "serve-flags-key-0001"


def _serve(store, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "refsight.cli", "--store", str(store), "serve", *args, "--port", str(port), "--workers", "1"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env(**(env or {})))
    return process, f"http://127.0.0.1:{port}"


def _wait(process: subprocess.Popen, url: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "refsight serve did not come up"
        time.sleep(0.3)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.parametrize(
    "args", [("no-such-model",), ("toy", "-c", "512"), ("toy", "-np", "1"), ("toy", "-fa", "on"),
             ("toy", "--flash-attn", "sometimes"), ("-m", "/nonexistent/model.gguf")]
)
def test_a_bad_model_or_option_is_one_line_and_exit_1_before_the_port_is_bound(tmp_path, args):
    process, url = _serve(tmp_path / "store", *args)
    port = int(url.rsplit(":", 1)[1])
    listening = False
    while process.poll() is None:
        with socket.socket() as s:
            listening = listening or s.connect_ex(("127.0.0.1", port)) == 0
        time.sleep(0.05)
    stderr = process.stderr.read()
    assert process.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("refsight: error: ") and "Traceback" not in stderr, stderr
    assert not listening


def test_fewer_workers_than_parallel_slots_is_a_usage_error(tmp_path):
    process, _ = _serve(tmp_path / "store", "toy", "-np", "4")  # with --workers 1
    assert process.wait(timeout=60) == 2 and "below --parallel 4" in process.stderr.read()


def test_model_named_twice_is_a_usage_error(tmp_path):
    process, _ = _serve(tmp_path / "store", "toy", "--model", "tiny-qwen2-vl")
    assert process.wait(timeout=60) == 2 and "named twice" in process.stderr.read()


def test_positional_model_api_key_and_alias(tmp_path):
    process, url = _serve(tmp_path / "store", "toy", "--api-key", KEY, "--alias", "gpt-4o-mini")
    try:
        _wait(process, url)
        assert httpx.get(f"{url}/v1/models").status_code == 401  # the key is required...
        headers = {"Authorization": f"Bearer {KEY}"}
        models = httpx.get(f"{url}/v1/models", headers=headers).json()
        assert [m["id"] for m in models["data"]] == ["gpt-4o-mini"]
        chat = httpx.post(f"{url}/v1/chat/completions", headers=headers, json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200 and chat.json()["model"] == "gpt-4o-mini"
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}  # ...but not for /health, as in llama-server
    finally:
        _stop(process)
    assert KEY not in process.stderr.read()


def test_the_api_key_from_the_environment(tmp_path):
    process, url = _serve(tmp_path / "store", "--served-model-name", "served", "--model", "toy",
                          env={"REFSIGHT_API_KEY": KEY})
    try:
        _wait(process, url)
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models/served", headers={"X-API-Key": KEY}).json()["id"] == "served"
    finally:
        _stop(process)


def test_a_gguf_file_by_m_with_mmproj_and_a_context_size(tmp_path, model_cache):
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    model, mmproj = ensure_gguf("tiny-qwen2-vl-gguf")
    process, url = _serve(tmp_path / "store", "-m", str(model), "--mmproj", str(mmproj), "--ctx-size", "1024")
    try:
        _wait(process, url)
        props = httpx.get(f"{url}/props").json()
        assert props["default_generation_settings"]["n_ctx"] == 1024
        assert props["model_path"] == f"llamacpp:{model}"
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert models[0]["max_model_len"] == 1024
    finally:
        _stop(process)


def _serve_as_is(store, *args: str) -> tuple[subprocess.Popen, str]:
    """``refsight serve`` with exactly ``args`` (no --workers: the slots follow -np)."""
    port = free_port()
    argv = [sys.executable, "-m", "refsight.cli", "--store", str(store), "serve", *args, "--port", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env())
    return process, f"http://127.0.0.1:{port}"


def test_several_hosts_short_and_several_api_keys(tmp_path):
    # llama-server: --host takes several addresses; --api-key any length, several (repeated or comma-separated).
    process, url = _serve(tmp_path / "store", "toy", "--host", "127.0.0.1,::1", "--api-key", "abc",
                          "--api-key", f"{KEY},{KEY}-2")
    port = url.rsplit(":", 1)[1]
    try:
        _wait(process, url)
        for base in (url, f"http://[::1]:{port}"):
            assert httpx.get(f"{base}/health").status_code == 200
            assert httpx.get(f"{base}/v1/models").status_code == 401
            for key in ("abc", KEY, f"{KEY}-2"):
                assert httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    finally:
        _stop(process)
    stderr = process.stderr.read()
    assert "3 characters" in stderr and "abc" not in stderr.replace("characters", "")  # warned, the key never shown


@pytest.mark.parametrize(("args", "named"), [
    (("--chat-template-file", "absent.jinja"), "--chat-template-file"), (("--lora", "a.gguf"), "--lora a.gguf"),
    (("--chat-template", "nonesuch"), "--chat-template"),
    (("--slot-save-path", "slots"), "--slot-save-path"),
    (("-ctk", "q8_0"), "--cache-type-k"), (("-ctv", "q4_0"), "--cache-type-v"), (("-n", "-2"), "--n-predict"),
])
def test_llama_server_flags_that_cannot_be_honoured_are_refused_by_name(tmp_path, args, named):
    process, _ = _serve(tmp_path / "store", "toy", *args)
    assert process.wait(timeout=60) == 2
    assert named in process.stderr.read()


def test_llama_server_flags_honoured_or_accepted(tmp_path):
    process, url = _serve(tmp_path / "store", "toy", "--jinja", "--metrics", "-ctk", "f16", "-ctv", "F16", "--no-webui",
                          "-n", "16", "--strict-model-name")
    try:
        _wait(process, url)
        assert httpx.get(f"{url}/props").json()["default_generation_settings"]["params"]["n_predict"] == 16
        assert httpx.get(f"{url}/").status_code == 404  # --no-webui
        chat = httpx.post(f"{url}/v1/chat/completions", json={"model": "gpt-3.5-turbo", "messages": [
            {"role": "user", "content": "hi"}]})
        assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"  # --strict-model-name
    finally:
        _stop(process)


@pytest.mark.parametrize(("args", "slots", "n_ctx"), [(("-np", "1", "-c", "1024"), 1, 1024),
                                                      (("-np", "2", "-c", "2048"), 2, 1024),
                                                      (("-np", "2", "-c", "1024", "--ctx-per-slot"), 2, 1024),
                                                      (("-np", "4", "-c", "256"), 4, 256)])  # llama.cpp pads each share
def test_np_slots_share_the_context_as_in_llama_server(tmp_path, model_cache, args, slots, n_ctx):
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    model, mmproj = ensure_gguf("tiny-qwen2-vl-gguf")
    process, url = _serve_as_is(tmp_path / "store", "-m", str(model), "--mmproj", str(mmproj), *args)
    try:
        _wait(process, url)
        assert len(httpx.get(f"{url}/slots").json()) == slots
        assert httpx.get(f"{url}/props").json()["default_generation_settings"]["n_ctx"] == n_ctx
    finally:
        _stop(process)


def test_chat_template_file_renders_every_chat_of_a_gguf(tmp_path, model_cache):
    """``--chat-template-file`` (llama-server's flag) replaces the GGUF's template: ``/props`` shows it,
    ``/apply-template`` renders with it, and a chat is answered through it."""
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    model, mmproj = ensure_gguf("tiny-qwen2-vl-gguf")
    template = tmp_path / "t.jinja"
    template.write_text("{% for message in messages %}<|im_start|>{{ message['role'] }}\n[from the file] "
                        "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
                        "<|im_start|>assistant\n{% endif %}")
    process, url = _serve_as_is(tmp_path / "store", "-m", str(model), "--mmproj", str(mmproj), "--jinja",
                                "--chat-template-file", str(template))
    try:
        _wait(process, url)
        assert httpx.get(f"{url}/props").json()["chat_template"] == template.read_text()
        messages = [{"role": "user", "content": "hi"}]
        rendered = httpx.post(f"{url}/apply-template", json={"messages": messages}).json()["prompt"]
        assert rendered == "<|im_start|>user\n[from the file] hi<|im_end|>\n<|im_start|>assistant\n"
        chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=120)
        assert chat.status_code == 200, chat.text
    finally:
        _stop(process)
