"""Tool calls round-trip through ``refsight serve`` with the client libraries unchanged: the OpenAI SDK, the ``ollama``
library, the ``anthropic`` SDK and a LangChain agent (``ChatOllama.bind_tools``), each on its own wire format.

One in-process server on the tiny GGUF (real llama.cpp) whose chat template is Llama 3.2's real one (the operator's
``--chat-template-file``): it renders the tools, an assistant's call and a tool's result, and teaches the
``llama3_json`` format (a call is the answer's JSON). Random weights never call a tool by themselves, so each call is
forced through the constrained decoder: OpenAI's and Anthropic's named or required ``tool_choice`` (vLLM's JSON
schema), and on Ollama, which has no ``tool_choice``, ``format`` set to a call's JSON schema (Ollama reads the calls of
a JSON-constrained answer as its template teaches them, as refsight does). The answers are short (``max_tokens`` about
60) and the enum-typed arguments make them end quickly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtimes import require_module

from live_server import LiveServer, photo_png
from refsight.backends.options import BackendOptions
from refsight.server import ServerConfig, create_app

GGUF = "tiny-qwen2-vl-gguf"
LLAMA_TEMPLATE = (Path(__file__).parents[1] / "data" / "chat_templates" / "meta-llama-Llama-3.2-3B-Instruct.jinja")
CITY = {"type": "string", "enum": ["Paris", "Rome"]}
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]}}
TOOLS = [{"type": "function", "function": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
#: A call in Llama 3.2's format, as Ollama's ``format`` (its tool_choice) forces one.
CALL_SCHEMA = {"type": "object", "properties": {"name": {"enum": ["get_weather"]}, "parameters": WEATHER["parameters"]},
               "required": ["name", "parameters"]}
TOKENS = 64


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One server on the tiny GGUF with Llama 3.2's chat template (the model loads once)."""
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)
    config = ServerConfig(store=tmp_path_factory.mktemp("store"), model=GGUF, keys={}, n_predict=16,
                          backend_options=BackendOptions(chat_template=LLAMA_TEMPLATE.read_text()))
    server = LiveServer(create_app(config)).start()
    yield server
    server.stop()


def _openai(live):
    openai = require_module("openai", "pip install openai")
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)


def _rendered(live, messages, tools=TOOLS) -> str:
    with live.client() as client:
        reply = client.post("/apply-template", json={"messages": messages, "tools": tools})
    assert reply.status_code == 200, reply.text
    return reply.json()["prompt"]


def test_the_openai_sdk_calls_a_named_tool_and_sends_its_result_back(live):
    client = _openai(live)
    named = {"type": "function", "function": {"name": "get_weather"}}
    answer = client.chat.completions.create(model="any", messages=ASK, tools=TOOLS, tool_choice=named,
                                            max_tokens=TOKENS)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in CITY["enum"]
    # The result turn: the SDK's own message back, then the tool's result answering the call by its id.
    history = [*ASK, choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id,
                                                                     "content": "21 degrees"}]
    final = client.chat.completions.create(model="any", messages=history, tools=TOOLS, max_tokens=8)
    assert final.choices[0].message.tool_calls is None and final.choices[0].finish_reason in ("stop", "length")
    # Rendered by the template: the tools, the call as Llama 3.2 writes it, the result in an ipython turn.
    prompt = _rendered(live, history)
    assert '"name": "get_weather"' in prompt.split("What is the weather")[0]
    written = '{"name": "get_weather", "parameters": ' + json.dumps(json.loads(call.function.arguments)) + "}"
    assert written in prompt and "<|start_header_id|>ipython<|end_header_id|>" in prompt and "21 degrees" in prompt
    plain = client.chat.completions.create(model="any", messages=ASK, max_tokens=1)
    assert final.usage.prompt_tokens > plain.usage.prompt_tokens


def test_a_streamed_required_call_arrives_as_one_delta(live):
    stream = _openai(live).chat.completions.create(
        model="any", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        max_tokens=TOKENS, stream=True)
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or ()]
    assert [c.index for c in calls] == [0] and calls[0].function.name == "get_weather" and calls[0].id
    assert json.loads(calls[0].function.arguments)["city"] in CITY["enum"]
    assert not any(d.content for d in deltas) and chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_renders_the_tools_and_answers_in_text(live):
    client = _openai(live)
    for choice in ("none", "auto"):  # random weights: the model never calls by itself, and nothing is guessed
        answer = client.chat.completions.create(model="any", messages=ASK, tools=TOOLS, tool_choice=choice,
                                                max_tokens=8)
        assert answer.choices[0].message.tool_calls is None and answer.choices[0].finish_reason in ("stop", "length")
    assert '"name": "get_weather"' in _rendered(live, ASK)


def test_an_image_chat_with_tools_is_answered_in_plain_text(live):
    """A chat about an image with tools offered (Open WebUI attaches its tools to every chat): text, no call."""
    import base64

    image = "data:image/png;base64," + base64.b64encode(photo_png()).decode()
    ask = [{"role": "user", "content": [{"type": "text", "text": "Is this a cat?"},
                                        {"type": "image_url", "image_url": {"url": image}}]}]
    answer = _openai(live).chat.completions.create(model="any", messages=ask, tools=TOOLS, max_tokens=8)
    assert answer.choices[0].message.tool_calls is None and isinstance(answer.choices[0].message.content, str)


def test_the_ollama_library_reads_calls_and_sends_results(live):
    ollama = require_module("ollama", "pip install ollama")
    client = ollama.Client(host=live.url)
    assert "tools" in client.show(GGUF).capabilities  # the template teaches a call format
    options = {"num_predict": TOKENS}
    answer = client.chat(model=GGUF, messages=ASK, tools=TOOLS, format=CALL_SCHEMA, options=options)
    (call,) = answer.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments["city"] in CITY["enum"]
    assert answer.done_reason == "stop" and answer.message.content == ""
    streamed = [part for part in client.chat(model=GGUF, messages=ASK, tools=TOOLS, format=CALL_SCHEMA,
                                             options=options, stream=True)]
    assert [c.function.name for p in streamed for c in p.message.tool_calls or ()] == ["get_weather"]
    history = [*ASK, answer.message, {"role": "tool", "content": "21 degrees", "tool_name": "get_weather"}]
    final = client.chat(model=GGUF, messages=history, tools=TOOLS, options={"num_predict": 4})
    assert final.done and not final.message.tool_calls
    assert final.prompt_eval_count > client.chat(model=GGUF, messages=ASK, options={"num_predict": 1}).prompt_eval_count


def test_the_anthropic_sdk_uses_a_tool_and_answers_its_result(live):
    anthropic = require_module("anthropic", "pip install anthropic")
    client = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0)
    tools = [{"name": "get_weather", "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    message = client.messages.create(model="any", max_tokens=TOKENS, messages=ASK, tools=tools,
                                     tool_choice={"type": "tool", "name": "get_weather"})
    (block,) = message.content
    assert message.stop_reason == "tool_use" and block.type == "tool_use" and block.name == "get_weather"
    assert block.input["city"] in CITY["enum"] and block.id
    with client.messages.stream(model="any", max_tokens=TOKENS, messages=ASK, tools=tools,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and [b.type for b in streamed.content] == ["tool_use"]
    assert streamed.content[0].input["city"] in CITY["enum"]
    history = [*ASK, {"role": "assistant", "content": [block.model_dump()]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "21 degrees"}]}]
    final = client.messages.create(model="any", max_tokens=4, messages=history, tools=tools)
    assert final.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in final.content)
    counted = client.messages.count_tokens(model="any", messages=history, tools=tools).input_tokens
    assert counted > client.messages.count_tokens(model="any", messages=ASK).input_tokens


def test_a_langchain_agent_calls_the_tool_and_reads_its_result(live):
    require_module("langchain_ollama", "pip install langchain-ollama")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_ollama import ChatOllama

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"21 degrees in {city}"

    # The agent's loop: the model asks for the tool (constrained to a call by format), the tool runs, its result goes
    # back, the model answers.
    calling = ChatOllama(model=GGUF, base_url=live.url, format=CALL_SCHEMA, num_predict=TOKENS)
    calling = calling.bind_tools([get_weather])
    messages = [HumanMessage("What is the weather in Paris?")]
    asked = calling.invoke(messages)
    (call,) = asked.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in CITY["enum"]
    messages += [asked, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answering = ChatOllama(model=GGUF, base_url=live.url, num_predict=4).bind_tools([get_weather])
    final = answering.invoke(messages)
    assert not final.tool_calls and isinstance(final.content, str)


def test_tool_fields_a_client_gets_wrong_are_refused_by_name(live):
    with live.client() as client:
        def refused(body, param):
            reply = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **body})
            assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text

        refused({"tools": [{"type": "web_search"}]}, "tools[0].type")
        refused({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice")
        refused({"tools": TOOLS, "tool_choice": "always"}, "tool_choice")
        refused({"tool_choice": "required"}, "tool_choice")
        refused({"tools": TOOLS, "grammar": "root ::= \"a\""}, "grammar")
        refused({"tools": TOOLS + TOOLS}, "tools")
        refused({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice")
