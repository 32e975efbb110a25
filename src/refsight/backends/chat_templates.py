"""llama-server's built-in chat templates (``--chat-template NAME``), written as the Jinja they render.

llama.cpp formats these names in C++ (``src/llama-chat.cpp``, ``llm_chat_apply_template``); each
entry here renders, for text messages, exactly what that code writes: roles, separators, the
trimming it does (Gemma and Llama 3 trim each message, among others), BOS and EOS as the text it
writes (``<s>``, ``</s>`` ..., never the model's own tokens), and the opening of the answer's turn
when ``add_generation_prompt`` is set; the formats whose C++ writes none (Llama 2, Mistral, Orion ...)
ignore it as llama.cpp does. A message's content is text, with images as the runtime's media marker
(llama.cpp). Trimming strips ``ws``, C's ``isspace()`` set, as llama.cpp's ``trim()`` does: a bare
Jinja ``trim`` would also strip what Python counts as whitespace (a no-break space, ``\\x1c``).
Every name llama.cpp knows (``LLAMA_CPP_NAMES``) is written here; :func:`builtin_template` refuses
any other, and would refuse by name one llama.cpp adds until it is written.
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
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}"
        "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim(ws) }}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # Gemma has no system turn: the system text opens the next user turn (llama.cpp's merge).
    "gemma": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% set ns = namespace(system='') %}{% for message in messages %}"
        "{% if message['role'] == 'system' %}{% set ns.system = ns.system + (message['content'] | trim(ws)) %}"
        "{% else %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "<start_of_turn>{{ role }}\n{% if ns.system and role != 'model' %}{{ ns.system }}\n\n"
        "{% set ns.system = '' %}{% endif %}{{ message['content'] | trim(ws) }}<end_of_turn>\n{% endif %}"
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
        "{% set ws = ' \\t\\n\\v\\f\\r' %}"
        "{% set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} %}"
        "{% for message in messages %}{% if message['role'] in tokens %}<|START_OF_TURN_TOKEN|>"
        "{{ tokens[message['role']] }}{{ message['content'] | trim(ws) }}<|END_OF_TURN_TOKEN|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
    ),
    "phi4": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}<|im_sep|>{{ message['content'] }}<|im_end|>"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"
    ),
    "llama4": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}"
        "<|header_start|>{{ message['role'] }}<|header_end|>\n\n{{ message['content'] | trim(ws) }}<|eot|>"
        "{% endfor %}{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}"
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
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}{% if message['role'] == 'system' %}"
        "[|system|]{{ message['content'] | trim(ws) }}[|endofturn|]\n"
        "{% elif message['role'] == 'user' %}[|user|]{{ message['content'] | trim(ws) }}\n"
        "{% elif message['role'] == 'assistant' %}[|assistant|]{{ message['content'] | trim(ws) }}[|endofturn|]\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}[|assistant|]{% endif %}"
    ),
    "exaone4": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}{% if message['role'] == 'user' %}"
        "[|user|]{{ message['content'] | trim(ws) }}\n{% elif message['role'] in ['system', 'assistant', 'tool'] %}"
        "[|{{ message['role'] }}|]{{ message['content'] | trim(ws) }}[|endofturn|]\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}[|assistant|]{% endif %}"
    ),
    "exaone-moe": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}"
        "{% if message['role'] in ['system', 'user', 'assistant', 'tool'] %}<|{{ message['role'] }}|>\n"
        "{{ message['content'] | trim(ws) }}<|endofturn|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "deepseek": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}"
        "{% elif message['role'] == 'user' %}### Instruction:\n{{ message['content'] }}\n"
        "{% elif message['role'] == 'assistant' %}### Response:\n{{ message['content'] }}\n<|EOT|>\n{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}### Response:\n{% endif %}"
    ),
    "deepseek2": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n\n"
        "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}<｜end▁of▁sentence｜>{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
    ),
    "deepseek3": (
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}<｜User｜>{{ message['content'] }}"
        "{% elif message['role'] == 'assistant' %}<｜Assistant｜>{{ message['content'] }}<｜end▁of▁sentence｜>{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
    ),
    "deepseek-ocr": "{% for message in messages %}{{ message['content'] }}{% endfor %}",
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
    # The Llama 2 family opens the first [INST] before any message and a new one after each answer.
    "llama2": (
        "[INST] {% for message in messages %}"
        "{% if not loop.first and loop.previtem['role'] not in ['system', 'user'] %}[INST] {% endif %}"
        "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
        "{% elif message['role'] == 'user' %}{{ message['content'] }} [/INST]"
        "{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "llama2-sys": (
        "[INST] {% for message in messages %}"
        "{% if not loop.first and loop.previtem['role'] not in ['system', 'user'] %}[INST] {% endif %}"
        "{% if message['role'] == 'system' %}<<SYS>>\n{{ message['content'] }}\n<</SYS>>\n\n"
        "{% elif message['role'] == 'user' %}{{ message['content'] }} [/INST]"
        "{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "llama2-sys-bos": (
        "[INST] {% for message in messages %}"
        "{% if not loop.first and loop.previtem['role'] not in ['system', 'user'] %}<s>[INST] {% endif %}"
        "{% if message['role'] == 'system' %}<<SYS>>\n{{ message['content'] }}\n<</SYS>>\n\n"
        "{% elif message['role'] == 'user' %}{{ message['content'] }} [/INST]"
        "{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "llama2-sys-strip": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}[INST] {% for message in messages %}"
        "{% if not loop.first and loop.previtem['role'] not in ['system', 'user'] %}[INST] {% endif %}"
        "{% if message['role'] == 'system' %}<<SYS>>\n{{ message['content'] | trim(ws) }}\n<</SYS>>\n\n"
        "{% elif message['role'] == 'user' %}{{ message['content'] | trim(ws) }} [/INST]"
        "{% else %}{{ message['content'] | trim(ws) }}</s>{% endif %}{% endfor %}"
    ),
    "mistral-v1": (
        "{% for message in messages %}{% if loop.first or loop.previtem['role'] not in ['system', 'user'] %}"
        " [INST] {% endif %}{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}{{ message['content'] }} [/INST]"
        "{% else %} {{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "mistral-v3": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}"
        "{% if loop.first or loop.previtem['role'] not in ['system', 'user'] %}[INST] {% endif %}"
        "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}{{ message['content'] }}[/INST]"
        "{% else %} {{ message['content'] | trim(ws) }}</s>{% endif %}{% endfor %}"
    ),
    "mistral-v3-tekken": (
        "{% for message in messages %}{% if loop.first or loop.previtem['role'] not in ['system', 'user'] %}"
        "[INST]{% endif %}{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
        "{% elif message['role'] == 'user' %}{{ message['content'] }}[/INST]"
        "{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "mistral-v7": (
        "{% for message in messages %}{% if message['role'] == 'system' %}[SYSTEM_PROMPT] {{ message['content'] }}"
        "[/SYSTEM_PROMPT]{% elif message['role'] == 'user' %}[INST] {{ message['content'] }}[/INST]"
        "{% else %} {{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "mistral-v7-tekken": (
        "{% for message in messages %}{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ message['content'] }}"
        "[/SYSTEM_PROMPT]{% elif message['role'] == 'user' %}[INST]{{ message['content'] }}[/INST]"
        "{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    # Orion merges the system text into the next user turn, and that turn writes the answer's opening.
    "orion": (
        "{% set ns = namespace(system='') %}{% for message in messages %}{% if message['role'] == 'system' %}"
        "{% set ns.system = ns.system + message['content'] %}{% elif message['role'] == 'user' %}Human: "
        "{% if ns.system %}{{ ns.system }}\n\n{% set ns.system = '' %}{% endif %}"
        "{{ message['content'] }}\n\nAssistant: </s>{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "chatglm3": (
        "[gMASK]sop{% for message in messages %}<|{{ message['role'] }}|>\n {{ message['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    ),
    "chatglm4": (
        "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "glmedge": (
        "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    ),
    # MiniCPM's user turn writes the answer's opening; llama.cpp writes nothing for add_generation_prompt.
    "minicpm": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}{% if message['role'] == 'user' %}"
        "<用户>{{ message['content'] | trim(ws) }}<AI>{% else %}{{ message['content'] | trim(ws) }}{% endif %}"
        "{% endfor %}"
    ),
    # RWKV opens the answer after a last user turn, whatever add_generation_prompt says.
    "rwkv-world": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}{% if message['role'] == 'system' %}"
        "System: {{ message['content'] | trim(ws) }}\n\n{% elif message['role'] == 'user' %}"
        "User: {{ message['content'] | trim(ws) }}\n\n{% if loop.last %}Assistant:{% endif %}"
        "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] | trim(ws) }}\n\n{% endif %}"
        "{% endfor %}"
    ),
    "granite": (
        "{% for message in messages %}<|start_of_role|>{{ message['role'] }}<|end_of_role|>"
        "{% if message['role'] == 'assistant_tool_call' %}<|tool_call|>{% endif %}"
        "{{ message['content'] }}<|end_of_text|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"
    ),
    "granite-4.0": (
        "{% for message in messages %}{% if message['role'] == 'assistant_tool_call' %}"
        "<|start_of_role|>assistant<|end_of_role|><|tool_call|>{% else %}"
        "<|start_of_role|>{{ message['role'] }}<|end_of_role|>{% endif %}{{ message['content'] }}<|end_of_text|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"
    ),
    "granite-4.1": (
        "{% for message in messages %}{% if message['role'] == 'assistant_tool_call' %}"
        "<|start_of_role|>assistant<|end_of_role|><|tool_call|>{% else %}"
        "<|start_of_role|>{{ message['role'] }}<|end_of_role|>{% endif %}{{ message['content'] }}<|end_of_text|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"
    ),
    # GigaChat reads a system message only as the first; every user turn declares (no) functions.
    "gigachat": (
        "<s>{% for message in messages %}{% if loop.first and message['role'] == 'system' %}"
        "{{ message['content'] }}<|message_sep|>{% elif message['role'] == 'user' %}user<|role_sep|>"
        "{{ message['content'] }}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
        "{% elif message['role'] == 'assistant' %}assistant<|role_sep|>{{ message['content'] }}<|message_sep|>"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}assistant<|role_sep|>{% endif %}"
    ),
    "yandex": (
        "{% for message in messages %}{% if message['role'] == 'user' %} Пользователь: {{ message['content'] }}\n\n"
        "{% elif message['role'] == 'assistant' %} Ассистент: {{ message['content'] }}\n\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %} Ассистент:[SEP]{% endif %}"
    ),
    "bailing": (
        "{% for message in messages %}<role>{{ 'HUMAN' if message['role'] == 'user' else message['role'] | upper }}"
        "</role>{{ message['content'] }}{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
    ),
    "bailing-think": (
        "{% for message in messages %}<role>{{ 'HUMAN' if message['role'] == 'user' else message['role'] | upper }}"
        "</role>{{ message['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<role>ASSISTANT</role><think>{% endif %}"
    ),
    # Without a system message first, Ling 2.0 gets llama.cpp's own: thinking off.
    "bailing2": (
        "{% if not messages or messages[0]['role'] != 'system' %}<role>SYSTEM</role>detailed thinking off<|role_end|>"
        "{% endif %}{% for message in messages %}"
        "<role>{{ 'HUMAN' if message['role'] == 'user' else message['role'] | upper }}</role>{{ message['content'] }}"
        "<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
    ),
    "hunyuan-moe": (
        "{% for message in messages %}{% if message['role'] == 'system' %}<|startoftext|>{{ message['content'] }}"
        "<|extra_4|>{% elif message['role'] == 'assistant' %}{{ message['content'] }}<|eos|>"
        "{% else %}<|startoftext|>{{ message['content'] }}<|extra_0|>{% endif %}{% endfor %}"
    ),
    "gpt-oss": (
        "{% for message in messages %}<|start|>{{ message['role'] }}<|message|>{{ message['content'] }}"
        "{{ '<|return|>' if message['role'] == 'assistant' else '<|end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
    ),
    # Hunyuan's user turn writes the answer's opening; a system message counts only as the first.
    "hunyuan-dense": (
        "{% for message in messages %}{% if loop.first and message['role'] == 'system' %}{{ message['content'] }}"
        "<｜hy_place▁holder▁no▁3｜>{% endif %}{% if message['role'] == 'assistant' %}<｜hy_Assistant｜>"
        "{{ message['content'] }}<｜hy_place▁holder▁no▁2｜>{% elif message['role'] == 'user' %}<｜hy_User｜>"
        "{{ message['content'] }}<｜hy_Assistant｜>{% endif %}{% endfor %}"
    ),
    # HunyuanVL writes each role's token after its text.
    "hunyuan-vl": (
        "<｜hy_begin▁of▁sentence｜>{% for message in messages %}{% if loop.first and message['role'] == 'system' %}"
        "{{ message['content'] }}<｜hy_place▁holder▁no▁3｜>{% elif message['role'] == 'user' %}"
        "{{ message['content'] }}<｜hy_User｜>{% elif message['role'] == 'assistant' %}{{ message['content'] }}"
        "<｜hy_Assistant｜>{% endif %}{% endfor %}"
    ),
    "kimi-k2": (
        "{% set heads = {'system': '<|im_system|>system', 'user': '<|im_user|>user', "
        "'assistant': '<|im_assistant|>assistant', 'tool': '<|im_system|>tool'} %}{% for message in messages %}"
        "{% if message['role'] in heads %}{{ heads[message['role']] }}<|im_middle|>{% endif %}"
        "{{ message['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
    ),
    "seed_oss": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}<seed:bos>{{ message['role'] }}\n"
        "{{ message['content'] | trim(ws) if message['role'] == 'assistant' else message['content'] }}"
        "<seed:eos>{% endfor %}{% if add_generation_prompt %}<seed:bos>assistant\n{% endif %}"
    ),
    # Grok 2 trims system and user text, not the answers.
    "grok-2": (
        "{% set ws = ' \\t\\n\\v\\f\\r' %}{% for message in messages %}{% if message['role'] == 'system' %}"
        "System: {{ message['content'] | trim(ws) }}<|separator|>\n\n{% elif message['role'] == 'user' %}"
        "Human: {{ message['content'] | trim(ws) }}<|separator|>\n\n{% elif message['role'] == 'assistant' %}"
        "Assistant: {{ message['content'] }}<|separator|>\n\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}Assistant:{% endif %}"
    ),
    # Without a system message first, openPangu gets an empty one.
    "pangu-embedded": (
        "{% set heads = {'system': '系统', 'user': '用户', 'assistant': '助手', 'tool': '工具', 'function': '方法'} %}"
        "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}[unused9]系统：[unused10]"
        "{% endif %}{% if message['role'] in heads %}[unused9]{{ heads[message['role']] }}：{{ message['content'] }}"
        "[unused10]{% endif %}{% endfor %}{% if add_generation_prompt %}[unused9]助手：{% endif %}"
    ),
    "solar-open": (
        "{% for message in messages %}<|begin|>{{ message['role'] }}<|content|>{{ message['content'] }}<|end|>"
        "{% endfor %}{% if add_generation_prompt %}<|begin|>assistant{% endif %}"
    ),
}

#: Every built-in name llama-server knows (``llama-chat.cpp``'s table): each is written above.
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
