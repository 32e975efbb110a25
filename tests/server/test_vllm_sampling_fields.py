"""vLLM's own sampling fields through refsight's server on the vLLM backend (real vLLM, the openai SDK).

``top_k``, ``min_p`` and ``repetition_penalty`` reach vLLM: ``top_k: 1`` and ``min_p: 1`` make a
sampled answer the greedy one, and a repetition penalty gives vLLM's tokens exactly what the same
weights give on transformers with transformers' own rule.
"""

from __future__ import annotations

import openai
import pytest

from live_server import LiveServer, data_url, photo_png
from refsight.server import ServerConfig, create_app

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"


@pytest.fixture(scope="module")
def live(vllm_servers, tmp_path_factory) -> LiveServer:
    server = vllm_servers.get(MODEL, 8)
    app = create_app(ServerConfig(store=tmp_path_factory.mktemp("vllm-fields"), model=f"vllm:{server.url}", keys={}))
    live = LiveServer(app).start()
    yield live
    live.stop()


def _ask(live: LiveServer, **fields):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                             {"type": "image_url", "image_url": {"url": data_url(photo_png())}}]}]
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=300)
    reply = client.chat.completions.create(messages=messages, model=live.service.model, max_tokens=16, extra_body=fields)
    return reply.choices[0].message.content


def test_top_k_and_min_p_reach_vllm(live):
    greedy = _ask(live)
    sampled = {_ask(live, temperature=1.5, seed=seed) for seed in (1, 2, 3)}
    assert sampled != {greedy}  # sampling at this temperature moves away from the greedy answer...
    for seed in (1, 2, 3):  # ...unless top_k 1 or min_p 1 keep only the most likely token
        assert _ask(live, temperature=1.5, seed=seed, top_k=1) == greedy
        assert _ask(live, temperature=1.5, seed=seed, min_p=1.0) == greedy
    assert _ask(live, top_k=-1) == greedy  # vLLM's "no limit"


def test_repetition_penalty_reaches_vllm_with_transformers_meaning(live):
    from refsight.backends.base import Sampling
    from refsight.requests import GenerationRequest

    backend = live.service.engine.backend()
    encoder = backend.encoder
    image = live.in_pool(live.service.decode, photo_png(), "image")
    # Each runtime its own package of the image (the vLLM server encodes pixels: its packages are
    # pixel packages, keyed apart from the transformers encoder's features).
    packages = {id(backend): backend.encode([image])[0], id(encoder): encoder.encode([image])[0]}

    def tokens(on, penalty):
        request = GenerationRequest(["Describe", packages[id(on)]], max_new_tokens=16,
                                    sampling=Sampling(repetition_penalty=penalty))
        return on.generate([request])[0].token_ids

    assert tokens(backend, 1.0) == tokens(encoder, 1.0)  # the same weights, the same greedy tokens
    assert tokens(backend, 1.8) == tokens(encoder, 1.8)
