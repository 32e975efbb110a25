"""A JSON schema cannot make a huge grammar (issue 49, group 2), through a real ``refsight serve`` on llama.cpp.

Before the fix, ``"pattern": "^a{100000000}$"`` in Ollama's ``format`` (a 173-byte body) took 26 s and
+2.1 GB while llama.cpp's converter wrote the repeat out, ``^[a-z]{100000000}$`` +3.8 GB and 55 s, and
the same through ``/completion``'s ``json_schema`` and ``response_format``. Now each such body is a 400
naming the field, answered before any grammar is built (and before the meta-schema check, whose time
grows with the schema), and the server's memory does not move. A cheap body goes first, so a regression
fails here before the large ones could cost gigabytes.
"""

from __future__ import annotations

import json
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


def test_grammar_bombs_are_400_naming_the_field_at_once_and_memory_stays(tmp_path):
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(MODEL)  # built once here, in the session's model cache the server inherits
    server = ServeProcess(tmp_path / "store", model=MODEL).wait_ready(timeout=300)
    try:
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
    finally:
        server.stop()
    print(f"RSS {before['VmRSS'] // 1024} -> {after['VmRSS'] // 1024} MB, peak {before['VmHWM'] // 1024} -> "
          f"{after['VmHWM'] // 1024} MB; seconds per body {seconds}")
    assert max(seconds) < 5, seconds  # unbounded, one took 26-55 s
    assert after["VmHWM"] - before["VmHWM"] < 100 * 1024 and after["VmRSS"] - before["VmRSS"] < 100 * 1024, (before, after)
