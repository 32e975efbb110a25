"""Every family vLLM serves, not only Qwen: source-pixel packages, uuid references, the connector across a restart.

For every tiny family in ``FAMILIES`` (``tiny-<family>-vllm``: the generic backend's recipes with
text heads of 32 for vLLM's CPU attention; the hybrid Gated DeltaNet language models of Qwen3.5,
Qwen3.5-MoE and MiniCPM-V 4.6 served in bfloat16, the only dtype vLLM's CPU kernel takes, with vLLM's
own hybrid prefix cache on) on a real vLLM server running refsight's encoder-cache connector on a
fresh store:

- refsight's packages are *source pixels* (the decoded image, not resized: the family's
  processor inside vLLM resizes, crops and tiles by its own rules), the references travel
  by uuid (pixels + uuid the first time, uuid-only the second), the candidate as pixels;
- greedy tokens equal vLLM's all-pixels path (every image sent straight to the server as a
  PNG by code independent of refsight's), and the first step's top log-probabilities agree too;
- the connector saved the references' encoder outputs; after a restart on the same store the
  new server loads them and never encodes them, and the tokens do not change.

One server per family and its restart (the session pool, keyed by store); a few tokens each. While one
family runs, the next families' servers start (``prefetch``): a start is mostly one core importing vLLM.
Qwen2-VL, Qwen2.5-VL and Qwen3-VL are proven by the other files of this folder (20 model types in all).
"""

from __future__ import annotations

import re

import pytest

from vllm_helpers import params_after, png_url, post_chat, served_model

pytestmark = pytest.mark.vllm

#: model name -> its transformers family (the encoder side's ``family``).
FAMILIES = {
    "tiny-gemma3-vllm": "gemma3",
    "tiny-llava-vllm": "llava",
    "tiny-internvl-vllm": "internvl",
    "tiny-mistral3-vllm": "mistral3",
    "tiny-smolvlm-vllm": "smolvlm",
    "tiny-llava-next-vllm": "llava_next",
    "tiny-llava-onevision-vllm": "llava_onevision",
    "tiny-qwen3.5-vllm": "qwen3_5",
    "tiny-qwen3.5-moe-vllm": "qwen3_5_moe",
    "tiny-qwen3-vl-moe-vllm": "qwen3_vl_moe",
    "tiny-glm4v-vllm": "glm4v",
    "tiny-glm4v-moe-vllm": "glm4v_moe",
    "tiny-paddleocr-vl-vllm": "paddleocr_vl",
    "tiny-exaone4-5-vllm": "exaone4_5",
    "tiny-idefics3-vllm": "idefics3",
    "tiny-minicpmv4-6-vllm": "minicpmv4_6",
    "tiny-gemma4-vllm": "gemma4",
}
#: The families whose server is also restarted on the same store (the connector is family-independent
#: code; two families, one tiled and one hybrid, keep CI's vLLM step short: each start is 35-45 s on 2 cores).
RESTARTED = ("tiny-smolvlm-vllm", "tiny-qwen3.5-vllm")
REFS = ("chelsea", "coffee")
CANDIDATE = "rocket"
MAX_NEW_TOKENS = 4
_EVENT = re.compile(r"refsight encoder cache: (encoded|loaded) ([\w-]+)")


def _events(server, kind: str) -> list[str]:
    return [m.group(2) for m in _EVENT.finditer(server.log.read_text()) if m.group(1) == kind]


def _segments(references, candidate) -> list:
    return [references[0], "Reference one.", references[1], "Reference two. The candidate:", candidate, "Same?"]


def _plain(url: str, row: list, top: int = 5) -> tuple[list[int], list[dict[str, float]]]:
    """vLLM's all-pixels path, no refsight code: every image a PNG, no uuid. Tokens and the first step's top log-probs."""
    parts = [
        {"type": "text", "text": item} if isinstance(item, str) else {"type": "image_url", "image_url": {"url": png_url(item)}}
        for item in row
    ]
    body = {
        "model": served_model(url), "messages": [{"role": "user", "content": parts}], "max_tokens": MAX_NEW_TOKENS,
        "temperature": 0.0, "return_token_ids": True, "logprobs": True, "top_logprobs": top,
        "return_tokens_as_token_ids": True,
    }
    choice = post_chat(url, body)["choices"][0]
    first = {item["token"]: item["logprob"] for item in choice["logprobs"]["content"][0]["top_logprobs"]}
    return choice["token_ids"], first


def _ask(server, photos):
    """Through a new ``vllm:`` backend: the references' packages, two generations (pixels + uuid, then uuid-only)."""
    from refsight.requests import GenerationRequest
    from refsight.backends.vllm.loading import load_vllm_backend
    from refsight.backends.vllm.pixels import reference_uuid

    backend = load_vllm_backend(f"vllm:{server.url}")
    try:
        references = backend.encode([photos[n] for n in REFS])
        request = GenerationRequest(_segments(references, photos[CANDIDATE]), max_new_tokens=MAX_NEW_TOKENS, prefix_segments=3)
        first = backend.generate([request], return_logits=True)[0]
        second = backend.generate([request])[0]
        return {
            "family": backend.encoder.family, "pixel_kind": backend.pixel_kind, "references": references,
            "uuids": [reference_uuid(r.key) for r in references], "first": first, "second": second,
            "stats": backend.uuid_stats(),
        }
    finally:
        backend.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A fresh store per family, made up front so that the next families' servers can start early."""
    return {name: tmp_path_factory.mktemp(f"vllm-{name}") / "store" for name in FAMILIES}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_run(request, vllm_servers, stores, photos):
    """One family: its server on a fresh store (asked through refsight, then straight), stopped, restarted, asked again."""
    name = request.param
    store = stores[name]
    server = vllm_servers.get(name, 8, store)
    for later in params_after(request, FAMILIES)[:vllm_servers.ahead]:
        vllm_servers.prefetch(later, 8, stores[later])
    run = _ask(server, photos)
    row = [photos[n].image for n in REFS]
    run["plain"] = _plain(server.url, _segments(row, photos[CANDIDATE].image))
    run["encoded"] = _events(server, "encoded")
    run.update(name=name, store=store)
    if name in RESTARTED:
        vllm_servers.stop(server)
        again = vllm_servers.get(name, 8, store)  # a new process on the same store
        run["restarted"] = _ask(again, photos)
        run["restart_encoded"], run["restart_loaded"] = _events(again, "encoded"), _events(again, "loaded")
    return run


def test_references_by_uuid_give_the_all_pixels_paths_tokens(family_run):
    tokens, first_step = family_run["plain"]
    assert family_run["family"] == FAMILIES[family_run["name"]]
    assert tokens and family_run["first"].token_ids == tokens
    assert family_run["second"].token_ids == tokens
    # The first step's log-probabilities agree with the all-pixels path's (refsight's are ``return_logits``).
    logits = family_run["first"].logits[0]
    for token, logprob in first_step.items():
        assert float(logits[int(token.split(":", 1)[1])]) == pytest.approx(logprob, abs=1e-4)
    # The references went with pixels + uuid once, then by uuid alone; the candidate always as pixels.
    assert family_run["stats"] == {"uuid_only": 2, "with_pixels": 2, "cache_miss_retries": 0}


def test_packages_are_the_decoded_images(family_run, photos):
    import numpy as np

    from refsight.backends.vllm.pixels import SOURCE_PIXELS

    assert family_run["pixel_kind"] == SOURCE_PIXELS
    for package, name in zip(family_run["references"], REFS):
        assert np.array_equal(package.tensors["pixels"].numpy(), np.array(photos[name].image))
        assert package.fingerprint.preprocessing["package"] == SOURCE_PIXELS
        assert package.metadata["num_tokens"] > 0
    generation = family_run["first"]
    assert generation.image_tokens[:2] == [p.metadata["num_tokens"] for p in family_run["references"]]
    assert len(generation.image_tokens) == 3 and generation.random_weights


def test_the_connector_saves_the_references_encoder_outputs(family_run):
    uuids = family_run["uuids"]
    assert set(uuids) <= set(family_run["encoded"])  # the server encoded and saved them
    assert len(list((family_run["store"] / "vllm-encoder").rglob("*.safetensors"))) == len(uuids)


@pytest.mark.parametrize("family_run", RESTARTED, indirect=True)
def test_the_connector_serves_the_references_after_a_restart(family_run):
    uuids = family_run["uuids"]
    restarted = family_run["restarted"]
    assert [r.key for r in restarted["references"]] == [r.key for r in family_run["references"]]
    assert set(uuids) <= set(family_run["restart_loaded"])
    assert not set(uuids) & set(family_run["restart_encoded"])  # vLLM's encoder ran for the candidate only
    assert restarted["first"].token_ids == restarted["second"].token_ids == family_run["plain"][0]
