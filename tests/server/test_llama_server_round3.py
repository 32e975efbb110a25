"""llama-server parity, round 3 (issue 51): the fields current llama-server clients send, on the real tiny GGUF.

GBNF ``grammar`` (``/completion`` and chat), ``logit_bias`` (object and array forms, text keys,
``false`` bans), ``ignore_eos`` (llama-server's ``-inf`` on every end-of-generation token), token
ids as the ``/completion`` prompt (alone or mixed with text), ``-c`` shared by ``-np`` slots as
llama.cpp sizes it, the assistant prefill (``continue_final_message``) and ``return_progress``. Each is honoured on llama.cpp and a 400 naming the field where a backend cannot
honour it; the grammar's and the bias's bounds are checked before any model work.
"""

from __future__ import annotations

import argparse
import time

import pytest
from runtimes import require_module

from live_server import LiveServer
from refsight import InvalidInputError, Sampling
from refsight.inputs.gbnf import MAX_GBNF_CHARS, MAX_REPEAT, check_gbnf
from refsight.cli.llama_flags import slot_context
from refsight.server import ServerConfig, create_app

GGUF = "tiny-qwen2-vl-gguf"
PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
YES_NO = 'root ::= ("yes" | "no") " " [a-z]{1,3}'


@pytest.mark.parametrize(("c", "np", "unified", "per_slot"), [
    (256, 4, False, 256),   # llama-server starts: each share of 64 is rounded up to 256
    (1024, 2, False, 512), (1000, 3, False, 512), (100, 1, False, 256), (4096, None, False, 4096),
    (256, 4, True, 256), (2048, 4, True, 2048),  # -kvu: each slot may fill the whole -c
])
def test_c_is_shared_by_the_np_slots_as_llama_cpp_sizes_it(c, np, unified, per_slot):
    args = argparse.Namespace(ctx_size=c, parallel=np, ctx_per_slot=False, kv_unified=unified)
    assert slot_context(args) == per_slot


def test_a_grammar_is_bounded_before_any_runtime_parses_it():
    assert check_gbnf(YES_NO) == YES_NO
    assert check_gbnf('root ::= "{99999}" [{}]{2}') is not None  # braces in literals and classes are characters
    for grammar, words in [
        ("", "non-empty"), ("x" * (MAX_GBNF_CHARS + 1), "characters"), ('item ::= "a"', "root"),
        (f'root ::= "a"{{{MAX_REPEAT + 1}}}', "counts above"), ('root ::= "a"{5,2}', "minimum is above"),
        ('root ::= "' + "a" * 3000 + '"{1500}', "could expand"), ('root ::= "a\x00"', "grammar"),
    ]:
        with pytest.raises(InvalidInputError, match=words) as e:
            Sampling(grammar=grammar)
        assert e.value.input == "grammar"


def test_a_logit_bias_is_token_ids_and_finite_or_banning_biases():
    assert Sampling(logit_bias=[(5, 1.5), (7, float("-inf"))]).logit_bias == ((5, 1.5), (7, float("-inf")))
    for pairs in ([(-1, 1.0)], [(True, 1.0)], [(5, float("nan"))], [(5, float("inf"))], [(5,)], "x"):
        with pytest.raises(InvalidInputError) as e:
            Sampling(logit_bias=pairs)
        assert e.value.input == "logit_bias"
    with pytest.raises(InvalidInputError) as e:
        Sampling(ignore_eos=1)
    assert e.value.input == "ignore_eos"
    assert Sampling.merged({"logit_bias": [[5, -1]], "ignore_eos": True}).non_default() == ["logit_bias", "ignore_eos"]


@pytest.fixture(scope="module")
def llama_live(tmp_path_factory):
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)  # built before the server starts, so start-up is only the load
    store = tmp_path_factory.mktemp("llama-round3")
    live = LiveServer(create_app(ServerConfig(store=store, model=GGUF, keys={}))).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def llama(llama_live):
    with llama_live.client() as client:
        yield client


def _complete(client, **body):
    return client.post("/completion", json={"prompt": PROMPT, "n_predict": 6, **body})


def _refused(response, param: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_a_gbnf_grammar_shapes_the_answer_on_completion_and_chat(llama):
    import re

    answer = _complete(llama, grammar=YES_NO, n_predict=12).json()
    assert re.fullmatch(r"(yes|no) [a-z]{1,3}", answer["content"]), answer["content"]
    assert answer["generation_settings"]["grammar"] == YES_NO
    chat = llama.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "yes?"}],
                                                    "grammar": 'root ::= "maybe"', "max_tokens": 8}).json()
    assert chat["choices"][0]["message"]["content"] == "maybe"
    _refused(_complete(llama, grammar="root ::= ( unclosed"), "grammar")  # llama.cpp's parser, before decoding
    _refused(_complete(llama, grammar=YES_NO, json_schema={"type": "object"}), "grammar")
    _refused(_complete(llama, grammar='root ::= "a"{100000}'), "grammar")


@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_logit_bias_in_both_forms_and_ignore_eos_as_llama_server_fills_it(llama):
    first = _complete(llama, n_predict=1, return_tokens=True).json()["tokens"][0]
    for bias in ({str(first): False}, [[first, False]], {str(first): -1e9}):
        banned = _complete(llama, n_predict=1, return_tokens=True, logit_bias=bias).json()
        assert banned["tokens"] != [first], bias
        assert banned["generation_settings"]["logit_bias"][0]["token"] == first
    text = llama.post("/detokenize", json={"tokens": [first]}).json()["content"]
    assert _complete(llama, n_predict=1, return_tokens=True, logit_bias=[[text, False]]).json()["tokens"] != [first]
    eos = llama.post("/tokenize", json={"content": "<|im_end|>"}).json()["tokens"][0]
    ends = _complete(llama, n_predict=8, logit_bias={str(eos): 100}).json()
    assert (ends["stop_type"], ends["tokens_predicted"]) == ("eos", 1)
    runs = _complete(llama, n_predict=8, logit_bias={str(eos): 100}, ignore_eos=True).json()
    assert (runs["stop_type"], runs["tokens_predicted"]) == ("limit", 8)
    assert runs["generation_settings"]["ignore_eos"] is True
    _refused(_complete(llama, logit_bias={"9999999": 1}), "logit_bias")
    _refused(_complete(llama, logit_bias={"5": True}), "logit_bias")
    _refused(_complete(llama, logit_bias=[[5]]), "logit_bias")


@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_token_ids_as_the_prompt_alone_or_mixed_with_text(llama):
    ids = llama.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    as_text = _complete(llama).json()
    for prompt in (ids, [ids], [*ids[:5], PROMPT[len(llama.post("/detokenize", json={"tokens": ids[:5]}).json()["content"]):]]):
        answer = _complete(llama, prompt=prompt).json()
        assert (answer["content"], answer["tokens_evaluated"]) == (as_text["content"], as_text["tokens_evaluated"]), prompt
    _refused(_complete(llama, prompt=[*ids, 10**9]), "prompt")
    _refused(_complete(llama, prompt=[1.5]), "prompt")
    # Strings beside each other (no id among them) are several prompts: an answer each (test_llama_server_api).
    assert [a["prompt"] for a in _complete(llama, prompt=["one", "two"]).json()] == ["one", "two"]


def test_a_backend_without_the_token_constraints_refuses_them_by_name(tmp_path):
    from starlette.testclient import TestClient

    with TestClient(create_app(ServerConfig(store=tmp_path / "s", model="toy", keys={})), base_url="http://127.0.0.1") as client:
        for field, value in (("ignore_eos", True), ("grammar", 'root ::= "a"'), ("logit_bias", {"5": 1.0}),
                             ("logprobs", True), ("n_probs", 2), ("post_sampling_probs", True)):
            body = {"messages": [{"role": "user", "content": "hi"}], field: value}
            _refused(client.post("/v1/chat/completions", json=body), field)
        _refused(client.post("/v1/completions", json={"prompt": "hi", "logprobs": 0}), "logprobs")


@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_log_probabilities_in_llama_server_and_openai_shapes_streamed_too(llama):
    import json

    plain = _complete(llama, n_predict=5, return_tokens=True).json()
    answer = _complete(llama, n_predict=5, n_probs=3, return_tokens=True).json()
    assert answer["tokens"] == plain["tokens"]  # log probabilities change no token
    probs = answer["completion_probabilities"]
    assert [p["id"] for p in probs] == answer["tokens"] and answer["generation_settings"]["n_probs"] == 3
    for p in probs:
        assert p["logprob"] <= 0 and isinstance(p["bytes"], list) and len(p["top_logprobs"]) == 3
        assert p["top_logprobs"][0]["logprob"] >= p["top_logprobs"][-1]["logprob"]
        assert p["top_logprobs"][0]["id"] == p["id"]  # greedy: the chosen token is the most likely
    assert "completion_probabilities" not in plain
    assert _complete(llama, n_predict=5, logprobs=3).json()["completion_probabilities"] == probs  # llama-server's alias
    with llama.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 5, "n_probs": 3, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    streamed = [p for e in events if not e["stop"] for p in e.get("completion_probabilities", [])]
    assert streamed == probs and "completion_probabilities" not in events[-1]
    for event in events[:-1]:  # llama-server's: one event per token, its probabilities alone
        assert event["tokens"] == [p["id"] for p in event["completion_probabilities"]] and len(event["tokens"]) == 1

    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 5}
    body = llama.post("/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 2}).json()
    content = body["choices"][0]["logprobs"]["content"]
    text = b"".join(bytes(t["bytes"]) for t in content).decode("utf-8", "replace")  # random weights: byte tokens too
    assert text == body["choices"][0]["message"]["content"]
    # The tokens' texts join to the answer's text, a byte that is not UTF-8 as U+FFFD (llama-server's test_logprobs).
    assert "".join(t["token"] for t in content) == text
    assert all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in content)
    assert llama.post("/v1/chat/completions", json={**chat, "logprobs": True}).json()["choices"][0]["logprobs"][
        "content"][0]["top_logprobs"] == []  # OpenAI's default: top_logprobs 0
    with llama.stream("POST", "/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 2, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = [t for c in chunks for t in ((c["choices"][0]["logprobs"] or {}).get("content") or [])]
    assert streamed == content
    assert "".join(t["token"] for t in streamed) == "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    legacy = llama.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "logprobs": 2}).json()
    logprobs = legacy["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["text_offset"]) == 5
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"]) and logprobs["content"][0]["id"] == probs[0]["id"]
    _refused(_complete(llama, n_probs=101), "n_probs")
    _refused(llama.post("/v1/chat/completions", json={**chat, "top_logprobs": 2}), "top_logprobs")
    _refused(llama.post("/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 21}), "top_logprobs")



@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_post_sampling_probs_are_the_sampler_chains_and_change_no_token(llama):
    import math

    # Sampled (llama-server's defaults: top-k 40, top-p 0.95, min-p 0.05): the same seeded tokens as without
    # the field, each with its probability among what the chain kept, llama-server's prob/top_probs fields.
    sampled = {"n_predict": 8, "temperature": 1.0, "seed": 7, "return_tokens": True}
    plain = _complete(llama, **sampled).json()
    answer = _complete(llama, **sampled, n_probs=10, post_sampling_probs=True).json()
    assert answer["tokens"] == plain["tokens"] and answer["generation_settings"]["post_sampling_probs"] is True
    for entry in answer["completion_probabilities"]:
        assert 0.0 < entry["prob"] <= 1.0 and "logprob" not in entry and "top_logprobs" not in entry
        top = entry["top_probs"]
        assert 0 < len(top) <= 10 and all(0.0 < t["prob"] <= 1.0 for t in top)
        assert [t["prob"] for t in top] == sorted((t["prob"] for t in top), reverse=True)
        assert sum(t["prob"] for t in top) <= 1.0 + 1e-6
        if len(top) < 10:  # fewer than asked only when the chain kept fewer: they are all of it
            assert math.isclose(sum(t["prob"] for t in top), 1.0, abs_tol=1e-5)
        if entry["id"] in [t["id"] for t in top]:
            assert next(t["prob"] for t in top if t["id"] == entry["id"]) == entry["prob"]
    # top-k 1 keeps one token, at probability 1; so does greedy decoding (llama-server's temperature 0).
    for narrow in ({"temperature": 1.0, "seed": 7, "top_k": 1}, {"temperature": 0}):
        body = _complete(llama, n_predict=4, n_probs=5, post_sampling_probs=True, return_tokens=True, **narrow).json()
        assert all(e["prob"] == 1.0 and [t["id"] for t in e["top_probs"]] == [e["id"]] for e in body["completion_probabilities"])
    # The chat carries the same entries, streamed too.
    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 4, "logprobs": True,
            "top_logprobs": 3, "post_sampling_probs": True, "temperature": 1.0, "seed": 3}
    content = llama.post("/v1/chat/completions", json=chat).json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all("prob" in e and "top_probs" in e for e in content)


def _metrics(client) -> dict[str, float]:
    lines = client.get("/metrics").text.splitlines()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line.startswith("llamacpp:")}


def test_metrics_in_llama_servers_names_beside_refsights(tmp_path):
    from starlette.testclient import TestClient

    with TestClient(create_app(ServerConfig(store=tmp_path / "s", model="toy", keys={})), base_url="http://127.0.0.1") as client:
        client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        figures = _metrics(client)
        scraped = client.get("/metrics")
        assert "refsight_request_seconds_count" in scraped.text
        assert 0 < int(dict(scraped.headers.raw)[b"Process-Start-Time-Unix"]) <= time.time()  # llama-server's header
    for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total",
                 "tokens_predicted_seconds_total", "n_tokens_max", "prompt_tokens_seconds", "predicted_tokens_seconds",
                 "requests_processing", "requests_deferred", "spec_decode_num_drafts_total"):
        assert f"llamacpp:{name}" in figures, name
    assert figures["llamacpp:requests_processing"] == figures["llamacpp:requests_deferred"] == 0


@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_metrics_count_the_served_tokens_as_llama_server_does(llama):
    before = _metrics(llama)
    answer = _complete(llama, n_predict=4, ignore_eos=True).json()
    after = _metrics(llama)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 4
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == answer["tokens_evaluated"]
    assert after["llamacpp:predicted_tokens_seconds"] > 0 and after["llamacpp:n_tokens_max"] >= answer["tokens_evaluated"] + 4
    assert _metrics(llama)["llamacpp:predicted_tokens_seconds"] == 0  # the rates cover the window since the last scrape


#: Run in a process of its own: freed memory shows in RSS only where no earlier test's allocations sit around it.
_SLEEP_PROBE = """
import functools, json, sys
import anyio
from refsight.server import ServerConfig
from refsight.server.edge.limits import WorkPool
from refsight.server.service import Service

def rss_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

service = Service(ServerConfig(store=sys.argv[1], model=sys.argv[2], keys={}), share_packages=True)
service.open()
try:
    service.sleep(), service.wake()  # the first load's lazy allocations, so both figures below count them
    awake = rss_mib()
    slept = service.sleep() and service.is_sleeping and bool(service.context_size)
    asleep = rss_mib()
    chat = functools.partial(service.chat, [sys.argv[3]], namespace="default", max_new_tokens=3, raw_prompt=True)
    answer = anyio.run(WorkPool(1, 0).run, chat)  # model work runs in a work pool's job
    print(json.dumps({"awake": awake, "asleep": asleep, "slept": slept, "tokens": len(answer.tokens),
                      "woke": not service.is_sleeping}))
finally:
    service.close()
"""


@pytest.mark.slow  # loads the tiny GGUF three times (llama-cpp-python: an optional runtime)
def test_sleep_frees_the_llama_cpp_models_memory_and_wake_loads_it_again(tmp_path):
    """``--sleep-idle-seconds``'s unload on llama.cpp: the model and its contexts are freed (RSS falls: 150 -> 108
    MiB measured on the tiny GGUF), ``/props`` facts stay, and the next generation loads it again."""
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    import json
    import subprocess
    import sys

    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)
    done = subprocess.run([sys.executable, "-c", _SLEEP_PROBE, str(tmp_path / "s"), GGUF, PROMPT],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["slept"] and probe["woke"] and probe["tokens"] > 0, probe
    assert probe["awake"] - probe["asleep"] > 10, probe


@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_a_final_assistant_message_is_continued_cached_and_fresh_alike_and_progress_is_streamed(llama_live, llama):
    """The assistant prefill and ``return_progress`` on llama.cpp (:mod:`prefill_checks`; the same checks run on
    transformers in test_openai_streaming.py, and against llama-server itself in test_llama_server_live.py)."""
    from live_server import b64, photo_png
    from prefill_checks import check_prefill, check_progress

    assert llama.post("/v1/references", json={"image": b64(photo_png()), "id": "prefill-cat"}).status_code == 201
    check_prefill(llama, llama_live.service.engine, "prefill-cat", "default")
    check_progress(llama, "prefill-cat")


def test_what_a_backend_cannot_render_or_report_is_refused_by_name(tmp_path):
    """The toy renders no chat template and reports no prompt: the prefill, ``add_generation_prompt: false`` and
    ``return_progress`` are 400s naming the field that asked; the two servers' own rules are 400s on every backend."""
    from starlette.testclient import TestClient

    hi = [{"role": "user", "content": "hi"}]
    prefilled = [*hi, {"role": "assistant", "content": "Hello"}]
    with TestClient(create_app(ServerConfig(store=tmp_path / "s", model="toy", keys={})), base_url="http://127.0.0.1") as client:
        def chat(messages, **fields):
            return client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, **fields})

        _refused(chat(prefilled), "messages")
        _refused(chat(prefilled, continue_final_message=True, add_generation_prompt=False), "continue_final_message")
        _refused(chat(hi, add_generation_prompt=False), "add_generation_prompt")
        _refused(chat(hi, stream=True, return_progress=True), "return_progress")
        _refused(client.post("/completion", json={"prompt": "hi", "stream": True, "return_progress": True}), "return_progress")
        _refused(client.post("/v1/completions", json={"prompt": "hi", "stream": True, "return_progress": True}),
                 "return_progress")
        _refused(chat(prefilled, continue_final_message=True), "continue_final_message")  # both servers' rule
        _refused(chat(hi, continue_final_message=True, add_generation_prompt=False), "continue_final_message")
        _refused(chat([*prefilled, {"role": "assistant", "content": "again"}]), "messages")
        assert chat(hi, return_progress=True).status_code == 200  # not streamed: nothing to report, as llama-server
        assert chat(hi, add_generation_prompt=True, continue_final_message=False).status_code == 200
