"""``generate_stream`` relays vLLM's own token stream; sampling fields reach vLLM.

On the real tiny Qwen2-VL server (the one the other files use): the streamed deltas
join to exactly the non-streamed greedy text, arriving in more than one piece; a stop
event set after the first delta closes the connection (vLLM aborts the request) and
the next request is served; a seed makes a sampled answer repeatable and another
seed changes it; stop strings cut the text; prompt and image token counts come from
vLLM's usage and the package's grid.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from refsight.backends.hf.grid import merge_size

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def backend(vllm_servers):
    from refsight.backends.registry import get_backend

    server = vllm_servers.get(MODEL, 8)
    backend = get_backend(f"vllm:{server.url}")
    backend.server = server
    # Not closed here: get_backend caches it (and its encoder) for the whole session, and the
    # next module asking for this server gets the same object.
    return backend


@pytest.fixture(scope="module")
def package(backend, photos):
    return backend.encode([photos["chelsea"]])[0]


def _request(package, max_new_tokens=MAX_NEW_TOKENS, **sampling):
    from refsight.backends.base import Sampling
    from refsight.requests import GenerationRequest

    return GenerationRequest(
        ["Describe", package, " in detail."], max_new_tokens=max_new_tokens, sampling=Sampling(**sampling)
    )


@pytest.fixture(scope="module")
def greedy(backend, package):
    return backend.generate([_request(package)])[0]


def test_streamed_deltas_join_to_the_greedy_text(backend, package, greedy):
    assert backend.supports_streaming
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(package), on_text=pieces.append)
    assert greedy.text and len(greedy.token_ids) > 1
    assert "".join(pieces) == streamed.text == greedy.text
    assert len(pieces) > 1, pieces
    assert streamed.token_ids == greedy.token_ids
    assert streamed.finish_reason == greedy.finish_reason
    assert greedy.finish_reason in ("stop", "length")
    assert greedy.finish_reason == ("length" if len(greedy.token_ids) == MAX_NEW_TOKENS else "stop")


def test_prompt_and_image_token_counts(backend, package, greedy):
    grid = [int(x) for x in package.metadata["image_grid_thw"]]
    image_tokens = math.prod(grid) // merge_size(backend.encoder) ** 2
    assert greedy.image_tokens == [image_tokens]
    assert greedy.prompt_tokens > image_tokens
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(package), on_text=pieces.append)
    assert (streamed.prompt_tokens, streamed.image_tokens) == (greedy.prompt_tokens, greedy.image_tokens)


def test_stop_event_after_the_first_delta_ends_the_stream(backend, package):
    url = backend.server.url
    # A race on a loaded 2-core machine: vLLM's engine may finish all 3000 tokens before its
    # API process has sent the first delta, and then nothing is left to abort and the attempt
    # proves nothing. So an attempt that generated them all is made again, three times at most.
    for _ in range(3):
        stop = threading.Event()
        pieces: list[str] = []

        def on_text(piece: str) -> None:
            pieces.append(piece)
            stop.set()

        generated_before = _metric(url, GENERATED)
        began = time.monotonic()
        # Long enough that vLLM is still generating when the connection closes.
        result = backend.generate_stream(_request(package, max_new_tokens=3000), on_text=on_text, stop_event=stop)
        elapsed = time.monotonic() - began
        assert result.finish_reason == "cancelled"
        assert pieces and result.text == "".join(pieces)
        assert len(result.token_ids) < 3000
        assert elapsed < 30
        generated = _once_idle(url)
        if generated < generated_before + 3000:
            break  # vLLM saw the client go away and aborted the request
    else:
        pytest.fail("vLLM generated all 3000 tokens after the client went away, three times: it never aborted")
    # Nothing runs for that request any more: no token is generated after it was aborted.
    time.sleep(1.0)
    assert _metric(url, GENERATED) == generated
    # The next request is served as usual.
    assert backend.generate([_request(package, max_new_tokens=4)])[0].token_ids


GENERATED = "vllm:generation_tokens_total{"


def _once_idle(url: str, timeout: float = 60.0) -> float:
    """vLLM's generated-token count once it runs no request (at most ``timeout`` seconds on)."""
    deadline = time.monotonic() + timeout
    while _metric(url, "vllm:num_requests_running{") != 0:
        assert time.monotonic() < deadline, f"vLLM still runs a request {timeout:g} s after its client went away"
        time.sleep(0.2)
    return _metric(url, GENERATED)


def _metric(url: str, prefix: str) -> float:
    """The sum of vLLM's Prometheus samples (``/metrics``) whose line starts with ``prefix``."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_stop_event_already_set_sends_nothing(backend, package):
    stop = threading.Event()
    stop.set()
    result = backend.generate_stream(_request(package), on_text=lambda piece: None, stop_event=stop)
    assert (result.text, result.finish_reason) == ("", "cancelled")


def test_a_seed_repeats_a_sampled_answer_and_another_seed_changes_it(backend, package):
    def sampled(seed):
        return backend.generate([_request(package, temperature=1.0, seed=seed)])[0].token_ids

    first, again, other = sampled(7), sampled(7), sampled(8)
    assert first == again
    assert first != other
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(package, temperature=1.0, seed=7), on_text=pieces.append)
    assert streamed.token_ids == first


def test_stop_strings_cut_the_text(backend, package, greedy):
    text = greedy.text
    start = next(i for i in range(len(text) // 3, len(text)) if not text[i].isspace())
    stop = text[start:start + 2]
    expected = text[: text.find(stop)]
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(package, stop=(stop,)), on_text=pieces.append)
    plain = backend.generate([_request(package, stop=(stop,))])[0]
    assert plain.text == streamed.text == "".join(pieces) == expected
    assert plain.finish_reason == streamed.finish_reason == "stop"


def test_a_conversation_goes_as_messages_and_cached_equals_pixels(backend, package, photos):
    """System, user (with the image), assistant and user turns: from the package == from vLLM's pixel path."""
    from refsight.requests import GenerationRequest

    turns = [("system", 1), ("user", 2), ("assistant", 1), ("user", 1)]

    def ask(image):
        segments = ["You compare animals.", image, "What is it?", "A cat.", "Are you sure?"]
        return backend.generate([GenerationRequest(segments, max_new_tokens=8, turns=turns)])[0]

    assert backend.supports_turns
    cached, pixels = ask(package), ask(photos["chelsea"])
    assert cached.token_ids == pixels.token_ids and cached.text == pixels.text
    one_turn = backend.generate([GenerationRequest(["Describe", package, " in detail."], max_new_tokens=4)])[0]
    assert cached.prompt_tokens > one_turn.prompt_tokens  # the other turns reached the template


def test_a_final_assistant_turn_is_continued_by_vllm_cached_and_pixels_alike(backend, package, photos):
    """Issue 51: ``prompt_end="continue"`` goes to vLLM as its ``continue_final_message`` (``add_generation_prompt``
    false): the prompt is the open turn's, the same from the package as from vLLM's pixel path."""
    from refsight.requests import GenerationRequest

    turns = [("user", 2), ("assistant", 1)]

    def ask(image, prefill="It is a", end="continue"):
        return backend.generate([GenerationRequest([image, "What is it?", prefill], max_new_tokens=6, turns=turns,
                                                   prompt_end=end)])[0]

    cached, pixels = ask(package), ask(photos["chelsea"])
    assert cached.token_ids == pixels.token_ids and cached.prompt_tokens == pixels.prompt_tokens
    closed = ask(package, end="generation_prompt")  # the assistant turn closed, another one opened
    assert closed.prompt_tokens > cached.prompt_tokens


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=1e-300, seed=1), dict(temperature=1e-40, seed=2), dict(temperature=1e-12, seed=3),
     dict(temperature=2.0, top_p=1e-300, seed=4), dict(temperature=2.0, top_p=5e-324, seed=5)],
    ids=lambda s: ",".join(f"{k}={v:g}" for k, v in s.items()),
)
def test_tiny_temperatures_and_top_p_decode_greedily(backend, package, greedy, sampling):
    """Issue 25, item 3: every value Sampling accepts works; these are greedy decoding, streamed or not."""
    assert backend.generate([_request(package, **sampling)])[0].token_ids == greedy.token_ids
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(package, **sampling), on_text=pieces.append)
    assert streamed.token_ids == greedy.token_ids and "".join(pieces) == streamed.text == greedy.text


def test_broken_schemas_are_refused_by_path_before_anything_is_sent(backend, package):
    """Issue 25, item 4: the shared check runs before the request leaves (vLLM sees nothing)."""
    from refsight.requests import GenerationRequest
    from refsight.errors import InvalidInputError
    from schema_cases import BROKEN

    sent = _metric(backend.server.url, "vllm:request_success_total{")
    for schema, path in BROKEN:
        with pytest.raises(InvalidInputError) as info:
            backend.generate([GenerationRequest(["Describe", package], max_new_tokens=4, json_schema=schema)])
        assert info.value.input == path, str(info.value)
    assert _metric(backend.server.url, "vllm:request_success_total{") == sent
    assert backend.generate([_request(package, max_new_tokens=4)])[0].token_ids  # still serving
