"""Real Ollama clients against ``refsight serve`` on loopback, serving ``ollama:tiny`` from an Ollama-layout
store: the ``ollama`` Python library (sync and async, streamed and whole, images as bytes, paths and base64,
``format`` from a pydantic model's schema, the model endpoints, errors) and LangChain's ``ChatOllama``."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from live_server import LiveServer, b64, photo_png
from ollama_helpers import tiny_store
from pydantic import BaseModel
from runtimes import require_module

from refsight.server import ServerConfig, create_app

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
ollama = require_module("ollama", "pip install 'refsight[test]'")
pytestmark = pytest.mark.slow  # an Ollama store of the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
GREEDY = {"num_predict": 8, "temperature": 0}


class Verdict(BaseModel):
    """A structured answer, as clients ask for one."""

    same: bool
    colour: str


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("ollama-models")
    tiny_store(root)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OLLAMA_MODELS", str(root))
        server = LiveServer(create_app(ServerConfig(store=tmp_path_factory.mktemp("store"), model="ollama:tiny",
                                                    keys={}))).start()
        yield server
        server.stop()


def test_the_python_library_chats_streams_and_generates_with_images_in_every_form(live, tmp_path):
    client = ollama.Client(host=live.url)
    png = photo_png()
    path = tmp_path / "cat.png"
    path.write_bytes(png)
    answers = []
    for image in (png, str(path), b64(png)):
        reply = client.chat(model="tiny", options=GREEDY, messages=[{"role": "user", "content": "What?", "images": [image]}])
        assert reply.done and reply.message.role == "assistant" and reply.eval_count > 0
        answers.append(reply.message.content)
    assert answers[0] == answers[1] == answers[2]  # the same pixels, however they were handed to the client
    parts = list(client.chat(model="tiny:latest", options=GREEDY, stream=True,
                             messages=[{"role": "user", "content": "What?", "images": [png]}]))
    assert "".join(p.message.content for p in parts) == answers[0] and parts[-1].done and not parts[0].done
    assert parts[-1].prompt_eval_count > 0 and parts[-1].total_duration > 0
    generated = client.generate(model="tiny", prompt="What?", images=[png], options=GREEDY)
    assert generated.response == answers[0] and generated.done_reason in ("stop", "length")
    streamed = "".join(p.response for p in client.generate(model="tiny", prompt="What?", images=[png], options=GREEDY,
                                                          stream=True))
    assert streamed == generated.response


def test_format_from_a_pydantic_schema_is_the_constrained_decoder(live):
    client = ollama.Client(host=live.url)
    reply = client.chat(model="tiny", format=Verdict.model_json_schema(), options={"num_predict": 200, "temperature": 0},
                        messages=[{"role": "user", "content": "Same colour?", "images": [photo_png()]}])
    if reply.done_reason == "stop":  # a random-weight model may spend its tokens inside a string
        Verdict.model_validate_json(reply.message.content)
    assert reply.message.content.startswith("{")
    whole = client.generate(model="tiny", prompt="JSON please", format="json", options={"num_predict": 40, "temperature": 0})
    assert whole.response.lstrip().startswith("{")


def test_the_model_endpoints_and_errors_as_the_library_reads_them(live):
    client = ollama.Client(host=live.url)
    (model,) = client.list().models
    assert model.model == "tiny:latest" and model.details.family == "qwen2vl" and model.size > 0
    shown = client.show("tiny")
    assert "vision" in shown.capabilities and shown.details.format == "gguf"
    assert client.ps().models[0].model == "tiny:latest"
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="llava:7b", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404 and 'model "llava:7b" not found' in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("llava:7b")
    assert caught.value.status_code == 400 and "refsight serves the model it was started with" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="tiny", think=True, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.error.startswith("think:")


def _reference_answers(live, ref_id: str, photo: str) -> tuple[str, str, str]:
    """Three answers naming a new stored reference (async client: whole, streamed, whole again)."""
    with live.client() as http:
        assert http.post("/v1/references", json={"image": b64(photo_png(photo)), "id": ref_id}).status_code == 201

    async def run() -> tuple[str, str, str]:
        client = ollama.AsyncClient(host=live.url)
        message = {"role": "user", "content": "Same?", "images": [f"refsight://ref/{ref_id}".encode(), photo_png(flip=True)]}
        first = await client.chat(model="tiny", options=GREEDY, messages=[message])
        pieces = [p.message.content async for p in await client.chat(model="tiny", options=GREEDY, messages=[message],
                                                                   stream=True)]
        again = await client.chat(model="tiny", options=GREEDY, messages=[message])
        assert first.done and first.prompt_eval_count > 0
        return first.message.content, "".join(pieces), again.message.content

    return asyncio.run(run())


def test_the_async_library_streams_and_names_a_stored_reference(live):
    _, streamed, again = _reference_answers(live, "cat", "chelsea")
    assert streamed == again  # both restore the reference prefix's stored state


def test_langchain_chat_ollama_with_an_image_message(live):
    require_module("langchain_ollama", "pip install 'refsight[test]'")
    from langchain_core.messages import HumanMessage
    from langchain_ollama import ChatOllama

    chat = ChatOllama(model="tiny", base_url=live.url, temperature=0, num_predict=8)
    image = base64.b64encode(photo_png()).decode()
    message = HumanMessage(content=[{"type": "text", "text": "What is this?"},
                                    {"type": "image_url", "image_url": f"data:image/png;base64,{image}"}])
    reply = chat.invoke([message])
    assert isinstance(reply.content, str) and reply.response_metadata["done"] is True
    assert reply.response_metadata["model"] == "tiny:latest"
    # The image reached the model: the prompt holds its tokens beside the text's.
    text_only = chat.invoke([HumanMessage(content="What is this?")])
    assert reply.usage_metadata["input_tokens"] > text_only.usage_metadata["input_tokens"] + 4
    assert json.dumps(reply.usage_metadata)
