"""Cached path == llama.cpp's own pixel path, bit for bit, for every built-in GGUF family.

(a) cached: references encoded by refsight (``mtmd_encode_chunk``), stored with
``refsight.store``, loaded back with ``.get(key)`` in a NEW process and replayed
from their saved embeddings (placeholder bitmaps, no pixels) beside a fresh
candidate;
(b) pixel path: written here with llama-cpp-python's bindings only, independent of
refsight's prompt and decoding code: the prompt text with one media marker per
image, ``mtmd_tokenize`` with every real bitmap, ``mtmd_helper_eval_chunks`` (which
encodes every image), then greedy decoding by argmax.

Greedy tokens must be identical and the logits' max-abs-diff exactly 0; and the
references of (a) must never reach the vision encoder.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from llama_models import (
    GGUF_FAMILIES,
    PROMPTS,
    require_llama_cpp,
)
from llama_workers import pixel_path_rows

from worker_spec import CANDIDATE, REFS, run_cached_path

require_llama_cpp()

MAX_NEW_TOKENS = 6
WORKER = Path(__file__).with_name("_llamacpp_cached_worker.py")


@pytest.fixture(scope="module")
def cached_results(gguf, photos, tmp_path_factory):
    """Encode the references, store them, and run the cached path in a new process."""
    backends = {name: gguf(name) for name in GGUF_FAMILIES}
    return run_cached_path(WORKER, tmp_path_factory.mktemp("llama-equivalence"), photos, backends, MAX_NEW_TOKENS)


class PixelPath:
    """llama.cpp on its own: real bitmaps, mtmd_helper_eval_chunks, argmax decoding."""

    def __init__(self, model_path: Path, mmproj_path: Path, n_threads: int) -> None:
        import llama_cpp as L
        import llama_cpp.mtmd_cpp as M

        from refsight.backends.llamacpp.logs import repack_weights

        self.L, self.M = L, M
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        # The backend's weight placement (plain CPU memory where llama.cpp's AMX kernels would crash).
        mp.use_extra_bufts = repack_weights()
        self.model = L.llama_model_load_from_file(str(model_path).encode(), mp)
        cp = L.llama_context_default_params()
        # The backend's defaults: same context and batch sizes, so the same batch splits.
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 4096, 2048, 2048
        cp.n_threads = cp.n_threads_batch = n_threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        mcp = M.mtmd_context_params_default()
        mcp.use_gpu, mcp.n_threads, mcp.warmup, mcp.print_timings = False, n_threads, False, False
        self.mctx = M.mtmd_init_from_file(str(mmproj_path).encode(), self.model, mcp)
        assert self.mctx
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def run(self, prompt: str, images, max_new_tokens: int):
        L, M = self.L, self.M
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        bitmaps = []
        for image in images:
            rgb = image.image.tobytes()
            buf = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
            bitmaps.append(M.mtmd_bitmap_init(image.image.width, image.image.height, buf))
        chunks = M.mtmd_input_chunks_init()
        text = M.mtmd_input_text()
        data = prompt.encode()
        text.text, text.text_len, text.add_special, text.parse_special = data, len(data), False, True
        array = (M.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
        assert M.mtmd_tokenize(self.mctx, chunks, ctypes.byref(text), array, len(bitmaps)) == 0
        n_past = L.llama_pos(0)
        assert M.mtmd_helper_eval_chunks(self.mctx, self.ctx, chunks, 0, 0, 2048, True, ctypes.byref(n_past)) == 0
        M.mtmd_input_chunks_free(chunks)
        for b in bitmaps:
            M.mtmd_bitmap_free(b)
        pos, tokens, logits = n_past.value, [], []
        for step in range(max_new_tokens):
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()
            logits.append(row)
            token = int(row.argmax())
            tokens.append(token)
            if L.llama_vocab_is_eog(self.vocab, token) or step + 1 == max_new_tokens:
                break
            batch = L.llama_batch_init(1, 0, 1)
            batch.n_tokens, batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = 1, token, pos, 1, True
            batch.seq_id[0][0] = 0
            assert L.llama_decode(self.ctx, batch) == 0
            L.llama_batch_free(batch)
            pos += 1
        return tokens, np.stack(logits)

    def close(self):
        self.M.mtmd_free(self.mctx)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


@pytest.mark.parametrize("n_refs", [1, 3])
@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_cached_path_from_disk_in_new_process_equals_pixel_path(cached_results, gguf, photos, name, n_refs):
    backend = gguf(name)
    fresh = pixel_path_rows(backend, PROMPTS[name], photos, REFS[:n_refs], CANDIDATE, MAX_NEW_TOKENS)
    cached = cached_results[f"{name}/{n_refs}"]
    assert len(cached["rows"]) == len(fresh) == 2
    for row, (tokens, logits) in zip(cached["rows"], fresh):
        assert row["tokens"] == tokens
        assert tuple(row["logits"].shape) == logits.shape
        assert np.abs(row["logits"].numpy() - logits).max() == 0.0
        assert row["random_weights"] is True


@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_cached_references_make_no_encode_calls(cached_results, gguf, photos, name):
    # Only the candidate's chunks (once per prompt, two prompts) reach the encoder.
    candidate_chunks = len(gguf(name).encode([photos[CANDIDATE]])[0].tensors)
    for n in (1, 3):
        assert cached_results[f"{name}/{n}"]["encode_calls"] == 2 * candidate_chunks


@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_fresh_references_give_the_same_tokens_as_cached(gguf, photos, name):
    """``use_cache=False`` hands references over as images: same tokens and logits as their packages."""
    from refsight.requests import GenerationRequest

    backend = gguf(name)
    packages = backend.encode([photos[r] for r in REFS])
    cached_row = [*packages, "Same as", photos[CANDIDATE], "?"]
    fresh_row = [*[photos[r] for r in REFS], "Same as", photos[CANDIDATE], "?"]
    before = backend.encode_calls
    cached = backend.generate([GenerationRequest(cached_row, max_new_tokens=4)], return_logits=True)[0]
    cached_calls = backend.encode_calls - before
    fresh = backend.generate([GenerationRequest(fresh_row, max_new_tokens=4)], return_logits=True)[0]
    assert cached.token_ids == fresh.token_ids
    assert (cached.logits - fresh.logits).abs().max().item() == 0.0
    assert cached_calls == len(backend.encode([photos[CANDIDATE]])[0].tensors)


def test_the_cached_path_read_packages_the_codec_compressed(cached_results):
    # llama.cpp's image embeddings (f32) went through the store's codec: containers with zstd tensor frames.
    use = cached_results["codec"]
    assert use["compressed"] == use["files"] >= len(GGUF_FAMILIES) and use["zstd_frames"] > 0, use
