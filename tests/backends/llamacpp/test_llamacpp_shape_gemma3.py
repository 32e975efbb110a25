"""``shape-gemma3-4b-gguf``'s conversion, proven at a tiny size: a Gemma 3 whose vocabulary is wider than its tokenizer.

The real-shape benchmark model (``shape-gemma3-4b-gguf-q4``: ~8 GB to build, so never in CI) keeps
Gemma 3's 262,208 embedding rows beside refsight's small stand-in tokenizer. llama.cpp's converter
cuts the embedding down to the tokenizer's size while the GGUF's vocabulary keeps the padded size,
and llama.cpp then refuses the file (``token_embd.weight`` has wrong shape). The shape's recipe
carries the fix (``converter_patch``); here it converts the tiny Gemma 3 widened to 1,024 rows, and
the file loads with every row and answers about an image, cached == fresh.
"""

from __future__ import annotations

from dataclasses import replace

from llama_models import require_llama_cpp

require_llama_cpp()

WIDE_VOCABULARY = 1024


def test_a_gemma3_wider_than_its_tokenizer_converts_with_every_embedding_row(monkeypatch, tmp_path, model_cache, photos):
    from refsight.requests import GenerationRequest
    from refsight.backends.registry import get_backend
    from refsight.builtin_models import gguf_families
    from refsight.builtin_models.gguf_converter import MMPROJ_FILE, MODEL_FILE

    shape, tiny = gguf_families.FAMILY_GGUFS["shape-gemma3-4b-gguf-f16"], gguf_families.FAMILY_GGUFS["tiny-gemma3-gguf"]
    assert shape.renames == tiny.renames and shape.converter_patch  # the shape converts as the tiny one, plus the fix
    wide = replace(tiny, recipe={**tiny.recipe, "vocab_size": WIDE_VOCABULARY}, converter_patch=shape.converter_patch)
    monkeypatch.setitem(gguf_families.FAMILY_GGUFS, "tiny-gemma3-wide-gguf", wide)
    gguf_families.build_family_gguf("tiny-gemma3-wide-gguf", tmp_path)

    backend = get_backend(f"llamacpp:{tmp_path / MODEL_FILE}", mmproj=str(tmp_path / MMPROJ_FILE))
    try:
        assert backend.runtime.n_vocab == WIDE_VOCABULARY
        (package,) = backend.encode([photos["chelsea"]])
        (cached,) = backend.generate([GenerationRequest([package, "Describe it."], max_new_tokens=3)], return_logits=True)
        (fresh,) = backend.generate([GenerationRequest([photos["chelsea"], "Describe it."], max_new_tokens=3)],
                                    return_logits=True)
        assert cached.token_ids == fresh.token_ids and len(cached.token_ids) == 3
        assert cached.logits.shape[-1] == WIDE_VOCABULARY  # the LM head (the tied embedding) has every row
        assert (cached.logits - fresh.logits).abs().max().item() == 0.0
    finally:
        backend.close()
