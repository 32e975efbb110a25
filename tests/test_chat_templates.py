"""llama-server's built-in chat templates (``--chat-template NAME``): each written here renders what llama.cpp's own
C++ formatter (``llama_chat_apply_template``) writes; ``--chat-template``/``--chat-template-file`` resolve to Jinja."""

from __future__ import annotations

import argparse
import ctypes

import pytest
from runtimes import require_module

from refsight.backends.chat_templates import BUILTIN_TEMPLATES, LLAMA_CPP_NAMES, builtin_template
from refsight.backends.llamacpp.prompt import render_prompt
from refsight.cli.arguments import UsageError
from refsight.cli.llama_flags import chat_template

TURNS = [("system", " Be brief. "), ("user", " What is this? "), ("assistant", " A cat. "), ("user", "And now?")]
#: Each template is held to llama.cpp on all of these, so that none passes by the luck of one conversation: no system
#: message, turns that end on an answer, a system message late, and text with spaces, newlines, a no-break space and
#: a \x1c at its ends (whitespace to Python's strip(), not to C's isspace(): a template that trims must keep them).
CONVERSATIONS = {
    "system-first": TURNS,
    "no-system": [("user", "  Hi there!\n"), ("assistant", "\tHello.\nWhat can I do? "),
                  ("user", "Two lines:\none, two "), ("assistant", "\u00a0Sure\x1c "),
                  ("user", " \r\nAnd\vthree?\f"), ("assistant", "Done.\n\n")],
    "late-system": [("user", "Hi"), ("assistant", "Hello."), ("system", " Answer in French.\n"), ("user", " Again? ")],
}


def _llama_cpp(name: str, turns: list[tuple[str, str]], add_ass: bool) -> str:
    import llama_cpp

    messages = (llama_cpp.llama_chat_message * len(turns))(
        *[llama_cpp.llama_chat_message(role=r.encode(), content=c.encode()) for r, c in turns]
    )
    buf = ctypes.create_string_buffer(8192)
    n = llama_cpp.llama_chat_apply_template(name.encode(), messages, len(turns), add_ass, buf, len(buf))
    assert 0 < n < len(buf), name
    return buf.raw[:n].decode()


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
@pytest.mark.parametrize("add_ass", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_each_builtin_renders_what_llama_cpp_writes(name, add_ass, conversation):
    require_module("llama_cpp")
    turns = CONVERSATIONS[conversation]
    ours = render_prompt(BUILTIN_TEMPLATES[name], "unknown", turns, generation_prompt=add_ass)
    assert ours == _llama_cpp(name, turns, add_ass)


def _args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"chat_template": None, "chat_template_file": None, **given})


def test_the_flags_resolve_to_jinja_or_are_refused_by_name(tmp_path):
    assert chat_template(_args()) is None
    assert chat_template(_args(chat_template="chatml")) == builtin_template("chatml")
    assert set(BUILTIN_TEMPLATES) == set(LLAMA_CPP_NAMES)  # every name llama.cpp knows is written, none refused
    assert all(chat_template(_args(chat_template=name)) == BUILTIN_TEMPLATES[name] for name in LLAMA_CPP_NAMES)
    assert chat_template(_args(chat_template="{{ messages }}")) == "{{ messages }}"  # the template itself
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert chat_template(_args(chat_template_file=str(path))) == path.read_text()
    for given, named in (({"chat_template": "nonesuch"}, "neither"),
                         ({"chat_template_file": str(tmp_path / "absent")}, "cannot read"),
                         ({"chat_template": "chatml", "chat_template_file": str(path)}, "give one")):
        with pytest.raises(UsageError, match=named):
            chat_template(_args(**given))
