"""Parallel slots (issue 29 item 4): concurrent requests decode together, each its own sequence of one context.

On real GGUFs (random weights): requests from several threads, each with its own
references and reference-prefix state, share ``llama_decode`` steps and give, bit for bit,
the tokens and logits each request gets alone (on a one-sequence backend with the same
attention kernel, and on the parallel backend itself). On a quantized model with rows of
real K-quant width, eight slots and a context past 512, this holds only because a decode
call carries at most three sequences and flash attention is off (both shown by breaking
them). Streams, stop events, scores, errors and the prefix states work per slot; the
options are checked by name.
"""

from __future__ import annotations

import threading

import pytest
from llama_models import GGUF_FAMILIES, require_llama_cpp

from refsight.requests import GenerationRequest
from refsight.errors import ContextLengthError, GenerationError, InvalidInputError

require_llama_cpp()

SLOTS = 3
REFS = ("chelsea", "coffee", "astronaut")
#: Q4_K_M with 256-wide rows: its weights take the repacked kernels real quantized models take.
QUANTIZED = "tiny-qwen2-vl-256-gguf-q4"


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
    """``pair(name)`` -> (one-sequence backend, backend with SLOTS sequences), both the registry's.

    The one-sequence backend runs the slots' attention kernel (flash attention off).
    """
    return lambda name: (gguf(name, flash_attn="off"), gguf(name, parallel=SLOTS))


def _assert_same(got, want) -> None:
    """Bit for bit: tokens, text, finish and every logit."""
    assert got.token_ids == want.token_ids and got.text == want.text and got.finish_reason == want.finish_reason
    assert got.prompt_tokens == want.prompt_tokens
    assert (got.logits - want.logits).abs().max().item() == 0.0


@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_concurrent_requests_share_decode_steps_and_answer_as_alone(pair, photos, name, tmp_path):
    from refsight.cache.prefix_states import PrefixStateCache
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
            _assert_same(g, want)
    assert all(g.prefix_tokens_reused > 0 for g in warm)
    steps = parallel.slots.steps - steps_before
    batched = parallel.slots.batched - batched_before
    # Float weights: one sequence a call (their kernels switch at two rows); see the K-quant test for shared calls.
    assert parallel.runtime.invariant_step_rows == 1 and batched == steps


def _long_requests(packages, photos, n):
    """``n`` requests on two references each with a long question: the context passes 512 positions."""
    question = "Compare the candidate with both references, detail by detail. " * 40
    candidates = ("rocket", "chelsea", "coffee")
    return [
        GenerationRequest(["Reference 1:", packages[i % 3], "Reference 2:", packages[(i + 1) % 3],
                           "Candidate:", photos[candidates[i % 3]], f"{i}. {question}"], max_new_tokens=24)
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def eight_slots(gguf, photos):
    """(8-slot backend of the K-quant model, its references, 8 long requests, their answers alone)."""
    backend = gguf(QUANTIZED, parallel=8)
    packages = backend.encode([photos[r] for r in REFS])
    requests = _long_requests(packages, photos, 8)
    return backend, requests, [backend.generate([r], return_logits=True)[0] for r in requests]


def test_eight_slots_on_k_quant_weights_answer_bit_for_bit_as_alone(eight_slots, gguf):
    backend, requests, alone = eight_slots
    assert backend.runtime.settings.flash_attn == "off" and backend.runtime.invariant_step_rows == 3
    assert min(a.prompt_tokens for a in alone) > 512  # past flash attention's split of a lone sequence
    steps, batched = backend.slots.steps, backend.slots.batched
    together, errors = _together(backend, requests, return_logits=True)
    assert errors == [None] * len(requests)
    for got, want in zip(together, alone):
        _assert_same(got, want)
    steps, batched = backend.slots.steps - steps, backend.slots.batched - batched
    assert steps < batched <= 3 * steps  # shared calls, never more than three sequences in one
    one_sequence = gguf(QUANTIZED, flash_attn="off")  # and as on a backend of one sequence
    _assert_same(one_sequence.generate([requests[0]], return_logits=True)[0], alone[0])


def _differs(backend, requests, alone) -> bool:
    together, errors = _together(backend, requests, return_logits=True)
    assert errors == [None] * len(requests)
    return any(g.token_ids != w.token_ids or (g.logits.shape == w.logits.shape and (g.logits != w.logits).any())
               for g, w in zip(together, alone))


def test_calls_of_eight_sequences_would_change_the_answers(eight_slots, monkeypatch):
    # The control: the K-quant model really switches kernels at four rows, so the rule above matters.
    backend, requests, alone = eight_slots
    monkeypatch.setattr(backend.runtime, "invariant_step_rows", 8)
    assert _differs(backend, requests, alone)


def test_flash_attention_on_the_slots_would_change_the_answers(gguf, photos):
    # The control: with flash attention on, a lone sequence past 512 positions sums in other parts.
    backend = gguf(QUANTIZED, parallel=8, flash_attn="on")
    packages = backend.encode([photos[r] for r in REFS])
    requests = _long_requests(packages, photos, 8)
    assert _differs(backend, requests, [backend.generate([r], return_logits=True)[0] for r in requests])


@pytest.mark.parametrize("value", ["yes", "", 1])
def test_a_bad_flash_attn_option_is_refused_by_name(gguf, value):
    with pytest.raises(InvalidInputError) as info:
        gguf(GGUF_FAMILIES[0], flash_attn=value)
    assert "flash_attn" in str(info.value.input)


def test_prefix_states_are_keyed_by_the_attention_kernel(gguf, photos, tmp_path):
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    default, off = gguf(GGUF_FAMILIES[0]), gguf(GGUF_FAMILIES[0], flash_attn="off")
    packages = default.encode([photos[r] for r in REFS[:2]])
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        request = _judge(packages, photos["rocket"], "round", cache)
        assert default.prefix_plan(request).model != off.prefix_plan(request).model
        default.generate([request])
        assert off.generate([request])[0].prefix_tokens_reused == 0  # the default's state is not reused


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
    assert parallel.slots.batched - batched == parallel.slots.steps - steps  # float weights: a sequence a call
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
    assert isinstance(errors[1], ContextLengthError) and "does not fit" in str(errors[1])
    assert errors[0] is None and errors[2] is None
    assert got[0].token_ids == got[2].token_ids == alone.generate([fine])[0].token_ids
    assert parallel.generate([fine])[0].token_ids == got[0].token_ids  # the slots still serve


@pytest.mark.parametrize("value", [0, -1, 257, "4", 2.0, True])
def test_a_bad_parallel_option_is_refused_by_name(gguf, value):
    with pytest.raises(InvalidInputError) as info:
        gguf(GGUF_FAMILIES[0], parallel=value)
    assert "parallel" in str(info.value.input)


def test_a_backend_without_slots_refuses_the_option_by_name(load):
    from refsight.backends.builtin import load_tiny

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
