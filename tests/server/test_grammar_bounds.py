"""Grammars that cannot cost the server its memory or its life, through a real ``refsight serve`` on llama.cpp.

A JSON schema cannot make a huge grammar (issue 49, group 2). Before the fix, ``"pattern": "^a{100000000}$"``
in Ollama's ``format`` (a 173-byte body) took 26 s and +2.1 GB while llama.cpp's converter wrote the repeat
out, ``^[a-z]{100000000}$`` +3.8 GB and 55 s, and the same through ``/completion``'s ``json_schema`` and
``response_format``. Now each such body is a 400 naming the field, answered before any grammar is built (and
before the meta-schema check, whose time grows with the schema), and the server's memory does not move. A
cheap body goes first, so a regression fails here before the large ones could cost gigabytes.

A GBNF grammar cannot crash llama.cpp (issue 60, group 1). Before the fix, 20,000 nested parentheses in
``grammar`` killed the server with a segmentation fault (exit -11), ``"\\x00"`` and ``<[100000000]>`` with
an abort (exit -6), on ``/completion`` and ``/v1/chat/completions``; so did ``[z-a]``, ``<|im_end|>``, a
token after a character its text starts with, a ``logit_bias`` banning all the grammar allows and a
schema's ``"const": "\\u0000"``. Now each is a 400 naming the field, on every route that takes a grammar,
and the same server answers a sound grammar afterwards. One server serves the module.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from hardening_helpers import ServeProcess
from runtimes import require_module

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")

pytestmark = pytest.mark.slow  # a llama.cpp server in a subprocess

MODEL = "tiny-qwen2-vl-gguf"
HI = [{"role": "user", "content": "hi"}]


def _name(pattern: str) -> dict:
    return {"type": "object", "properties": {"name": {"type": "string", "pattern": pattern}}, "required": ["name"]}


def _status_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


# (route, body, the field the 400 names); the first is small enough to be harmless even unchecked.
BODIES = [
    ("/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "format": _name("^a{5000}$")},
     "format.properties.name.pattern"),
    ("/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "format": _name("^a{100000000}$")},
     "format.properties.name.pattern"),
    ("/api/chat", {"model": MODEL, "messages": HI, "stream": False, "format": _name("^[a-z]{100000000}$")},
     "format.properties.name.pattern"),
    ("/completion", {"prompt": "hi", "n_predict": 4, "json_schema": _name("^a{100000000}$")},
     "json_schema.properties.name.pattern"),
    ("/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": _name("^(a{1000}){100000}$")}}},
     "response_format.json_schema.schema.properties.name.pattern"),
    ("/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
            f"p{i}": {"type": "string", "maxLength": 1000} for i in range(300)}}}}},
     "response_format.json_schema.schema"),
    # 40,000 values: refused by count before the meta-schema check, which takes ~0.5 ms a property.
    ("/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "format": {"type": "object", "properties": {
        f"p{i}": {"type": "string"} for i in range(20_000)}}}, "format"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(MODEL)  # built once here, in the session's model cache the server inherits
    process = ServeProcess(tmp_path_factory.mktemp("grammar") / "store", model=MODEL).wait_ready(timeout=300)
    yield process
    process.stop()


def test_grammar_bombs_are_400_naming_the_field_at_once_and_memory_stays(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        # A bounded pattern still constrains: the grammar path works and its first allocations are made.
        answer = client.post("/completion", json={"prompt": "hi", "n_predict": 8,
                                                  "json_schema": {"type": "string", "pattern": "^[a-z]{1,3}$"}})
        assert answer.status_code == 200, answer.text
        assert json.loads(answer.json()["content"]).isalpha()
        before = _status_kb(server.process.pid)
        seconds = []
        for route, body, field in BODIES:
            began = time.monotonic()
            reply = client.post(route, json=body)
            seconds.append(round(time.monotonic() - began, 2))
            assert reply.status_code == 400 and f"{field}:" in reply.text, (route, field, reply.text[:300])
        after = _status_kb(server.process.pid)
    print(f"RSS {before['VmRSS'] // 1024} -> {after['VmRSS'] // 1024} MB, peak {before['VmHWM'] // 1024} -> "
          f"{after['VmHWM'] // 1024} MB; seconds per body {seconds}")
    assert max(seconds) < 5, seconds  # unbounded, one took 26-55 s
    assert after["VmHWM"] - before["VmHWM"] < 100 * 1024 and after["VmRSS"] - before["VmRSS"] < 100 * 1024, (before, after)


# (grammar, words its 400 says): the three first, then other shapes of each mechanism.
CRAFTED = [
    ("root ::= " + "(" * 20000 + '"a"' + ")" * 20000, "nest deeper"),
    ('root ::= "\\x00"', "code point 0"),
    ("root ::= <[100000000]>", "not in the vocabulary"),
    ("root ::= " + '("a" | ' * 3000 + '"b"' + ")*" * 3000, "nest deeper"),
    ("root ::= x\nx ::= " + "(" * 1100 + "[a]" + ")+" * 1100, "nest deeper"),
    ('root ::= "a\\u0000"', "code point 0"), ('root ::= "\\U00000000"', "code point 0"),
    ("root ::= [\\x00]", "matches no character"), ("root ::= [^\\x01-\\U0010FFFF]", "matches no character"),
    ("root ::= [z-a]", "runs backwards"), ('root ::= "\\U00110000"', "U+10FFFF"), ("root ::= [\\uD800]", "surrogate"),
    ("root ::= <[512]>", "not in the vocabulary"), ("root ::= !<[4294967295]>", "not in the vocabulary"),
    ("root ::= <|im_end|>", "end-of-generation"), ("root ::= <think>", "not one"),
    ("root ::= . <|vision_start|>", "comes right after"), ('root ::= "a" !<[5]>', "follow a character"),
    ("root ::= missing", "never defined"), ('root ::= root "a" | "b"', "left-recursive"),
    ('root ::= a root "x" | "y"\na ::= b\nb ::= ""', "left-recursive"), ('root ::= "a" root', "never end"),
    ("root ::= a0\n" + "".join(f"a{i} ::= a{i + 1} | a{i + 1}\n" for i in range(25)) + 'a25 ::= "x"', "paths"),
    ('root ::= "a"{5,2}', "minimum"), ('root ::= "a"{0,3000}', "counts above"),
]
ROUTES = {
    "/completion": lambda grammar: {"prompt": "x", "n_predict": 2, "grammar": grammar},
    "/v1/chat/completions": lambda grammar: {"messages": HI, "max_tokens": 2, "grammar": grammar},
}


def _refused(reply: httpx.Response, field: str, words: str) -> None:
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    if isinstance(error, str):  # Ollama's shape: the message alone
        error = {"param": field, "message": error}
    assert error["param"] == field and error["message"].startswith(f"{field}:") and words in error["message"], error


def test_crafted_grammars_are_400s_naming_the_field_on_every_route_and_the_server_lives(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for route, body in ROUTES.items():
            for grammar, words in CRAFTED:
                _refused(client.post(route, json=body(grammar)), "grammar", words)
        _refused(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "grammar": "root ::= <[512]>"}),
                 "grammar", "not in the vocabulary")
        # At run time: a bias banning all the grammar allows (an abort), a schema's grammar matching a NUL.
        banned = {"prompt": "x", "n_predict": 2, "grammar": 'root ::= "a"', "logit_bias": [["a", False]]}
        _refused(client.post("/completion", json=banned), "grammar", "no token of the vocabulary")
        nul = {"const": "\u0000"}
        _refused(client.post("/completion", json={"prompt": "x", "n_predict": 2, "json_schema": nul}),
                 "json_schema", "code point 0")
        # The backend names a schema json_schema whichever dialect carried it (Ollama's format here).
        _refused(client.post("/api/generate", json={"model": MODEL, "prompt": "x", "stream": False, "format": nul}),
                 "json_schema", "code point 0")
        assert server.process.poll() is None, server.log[-3000:]
        # The same server still constrains: a sound grammar on each route.
        answer = client.post("/completion", json={"prompt": "x", "n_predict": 8, "grammar": 'root ::= "yes" | "no"'})
        assert answer.status_code == 200 and answer.json()["content"] in ("yes", "no"), answer.text
        chat = client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 8, "grammar": 'root ::= [a-c]{2}'})
        assert chat.status_code == 200, chat.text
        assert re.fullmatch("[a-c]{2}", chat.json()["choices"][0]["message"]["content"]), chat.text
        ended = client.post("/completion", json={"prompt": "x", "n_predict": 8, "grammar": 'root ::= "a"', "ignore_eos": True})
        assert (ended.json()["content"], ended.json()["stop_type"]) == ("a", "eos"), ended.text  # the grammar's end
    assert server.process.poll() is None, server.log[-3000:]
