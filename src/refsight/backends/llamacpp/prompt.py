"""The chat prompt of a llama.cpp request: the GGUF's own chat template around mtmd media markers.

As llama-server does, the user turn is one string in which every image is mtmd's
default media marker; mtmd expands each marker into the model's own image tokens
(``<|vision_start|>`` ... for Qwen, tiles with ``<row_i_col_j>`` for SmolVLM).
A GGUF without a template falls back to its family's known one. The template renders in the bounded
renderer (:mod:`refsight.backends.templates`, the ``llama.cpp`` flavour: the settings Hugging Face and
llama-cpp-python render chat templates with, and what llama.cpp's own Jinja engine adds), never in this process.
As llama-server's, every render is given today's date (:func:`date_variables`: ``datetime`` and ``date_string``,
which Llama 3's and firefunction's templates print).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..templates import render

__all__ = ["render_prompt", "chat_template", "date_variables", "FALLBACK_TEMPLATES"]

_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SMOLVLM = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)

#: ``general.architecture`` → template, for GGUFs that carry none.
FALLBACK_TEMPLATES: dict[str, str] = {
    "qwen2vl": _CHATML,
    "qwen3vl": _CHATML,
    "qwen2": _CHATML,
    "llama": _SMOLVLM,  # SmolVLM / Idefics3 language models are llama-architecture
}


def chat_template(template: str | None, arch: str) -> str:
    """The template a prompt is rendered with: the GGUF's own, else its family's known one."""
    return template or FALLBACK_TEMPLATES.get(arch, _CHATML)


def date_variables() -> dict[str, str]:
    """Today's date as llama.cpp hands it to every template (``common_chat_extra_context``): ``datetime``
    (``Dec 07 2026``) and ``date_string`` (``07 Dec 2026``). A value, not a global: a render is remembered by its
    whole context, so tomorrow's renders are new ones."""
    now = datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


def render_prompt(
    template: str | None, arch: str, content: str | list[tuple[str, str]], *, bos: str = "", eos: str = "",
    generation_prompt: bool = True, tools: Any = None, variables: Mapping[str, Any] | None = None,
) -> str:
    """The full prompt, ready for generation: one user turn ``content``, or ``(role, content)`` turns
    (roles system / user / assistant / tool), media markers included; ``generation_prompt=False`` leaves out the
    opening of the answer's turn (llama-server's ``add_generation_prompt: false``). ``tools``
    (a :class:`~refsight.tools.ChatTools`): the ``tools`` variable where tools are offered, and each message's tool
    fields, as llama-server hands them to its template (an assistant's calls with their arguments as objects);
    ``variables``: the template's own beside them (llama-server's ``chat_template_kwargs``)."""
    template = chat_template(template, arch)
    turns = [("user", content)] if isinstance(content, str) else content
    messages = [{"role": role, "content": text} for role, text in turns]
    if tools is not None:
        messages = [{**message, **tools.message_fields(i)} for i, message in enumerate(messages)]
    return render(template, {
        **date_variables(),
        **(variables or {}),
        "messages": messages,
        "add_generation_prompt": generation_prompt,
        "bos_token": bos,
        "eos_token": eos,
        **(tools.variables() if tools is not None else {}),
    }, flavour="llama.cpp")
