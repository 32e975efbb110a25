"""``refsight serve --model <llama.cpp model>``: the OpenAI endpoint backed by llama.cpp, as a llama-server
user would call it (the official SDK, a real server on loopback), stored references replayed with no encode."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hardening_helpers import free_port
from llama_models import require_llama_cpp

from refsight.samples import load_sample

require_llama_cpp()

MODEL = "tiny-qwen2-vl-gguf"


def _png(name: str) -> bytes:
    buffer = io.BytesIO()
    load_sample(name, (56, 56)).save(buffer, format="PNG")
    return buffer.getvalue()


def _serve(tmp_path: Path, *flags: str):
    """``refsight serve MODEL FLAGS`` on a free loopback port; yields its URL once it answers."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "refsight.cli", "serve", MODEL, *flags, "--port", str(port), "--store", str(tmp_path / "s")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"refsight serve did not start: {process.stderr.read().decode()[-2000:]}")
        time.sleep(0.5)
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory, gguf_files):
    gguf_files(MODEL)  # built before the server starts, so start-up is only the load
    yield from _serve(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def parallel_server(tmp_path_factory, gguf_files):
    """The server with two slots and no flash attention, spelled as llama-server's ``-np`` and ``-fa``."""
    gguf_files(MODEL)
    yield from _serve(tmp_path_factory.mktemp("serve-np"), "-np", "2", "-fa", "off")


def _add_reference(url: str, photo: str, ref_id: str) -> None:
    import base64

    added = httpx.post(f"{url}/v1/references", json={"image": base64.b64encode(_png(photo)).decode(), "id": ref_id}, timeout=120)
    assert added.status_code == 201, added.text


def test_the_openai_sdk_gets_llama_cpp_answers_from_stored_references(llama_server):
    import base64

    from openai import OpenAI

    client = OpenAI(base_url=f"{llama_server}/v1", api_key="unused-without-keys")
    _add_reference(llama_server, "chelsea", "cat")
    assert client.models.list().data[0].id == MODEL
    candidate = "data:image/png;base64," + base64.b64encode(_png("coffee")).decode()
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Reference:"},
        {"type": "image_url", "image_url": {"url": "refsight://ref/cat"}},
        {"type": "text", "text": "Candidate:"},
        {"type": "image_url", "image_url": {"url": candidate}},
        {"type": "text", "text": "Same animal?"},
    ]}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    assert first.choices[0].message.content == again.choices[0].message.content  # greedy
    assert first.model_extra["refsight"]["references_cached"][0] is True  # the stored reference: no encode
    usage = first.usage
    assert usage.prompt_tokens > usage.prompt_tokens_details.cached_tokens > 0  # the reference's image tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_the_openai_sdk_streams_llama_cpp_tokens_as_they_are_generated(llama_server):

    from openai import OpenAI

    client = OpenAI(base_url=f"{llama_server}/v1", api_key="unused-without-keys")
    _add_reference(llama_server, "chelsea", "cat-stream")
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "refsight://ref/cat-stream"}},
        {"type": "text", "text": "Describe it."},
    ]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16)
    deltas, finish = [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert "".join(deltas) == whole.choices[0].message.content
    assert len(deltas) > 1  # token by token, not one chunk at the end
    assert finish == whole.choices[0].finish_reason
    # Sampling fields reach llama.cpp's sampler chain (none is refused): a seeded answer repeats.
    sampled = dict(model=MODEL, messages=messages, max_tokens=12, temperature=1.0, top_p=0.9, seed=5,
                   frequency_penalty=0.5, presence_penalty=0.5)
    first = client.chat.completions.create(**sampled).choices[0].message.content
    assert client.chat.completions.create(**sampled).choices[0].message.content == first


def test_two_slots_answer_concurrent_clients_as_one_at_a_time(parallel_server):
    """``-np 2``: two slots in /props and /slots, and two clients at once get the answers they get one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    assert httpx.get(f"{parallel_server}/props", timeout=10).json()["total_slots"] == 2
    assert len(httpx.get(f"{parallel_server}/slots", timeout=10).json()) == 2
    client = OpenAI(base_url=f"{parallel_server}/v1", api_key="unused-without-keys")
    for ref_id, photo in (("cat", "chelsea"), ("cup", "coffee")):
        _add_reference(parallel_server, photo, ref_id)

    def ask(ref_id: str) -> str:
        messages = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"refsight://ref/{ref_id}"}},
            {"type": "text", "text": "Describe it."},
        ]}]
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24).choices[0].message.content

    one_by_one = [ask("cat"), ask("cup")]
    with ThreadPoolExecutor(2) as pool:
        for _ in range(2):
            assert list(pool.map(ask, ["cat", "cup"])) == one_by_one
