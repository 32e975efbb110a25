"""llama-server's ``--no-jinja``: which built-in format renders the chats, detected from the chat template.

Without Jinja, llama.cpp renders a chat with one of its built-in C++ formats (``llm_chat_apply_template``),
picked by ``llm_chat_detect_template`` from the template's source: its name when the source is one
(``--chat-template chatml``), else by the strings the source contains (``<|im_start|>`` is ChatML ...).
:data:`RULES` is that detection, rule for rule and in its order (llama.cpp's ``src/llama-chat.cpp``), and
:func:`builtin_format` the Jinja that renders the detected format (:mod:`.chat_templates` writes each
as its C++ does). A source no rule matches is refused by name, as llama.cpp refuses it ("this custom
template is not supported, try using --jinja").
"""

from __future__ import annotations

from .chat_templates import LLAMA_CPP_NAMES, builtin_template

__all__ = ["RULES", "detect_format", "builtin_format"]

#: A needle that must start the source instead of appearing anywhere in it.
_START = "^"

#: Each group is satisfied when the source contains any of its needles.
_MISTRAL = ("^mistral", "[INST]")
_MISTRAL_OFFICIAL = ("' [INST] ' + system_message", "[AVAILABLE_TOOLS]")
_GRANITE_TOOLS = ("<tool_call>", "<tools>")
_EXAONE = ("[|system|]", "[|assistant|]", "[|endofturn|]")
_DEEPSEEK3 = ("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>")
_RWKV = ("rwkv-world", "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}")

#: ``llm_chat_detect_template``'s if/else chain, flattened: (format, groups), the first rule whose every group
#: the source satisfies wins. A group is one needle (contained) or a tuple of them (any contained); each
#: branch of the chain ends with its own condition alone, so the flattened order picks what the chain picks.
#: ``dots1`` is detected by llama.cpp but has no built-in name to give it: :func:`builtin_format` refuses it.
RULES: tuple[tuple[str, tuple[str | tuple[str, ...], ...]], ...] = (
    ("phi4", ("<|im_start|>", "<|im_sep|>")),
    ("smolvlm", ("<|im_start|>", "<end_of_utterance>")),
    ("chatml", ("<|im_start|>",)),
    ("mistral-v7", (_MISTRAL, "[SYSTEM_PROMPT]")),
    ("mistral-v1", (_MISTRAL, _MISTRAL_OFFICIAL, " [INST]")),
    ("mistral-v3-tekken", (_MISTRAL, _MISTRAL_OFFICIAL, '"[INST]"')),
    ("mistral-v3", (_MISTRAL, _MISTRAL_OFFICIAL)),
    ("llama2-sys-strip", (_MISTRAL, "content.strip()")),
    ("llama2-sys-bos", (_MISTRAL, "bos_token + '[INST]")),
    ("llama2-sys", (_MISTRAL, "<<SYS>>")),
    ("llama2", (_MISTRAL,)),
    ("phi3", ("<|assistant|>", "<|end|>")),
    ("chatglm4", ("[gMASK]<sop>",)),
    ("exaone-moe", ("<|assistant|>", "<|user|>", "<|tool_declare|>")),
    ("falcon3", ("<|assistant|>", "<|user|>", "</s>")),
    ("glmedge", ("<|assistant|>", "<|user|>")),
    ("glmedge", ("<|{{ item['role'] }}|>", "<|begin_of_image|>")),
    ("zephyr", ("<|user|>", "<|endoftext|>")),
    ("monarch", ("bos_token + message['role']",)),
    ("gemma", ("<start_of_turn>",)),
    ("orion", ("'\\n\\nAssistant: ' + eos_token",)),
    ("openchat", ("GPT4 Correct ",)),
    ("vicuna-orca", ("USER: ", "ASSISTANT: ", "SYSTEM: ")),
    ("vicuna", ("USER: ", "ASSISTANT: ")),
    ("deepseek", ("### Instruction:", "<|EOT|>")),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>")),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>")),
    ("chatglm3", ("[gMASK]sop",)),
    ("minicpm", ("<用户>",)),
    ("deepseek2", ("'Assistant: ' + message['content'] + eos_token",)),
    ("deepseek3", _DEEPSEEK3),
    ("exaone4", (*_EXAONE, "[|tool|]")),
    ("exaone3", _EXAONE),
    ("rwkv-world", (_RWKV,)),
    ("granite-4.0", ("<|start_of_role|>", _GRANITE_TOOLS, "g4_default_system_message")),
    ("granite-4.1", ("<|start_of_role|>", _GRANITE_TOOLS)),
    ("granite", ("<|start_of_role|>",)),
    ("gigachat", ("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]",)),
    ("megrez", ("<|role_start|>",)),
    ("yandex", (" Ассистент:",)),
    ("bailing", ("<role>ASSISTANT</role>", "'HUMAN'")),
    ("bailing-think", ("<role>ASSISTANT</role>", '"HUMAN"', "<think>")),
    ("bailing2", ("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>")),
    ("llama4", ("<|header_start|>", "<|header_end|>")),
    ("dots1", ("<|endofuserprompt|>",)),
    ("hunyuan-moe", ("<|extra_0|>", "<|extra_4|>")),
    ("gpt-oss", ("<|start|>", "<|channel|>")),
    ("hunyuan-vl", ("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>")),
    ("hunyuan-dense", ("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>")),
    ("kimi-k2", ("<|im_assistant|>assistant<|im_middle|>",)),
    ("seed_oss", ("<seed:bos>",)),
    ("grok-2", ("'Assistant: '  + message['content'] + '<|separator|>",)),
    ("pangu-embedded", ("[unused9]系统：[unused10]",)),
    ("solar-open", ("<|begin|>", "<|end|>", "<|content|>")),
)


def _has(source: str, needle: str) -> bool:
    return source.startswith(needle[1:]) if needle.startswith(_START) else needle in source


def _satisfies(source: str, groups: tuple[str | tuple[str, ...], ...]) -> bool:
    return all(any(_has(source, n) for n in ((g,) if isinstance(g, str) else g)) for g in groups)


def detect_format(source: str) -> str | None:
    """The built-in format llama.cpp renders ``source`` (a template's text, or a built-in name) in, or None."""
    if source in LLAMA_CPP_NAMES:
        return source
    return next((name for name, groups in RULES if _satisfies(source, groups)), None)


def builtin_format(source: str) -> str:
    """The Jinja of the built-in format detected from ``source``; ValueError when none is (llama.cpp's refusal)."""
    name = detect_format(source)
    if name is None:
        raise ValueError("the chat template is none of llama.cpp's built-in formats, which it renders without Jinja "
                         "(llama.cpp: 'this custom template is not supported, try using --jinja')")
    if name not in LLAMA_CPP_NAMES:
        raise ValueError(f"the chat template is llama.cpp's {name!r} format, which has no built-in name to render "
                         "it by here; serve it with Jinja (without --no-jinja)")
    return builtin_template(name)
