"""Parallel slots (issue 29 item 4): concurrent requests decode together, each its own sequence of one context.

On real GGUFs (random weights): requests from several threads, each with its own
references and reference-prefix state, share ``llama_decode`` steps and give the same
greedy tokens as each request run alone on a one-sequence backend (logits within a
measured bound: a batched matrix product sums in another order; run alone on the
parallel backend they are bit-identical). Streams, stop events, scores, errors and the
prefix states work per slot; the option is checked by name.
"""

from __future__ import annotations

import threading

import pytest
from llama_models import GGUF_FAMILIES, require_llama_cpp

from refsight.backends.base import GenerationRequest
from refsight.errors import GenerationError, InvalidInputError

require_llama_cpp()

SLOTS = 3
#: Measured: at most 8.7e-06 on the tiny families (float32 sums in a batch's order).
LOGITS_BOUND = 1e-4
REFS = ("chelsea", "coffee", "astronaut")


def _judge(packages, candidate, rubric, cache=None, max_new_tokens=10):
    from refsight.judge.prompts import reference_prefix

    prefix = reference_prefix(packages)
    segments = [*prefix, "Candidate:", candidate, f"\nCriteria:\n1. {rubric}\nAnswer with JSON."]
    return GenerationRequest(segments, max_new_tokens=max_new_tokens, prefix_segments=len(prefix), prefix_cache=cache)


def _together(backend, requests, **kwargs):
    """Each request from its own thread, all started at once; the generations in order."""
    out: list = [None] * len(requests)
    errors: list = [None] * len(requests)
    go = threading.Barrier(len(requests))

    def call(i):
        go.wait()
        try:
            out[i] = backend.generate([requests[i]], **kwargs)[0]
        except Exception as e:  # noqa: BLE001 - compared by the test
            errors[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, errors


@pytest.fixture(scope="module")
def pair(gguf):
    """``pair(name)`` -> (one-sequence backend, backend with SLOTS sequences), both the registry's."""
    return lambda name: (gguf(name), gguf(name, parallel=SLOTS))


@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_concurrent_requests_share_decode_steps_and_answer_as_alone(pair, photos, name, tmp_path):
    from refsight.prefixes import PrefixStateCache
    from refsight.store import open_store

    alone, parallel = pair(name)
    packages = alone.encode([photos[r] for r in REFS])
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        # Different reference sets, candidates and rubrics: three prefixes, three states.
        def judge(i, states=None):
            return _judge(packages[i:i + 2], photos["rocket" if i else "chelsea"], f"rubric {i}", states)

        requests = [judge(i, cache) for i in range(SLOTS)]
        expected = [alone.generate([judge(i)], return_logits=True)[0] for i in range(SLOTS)]
        steps_before, batched_before = parallel.slots.steps, parallel.slots.batched
        cold, errors = _together(parallel, requests, return_logits=True)   # builds each prefix state in its slot
        warm, errors_warm = _together(parallel, requests, return_logits=True)  # restores them, one per slot
    assert errors == errors_warm == [None] * SLOTS
    for want, *got in zip(expected, cold, warm):
        for g in got:
            assert g.token_ids == want.token_ids and g.text == want.text and g.finish_reason == want.finish_reason
            assert (g.logits - want.logits).abs().max().item() <= LOGITS_BOUND
            assert g.prompt_tokens == want.prompt_tokens
    assert all(g.prefix_tokens_reused > 0 for g in warm)
    steps = parallel.slots.steps - steps_before
    batched = parallel.slots.batched - batched_before
    assert batched > steps  # decode steps carried more than one sequence


def test_one_request_alone_on_the_parallel_backend_is_bit_identical(pair, photos):
    alone, parallel = pair(GGUF_FAMILIES[0])
    packages = alone.encode([photos[r] for r in REFS])
    request = _judge(packages, photos["rocket"], "short fur")
    want = alone.generate([request], return_logits=True)[0]
    got = parallel.generate([request], return_logits=True)[0]
    assert got.token_ids == want.token_ids
    assert (got.logits - want.logits).abs().max().item() == 0.0


def test_a_batch_of_requests_decodes_together_and_scores_match(pair, photos):
    alone, parallel = pair(GGUF_FAMILIES[0])
    packages = alone.encode([photos[r] for r in REFS])
    requests = [_judge(packages[:k], photos["rocket"], f"rubric {k}") for k in (1, 2, 3, 1, 2)]  # more than SLOTS
    steps, batched = parallel.slots.steps, parallel.slots.batched
    got = parallel.generate(requests)
    assert [g.token_ids for g in got] == [g.token_ids for g in alone.generate(requests)]
    assert parallel.slots.batched - batched > parallel.slots.steps - steps
    assert parallel.score_yes_no(requests) == pytest.approx(alone.score_yes_no(requests), abs=1e-6)


def test_a_stream_and_a_stop_event_act_on_their_own_slot_only(pair, photos):
    alone, parallel = pair(GGUF_FAMILIES[0])
    packages = alone.encode([photos[r] for r in REFS])
    long = [_judge(packages[:2], photos["rocket"], f"rubric {i}", max_new_tokens=40) for i in range(2)]
    want = alone.generate(long)
    pieces: list[str] = []
    stop = threading.Event()
    cancelled_pieces: list[str] = []

    def cancel_after_first(piece: str) -> None:
        cancelled_pieces.append(piece)
        stop.set()

    results: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda: results.__setitem__("stream", parallel.generate_stream(long[0], on_text=pieces.append))),
        threading.Thread(target=lambda: results.__setitem__(
            "cancelled", parallel.generate_stream(long[1], on_text=cancel_after_first, stop_event=stop))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    streamed, cancelled = results["stream"], results["cancelled"]
    assert "".join(pieces) == streamed.text == want[0].text and streamed.token_ids == want[0].token_ids
    assert cancelled.finish_reason == "cancelled" and len(cancelled.token_ids) < len(want[1].token_ids)
    assert want[1].token_ids[: len(cancelled.token_ids)] == cancelled.token_ids
    assert "".join(cancelled_pieces) == cancelled.text


def test_a_failing_request_fails_alone_and_the_slots_go_on(pair, photos):
    alone, parallel = pair(GGUF_FAMILIES[0])
    packages = alone.encode([photos[r] for r in REFS])
    fine = _judge(packages[:1], photos["rocket"], "round")
    too_long = _judge(packages[:1], photos["rocket"], "round", max_new_tokens=parallel.context_size)
    got, errors = _together(parallel, [fine, too_long, fine])
    assert isinstance(errors[1], GenerationError) and "does not fit" in str(errors[1])
    assert errors[0] is None and errors[2] is None
    assert got[0].token_ids == got[2].token_ids == alone.generate([fine])[0].token_ids
    assert parallel.generate([fine])[0].token_ids == got[0].token_ids  # the slots still serve


@pytest.mark.parametrize("value", [0, -1, 257, "4", 2.0, True])
def test_a_bad_parallel_option_is_refused_by_name(gguf, value):
    with pytest.raises(InvalidInputError) as info:
        gguf(GGUF_FAMILIES[0], parallel=value)
    assert "parallel" in str(info.value.input)


def test_a_backend_without_slots_refuses_the_option_by_name(load):
    from refsight.backends.tiny import load_tiny

    with pytest.raises(InvalidInputError) as info:
        load_tiny("tiny-qwen2-vl", parallel=2)
    assert "parallel" in str(info.value.input)


def test_a_closed_backend_finishes_its_slots_and_refuses_more(gguf_files, photos):
    from refsight.backends.llamacpp import load_llamacpp_backend

    model, mmproj = gguf_files(GGUF_FAMILIES[0])
    backend = load_llamacpp_backend(GGUF_FAMILIES[0], source=str(model), mmproj=str(mmproj), parallel=2)
    request = GenerationRequest([photos["rocket"], "Describe it."], max_new_tokens=4)
    assert len(backend.generate([request, request])) == 2
    slots = backend.slots
    backend.close()
    with pytest.raises(GenerationError, match="closed"):
        slots.run([])  # (the runtime itself is freed: nothing may reach it any more)
