"""Qwen3-VL as a GGUF (deepstack features, interleaved M-RoPE): cached == llama.cpp's own pixel path, prefix states valid.

``tiny-qwen3-vl-gguf`` has the transformers tiny model's vision tower (two deepstack
layers) and a three-layer language model: llama.cpp's qwen3vl graph cannot have its last
layer be a deepstack layer (see the model's definition in
:mod:`refsight.builtin_models.gguf`). Packages carry the deepstack features beside the
main embedding (``n_embd_inp = n_embd x (1 + deepstack layers)``), so a cached reference
replays all of them.
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_models import PROMPTS, require_llama_cpp
from llama_workers import pixel_path_rows, stored_proofs

require_llama_cpp()

MODEL = "tiny-qwen3-vl-gguf"
REFS = ("chelsea", "coffee")
CANDIDATE = "rocket"
RUBRICS = ("same colour", "a round shape")
MAX_NEW_TOKENS = 6


def test_packages_hold_the_deepstack_features_beside_the_embedding(gguf, photos):
    backend = gguf(MODEL)
    n_embd = int(backend.runtime.meta("qwen3vl.embedding_length"))
    assert backend.arch == "qwen3vl"
    assert backend.runtime.n_embd_inp == n_embd * (1 + 2)  # two deepstack layers
    (package,) = backend.encode([photos[REFS[0]]])
    assert all(t.shape[-1] == backend.runtime.n_embd_inp for t in package.tensors.values())


@pytest.fixture(scope="module")
def from_disk(gguf, photos, tmp_path_factory):
    """Packages stored and prefix states built here; a new process replays both from disk."""
    here, cached, prefix = stored_proofs(
        gguf, photos, tmp_path_factory.mktemp("llama-qwen3vl"), (MODEL,), n_refs=(len(REFS),), refs=REFS,
        candidate=CANDIDATE, rubrics=RUBRICS, max_new_tokens=MAX_NEW_TOKENS,
    )
    return here[MODEL], cached[f"{MODEL}/{len(REFS)}"], prefix[MODEL]


def test_cached_path_from_disk_equals_llama_cpps_pixel_path(from_disk, gguf, photos):
    _, cached, _ = from_disk
    backend = gguf(MODEL)
    chatml = PROMPTS["tiny-qwen2-vl-gguf"]  # Qwen3-VL keeps Qwen2-VL's ChatML prompt
    fresh = pixel_path_rows(backend, chatml, photos, REFS, CANDIDATE, MAX_NEW_TOKENS)
    for got, (tokens, logits) in zip(cached["rows"], fresh, strict=True):
        assert got["tokens"] == tokens
        assert np.abs(got["logits"].numpy() - logits).max() == 0.0
    assert cached["encode_calls"] == 2 * len(backend.encode([photos[CANDIDATE]])[0].tensors)  # the candidate only


def test_prefix_states_are_valid_here_and_from_disk(from_disk):
    here, _, prefix = from_disk
    for plain, cached, loaded in zip(here["plain"], here["cached"], prefix, strict=True):
        assert plain["tokens"] == cached["tokens"] == loaded["tokens"]
        assert (plain["logits"] - cached["logits"]).abs().max().item() == 0.0
        assert (plain["logits"] - loaded["logits"]).abs().max().item() == 0.0
        assert loaded["restores"] == 1 and loaded["decoded"] == loaded["prompt_tokens"] - loaded["cached_tokens"]
    assert here["cached"][1]["restores"] == 1
