"""Tool calling on each runtime that renders its own chat template (transformers, llama.cpp), through the engine: the
tools rendered by a real template (Qwen3.5's, which lays images out as the tiny Qwen2-VL does), a forced call read out
of the constrained answer, and a stored reference's prefix state reused under the tools (the template writes them
before the reference, so they are part of its prefix). vLLM renders its own template on its server: the routes refuse
tools there by name (``tests/server/test_tool_calling.py`` has the dialects; the toy echo proves the refusal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refsight import Engine, ReferenceSegment
from refsight.backends.options import BackendOptions
from refsight.requests import GenerationRequest
from refsight.tools import ChatTools, ToolUse

TEMPLATE = (Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen3.5-4B.jinja").read_text()
WEATHER = {"name": "get_weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}


@pytest.mark.slow  # loads a tiny model per runtime
@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2-vl-gguf"])
def test_a_forced_call_under_tools_the_template_renders_and_a_reused_prefix(tmp_path, real_photo, model):
    options = BackendOptions(chat_template=TEMPLATE)
    with Engine(tmp_path / "store", model=model, backend_options=options) as engine:
        backend = engine.backend()
        assert backend.tool_format().name == "qwen3_coder"
        offered = backend.chat_text(["Weather?"], tools=ChatTools(ToolUse([WEATHER])))
        assert "<tools>" in offered and '"name": "get_weather"' in offered and "<function=" in offered
        engine.add(real_photo("chelsea", size=(64, 48)), ref_id="cat")
        request = GenerationRequest([ReferenceSegment("cat"), "What is the weather where this cat lives?"],
                                    tools=ToolUse([WEATHER], function="get_weather"), max_new_tokens=24)
        first, again = engine.chat(request), engine.chat(request)
    for result in (first, again):
        assert result.finish_reason == "tool_calls" and result.text == ""
        (call,) = result.tool_calls
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
    assert again.prefix_tokens_reused > 0 and first.prefix_tokens_reused == 0
    assert again.tokens == first.tokens and again.tool_calls[0].arguments == first.tool_calls[0].arguments
