"""The chat template's variables a request sets (``chat_template_kwargs``, ``reasoning_effort``, ``think``, Anthropic's
``thinking`` disabled) reach a template that reads them, on llama.cpp and transformers, on every route that renders
it (the chat's generation and its count, ``/apply-template``, ``input_tokens``, Ollama's chat, Anthropic's); and the
raw-prompt routes, which render none, name them in ``refsight.ignored`` with the fields refsight does not know.

The served template is a ChatML one that thinks (Qwen 3's switch: an empty think block when ``enable_thinking`` is
false; gpt-oss's ``reasoning_effort`` written out), given as ``--chat-template`` over the tiny models.
"""

from __future__ import annotations

import json

import pytest
from runtimes import require_module

from live_server import LiveServer
from refsight.backends.options import BackendOptions
from refsight.server import ServerConfig, create_app

THINKING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% if reasoning_effort is defined %}[effort {{ reasoning_effort }}]{% endif %}{% endif %}"
)
HI = [{"role": "user", "content": "hi"}]
OFF = "<think>\n\n</think>"


@pytest.fixture(scope="module", params=["tiny-qwen2-vl-gguf", "tiny-qwen2-vl"])
def live(request, tmp_path_factory):
    if request.param.endswith("-gguf"):
        require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
        from refsight.builtin_models.gguf import ensure_gguf

        ensure_gguf(request.param)
    else:
        require_module("transformers")
    # verbose: llama-server's --verbose, so every chat carries __verbose (its rendered prompt) unasked.
    config = ServerConfig(store=tmp_path_factory.mktemp("variables"), model=request.param, keys={}, n_predict=4,
                          backend_options=BackendOptions(chat_template=THINKING), verbose=True)
    server = LiveServer(create_app(config)).start()
    with server.client(timeout=300) as client:
        yield client
    server.stop()


def _prompt(client, **fields) -> str:
    reply = client.post("/apply-template", json={"messages": HI, **fields})
    assert reply.status_code == 200, reply.text
    assert "refsight" not in reply.json()  # every variable set is one the template reads
    return reply.json()["prompt"]


def test_each_field_sets_the_variables_the_template_reads(live):
    plain = _prompt(live)
    assert OFF not in plain and "[effort" not in plain
    assert _prompt(live, chat_template_kwargs={"enable_thinking": False}) == plain + OFF + "\n\n"
    assert _prompt(live, reasoning_effort="none") == plain + OFF + "\n\n"  # llama-server's "none": thinking off
    assert _prompt(live, reasoning_effort="high") == plain + "[effort high]"
    assert _prompt(live, think="low") == plain + "[effort low]"
    assert _prompt(live, think=False) == plain + OFF + "\n\n"
    unread = live.post("/apply-template", json={"messages": HI, "chat_template_kwargs": {"nobody_reads": 1}})
    assert unread.json()["prompt"] == plain and unread.json()["refsight"]["ignored"] == ["chat_template_kwargs.nobody_reads"]


def test_the_chat_its_count_and_every_dialect_render_with_them(live):
    def chat(**fields):
        reply = live.post("/v1/chat/completions", json={"messages": HI, **fields})
        assert reply.status_code == 200, reply.text
        assert "ignored" not in reply.json()["refsight"]
        return reply.json()

    on, off = chat(), chat(chat_template_kwargs={"enable_thinking": False})
    assert off["__verbose"]["prompt"] == on["__verbose"]["prompt"] + OFF + "\n\n"
    assert off["usage"]["prompt_tokens"] > on["usage"]["prompt_tokens"]  # the generation rendered it too
    counted = live.post("/v1/chat/completions/input_tokens", json={"messages": HI, "reasoning_effort": "none"})
    assert counted.json()["input_tokens"] == off["usage"]["prompt_tokens"]
    # Ollama's think: honoured where the template can think (no 400), in its chat's prompt.
    name = live.get("/api/tags").json()["models"][0]["model"]
    assert "thinking" in live.post("/api/show", json={"model": name}).json()["capabilities"]  # as Ollama decides it
    ollama = [live.post("/api/chat", json={"model": name, "stream": False, "messages": HI, "think": think}).json()
              for think in (True, False)]
    assert ollama[1]["prompt_eval_count"] == off["usage"]["prompt_tokens"] > ollama[0]["prompt_eval_count"]
    anthropic = live.post("/v1/messages", json={"max_tokens": 4, "messages": HI, "thinking": {"type": "disabled"}})
    assert anthropic.json()["usage"]["input_tokens"] == off["usage"]["prompt_tokens"], anthropic.text
    enabled = live.post("/v1/messages", json={"max_tokens": 4, "messages": HI,
                                              "thinking": {"type": "enabled", "budget_tokens": 2}}).json()
    assert enabled["usage"]["input_tokens"] == on["usage"]["prompt_tokens"] and "refsight" not in enabled, enabled


def test_a_raw_prompt_names_them_and_every_field_refsight_does_not_use(live):
    body = {"prompt": "<|im_start|>user\nhi<|im_end|>\n", "n_predict": 2, "think": True, "made_up": 1,
            "cache_prompt": True}
    native = live.post("/completion", json=body)
    assert native.status_code == 200, native.text
    assert native.json()["refsight"]["ignored"] == ["cache_prompt", "made_up", "think"]
    openai = live.post("/v1/completions", json={**body, "reasoning_effort": "low"})
    assert openai.json()["refsight"]["ignored"] == ["cache_prompt", "made_up", "reasoning_effort", "think"]
    tokens = live.post("/tokenize", json={"content": "hi", "with_pieces": False, "made_up": 1})
    assert tokens.json()["refsight"] == {"ignored": ["made_up"]} and tokens.json()["tokens"], tokens.text
    stream = live.post("/completion", json={**body, "stream": True}).text
    last = json.loads([line for line in stream.splitlines() if line.startswith("data:")][-1][5:])
    assert last["refsight"]["ignored"] == ["cache_prompt", "made_up", "think"]


def test_the_servers_own_variables_go_under_the_requests(tmp_path):
    """llama-server's ``--reasoning off`` / ``--chat-template-kwargs``: every request's template gets them unless the
    request sets its own; a variable the template never reads is not handed to it, and no request field is named."""
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf("tiny-qwen2-vl-gguf")
    config = ServerConfig(store=tmp_path, model="tiny-qwen2-vl-gguf", keys={}, n_predict=2,
                          backend_options=BackendOptions(chat_template=THINKING),
                          template_variables={"enable_thinking": False, "reasoning_effort": "low", "nobody_reads": 1})
    server = LiveServer(create_app(config)).start()
    try:
        with server.client(timeout=300) as client:
            defaults = _prompt(client)
            assert defaults.endswith(OFF + "\n\n[effort low]")
            assert _prompt(client, chat_template_kwargs={"enable_thinking": True}) == defaults.replace(OFF + "\n\n", "")
            assert _prompt(client, reasoning_effort="high").endswith(OFF + "\n\n[effort high]")
    finally:
        server.stop()
