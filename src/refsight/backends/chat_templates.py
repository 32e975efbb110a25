"""llama-server's built-in chat templates (``--chat-template NAME``), written as the Jinja they render.

llama.cpp formats these names in C++ (``src/llama-chat.cpp``, ``llm_chat_apply_template``); each
entry here renders, for text messages, exactly what that code writes: roles, separators, the
trimming it does (Gemma and Llama 3 trim each message), and the opening of the answer's turn when
``add_generation_prompt`` is set. A message's content is text, with images as the runtime's media
marker (llama.cpp). The other names llama-server knows are refused by name (:func:`builtin_template`).
"""

from __future__ import annotations

__all__ = ["BUILTIN_TEMPLATES", "LLAMA_CPP_NAMES", "builtin_template"]

#: Name → Jinja, each as ``llm_chat_apply_template`` writes that format.
BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
        "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # Gemma has no system turn: the system text opens the next user turn (llama.cpp's merge).
    "gemma": (
        "{% set ns = namespace(system='') %}{% for message in messages %}"
        "{% if message['role'] == 'system' %}{% set ns.system = ns.system + (message['content'] | trim) %}"
        "{% else %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "<start_of_turn>{{ role }}\n{% if ns.system and role != 'model' %}{{ ns.system }}\n\n"
        "{% set ns.system = '' %}{% endif %}{{ message['content'] | trim }}<end_of_turn>\n{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "zephyr": (
        "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|endoftext|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "phi3": (
        "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "command-r": (
        "{% set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} %}"
        "{% for message in messages %}{% if message['role'] in tokens %}<|START_OF_TURN_TOKEN|>"
        "{{ tokens[message['role']] }}{{ message['content'] | trim }}<|END_OF_TURN_TOKEN|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
    ),
    "phi4": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}<|im_sep|>{{ message['content'] }}<|im_end|>"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"
    ),
    "llama4": (
        "{% for message in messages %}<|header_start|>{{ message['role'] }}<|header_end|>\n\n"
        "{{ message['content'] | trim }}<|eot|>{% endfor %}"
        "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}"
    ),
    "falcon3": (
        "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "vicuna": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}USER: {{ message['content'] }}\n"
        "{% elif message['role'] == 'assistant' %}ASSISTANT: {{ message['content'] }}</s>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    ),
    "vicuna-orca": (
        "{% for message in messages %}{% if message['role'] == 'system' %}SYSTEM: {{ message['content'] }}\n"
        "{% elif message['role'] == 'user' %}USER: {{ message['content'] }}\n"
        "{% elif message['role'] == 'assistant' %}ASSISTANT: {{ message['content'] }}</s>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    ),
    "openchat": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}<|end_of_turn|>"
        "{% else %}GPT4 Correct {{ message['role'] | capitalize }}: {{ message['content'] }}<|end_of_turn|>{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}GPT4 Correct Assistant:{% endif %}"
    ),
    "exaone3": (
        "{% for message in messages %}{% if message['role'] == 'system' %}[|system|]{{ message['content'] | trim }}"
        "[|endofturn|]\n{% elif message['role'] == 'user' %}[|user|]{{ message['content'] | trim }}\n"
        "{% elif message['role'] == 'assistant' %}[|assistant|]{{ message['content'] | trim }}[|endofturn|]\n{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}[|assistant|]{% endif %}"
    ),
    "deepseek3": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}<｜User｜>{{ message['content'] }}"
        "{% elif message['role'] == 'assistant' %}<｜Assistant｜>{{ message['content'] }}<｜end▁of▁sentence｜>{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
    ),
    "megrez": (
        "{% for message in messages %}<|role_start|>{{ message['role'] }}<|role_end|>{{ message['content'] }}<|turn_end|>"
        "{% endfor %}{% if add_generation_prompt %}<|role_start|>assistant<|role_end|>{% endif %}"
    ),
    "monarch": (
        "{% for message in messages %}{% if not loop.first %}<s>{% endif %}{{ message['role'] }}\n{{ message['content'] }}"
        "</s>\n{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    ),
    "smolvlm": (
        "<|im_start|>{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}User: {{ message['content'] }}<end_of_utterance>\n"
        "{% else %}Assistant: {{ message['content'] }}<end_of_utterance>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}Assistant:{% endif %}"
    ),
}

#: Every built-in name llama-server knows (``llama-chat.cpp``'s table), for the refusal of the others.
LLAMA_CPP_NAMES: tuple[str, ...] = (
    "bailing", "bailing-think", "bailing2", "chatglm3", "chatglm4", "chatml", "command-r", "deepseek", "deepseek-ocr",
    "deepseek2", "deepseek3", "exaone-moe", "exaone3", "exaone4", "falcon3", "gemma", "gigachat", "glmedge", "gpt-oss",
    "granite", "granite-4.0", "granite-4.1", "grok-2", "hunyuan-dense", "hunyuan-moe", "hunyuan-vl", "kimi-k2",
    "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3", "llama4", "megrez", "minicpm",
    "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "monarch", "openchat",
    "orion", "pangu-embedded", "phi3", "phi4", "rwkv-world", "seed_oss", "smolvlm", "solar-open", "vicuna",
    "vicuna-orca", "yandex", "zephyr",
)


def builtin_template(name: str) -> str:
    """The Jinja of built-in template ``name``; ValueError naming it (and the names served) otherwise."""
    template = BUILTIN_TEMPLATES.get(name)
    if template is not None:
        return template
    served = ", ".join(sorted(BUILTIN_TEMPLATES))
    if name in LLAMA_CPP_NAMES:
        raise ValueError(f"the built-in template {name!r} is not written here yet; built-in: {served} "
                         "(or give the model's Jinja template with --chat-template-file)")
    raise ValueError(f"{name!r} is neither a built-in template ({served}) nor a Jinja template")
