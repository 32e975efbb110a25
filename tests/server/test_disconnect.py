"""A non-streamed request stops its worker when its client leaves (issue 38, item 4), on a real tiny model over loopback:
OpenAI's chat, llama-server's ``/completion`` and Ollama's ``/api/chat`` and ``/api/generate`` with ``stream: false``.

The same chat run to its end takes seconds on ``tiny-qwen2-vl`` (about 200 greedy tokens); a client
that gives up at 0.3 s must free the worker well before that, as streams already do.
"""

from __future__ import annotations

import time

import httpx
import pytest
from live_server import LiveServer

pytestmark = pytest.mark.slow  # a live server generating thousands of tokens per request

GIVE_UP_S = 0.3


@pytest.fixture(scope="module")
def tiny_options() -> dict:
    """One worker (the one a request that was left must free), answers as long as :data:`TOKENS`."""
    return {"workers": 1, "max_new_tokens": TOKENS}


def _busy_after_giving_up(live: LiveServer, path: str, body: dict) -> tuple[float, float]:
    """(seconds the whole request takes, seconds the worker stays busy after the client left at GIVE_UP_S)."""
    pool = live.app.state.pool
    with live.client() as c:
        began = time.monotonic()
        assert c.post(path, json=body).status_code == 200
        whole = time.monotonic() - began
    began = time.monotonic()
    with pytest.raises(httpx.TimeoutException), live.client(timeout=GIVE_UP_S) as c:
        c.post(path, json=body)
    while pool.pending and time.monotonic() - began < 60:
        time.sleep(0.02)
    return whole, time.monotonic() - began


#: A long answer whatever the random weights say: the grammar allows no end before the token bound
#: (unconstrained, the tiny model may end after a few hundred tokens: too quick on a fast machine).
LONG = {"type": "array", "items": {"type": "string", "minLength": 1000}, "minItems": 1000}
TOKENS = 4000


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "tiny-qwen2-vl", "max_tokens": TOKENS, "messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "long", "schema": LONG}}}),
    ("/completion", {"prompt": "Once upon a time", "n_predict": TOKENS, "json_schema": LONG}),
    ("/api/chat", {"model": "tiny-qwen2-vl", "stream": False, "format": LONG, "options": {"num_predict": TOKENS},
                   "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"model": "tiny-qwen2-vl", "stream": False, "format": LONG, "options": {"num_predict": TOKENS},
                       "prompt": "Once upon a time"}),
])
def test_a_client_that_leaves_frees_its_worker(tiny, path, body):
    whole, busy = _busy_after_giving_up(tiny, path, body)
    assert whole > 2.0, f"the request is too quick ({whole:.2f} s) to show anything"
    assert busy < min(1.5, whole / 2), f"the worker stayed busy {busy:.2f} s after its client left (whole: {whole:.2f} s)"
