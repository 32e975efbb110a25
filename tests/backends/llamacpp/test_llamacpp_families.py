"""More families as built-in GGUFs: cached == llama.cpp's own pixel path, prefix states valid, for each.

Gemma 3, InternVL, Mistral 3, LFM2-VL, Llama 4, GLM-4.1V, MiniCPM-V 4.6, the hybrids Qwen3.5 and
Qwen3.5-MoE (Gated DeltaNet layers: their recurrent and convolution states are part of the sequence
state saved after the references) and Gemma 4 (per-layer inputs, KV-shared layers) (tiny random
checkpoints of the transformers tiny-family recipes, converted with llama.cpp's converter:
:mod:`refsight.builtin_models.gguf_families`), and Gemma 3 quantized to Q4_K_M with llama.cpp's
quantizer. With Qwen2-VL, Qwen2.5-VL, SmolVLM (test_llamacpp_equivalence.py,
test_llamacpp_prefix_cache.py) and Qwen3-VL (test_llamacpp_qwen3vl.py) that is fourteen model types.

For each model, the method of those tests: (a) references encoded here, stored, and replayed
from their packages in a NEW process beside a fresh candidate, against (b) llama.cpp on its
own (real bitmaps, ``mtmd_helper_eval_chunks``, argmax decoding) on the family's prompt,
written here independently: identical greedy tokens, logits max |Δ| exactly 0, with one and
two references; the references never reach the encoder. And the judge's reference prefix:
its KV state built here and restored from disk in a new process gives the tokens and logits
of evaluating the prefix. Every model is loaded once per process (the registry keeps it).
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_models import require_llama_cpp
from llama_workers import pixel_path_rows, stored_proofs

require_llama_cpp()

from _llamacpp_prefix_worker import judge_request, run  # noqa: E402

_CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
#: Each family's prompt, written from its real chat template, independently of refsight's prompt code.
PROMPTS = {
    "tiny-gemma3-gguf": "<bos><start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
    "tiny-internvl-gguf": _CHATML,
    "tiny-mistral3-gguf": "<s>[INST]{}[/INST]",
    "tiny-lfm2-vl-gguf": "<|startoftext|><|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
    "tiny-llama4-gguf": "<|begin_of_text|><|header_start|>user<|header_end|>\n\n{}<|eot|>"
                        "<|header_start|>assistant<|header_end|>\n\n",
    "tiny-glm4v-gguf": "[gMASK]<sop><|user|>\n{}<|assistant|>\n",
    "tiny-minicpmv4-6-gguf": _CHATML,
    "tiny-qwen3.5-gguf": _CHATML,
    "tiny-qwen3.5-moe-gguf": _CHATML,
    "tiny-gemma4-gguf": "<bos><|turn>user\n{}<turn|>\n<|turn>model\n",
}
#: A family quantized with llama.cpp's quantizer (its f16 conversion, then Q4_K_M), beside its f16 mmproj.
QUANTIZED = {"tiny-gemma3-gguf-q4": "tiny-gemma3-gguf"}
MODELS = (*PROMPTS, *QUANTIZED)
REFS = ("chelsea", "coffee")
CANDIDATE = "rocket"
RUBRICS = ("same colour", "a round shape")
MAX_NEW_TOKENS = 4


def prompt(name: str) -> str:
    return PROMPTS[QUANTIZED.get(name, name)]


@pytest.fixture(scope="module")
def proofs(gguf, photos, tmp_path_factory):
    """Per model: packages stored and prefix states built here (with and without the cache); then
    one new process replays every model's packages, and another every model's prefix states, from disk."""
    return stored_proofs(
        gguf, photos, tmp_path_factory.mktemp("llama-families"), MODELS, n_refs=(1, 2), refs=REFS,
        candidate=CANDIDATE, rubrics=RUBRICS, max_new_tokens=MAX_NEW_TOKENS,
    )


@pytest.mark.parametrize("name", MODELS)
def test_the_prompt_written_here_is_the_ggufs_own_template(gguf, name):
    backend = gguf(name)
    assert backend.prompt_text(["Hello"]) == prompt(name).format("Hello")


@pytest.mark.parametrize("n_refs", (1, 2))
@pytest.mark.parametrize("name", MODELS)
def test_cached_path_from_disk_equals_llama_cpps_pixel_path(proofs, gguf, photos, name, n_refs):
    _, cached, _ = proofs
    backend = gguf(name)
    fresh = pixel_path_rows(backend, prompt(name), photos, REFS[:n_refs], CANDIDATE, MAX_NEW_TOKENS)
    got = cached[f"{name}/{n_refs}"]
    assert len(got["rows"]) == len(fresh) == 2
    for row, (tokens, logits) in zip(got["rows"], fresh, strict=True):
        assert row["tokens"] == tokens
        assert tuple(row["logits"].shape) == logits.shape
        assert np.abs(row["logits"].numpy() - logits).max() == 0.0
        assert row["random_weights"] is True
    # Only the candidate reached the vision encoder (once per prompt).
    assert got["encode_calls"] == 2 * len(backend.encode([photos[CANDIDATE]])[0].tensors)


@pytest.mark.parametrize("name", MODELS)
def test_prefix_states_are_valid_here_and_from_disk(proofs, name):
    here, _, prefix = proofs
    for plain, cached, loaded in zip(here[name]["plain"], here[name]["cached"], prefix[name], strict=True):
        assert plain["tokens"] == cached["tokens"] == loaded["tokens"]
        assert (plain["logits"] - cached["logits"]).abs().max().item() == 0.0
        assert (plain["logits"] - loaded["logits"]).abs().max().item() == 0.0
        assert plain["prompt_tokens"] == loaded["prompt_tokens"]
        # In the new process: the state restored, only what follows the prefix evaluated.
        assert loaded["restores"] == 1 and loaded["cached_tokens"] > 0
        assert loaded["decoded"] == loaded["prompt_tokens"] - loaded["cached_tokens"]
        assert loaded["image_decodes"] == loaded["encodes"] == plain["encodes"]  # the candidate's only
    assert here[name]["cached"][0]["restores"] == 0 and here[name]["cached"][1]["restores"] == 1


@pytest.mark.parametrize("name", MODELS)
def test_fresh_references_give_the_same_tokens_and_logits_as_cached(gguf, photos, name):
    """``use_cache=False`` hands references over as images: the same answer as their packages."""
    from refsight.requests import GenerationRequest

    backend = gguf(name)
    packages = backend.encode([photos[r] for r in REFS])
    cached = backend.generate([GenerationRequest([*packages, "Same as", photos[CANDIDATE], "?"], max_new_tokens=4)],
                              return_logits=True)[0]
    fresh = backend.generate([GenerationRequest([*[photos[r] for r in REFS], "Same as", photos[CANDIDATE], "?"],
                                                max_new_tokens=4)], return_logits=True)[0]
    assert cached.token_ids == fresh.token_ids
    assert (cached.logits - fresh.logits).abs().max().item() == 0.0


def test_the_quantized_family_is_quantized_beside_its_f16_mmproj(gguf):
    for name, base in QUANTIZED.items():
        backend = gguf(name)
        assert backend.runtime.meta("general.file_type") == "15"  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        assert backend.arch == gguf(base).arch


def test_gemma4_reuses_no_state_past_its_sliding_window(gguf, photos, tmp_path):
    """Six references reach past Gemma 4's window: no state is saved or restored, the answer is the plain path's."""
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend = gguf("tiny-gemma4-gguf")
    packages = backend.encode([photos[r] for r in (*REFS, "astronaut")]) * 2
    plain = run(backend, judge_request(packages, photos[CANDIDATE], RUBRICS[0], None))
    assert plain["prompt_tokens"] > int(backend.runtime.meta("gemma4.attention.sliding_window")) == 512
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        for _ in range(2):
            got = run(backend, judge_request(packages, photos[CANDIDATE], RUBRICS[0], cache))
            assert got["restores"] == 0 and got["cached_tokens"] == 0
            assert got["tokens"] == plain["tokens"]
            assert (got["logits"] - plain["logits"]).abs().max().item() == 0.0
        assert not list((tmp_path / "store" / "prefixes").rglob("*.safetensors"))
