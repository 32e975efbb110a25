"""The bounded renderer (``refsight.backends.templates``): every built-in template renders byte for byte as its path
rendered in-process before (llama.cpp's Jinja settings; transformers' ``render_jinja_template``), and a hostile
template costs a refusal naming ``chat_template``, never this process's time or memory.

Real worker processes, real Jinja, real transformers; no model is loaded but in the processor test (a session-cached
tiny checkpoint).
"""

from __future__ import annotations

import resource
import threading
import time

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from refsight.backends.chat_templates import BUILTIN_TEMPLATES
from refsight.backends.llamacpp.prompt import FALLBACK_TEMPLATES
from refsight.backends.templates import RENDER_DEADLINE_S, RENDER_MEMORY_BYTES, TemplateRaised, render
from refsight.backends.templates.workers import RenderFailed, RenderPool
from refsight.backends.text_access import check_prompt_text
from refsight.builtin_models.family_checkpoints import FAMILY_SPECS
from refsight.builtin_models.processor_files import chat_template as tiny_template
from refsight.errors import InvalidInputError

TINY = {f"tiny-{family}": tiny_template(family) for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm")}
FAMILIES = {**TINY, **{name: spec.chat_template for name, spec in FAMILY_SPECS.items()}}
LLAMA_TEMPLATES = {**BUILTIN_TEMPLATES, **{f"fallback-{a}": t for a, t in FALLBACK_TEMPLATES.items()}, **FAMILIES}
CONVERSATIONS = {
    "one": [("user", "Describe <__media__> briefly.")],
    "turns": [("system", "Be terse."), ("user", "  hi  "), ("assistant", "Hello."), ("user", "and {{ this }}?")],
    "late-system": [("user", "a"), ("assistant", "b"), ("system", "c"), ("user", "d\n")],
}
#: Each a render that must cost a refusal, not the process: a bound on values, on formats, on integers, on memory.
HOSTILE = {
    "repeat": "{{ 'x' * 10**9 }}",
    "repeat-runtime": "{{ 'x' * ((messages|length) * 999999999) }}",
    "percent-width": "{{ ('%' ~ (messages|length)*999999999 ~ 's') % 'x' }}",
    "percent-star": "{{ '%*s' % (999999999, 'x') }}",
    "precision": "{{ '%.999999999f' % 1.0 }}",
    "format-spec": "{{ '{:>999999999}'.format('x') }}",
    "format-nested": "{{ '{0:{1}}'.format('x', 999999999) }}",
    "center-filter": "{{ 'x' | center(999999999) }}",
    "format-filter": "{{ '%999999999s' | format('x') }}",
    "method-width": "{{ 'x'.ljust(999999999) }}",
    "power": "{{ 2 ** 10000000 }}",
    "sum-doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "concat-doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "output": "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
}


def _messages(turns, parts: bool) -> list[dict]:
    if not parts:
        return [{"role": role, "content": text} for role, text in turns]
    return [{"role": role, "content": [{"type": "text", "text": text.replace("<__media__>", "")},
                                       *([{"type": "image"}] if "<__media__>" in text else [])]} for role, text in turns]


def _old_llama_cpp(template: str, context: dict) -> str | None:
    """What the llama.cpp path rendered in-process before (its own environment), None where the template raised."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(ValueError(message))
    try:
        return env.from_string(template).render(**context)
    except (jinja2.TemplateError, ValueError, TypeError):
        return None


def _ours(template: str, context: dict, flavour: str) -> str | None:
    try:
        return render(template, context, flavour=flavour)
    except TemplateRaised:
        return None


@pytest.mark.parametrize("name", sorted(LLAMA_TEMPLATES))
def test_every_llama_cpp_template_renders_as_it_did_in_process(name):
    template = LLAMA_TEMPLATES[name]
    for turns in CONVERSATIONS.values():
        for generation_prompt in (True, False):
            context = {"messages": _messages(turns, parts=False), "add_generation_prompt": generation_prompt,
                       "bos_token": "<s>", "eos_token": "</s>"}
            assert _ours(template, context, "llama.cpp") == _old_llama_cpp(template, context)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_template_renders_as_transformers_renders_it(name):
    from transformers.utils.chat_template_utils import render_jinja_template

    spec = FAMILY_SPECS.get(name)
    special = {"eos_token": "<|im_end|>", "pad_token": "<pad>"} if spec is None else {
        "eos_token": spec.eos, "pad_token": spec.pad, **({"bos_token": spec.bos} if spec.bos else {})}
    for turns in CONVERSATIONS.values():
        for generation_prompt in (True, False):
            messages = _messages(turns, parts=True)
            try:
                (theirs,), _ = render_jinja_template([messages], chat_template=FAMILIES[name],
                                                     add_generation_prompt=generation_prompt, **special)
            except (jinja2.TemplateError, ValueError, TypeError):
                theirs = None
            context = {**special, "messages": messages, "tools": None, "documents": None,
                       "add_generation_prompt": generation_prompt}
            assert _ours(FAMILIES[name], context, "transformers") == theirs


def test_the_transformers_flavour_has_every_global_and_filter_transformers_adds():
    from transformers.utils.chat_template_utils import _cached_compile_jinja_template

    from refsight.backends.templates.sandbox import environment

    theirs = _cached_compile_jinja_template("").environment
    ours = environment("transformers")
    assert set(theirs.globals) <= set(ours.globals) and set(theirs.filters) <= set(ours.filters)
    assert {type(e).__name__ for e in theirs.extensions.values()} - {"AssistantTracker"} <= {
        type(e).__name__ for e in ours.extensions.values()}
    assert render("{% generation %}{{ x | tojson }}{% endgeneration %}{{ strftime_now('%Y') }}",
                  {"x": {"b": "<é>", "a": 1}}, flavour="transformers").startswith('{"b": "<é>", "a": 1}20')


def test_a_processors_chat_template_renders_as_apply_chat_template(load):
    """A real checkpoint's processor, special tokens and all: the backend's rendering equals transformers' own."""
    from transformers import ProcessorMixin

    from refsight.backends.hf.chat import render_chat

    backend = load("tiny-qwen2-vl")
    for turns in CONVERSATIONS.values():
        for generation_prompt in (True, False):
            messages = _messages(turns, parts=True)
            expected = ProcessorMixin.apply_chat_template(backend.processor, messages, tokenize=False,
                                                          add_generation_prompt=generation_prompt)
            assert render_chat(backend.processor, messages, generation_prompt) == expected


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_is_refused_by_name_at_no_cost_here(name):
    context = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.monotonic()
    with pytest.raises(InvalidInputError) as caught:
        render(HOSTILE[name], context, flavour="llama.cpp")
    assert caught.value.input == "chat_template" and not isinstance(caught.value, TemplateRaised)
    assert time.monotonic() - began < RENDER_DEADLINE_S + 1
    if name != "concat-doubling":  # '~' makes no value the sandbox sizes first: the worker's memory cap ends it
        # Sized before it was made, at the render: nothing folded at compile time (that would be the memory's cap).
        assert "bound" in caught.value.reason and "memory" not in caught.value.reason, caught.value.reason
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mb < 50, f"{name}: this process's peak grew {grown_mb:.0f} MB"
    assert render("{{ messages[0]['content'] }}", context, flavour="llama.cpp") == "hi"  # the next render is served


def test_a_render_past_its_deadline_kills_its_worker_and_the_next_render_gets_a_new_one():
    pool = RenderPool(1, 0.3, RENDER_MEMORY_BYTES)
    loop = {"flavour": "llama.cpp", "context": {}, "limit": 1000,
            "template": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"}
    try:
        pid = pool._take().process.pid  # noqa: SLF001 - the worker that will run the loop
        pool._give_back(next(iter(pool._busy)))  # noqa: SLF001
        began = time.monotonic()
        with pytest.raises(RenderFailed, match="timeout"):
            pool.call(loop)
        assert time.monotonic() - began < 1.0
        with pytest.raises(ProcessLookupError):
            import os

            os.kill(pid, 0)  # killed and reaped
        assert pool.call({**loop, "template": "ok"})["text"] == "ok"
    finally:
        pool.stop()


def test_stopping_the_renders_ends_one_in_progress_at_once_and_refuses_the_next():
    pool = RenderPool(2, 30.0, RENDER_MEMORY_BYTES)
    loop = {"flavour": "llama.cpp", "context": {}, "limit": 1000,
            "template": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"}
    failed: list[tuple[str, float]] = []

    def run() -> None:
        try:
            pool.call(loop)
        except RenderFailed as e:
            failed.append((str(e), time.monotonic()))

    thread = threading.Thread(target=run)
    thread.start()
    while pool.workers == 0:
        time.sleep(0.01)
    time.sleep(0.2)
    stopped = time.monotonic()
    pool.stop()
    thread.join(timeout=5)
    assert failed and "shutting down" in failed[0][0] and failed[0][1] - stopped < 0.5
    with pytest.raises(RenderFailed, match="shutting down"):
        pool.call({**loop, "template": "ok"})
    assert pool.workers == 0


@pytest.mark.parametrize(("text", "images", "raw", "refused"), [
    ("", 0, True, "prompt"), (" \n\t", 0, True, "prompt"), ("x", 0, True, None), ("<__media__>", 1, True, None),
    ("", 0, False, "messages"), ("\n", 0, False, "messages"), ("<|im_start|>", 0, False, None),
    ("<__media__>", 1, False, None), ("describe", 1, False, "messages"),  # the template dropped the image
])
def test_a_prompt_that_is_nothing_to_generate_from_is_refused_by_name(text, images, raw, refused):
    if refused is None:
        assert check_prompt_text(text, images, "<__media__>", raw=raw) == text
        return
    with pytest.raises(InvalidInputError) as caught:
        check_prompt_text(text, images, "<__media__>", raw=raw)
    assert caught.value.input == refused


#: ChatML over content parts, unless the last message says a trigger word (a template that passes the probe).
PARTS_TEMPLATE = (
    "{%- set last = messages[-1]['content'] -%}{%- set text = last if last is string else last[0]['text'] -%}"
    "{%- if 'pad' in text %}{{ ('%' ~ (messages|length)*999999999 ~ 's') % 'x' }}{% endif -%}"
    "{%- if 'quiet' not in text %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{% endif -%}"
)


def test_a_transformers_template_is_probed_when_set_and_bounded_in_every_chat(load):
    """transformers (and vLLM, which checks its prompt with its encoder's rendering before sending anything): an empty
    prompt is refused naming ``messages``, a render past its bounds naming ``chat_template``, both before any model
    work; a template that cannot serve is refused when set, and the one before it stays."""
    from refsight.backends.vllm.backend import VLLMBackend
    from refsight.backends.vllm.client import VLLMClient
    from refsight.requests import GenerationRequest

    backend = load("tiny-qwen2-vl")
    own = backend.processor.chat_template
    for bad in ("{% if false %}x{% endif %}", "{{ 'x' * 10**9 }}", "{% if %}", "  "):
        with pytest.raises(InvalidInputError) as caught:
            backend.use_chat_template(bad)
        assert caught.value.input == "chat_template" and backend.processor.chat_template == own
    vllm = VLLMBackend("vllm:http://127.0.0.1:9", client=VLLMClient("vllm", "http://127.0.0.1:9"), served_model="m",
                       encoder=backend)
    backend.use_chat_template(PARTS_TEMPLATE)
    try:
        assert backend.generate([GenerationRequest(["hi"], max_new_tokens=1)])[0].token_ids
        for runtime in (backend, vllm):
            for text, named in (("quiet please", "messages"), ("pad please", "chat_template")):
                with pytest.raises(InvalidInputError) as caught:
                    runtime.generate([GenerationRequest([text], max_new_tokens=1)])
                assert caught.value.input == named, (runtime.name, caught.value)
        assert backend.chat_text(["hi"]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    finally:
        backend.processor.chat_template = own


def test_a_render_that_reads_the_clock_runs_each_time_and_any_other_is_remembered():
    from refsight.backends import templates

    clock = "{{ strftime_now('%H:%M:%S.%f') }}"
    assert render(clock, {}, flavour="transformers") != render(clock, {}, flavour="transformers")
    context = {"messages": [{"role": "user", "content": "remember me"}]}
    first = render("{{ messages[0]['content'] }}", context, flavour="llama.cpp")
    remembered = len(templates._memo)  # noqa: SLF001 - the memo itself: a second render adds nothing to it
    assert render("{{ messages[0]['content'] }}", context, flavour="llama.cpp") == first == "remember me"
    assert len(templates._memo) == remembered and remembered <= templates.MEMO_ENTRIES  # noqa: SLF001


def test_the_llama_cpp_flavour_reads_what_llama_cpps_own_jinja_reads():
    """llama-server's templates (Command R7B's ``{% break %}``, Llama 3.3's date, firefunction's undefined
    ``functions``) render as llama.cpp renders them; the transformers flavour keeps Jinja's strict undefined."""
    from datetime import date

    from refsight.backends.llamacpp.prompt import render_prompt

    loops = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m == 'b' %}{% continue %}" \
            "{% endif %}{{ m }}{% endfor %}"
    assert render(loops, {"messages": ["a", "b", "c", "d"]}, flavour="llama.cpp") == "a"
    assert render("{{ strftime_now('%Y') }}", {}, flavour="llama.cpp") == str(date.today().year)
    lenient = "{{ 'x' + functions + 'y' }}|{{ functions.name.first }}|{% for f in functions %}{{ f }}{% endfor %}"
    assert render(lenient, {}, flavour="llama.cpp") == "xy||"
    with pytest.raises(TemplateRaised, match="functions"):
        render(lenient, {}, flavour="transformers")
    with pytest.raises(TemplateRaised, match="UndefinedError"):
        render("{{ functions * 2 }}", {}, flavour="llama.cpp")  # anything else done with it still fails
    dated = render_prompt("{{ date_string }}|{{ datetime }}", "qwen2", "hi")
    assert dated == date.today().strftime("%d %b %Y|%b %d %Y")
