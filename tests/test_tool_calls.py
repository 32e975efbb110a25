"""Tool calling's own parts (``refsight.tools``): the format a real template teaches, each format's reader on what its
real models emit, an answer read whole and as it streams, the tools a request offers and a forced call's schema, and
the real templates rendering a tool conversation in the bounded renderer. No model: the round trips through real
runtimes and client libraries are ``tests/server/test_tool_calling.py``.

The answers below are written as the models emit them (their model cards, and their own templates, which write a
call in a conversation's history exactly as the model is trained to answer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refsight import InvalidInputError
from refsight.backends.hf.chat import chat_messages
from refsight.backends.llamacpp.prompt import render_prompt
from refsight.backends.templates import render
from refsight.builtin_models.family_checkpoints import FAMILY_SPECS
from refsight.builtin_models.gguf import CHATML_TEMPLATE
from refsight.builtin_models.processor_files import chat_template as tiny_template
from refsight.requests import GenerationRequest
from refsight.tools import ChatTools, ToolCall, ToolReader, ToolTurn, ToolUse, format_named, format_of

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
WEATHER = {"name": "get_current_temperature", "description": "Get the current temperature at a location.",
           "parameters": {"type": "object", "properties": {
               "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
               "days": {"type": "integer"}}, "required": ["location"]}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
USE = ToolUse([WEATHER, TIME])
PARIS = {"location": "Paris, France", "unit": "celsius"}


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text()


@pytest.mark.parametrize(("name", "expected"), [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"), ("Qwen3.5-4B.jinja", "qwen3_coder"),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral"), ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json"), ("google-gemma-4-31B-it.jinja", "gemma4"),
])
def test_the_format_is_read_off_the_real_template(name, expected):
    assert format_of(_template(name)).name == expected


def test_templates_that_read_no_tools_teach_no_format():
    built_in = [tiny_template(f) for f in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm")]
    for template in [CHATML_TEMPLATE, *built_in, *(spec.chat_template for spec in FAMILY_SPECS.values())]:
        assert format_of(template) is None
    assert format_of("{{ '<tool_call>' }}{{ messages }}") is None  # a marker without the tools variable
    assert format_of(None) is None and format_of({"default": "x"}) is None


# What the real models emit: (format, answer, the text before the calls, the calls).
EMITTED = [
    ("hermes", 'I will check.\n<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
               '"Paris, France", "unit": "celsius"}}\n</tool_call>', "I will check.\n",
     [("get_current_temperature", PARIS)]),
    ("hermes", '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "Paris, France", "unit": '
               '"celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "",
     [("get_current_temperature", PARIS), ("get_time", {})]),
    ("qwen3_coder", "<tool_call>\n<function=get_current_temperature>\n<parameter=location>\nParis, France\n"
                    "</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                    "</function>\n</tool_call>", "", [("get_current_temperature", {**PARIS, "days": 3})]),
    ("mistral", '[TOOL_CALLS][{"name": "get_current_temperature", "arguments": {"location": "Paris, France", '
                '"unit": "celsius"}}]', "", [("get_current_temperature", PARIS)]),
    ("mistral", '[TOOL_CALLS]get_current_temperature[ARGS]{"location": "Paris, France", "unit": "celsius"}'
                "[TOOL_CALLS]get_time[ARGS]{}", "", [("get_current_temperature", PARIS), ("get_time", {})]),
    ("mistral", 'Sure.[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}', "Sure.", [("get_time", {})]),
    ("llama3_json", '{"name": "get_current_temperature", "parameters": {"location": "Paris, France", "unit": '
                    '"celsius"}}', "", [("get_current_temperature", PARIS)]),
    ("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_current_temperature", '
                    '"parameters": {"location": "Paris, France", "unit": "celsius"}}', "",
     [("get_time", {}), ("get_current_temperature", PARIS)]),
    ("gemma4", '<|tool_call>call:get_current_temperature{location:<|"|>Paris, France<|"|>,unit:<|"|>celsius<|"|>,'
               "days:3}<tool_call|>", "", [("get_current_temperature", {**PARIS, "days": 3})]),
]

IDS = [f"{name}-{i}" for i, (name, *_) in enumerate(EMITTED)]


def _read(name: str, answer: str, use: ToolUse = USE) -> tuple[str, list[tuple[str, dict]]]:
    text, calls = ToolReader(use, format_named(name)).finish(answer)
    return text, [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize(("name", "answer", "text", "calls"), EMITTED, ids=IDS)
def test_each_format_reads_what_its_models_emit(name, answer, text, calls):
    assert _read(name, answer) == (text, calls)


@pytest.mark.parametrize(("name", "answer", "text", "calls"), EMITTED, ids=IDS)
def test_streamed_piece_by_piece_the_answer_reads_as_it_does_whole(name, answer, text, calls):
    pieces, sent = [], []
    reader = ToolReader(USE, format_named(name))
    on_text = reader.watch(pieces.append, sent.append)
    for i in range(0, len(answer), 3):  # three characters a piece: markers split across pieces
        on_text(answer[i:i + 3])
    whole, made = reader.finish(answer)
    assert "".join(pieces) == whole == text and tuple(sent) == made
    assert [(c.name, json.loads(c.arguments)) for c in made] == calls
    assert len({c.id for c in made}) == len(made) and all(c.id.startswith("call_") or len(c.id) == 9 for c in made)


@pytest.mark.parametrize(("name", "answer"), [
    ("hermes", 'The tag <tool_call> is how I call tools.'),  # not JSON after the marker
    ("hermes", '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'),  # not offered
    ("llama3_json", '{"answer": 42}'),  # JSON content, not a call
    ("llama3_json", 'Use {"name": "get_time", "parameters": {}} later.'),  # calls open the answer or are none
    ("mistral", "[TOOL_CALLS]get_time[ARGS]{broken"),
    ("gemma4", "<|tool_call>call:get_time{oops}<tool_call|>"),
    ("qwen3_coder", "<tool_call>\nno function here\n</tool_call>"),
])
def test_no_call_is_guessed_out_of_text(name, answer):
    assert _read(name, answer) == (answer, [])


def test_mistral_calls_get_the_nine_character_ids_its_templates_take():
    _, calls = ToolReader(USE, format_named("mistral")).finish("[TOOL_CALLS]get_time[ARGS]{}")
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()


def test_without_parallel_calls_only_the_first_is_kept():
    one = ToolUse([WEATHER, TIME], parallel=False)
    assert _read("hermes", EMITTED[1][1], one) == ("", [("get_current_temperature", PARIS)])


def test_none_and_no_format_leave_the_answer_text():
    answer = EMITTED[0][1]
    assert ToolReader(ToolUse([WEATHER], choice="none"), format_named("hermes")).finish(answer) == (answer, ())
    assert ToolReader(USE, None).finish(answer) == (answer, ())
    assert ToolReader(None, format_named("hermes")).finish(answer) == (answer, ())


def test_a_forced_call_is_read_from_its_json():
    required, named = ToolUse([WEATHER, TIME], choice="required"), ToolUse([WEATHER, TIME], function="get_time")
    both = '[{"name": "get_current_temperature", "parameters": {"location": "Paris, France", "unit": "celsius"}}, ' \
           '{"name": "get_time", "parameters": {}}]'
    assert _read("hermes", both, required) == ("", [("get_current_temperature", PARIS), ("get_time", {})])
    assert _read("hermes", "{}", named) == ("", [("get_time", {})])
    assert _read("hermes", '[{"name": "get_ti', required) == ('[{"name": "get_ti', [])  # cut at max_tokens: text
    sent: list = []
    reader = ToolReader(named, None)
    reader.watch(sent.append, sent.append)("{")
    assert sent == [] and reader.finish("{}")[1] and [c.name for c in sent] == ["get_time"]


def test_a_forced_call_is_its_requests_json_schema():
    required = ToolUse([WEATHER, TIME], choice="required", parallel=False).forced_schema()
    assert required["type"] == "array" and required["minItems"] == required["maxItems"] == 1
    names = [c["properties"]["name"]["enum"] for c in required["items"]["anyOf"]]
    assert names == [["get_current_temperature"], ["get_time"]]
    assert ToolUse([WEATHER], function="get_current_temperature").forced_schema() == WEATHER["parameters"]
    assert ToolUse([WEATHER]).forced_schema() is None
    request = GenerationRequest(["hi"], tools=ToolUse([WEATHER], choice="required"))
    assert request.json_schema["type"] == "array"
    with pytest.raises(InvalidInputError, match="tool_choice"):
        GenerationRequest(["hi"], tools=ToolUse([WEATHER], choice="required"), json_schema={"type": "object"})
    shared = {"$defs": {"Place": {"type": "string"}}, "type": "object",
              "properties": {"where": {"$ref": "#/$defs/Place"}}}
    hoisted = ToolUse([{"name": "a", "parameters": shared}, {"name": "b", "parameters": shared}], choice="required")
    assert hoisted.forced_schema()["$defs"] == {"Place": {"type": "string"}}


@pytest.mark.parametrize(("functions", "options", "field"), [
    ([], {}, "tools"),
    ([WEATHER, WEATHER], {}, "tools"),
    ([{"description": "no name"}], {}, "tools[0].function.name"),
    ([{"name": "has space"}], {}, "tools[0].function.name"),
    ([{"name": "f", "parameters": "{}"}], {}, "tools[0].function.parameters"),
    ([WEATHER], {"choice": "always"}, "tool_choice"),
    ([WEATHER], {"function": "get_time"}, "tool_choice"),
    ([WEATHER], {"parallel": "yes"}, "parallel_tool_calls"),
    ([{"name": "f", "parameters": {"type": "object", "properties": {"p": {"pattern": "(a{1000}){1000}"}}}}],
     {"choice": "required"}, "tools[0].function.parameters"),
])
def test_tools_are_checked_naming_the_field(functions, options, field):
    with pytest.raises(InvalidInputError) as e:
        GenerationRequest(["hi"], tools=ToolUse(functions, **options))
    assert str(e.value.input).startswith(field)


def test_tool_turns_belong_to_their_roles():
    call = ToolCall("call_1", "get_time", "{}")
    turns = [("user", 1), ("assistant", 1), ("tool", 1)]
    GenerationRequest(["a", "", "b"], turns=turns, tool_turns=[None, ToolTurn([call]), ToolTurn(call_id="call_1")])
    with pytest.raises(InvalidInputError, match="tool_turns"):
        GenerationRequest(["a", "", "b"], turns=turns, tool_turns=[ToolTurn([call]), None, None])
    with pytest.raises(InvalidInputError, match="tool_turns"):
        GenerationRequest(["a", "", "b"], turns=turns, tool_turns=[None, ToolTurn([call])])
    assert GenerationRequest(["a"], tool_turns=[None]).tool_turns is None  # nothing in them: no tool turns


CALL = ToolCall("abcDEF123", "get_current_temperature", json.dumps(PARIS))
CONVERSATION = [("user", "Weather in Paris?"), ("assistant", ""), ("tool", '{"temperature": 21}')]
TOOLS = ChatTools(ToolUse([WEATHER]), (None, ToolTurn([CALL]), ToolTurn(call_id=CALL.id)))


@pytest.mark.parametrize(("name", "call", "result"), [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
     '"Paris, France", "unit": "celsius"}}\n</tool_call>', '<tool_response>\n{"temperature": 21}\n</tool_response>'),
    ("Qwen3.5-4B.jinja", "<function=get_current_temperature>\n<parameter=location>\nParis, France\n</parameter>",
     '<tool_response>\n{"temperature": 21}\n</tool_response>'),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", '{"name": "get_current_temperature", "parameters": {"location": '
     '"Paris, France", "unit": "celsius"}}', "<|start_header_id|>ipython<|end_header_id|>"),
    ("google-gemma-4-31B-it.jinja", "<|tool_call>call:get_current_temperature{location:<|\"|>Paris, France<|\"|>",
     "<|tool_response>response:get_current_temperature"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", '"name": "get_current_temperature", "id": "abcDEF123"',
     '[TOOL_RESULTS]{"content": {"temperature": 21}, "call_id": "abcDEF123"}'),
])
def test_the_real_templates_render_the_tools_the_call_and_its_result(name, call, result):
    prompt = render_prompt(_template(name), "x", CONVERSATION, bos="<s>", eos="</s>", tools=TOOLS)
    assert "get_current_temperature" in prompt.split(call)[0]  # the offered tool, before the call
    assert call in prompt and result in prompt.split(call, 1)[1]


def test_transformers_renders_tools_as_apply_chat_template_hands_them_over():
    """The transformers flavour's messages: parts for text, a tool result's content as its text, the tool fields."""
    turns = [("user", 1), ("assistant", 1), ("tool", 1)]
    messages = chat_messages(["Weather?", "", '{"temperature": 21}'], turns, TOOLS)
    assert messages[2] == {"role": "tool", "content": '{"temperature": 21}', "tool_call_id": CALL.id,
                           "name": "get_current_temperature"}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == PARIS  # an object, as transformers takes it
    prompt = render(_template("Mistral-Small-3.2-24B-Instruct-2506.jinja"),
                    {"messages": messages, "bos_token": "<s>", "add_generation_prompt": True, **TOOLS.variables()},
                    flavour="transformers")
    assert "[AVAILABLE_TOOLS]" in prompt and '[TOOL_CALLS]get_current_temperature[CALL_ID]abcDEF123[ARGS]' in prompt
    assert "[TOOL_RESULTS]abcDEF123[TOOL_CONTENT]" in prompt
