"""llama-server parity, round 3 (issue 51): ``/props`` and ``/slots`` as current llama-server reports them,
model ``aliases``/``tags`` in ``/v1/models``, and ``--sleep-idle-seconds`` (the model unloaded when idle, loaded
again by the next request; asking ``/props``, ``/health``, ``/v1/models`` or ``/metrics`` never wakes it).

Orchestration on the toy backend (fast); the llama.cpp model's unload is pinned in
``test_llama_server_round3.py``.
"""

from __future__ import annotations

import argparse
import time

import pytest

from refsight.cli.arguments import UsageError
from refsight.cli.llama_flags import add_llama_server_arguments, llama_server_settings
from refsight.cli.serving import _aliases

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _flags(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_llama_server_arguments(parser)
    return llama_server_settings(parser.parse_args(list(argv)))


def test_aliases_and_tags_are_comma_separated_as_llama_servers_flags():
    assert _aliases(["tinyllama-2,fim", "code", "fim"]) == ("tinyllama-2", "fim", "code")
    assert _flags("--tags", "chat, fim,,small,chat")["model_tags"] == ("chat", "fim", "small")
    assert _flags()["sleep_idle_seconds"] is None and _flags("--sleep-idle-seconds", "2")["sleep_idle_seconds"] == 2
    for bad in ("0", "-3"):
        with pytest.raises(UsageError, match="--sleep-idle-seconds"):
            _flags("--sleep-idle-seconds", bad)


def test_sampler_flags_are_the_servers_defaults_and_a_bad_one_is_refused_naming_the_flag():
    settings = _flags("--temp", "0.7", "--top-k", "5", "--top-p", "0.5", "--min-p", "0.1", "--repeat-penalty", "1.1",
                      "--presence-penalty", "0.2", "--frequency-penalty", "-0.3")
    assert settings["sampling_defaults"] == {"temperature": 0.7, "top_k": 5, "top_p": 0.5, "min_p": 0.1,
                                             "repetition_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": -0.3}
    assert _flags()["sampling_defaults"] == {}  # unset: the runtime's own (llama-server's chain on llama.cpp)
    for flag, bad in (("--top-p", "0"), ("--top-k", "-2"), ("--min-p", "nan"), ("--temp", "9"), ("--repeat-penalty", "0")):
        with pytest.raises(UsageError, match=f"^{flag} "):  # at start, not a 400 blaming every client
            _flags(flag, bad)


def test_models_list_aliases_and_tags_and_props_has_current_llama_server_fields(make_server):
    server = make_server(served_model_names=("tinyllama-2", "fim", "code"), model_tags=("chat", "fim", "small"))
    with server.client() as c:
        (model,) = c.get("/v1/models").json()["data"]
        assert model["aliases"] == ["code", "fim", "tinyllama-2"] and model["tags"] == ["chat", "fim", "small"]
        assert model["id"] == "tinyllama-2"  # refsight's (and vLLM's) first name; llama-server takes the first sorted
        props = c.get("/props").json()
        assert props["modalities"] == {"vision": True, "video": False, "audio": False}
        assert {k: props[k] for k in ("endpoint_slots", "endpoint_props", "endpoint_metrics", "ui", "is_sleeping",
                                      "cors_proxy_enabled")} == {
            "endpoint_slots": True, "endpoint_props": True, "endpoint_metrics": True, "ui": True,
            "is_sleeping": False, "cors_proxy_enabled": False}
        assert props["ui_settings"] == {} and props["chat_template_caps"] == {} and props["model_alias"] == "tinyllama-2"
        slots = c.get("/slots", params={"fail_on_no_slot": 1})
        assert slots.status_code == 200 and [s["is_processing"] for s in slots.json()] == [False, False]
    with make_server().client() as c:
        assert c.get("/v1/models").json()["data"][0]["aliases"] == ["toy"]


def test_no_slots_answers_501_and_props_shows_the_servers_seed_as_llama_server(make_server):
    from refsight.cli import build_parser

    args = build_parser().parse_args(["serve", "--no-slots", "--verbose"])
    assert args.slots_endpoint is False and args.verbose is True  # llama-server's flags, as its users type them
    assert build_parser().parse_args(["serve", "--slots"]).slots_endpoint is True
    with make_server(slots_endpoint=False).client() as c:
        answer = c.get("/slots")
        assert answer.status_code == 501 and answer.json()["error"]["code"] == "not_supported"
        assert c.get("/props").json()["endpoint_slots"] is False
    # --seed/--temp are the defaults /props and /slots show, as llama-server's (the test suite's test_server_props).
    with make_server(sampling_defaults={"seed": 42, "temperature": 0.8}).client() as c:
        settings = c.get("/props").json()["default_generation_settings"]
        assert (settings["params"]["seed"], settings["params"]["temperature"]) == (42, 0.8)
        # A slot that has run no task shows its id, context and state only (llama-server's test_server_slots).
        fresh = {"id": 0, "n_ctx": settings["n_ctx"], "speculative": False, "is_processing": False}
        assert c.get("/slots").json()[0] == fresh


def _wait_asleep(client, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not client.get("/props").json()["is_sleeping"]:
        assert time.monotonic() < deadline, "the model did not go to sleep"
        time.sleep(0.05)


def test_an_idle_model_sleeps_and_the_next_request_loads_it_again(make_server):
    server = make_server(sleep_idle_seconds=0.3)
    service = server.service
    with server.client() as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        before = service.engine.backend()
        _wait_asleep(c)
        assert not service.engine.models.is_loaded()  # unloaded: the backend is gone from the engine and registry
        for path in ("/health", "/props", "/v1/models", "/models", "/metrics"):  # asking never wakes it
            assert c.get(path).status_code == 200, path
        assert c.options("/v1/chat/completions", headers={"Origin": "http://localhost"}).status_code in (200, 405)
        assert c.get("/props").json()["is_sleeping"] is True
        assert c.get("/v1/models").json()["data"][0]["id"] == "toy"
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # loads it again, then answers
        assert c.get("/props").json()["is_sleeping"] is False
        assert service.engine.backend() is not before
        _wait_asleep(c)  # and sleeps again


def test_no_sleep_while_a_request_is_in_flight(make_server):
    import asyncio

    server = make_server(sleep_idle_seconds=60)
    watch = server.app.user_middleware  # the stack is built: reach the watch through the middleware options
    (sleep_mw,) = [m for m in watch if m.cls.__name__ == "SleepMiddleware"]
    watch = sleep_mw.kwargs["watch"]
    watch.seconds = 0.0
    watch.in_flight = 1
    assert asyncio.run(watch.sleep_if_idle()) is False and not server.service.is_sleeping
    watch.in_flight = 0
    assert asyncio.run(watch.sleep_if_idle()) is True and server.service.is_sleeping
    watch.seconds = 60.0
