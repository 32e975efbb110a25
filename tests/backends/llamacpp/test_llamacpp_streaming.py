"""llama.cpp streams from its token loop and samples through its own sampler chain (real GGUFs, random weights)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from llama_models import require_llama_cpp

from refsight.requests import GenerationRequest
from refsight.sampling import OUTPUT_FIELDS, SAMPLING_FIELDS, TOKEN_FIELDS, WINDOW_FIELDS, Sampling

require_llama_cpp()
pytestmark = pytest.mark.slow  # converts the tiny models to GGUF (llama-cpp-python: an optional runtime)

QWEN, SMOL = "tiny-qwen2-vl-gguf", "tiny-smolvlm-gguf"


def _request(photos, max_new_tokens: int = 24, **sampling) -> GenerationRequest:
    return GenerationRequest([photos["chelsea"], "Describe it."], max_new_tokens=max_new_tokens, sampling=Sampling(**sampling))


@pytest.mark.parametrize("name", [QWEN, SMOL])
def test_streamed_pieces_are_the_greedy_text_and_arrive_while_generating(gguf, photos, name):
    backend = gguf(name)
    assert backend.supports_streaming and backend.sampling_fields == frozenset(
        (*SAMPLING_FIELDS, *WINDOW_FIELDS, *TOKEN_FIELDS, *OUTPUT_FIELDS))
    plain = backend.generate([_request(photos, 48)])[0]
    assert plain.finish_reason in ("stop", "length")
    pieces: list[str] = []
    times: list[float] = []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        times.append(time.perf_counter())

    streamed = backend.generate_stream(_request(photos, 48), on_text=on_text)
    ended = time.perf_counter()
    assert "".join(pieces) == streamed.text == plain.text
    assert streamed.token_ids == plain.token_ids and streamed.finish_reason == plain.finish_reason
    assert streamed.prompt_tokens == plain.prompt_tokens
    # Token by token, not once at the end: many calls, the first well before generation ended.
    assert len(pieces) > 1 and all(pieces)
    assert times[0] < times[-1] <= ended
    assert len({round(t, 6) for t in times}) > 1


def _first_piece_token(backend, tokens: list[int]) -> int:
    """How many greedy tokens pass before the first piece of text can be shown."""
    from refsight.backends.llamacpp.generation import TextStream

    seen: list[str] = []
    stream = TextStream((), seen.append)
    for i, token in enumerate(tokens):
        stream.add(backend.runtime.piece(token))
        if seen:
            return i + 1
    return len(tokens)


@pytest.mark.parametrize("name", [QWEN, SMOL])
def test_a_set_stop_event_ends_the_token_loop_within_a_token(gguf, photos, name):
    backend = gguf(name)
    greedy = backend.generate([_request(photos, 200)])[0]
    stop = threading.Event()
    seen: list[str] = []

    def on_text(piece: str) -> None:
        seen.append(piece)
        stop.set()  # the caller "leaves" after the first piece

    cancelled = backend.generate_stream(_request(photos, 200), on_text=on_text, stop_event=stop)
    assert cancelled.finish_reason == "cancelled"
    assert len(cancelled.token_ids) <= _first_piece_token(backend, greedy.token_ids) + 2
    assert cancelled.token_ids == greedy.token_ids[: len(cancelled.token_ids)]
    assert "".join(seen) == cancelled.text and greedy.text.startswith(cancelled.text)
    # Set before the call: nothing is generated.
    assert backend.generate_stream(_request(photos), on_text=seen.append, stop_event=stop).token_ids == []


def test_seeded_sampling_repeats_and_seeds_differ(gguf, photos):
    backend = gguf(QWEN)

    def text(seed: int) -> str:
        return backend.generate([_request(photos, 12, temperature=1.0, seed=seed)])[0].text

    assert text(1) == text(1)
    assert len({text(1), text(2), text(3)}) > 1
    # A seeded stream is the same draw as the seeded generate.
    pieces: list[str] = []
    assert backend.generate_stream(_request(photos, 12, temperature=1.0, seed=5), on_text=pieces.append).text == text(5)
    assert "".join(pieces) == text(5)


def test_a_tiny_top_p_keeps_only_the_greedy_token(gguf, photos):
    backend = gguf(QWEN)
    greedy = backend.generate([_request(photos, 16)])[0].token_ids
    assert backend.generate([_request(photos, 16, temperature=1.0, top_p=1e-6, seed=3)])[0].token_ids == greedy


@pytest.mark.parametrize("penalties", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                                       {"frequency_penalty": 0.5, "presence_penalty": -1.0}])
def test_penalties_follow_the_openai_formula(gguf, photos, penalties):
    backend = gguf(SMOL)  # its greedy answer repeats itself, so penalties matter
    out = backend.generate([_request(photos, 24, **penalties)], return_logits=True)[0]
    logits = out.logits.numpy()
    freq, presence = penalties.get("frequency_penalty", 0.0), penalties.get("presence_penalty", 0.0)
    for step, token in enumerate(out.token_ids):
        counts = np.bincount(np.array(out.token_ids[:step], dtype=np.int64), minlength=logits.shape[1]).astype(np.float32)
        expected = logits[step] - freq * counts - presence * (counts > 0)
        assert token == int(np.argmax(expected)), step
    assert out.token_ids != backend.generate([_request(photos, 24)])[0].token_ids or presence < 0


@pytest.mark.parametrize("name", [QWEN, SMOL])
def test_a_stop_string_cuts_the_text_streamed_or_not(gguf, photos, name):
    backend = gguf(name)
    greedy = backend.generate([_request(photos, 48)])[0].text
    # A stop string from the middle of the greedy answer (spanning tokens, no replacement characters).
    start = next(i for i in range(len(greedy) // 3, len(greedy) - 3) if "\ufffd" not in greedy[i:i + 3])
    stop = greedy[start:start + 3]
    expected = greedy[: greedy.find(stop)]
    plain = backend.generate([_request(photos, 48, stop=(stop,))])[0]
    assert plain.text == expected and plain.finish_reason == "stop"
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(photos, 48, stop=(stop,)), on_text=pieces.append)
    assert "".join(pieces) == streamed.text == expected and streamed.finish_reason == "stop"
    assert len(streamed.token_ids) < 48


def test_engine_chat_streams_and_samples_on_llama_cpp(tmp_path, gguf, photos):
    from refsight import Engine
    from refsight.errors import InvalidInputError

    gguf(QWEN)
    with Engine(tmp_path / "store", model=QWEN) as engine:
        engine.add(photos["chelsea"].image, ref_id="cat")
        from refsight import ReferenceSegment

        segments = ["Reference:", ReferenceSegment("cat"), "Describe it."]
        plain = engine.chat(segments, max_new_tokens=12)
        pieces: list[str] = []
        streamed = engine.chat(segments, max_new_tokens=12, on_text=pieces.append)
        assert "".join(pieces) == streamed.text == plain.text and len(pieces) > 1
        # Every field is honoured (none refused): penalties and a seeded draw repeat.
        sampling = Sampling(temperature=1.0, top_p=0.9, seed=11, frequency_penalty=1.0, presence_penalty=0.5)
        once = engine.chat(segments, max_new_tokens=12, sampling=sampling)
        assert engine.chat(segments, max_new_tokens=12, sampling=sampling).text == once.text
        with pytest.raises(InvalidInputError):
            engine.chat(segments, max_new_tokens=12, sampling=Sampling(frequency_penalty=3.0))
