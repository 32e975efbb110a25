"""The one module that calls llama.cpp (through llama-cpp-python's ctypes bindings).

:class:`LlamaRuntime` owns a language model, its context and the mtmd (multimodal)
context of an mmproj file, and offers the few operations refsight needs:
tokenizing a prompt whose images are real bitmaps or size-only placeholders,
encoding one image chunk to float embeddings, evaluating text chunks, decoding an
image chunk from saved embeddings, decoding generated tokens, and reading logits.

Every call that runs the vision encoder increments :attr:`LlamaRuntime.encode_calls`
(explicit encodes and pixel-path evaluations alike), so tests can prove that a
cached reference never reaches the encoder. The runtime is not thread-safe: the
backend serialises calls with a lock.

A runtime loaded with ``n_seq > 1`` holds that many sequences in one context, each with a
KV stream of its own ``n_ctx`` positions (llama-server's ``-np``): the operations that
touch the KV cache take the sequence (``seq``), and :meth:`LlamaRuntime.decode_batch`
appends one token to each of several sequences in a single ``llama_decode``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .logs import init_backend, last_error, recent_errors, repack_weights

__all__ = ["INVARIANT_STEP_ROWS", "FLOAT_FILE_TYPES", "DEFAULT_N_CTX", "LlamaRuntime", "RuntimeSettings", "Bitmap",
           "ChunkInfo", "NativeError", "ContextTooLarge", "llama_cpp_version"]

IMAGE_CHUNK = 1  # MTMD_INPUT_CHUNK_TYPE_IMAGE
TEXT_CHUNK = 0  # MTMD_INPUT_CHUNK_TYPE_TEXT
#: ``llama_flash_attn_type`` by llama-server's ``-fa`` spelling.
FLASH_ATTN_TYPE = {"auto": -1, "off": 0, "on": 1}
#: The most sequences one decode call may carry and still give each sequence the numbers it gets
#: alone, for quantized weights on the CPU. ggml's CPU matrix product switches kernels on the rows of its
#: right-hand side, each summing in its own order: repacked weights (Q4_0, Q4_K, Q6_K ... on AVX2
#: and NEON) take a 4-row GEMM from 4 rows up and a GEMV below (``nrows > 3`` in
#: ggml-cpu/repack.cpp), other K-quant weights a tiled kernel from 8 rows up. Measured on the
#: 28-layer Q4_K_M GGUF: calls of 1, 2 or 3 sequences give logits bit-identical to one sequence
#: alone, a call of 4 moves them by up to 0.26.
INVARIANT_STEP_ROWS = 3
#: ``general.file_type`` of GGUFs whose weights are floats (LLAMA_FTYPE_ALL_F32, _MOSTLY_F16, _MOSTLY_BF16):
#: their products go through llamafile's tinyBLAS from 2 rows up (``n < 2`` in llamafile/sgemm.cpp) and
#: ggml's dot products below, so only a call of one sequence gives a sequence's lone numbers.
FLOAT_FILE_TYPES = frozenset({0, 1, 32})
#: Each sequence's context when none is asked for (or the model's trained context, when that is smaller).
DEFAULT_N_CTX = 4096


class NativeError(RuntimeError):
    """A llama.cpp call failed (the backend turns this into a refsight error)."""


class ContextTooLarge(NativeError):
    """The context asked for is above the one the model was trained for (refused before any KV cache exists)."""

    def __init__(self, n_ctx: int, trained: int, arch: str) -> None:
        self.n_ctx, self.trained, self.key = n_ctx, trained, f"{arch}.context_length"
        super().__init__(f"{n_ctx} tokens per sequence is above the {trained} the model was trained for (GGUF {self.key})")


def _bindings():
    from .logs import bindings

    return bindings()


def llama_cpp_version() -> str:
    """The installed llama-cpp-python version (it pins the llama.cpp commit it vendors)."""
    import llama_cpp

    return str(llama_cpp.__version__)


@dataclass(frozen=True)
class RuntimeSettings:
    """Load-time settings. ``image_min_tokens`` / ``image_max_tokens`` change the chunks (-1: the model's default).

    ``n_ctx`` is each sequence's context (None: :data:`DEFAULT_N_CTX` capped at the trained context; above it:
    :class:`ContextTooLarge`); ``n_seq`` how many sequences decode together; ``flash_attn`` llama.cpp's
    flash attention ("auto", "on" or "off", as llama-server's ``-fa``).
    """

    n_ctx: int | None = None
    n_batch: int = 2048
    n_threads: int = 0  # 0: the threads asked for (--threads / -t, refsight.support.threads), else every core it may use
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    use_gpu: bool = False
    n_seq: int = 1
    flash_attn: str = "auto"

    def threads(self) -> int:
        """The thread count to give llama.cpp."""
        if self.n_threads > 0:
            return self.n_threads
        from ...support.threads import available_cores, configured_threads

        asked = configured_threads()  # --threads / -t; never the per-worker share: one team runs at a time
        return asked if asked is not None else available_cores()


@dataclass(frozen=True)
class ChunkInfo:
    """What mtmd says about one chunk of a tokenized prompt."""

    kind: str  # "text" or "image"
    n_tokens: int
    n_pos: int
    image_id: str = ""  # the id of the bitmap an image chunk came from
    nx: int = 0
    ny: int = 0
    tokens: tuple[int, ...] = ()  # text chunks only


class Bitmap:
    """An mtmd bitmap: real RGB pixels, or a size-only placeholder (``rgb=None``) for a cached image."""

    def __init__(self, width: int, height: int, rgb: bytes | None, image_id: str) -> None:
        L, M = _bindings()
        self._M = M
        if rgb is not None:
            if len(rgb) != width * height * 3:
                raise NativeError(f"bitmap of {width}x{height} needs {width * height * 3} bytes, got {len(rgb)}")
            buffer = (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)
            self.ptr = M.mtmd_bitmap_init(width, height, buffer)
        else:
            self.ptr = M.mtmd_bitmap_init(width, height, None)
        if not self.ptr:
            raise NativeError(f"mtmd_bitmap_init({width}, {height}) failed")
        M.mtmd_bitmap_set_id(self.ptr, image_id.encode())
        self.placeholder = rgb is None

    def free(self) -> None:
        """Release the native bitmap. Idempotent."""
        if self.ptr:
            self._M.mtmd_bitmap_free(self.ptr)
            self.ptr = None


class LlamaRuntime:
    """A loaded GGUF language model + mmproj, one llama context, one mtmd context."""

    def __init__(self, model_path: Path, mmproj_path: Path, settings: RuntimeSettings) -> None:
        L, M = _bindings()
        self._L, self._M = L, M
        self.settings = settings
        self.encode_calls = 0
        #: tokens that went through the language model (text and image chunks, generated tokens excluded)
        self.decoded_tokens = 0
        #: image chunks decoded into the KV cache (from pixels or from saved embeddings)
        self.image_decodes = 0
        #: prefix states loaded with ``llama_state_seq_set_data``
        self.state_restores = 0
        self.model = self.ctx = self.mctx = self._sampler = None
        init_backend()
        recent_errors.clear()
        params = L.llama_model_default_params()
        if not settings.use_gpu:
            params.n_gpu_layers = 0
        params.use_extra_bufts = repack_weights()
        self.model = L.llama_model_load_from_file(str(model_path).encode(), params)
        if not self.model:
            raise NativeError(f"llama.cpp cannot load {model_path} as a language model GGUF ({last_error() or 'no reason given'})")
        try:
            self.vocab = L.llama_model_get_vocab(self.model)
            self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
            self.n_embd_inp = int(L.llama_model_n_embd_inp(self.model))
            self.n_params = int(L.llama_model_n_params(self.model))  # the language model's (Ollama's parameter_size)
            file_type = self.meta("general.file_type")
            #: the most sequences a decode call may carry with each getting its lone numbers (:mod:`.slots`)
            self.invariant_step_rows = 1 if file_type is None or int(file_type) in FLOAT_FILE_TYPES else INVARIANT_STEP_ROWS
            # Sized before the KV cache exists: a runaway n_ctx took gigabytes before llama.cpp failed.
            self.settings = settings = self._fit_context(settings)
            self.ctx = L.llama_init_from_model(self.model, self._context_params())
            if not self.ctx:
                raise NativeError("llama_init_from_model failed (n_ctx too large for memory?)")
            mp = M.mtmd_context_params_default()
            mp.use_gpu = settings.use_gpu
            mp.n_threads = settings.threads()
            mp.warmup = False
            mp.print_timings = False
            mp.image_min_tokens = settings.image_min_tokens
            mp.image_max_tokens = settings.image_max_tokens
            self.flash_attn_type = int(mp.flash_attn_type)
            self.mctx = M.mtmd_init_from_file(str(mmproj_path).encode(), self.model, mp)
            if not self.mctx:
                raise NativeError(
                    f"mtmd cannot load {mmproj_path} as the vision projector of {model_path}: "
                    f"{last_error() or 'not an mmproj GGUF, or made for another model'}"
                )
            if not M.mtmd_support_vision(self.mctx):
                raise NativeError(f"{mmproj_path} has no vision encoder")
            self.marker = M.mtmd_default_marker().decode()
            self.use_mrope = bool(M.mtmd_decode_use_mrope(self.mctx))
        except BaseException:
            self.close()
            raise

    def _fit_context(self, settings: RuntimeSettings) -> RuntimeSettings:
        """``settings`` with each sequence's context: as asked, up to the trained context, else the default capped at it."""
        trained = int(self._L.llama_model_n_ctx_train(self.model))
        if settings.n_ctx is None:
            n_ctx = min(DEFAULT_N_CTX, trained) if trained > 0 else DEFAULT_N_CTX
            return replace(settings, n_ctx=n_ctx)
        if 0 < trained < settings.n_ctx:
            raise ContextTooLarge(settings.n_ctx, trained, self.meta("general.architecture") or "unknown")
        return settings

    def _context_params(self):
        """The llama context's parameters for these settings."""
        settings = self.settings
        cp = self._L.llama_context_default_params()
        # One KV stream per sequence (not one shared pool): a sequence's cells sit exactly
        # where they would in a context of its own, so its numbers do not depend on its neighbours.
        cp.n_ctx = settings.n_ctx * settings.n_seq
        cp.n_seq_max = settings.n_seq
        cp.kv_unified = False
        # One batch for a whole image chunk: non-causal image chunks must not be split.
        cp.n_batch = cp.n_ubatch = min(settings.n_batch, settings.n_ctx)
        cp.n_threads = cp.n_threads_batch = settings.threads()
        cp.flash_attn_type = FLASH_ATTN_TYPE[settings.flash_attn]
        return cp

    # ------------------------------------------------------------- model facts

    def meta(self, key: str) -> str | None:
        """A GGUF metadata string of the language model (``general.architecture`` ...), or None."""
        buf = ctypes.create_string_buffer(4096)
        n = self._L.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def chat_template(self) -> str | None:
        """The chat template stored in the GGUF, if any."""
        raw = self._L.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8", "replace") if raw else None

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|> ...)."""
        return bool(self._L.llama_vocab_is_eog(self.vocab, token))

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (special tokens render as empty unless ``special``)."""
        buf = ctypes.create_string_buffer(256)
        n = self._L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def tokenize(self, text: str, parse_special: bool, add_special: bool = False) -> list[int]:
        """Plain text tokenization (a BOS only with ``add_special``, when the vocabulary wants one)."""
        data = text.encode()
        cap = len(data) + 8
        out = (self._L.llama_token * cap)()
        n = self._L.llama_tokenize(self.vocab, data, len(data), out, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            out = (self._L.llama_token * cap)()
            n = self._L.llama_tokenize(self.vocab, data, len(data), out, cap, add_special, parse_special)
        return list(out[:n])

    # ---------------------------------------------------------------- prompts

    @contextmanager
    def tokenized(self, text: str, bitmaps: Sequence[Bitmap]) -> Iterator[list]:
        """Tokenize ``text`` (one media marker per bitmap) into mtmd chunks; yields the chunk pointers."""
        M = self._M
        chunks = M.mtmd_input_chunks_init()
        try:
            data = text.encode()
            inp = M.mtmd_input_text()
            # No BOS: templates that want one write it themselves (as llama-server does).
            inp.text, inp.text_len, inp.add_special, inp.parse_special = data, len(data), False, True
            array = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*[b.ptr for b in bitmaps])
            rc = M.mtmd_tokenize(self.mctx, chunks, ctypes.byref(inp), array, len(bitmaps))
            if rc != 0:
                raise NativeError(f"mtmd_tokenize failed ({rc}): markers and images disagree, or an image is unusable")
            yield [M.mtmd_input_chunks_get(chunks, i) for i in range(M.mtmd_input_chunks_size(chunks))]
        finally:
            M.mtmd_input_chunks_free(chunks)

    def chunk_info(self, chunk) -> ChunkInfo:
        """Type, token and position counts, image id and grid of one chunk."""
        M = self._M
        kind = M.mtmd_input_chunk_get_type(chunk)
        n_tokens = int(M.mtmd_input_chunk_get_n_tokens(chunk))
        n_pos = int(M.mtmd_input_chunk_get_n_pos(chunk))
        if kind == TEXT_CHUNK:
            count = ctypes.c_size_t()
            ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            return ChunkInfo("text", n_tokens, n_pos, tokens=tuple(int(ptr[i]) for i in range(count.value)))
        if kind != IMAGE_CHUNK:
            raise NativeError(f"unsupported mtmd chunk type {kind} (audio?)")
        image = M.mtmd_input_chunk_get_tokens_image(chunk)
        raw_id = M.mtmd_input_chunk_get_id(chunk)
        return ChunkInfo(
            "image",
            n_tokens,
            n_pos,
            image_id=raw_id.decode() if raw_id else "",
            nx=int(M.mtmd_image_tokens_get_nx(image)),
            ny=int(M.mtmd_image_tokens_get_ny(image)),
        )

    # ------------------------------------------------------------------ encode

    def encode_chunk(self, chunk, n_tokens: int) -> np.ndarray:
        """Run the vision encoder + projector on one image chunk: float32 ``[n_tokens, n_embd_inp]``."""
        M = self._M
        self.encode_calls += 1
        rc = M.mtmd_encode_chunk(self.mctx, chunk)
        if rc != 0:
            raise NativeError(f"mtmd_encode_chunk failed ({rc})")
        ptr = M.mtmd_get_output_embd(self.mctx)
        # Copy: the buffer belongs to mtmd and is overwritten by the next encode.
        return np.ctypeslib.as_array(ptr, shape=(n_tokens, self.n_embd_inp)).astype(np.float32, copy=True)

    # ------------------------------------------------------------------ decode

    def clear(self, seq: int = 0) -> None:
        """Forget sequence ``seq``'s KV cache (a new prompt starts at position 0)."""
        memory = self._L.llama_get_memory(self.ctx)
        if self.settings.n_seq == 1:
            self._L.llama_memory_clear(memory, True)
        elif not self._L.llama_memory_seq_rm(memory, seq, -1, -1):
            raise NativeError(f"llama_memory_seq_rm refused to clear sequence {seq}")

    def eval_chunk(self, chunk, n_past: int, logits_last: bool, *, image: bool, seq: int = 0) -> int:
        """Evaluate a chunk the way llama.cpp does on its own (an image chunk is encoded from its pixels)."""
        L, M = self._L, self._M
        if image:
            self.encode_calls += 1
            self.image_decodes += 1
        self.decoded_tokens += int(M.mtmd_input_chunk_get_n_tokens(chunk))
        out = L.llama_pos(n_past)
        rc = M.mtmd_helper_eval_chunk_single(
            self.mctx, self.ctx, chunk, n_past, seq, self._n_batch(), logits_last, ctypes.byref(out)
        )
        if rc != 0:
            raise NativeError(f"mtmd_helper_eval_chunk_single failed ({rc})")
        return int(out.value)

    def decode_image(self, chunk, embeddings: np.ndarray, n_past: int, seq: int = 0) -> int:
        """Decode an image chunk from saved embeddings (no encoder); returns the new ``n_past``.

        The helper places the embeddings (M-RoPE positions for Qwen) and switches to
        non-causal attention for chunks that need it (``mtmd_decode_use_non_causal``).
        """
        L, M = self._L, self._M
        embd = np.ascontiguousarray(embeddings, dtype=np.float32)
        self.image_decodes += 1
        self.decoded_tokens += int(M.mtmd_input_chunk_get_n_tokens(chunk))
        out = L.llama_pos(n_past)
        rc = M.mtmd_helper_decode_image_chunk(
            self.mctx, self.ctx, chunk, embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n_past, seq,
            self._n_batch(), ctypes.byref(out), M.mtmd_helper_post_decode_callback(), None,
        )
        if rc != 0:
            raise NativeError(f"mtmd_helper_decode_image_chunk failed ({rc})")
        return int(out.value)

    def decode_token(self, token: int, n_past: int, seq: int = 0) -> int:
        """Append one generated token at ``n_past`` (logits computed for it); returns ``n_past + 1``."""
        self.decode_batch([(token, n_past, seq)])
        return n_past + 1

    def decode_batch(self, steps: Sequence[tuple[int, int, int]]) -> None:
        """Append one token to each of several sequences in one ``llama_decode``: ``(token, n_past, seq)`` each.

        The logits of step ``i`` are output ``i`` (:meth:`last_logits`, the sampler's index).
        """
        L = self._L
        batch = L.llama_batch_init(len(steps), 0, 1)
        try:
            batch.n_tokens = len(steps)
            for i, (token, n_past, seq) in enumerate(steps):
                # One position even for M-RoPE models: llama.cpp spreads a text token's
                # position over every rope section itself.
                batch.token[i] = token
                batch.pos[i] = n_past
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = True
            rc = L.llama_decode(self.ctx, batch)
        finally:
            L.llama_batch_free(batch)
        if rc != 0:
            raise NativeError(f"llama_decode failed ({rc}): context full?")

    def state_bytes(self, seq: int = 0) -> np.ndarray:
        """The KV state of sequence ``seq`` (``llama_state_seq_get_data``) as a uint8 array (a copy)."""
        L = self._L
        size = int(L.llama_state_seq_get_size(self.ctx, seq))
        out = np.empty(size, dtype=np.uint8)
        written = int(L.llama_state_seq_get_data(self.ctx, out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq))
        if written != size:
            raise NativeError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
        return out

    def restore_state(self, state: np.ndarray, seq: int = 0) -> None:
        """Clear sequence ``seq`` and load a :meth:`state_bytes` blob into it (``llama_state_seq_set_data``)."""
        L = self._L
        data = np.ascontiguousarray(state, dtype=np.uint8)
        self.clear(seq)
        read = int(L.llama_state_seq_set_data(self.ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), data.size, seq))
        if read == 0:
            self.clear(seq)  # a half-read state must not leak into the next prompt
            raise NativeError("llama_state_seq_set_data refused the prefix state (made by another model or context?)")
        self.state_restores += 1

    def last_logits(self, output: int = -1) -> np.ndarray:
        """float32 ``[n_vocab]`` logits of the last decode's output ``output`` (-1: its last; a copy)."""
        ptr = self._L.llama_get_logits_ith(self.ctx, output)
        if not ptr:
            raise NativeError(f"no logits for output {output}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _n_batch(self) -> int:
        return min(self.settings.n_batch, self.settings.n_ctx)

    # ---------------------------------------------------------------- sampling
    # (the sampler chain itself is :class:`.sampler.Sampler`, built over this runtime)

    def check_grammar(self, grammar: str) -> None:
        """Raise :class:`NativeError` when llama.cpp's GBNF parser refuses ``grammar`` (nothing is decoded)."""
        sampler = self._L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not sampler:
            raise NativeError(f"llama.cpp cannot parse the grammar: {last_error() or 'no reason given'}")
        self._L.llama_sampler_free(sampler)

    # ------------------------------------------------------------------- close

    def close(self) -> None:
        """Free the mtmd context, the llama context and the model. Idempotent."""
        L, M = self._L, self._M
        if self.mctx:
            M.mtmd_free(self.mctx)
            self.mctx = None
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None
