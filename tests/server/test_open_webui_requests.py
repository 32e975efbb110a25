"""Every request Open WebUI 0.12.4 sends to refsight, replayed byte for byte: each must be answered 2xx with a
reply Open WebUI reads (issue 61).

The bodies were captured from a real Open WebUI connected to ``refsight serve tiny-qwen2-vl-gguf`` through
its Ollama and its OpenAI connection (``benchmarks/open_webui.py --save-fixtures tests/server/data/open_webui``,
which needs Open WebUI's own venv; CI has none): its model lists, its page's chats (text, image, attached
file: its built-in tools attached, as for every user), the tasks it runs (title, tags, follow-ups, search
queries), and every advanced parameter at the value its UI fills in. Here they go to an in-process server
on the same GGUF, and :func:`open_webui_replay.unreadable` reads each reply as Open WebUI's code does.

Requests refsight refuses today are listed in :data:`REFUSED_TODAY` with the exact refusal: they xfail
(strict) only while refsight answers exactly that; when a fix makes one pass, the run fails (XPASS) until its
line is deleted, and a different refusal fails at once. Requests the real server refuses too are listed in
:data:`REFUSED_AS_THE_REAL_SERVER`: they pass only when refused with exactly its words.
"""

from __future__ import annotations

import pytest
from runtimes import require_module

from live_server import LiveServer
from open_webui_replay import load_requests, send, unreadable
from refsight.server import ServerConfig, create_app

GGUF = "tiny-qwen2-vl-gguf"
REQUESTS = load_requests()

_NO_THINKING = f'400: "{GGUF}:latest" does not support thinking'

#: The requests refsight refuses today, by fixture name, with its refusal (see the module docstring).
REFUSED_TODAY: dict[str, str] = {
}
#: Requests the real server refuses too, for this model, refused as it words it: Ollama answers a thinking request
#: to a model that cannot think (the tiny GGUF's chat template reads no thinking variable) with this 400 (its
#: server/routes.go), where ``think: false`` passes; on the OpenAI connection ``think`` is answered as llama-server
#: answers ``reasoning_effort`` for such a model (200, the variable unread, named in ``refsight.ignored``).
REFUSED_AS_THE_REAL_SERVER: dict[str, str] = {"ollama.params.think=true": _NO_THINKING,
                                              'ollama.params.think="medium"': _NO_THINKING}


class StillRefused(AssertionError):
    """refsight refuses the request exactly as :data:`REFUSED_TODAY` records (the only xfail accepted)."""


def _cases() -> list:
    cases = []
    for request in REQUESTS:
        refusal = REFUSED_TODAY.get(request["name"])
        marks = [pytest.mark.xfail(strict=True, raises=StillRefused, reason=(
            f"refsight refuses it today ({refusal}); when a fix makes it pass, delete its REFUSED_TODAY line"))
        ] if refusal else []
        cases.append(pytest.param(request, id=request["name"], marks=marks))
    return cases


#: The answer's bound where a body names none (llama-server's ``-n``): a deployment's setting, not the body's,
#: kept short so the replay stays cheap (random weights rarely end a text early).
N_PREDICT = 16


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One in-process server on the tiny GGUF for every request (the model loads once)."""
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)
    config = ServerConfig(store=tmp_path_factory.mktemp("store"), model=GGUF, keys={}, n_predict=N_PREDICT)
    server = LiveServer(create_app(config)).start()
    yield server
    server.stop()


def test_every_refusal_today_names_a_captured_request():
    assert {*REFUSED_TODAY, *REFUSED_AS_THE_REAL_SERVER} <= {request["name"] for request in REQUESTS}


@pytest.mark.parametrize("request_", _cases())
def test_open_webui_request_is_answered_as_open_webui_reads_it(live, request_):
    with live.client(timeout=300) as client:
        problem = unreadable(request_, send(client, request_))
    if problem is not None and problem == REFUSED_TODAY.get(request_["name"]):
        raise StillRefused(problem)
    expected = REFUSED_AS_THE_REAL_SERVER.get(request_["name"])
    assert problem == expected, f"{request_['method']} {request_['path']} ({request_['kind']}): {problem}"
