"""Assistant prefill and prompt progress over real HTTP, checked alike on every runtime that honours them (issue 51;
imported by name: unique on purpose).

:func:`check_prefill`: a final assistant message is continued as llama-server renders a prefill (the earlier turns
with the answer's opening, then that text), ``continue_final_message`` is the same prompt, ``add_generation_prompt:
false`` ends it after the turns, and the stored reference's package and prefix state give the tokens its pixels give
through the runtime's own path. :func:`check_progress`: ``return_progress`` streams llama-server's
``prompt_progress`` before the first token, its figures the answer's own (``cache``: the prefix state's tokens).
"""

from __future__ import annotations

import json

import httpx

from refsight import ReferenceSegment
from refsight.inputs.text import printable_text

PREFILL = "It is a"


def reference_messages(ref_id: str, *prefill: str) -> list[dict]:
    """A user turn with the stored reference and a question, then the assistant's ``prefill`` (when given)."""
    user = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"refsight://ref/{ref_id}"}},
                                        {"type": "text", "text": "What is it?"}]}
    return [user, *({"role": "assistant", "content": text} for text in prefill)]


def _chat(client: httpx.Client, messages: list[dict], **fields) -> dict:
    response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def check_prefill(client: httpx.Client, engine, ref_id: str, namespace: str) -> None:
    """The prefill's prompt, its two spellings, ``add_generation_prompt: false``, and cached == fresh tokens."""
    asked, prefilled = reference_messages(ref_id), reference_messages(ref_id, PREFILL)
    opened = client.post("/apply-template", json={"messages": asked}).json()["prompt"]
    assert client.post("/apply-template", json={"messages": prefilled}).json()["prompt"] == opened + PREFILL
    closed = client.post("/apply-template", json={"messages": asked, "add_generation_prompt": False}).json()["prompt"]
    assert opened.startswith(closed) and len(closed) < len(opened)
    implicit = _chat(client, prefilled)
    explicit = _chat(client, prefilled, continue_final_message=True, add_generation_prompt=False)
    plain, ended = _chat(client, asked), _chat(client, asked, add_generation_prompt=False)
    assert explicit["choices"] == implicit["choices"] and explicit["usage"] == implicit["usage"]
    assert ended["usage"]["prompt_tokens"] < plain["usage"]["prompt_tokens"] < implicit["usage"]["prompt_tokens"]
    # The stored reference (its package, its prefix state) and its pixels through the runtime's own path.
    segments, turns = [ReferenceSegment(ref_id), "What is it?", PREFILL], [("user", 2), ("assistant", 1)]
    answers = [engine.chat(segments, turns=turns, prompt_end="continue", max_new_tokens=6, namespace=namespace,
                           use_cache=cache, prefix_states=cache) for cache in (True, False)]
    assert answers[0].tokens == answers[1].tokens and answers[0].prompt_tokens == answers[1].prompt_tokens
    assert answers[0].references_cached == [True] and answers[1].references_cached == [False]
    # The answer is what follows the prefill (as the server writes any answer: printable).
    assert implicit["choices"][0]["message"]["content"] == printable_text(answers[0].text)
    assert implicit["usage"]["prompt_tokens"] == answers[0].prompt_tokens


def _events(client: httpx.Client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


def check_progress(client: httpx.Client, ref_id: str) -> None:
    """``prompt_progress`` as the prompt's evaluation starts (``processed == cache``) and once it is done, before the
    first token, on the chat route (the reference's prefix state counted in ``cache``) and on ``/completion``."""
    messages = reference_messages(ref_id)
    _chat(client, messages)  # the reference prefix's state is stored by now
    chunks = _events(client, "/v1/chat/completions",
                     {"messages": messages, "max_tokens": 4, "stream": True, "return_progress": True})
    reports = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
    texts = [i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(reports) == 2 and texts and reports[-1] < texts[0], (reports, texts)
    start, done = (chunks[i]["prompt_progress"] for i in reports)
    timings = chunks[-1]["timings"]
    assert start["processed"] == start["cache"] == done["cache"] == timings["cache_n"] > 0
    assert done["processed"] == done["total"] == start["total"] == timings["prompt_n"] + timings["cache_n"]
    assert 0 <= start["time_ms"] <= done["time_ms"]
    assert all(chunks[i]["choices"][0]["delta"] == {"role": "assistant", "content": None} for i in reports)
    events = _events(client, "/completion", {"prompt": "Name a colour:", "n_predict": 3, "stream": True,
                                             "return_progress": True, "timings_per_token": True})
    progress = [e for e in events if "prompt_progress" in e]
    assert [p["prompt_progress"]["processed"] for p in progress] == [0, events[-1]["tokens_evaluated"]]
    assert events[-1]["stop"]
    # with timings_per_token each report has llama-server's timings: the prompt's so far, nothing predicted
    first, last = (p["timings"] for p in (progress[0], progress[-1]))
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"], first["predicted_ms"]) == (0, 0.0, 0, 0.0)
    assert last["prompt_n"] == events[-1]["tokens_evaluated"] and last["prompt_ms"] > 0 and last["predicted_n"] == 0
    assert not any("prompt_progress" in c for c in _events(client, "/v1/chat/completions",
                                                            {"messages": messages, "max_tokens": 2, "stream": True}))
