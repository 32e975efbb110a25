"""refsight against llama-server itself, started with the same start-up flags (issue 37 item 7):
``--host 127.0.0.1,::1`` (both addresses served), two ``--api-key``s (one of them short), ``--cors-origins``,
``-np 2 -c 1024`` (the context shared by the slots). The same requests to both, the same status codes and
what ``/props`` and ``/slots`` report. Slow: llama-server is built once and cached (``benchmarks/llama_server.py``).
"""

from __future__ import annotations

import socket

import pytest
from runtimes import require_module

from llama_pair import both, start_pair

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")

KEY, SHORT = "a-long-enough-key", "k2"  # llama-server takes keys of any length; refsight warns below 8
ORIGIN = "http://app.example"
FLAGS = ("--host", "127.0.0.1,::1", "--api-key", KEY, "--api-key", SHORT, "--cors-origins", ORIGIN)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(llama-server's URL, refsight's URL), each started with ``-np 2 -c 1024`` and :data:`FLAGS`."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here: --host 127.0.0.1,::1 cannot be bound")
    theirs, ours = start_pair(tmp_path_factory.mktemp("live-flags"), parallel=2, n_ctx=512, extra=FLAGS)
    yield theirs.url, ours.url
    ours.stop()
    theirs.stop()


def _v6(url: str) -> str:
    return url.replace("127.0.0.1", "[::1]")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_host_and_every_key_is_served(servers):
    for urls in (servers, [_v6(url) for url in servers]):
        assert [r.status_code for r in both(urls, "GET", "/health")] == [200, 200]  # public on both
        assert [r.status_code for r in both(urls, "GET", "/props")] == [401, 401]
        for key in (KEY, SHORT):
            for headers in ({"Authorization": f"Bearer {key}"}, {"X-Api-Key": key}):
                assert [r.status_code for r in both(urls, "GET", "/props", headers=headers)] == [200, 200], headers
    wrong = both(servers, "POST", "/v1/chat/completions", headers={"Authorization": "Bearer nope"},
                 json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert [r.status_code for r in wrong] == [401, 401]
    assert wrong[0].json()["error"]["type"] == wrong[1].json()["error"]["type"] == "authentication_error"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_context_is_shared_by_the_slots(servers):
    """``-np 2 -c 1024``: two slots of 512 positions each, on both."""
    headers = {"Authorization": f"Bearer {KEY}"}
    theirs, ours = (r.json() for r in both(servers, "GET", "/props", headers=headers))
    assert theirs["total_slots"] == ours["total_slots"] == 2
    assert theirs["default_generation_settings"]["n_ctx"] == ours["default_generation_settings"]["n_ctx"] == 512
    theirs, ours = (r.json() for r in both(servers, "GET", "/slots", headers=headers))
    assert [s["n_ctx"] for s in theirs] == [s["n_ctx"] for s in ours] == [512, 512]
    assert [s["id"] for s in theirs] == [s["id"] for s in ours] == [0, 1]
    over = {"prompt": "hello " * 600, "n_predict": 2}
    theirs, ours = (r.json()["error"] for r in both(servers, "POST", "/completion", headers=headers, json=over))
    assert theirs["n_ctx"] == ours["n_ctx"] == 512


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_cors_preflight_is_answered_before_the_key_check(servers):
    """A preflight carries no key: 200 with the listed origin on both; then the real request needs its key."""
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    theirs, ours = both(servers, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert theirs.status_code == ours.status_code == 200
    assert theirs.headers["access-control-allow-origin"] == ours.headers["access-control-allow-origin"] == ORIGIN
    for response in (theirs, ours):
        allowed = response.headers["access-control-allow-methods"]
        assert "POST" in allowed and "OPTIONS" in allowed
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    replies = both(servers, "POST", "/v1/chat/completions", headers={"Origin": ORIGIN}, json=body)
    assert [r.status_code for r in replies] == [401, 401]
    replies = both(servers, "POST", "/v1/chat/completions", json=body,
                   headers={"Origin": ORIGIN, "Authorization": f"Bearer {SHORT}"})
    assert [r.status_code for r in replies] == [200, 200]
    assert all(r.headers["access-control-allow-origin"] == ORIGIN for r in replies)
    # Another origin: llama-server names its one listed origin (the browser then refuses), refsight sends no
    # CORS header; either way that page cannot read the reply.
    theirs, ours = both(servers, "OPTIONS", "/v1/chat/completions", headers={**preflight, "Origin": "http://other.example"})
    assert theirs.status_code == ours.status_code == 200
    assert theirs.headers.get("access-control-allow-origin") == ORIGIN and "access-control-allow-origin" not in ours.headers
