""":class:`LlamaCppBackend`: refsight's Backend on llama.cpp (GGUF language model + mmproj).

Encoding tokenizes one media marker with the real bitmap and keeps every image
chunk's embeddings (:mod:`.package_format`). Generation renders the GGUF's chat
template around media markers and tokenizes it with mtmd; a cached package's image
is a size-only placeholder bitmap whose chunks are decoded from the saved
embeddings, a fresh image goes through llama.cpp's own pixel path. Decoding then
runs llama.cpp's sampler chain as the request's ``sampling`` says (greedy by default;
penalties, temperature, top-p, a seeded draw), with a GBNF grammar made from the
request's JSON schema when there is one (:mod:`.grammar`). Each token's text leaves
the loop as it is sampled (:meth:`LlamaCppBackend.generate_stream`), stop strings cut
the answer and a set stop event ends it before the next token.

A request naming its reference prefix (``prefix_segments``, with a ``prefix_cache``)
restores llama.cpp's sequence state after that prefix instead of evaluating it
(:mod:`.prefix`); :meth:`LlamaCppBackend.score_yes_no` scores P("yes") from the logits
after a prompt evaluated the same way.

Runtime failures become refsight errors here and only here (:func:`_native_errors`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from ...errors import (
    BackendError,
    GenerationError,
    InvalidInputError,
    RefsightError,
)
from ...inputs.images import ImageInput
from ...package import EncoderFingerprint, VisualPackage
from ..base import Backend, Execution, Generation, PreparedRequest
from ...requests import PROMPT_ENDS, GenerationRequest
from ..turns import split_final_turn
from ...sampling import OUTPUT_FIELDS, SAMPLING_FIELDS, TOKEN_FIELDS, WINDOW_FIELDS
from . import package_format as fmt
from .grammar import check_grammar, schema_to_gbnf
from .native import Bitmap, LlamaRuntime, RuntimeSettings, llama_cpp_version
from .prompt import chat_template, render_prompt
from .sampler import eog_tokens

__all__ = ["LlamaCppBackend"]


@contextlib.contextmanager
def _native_errors(model: str, error: type[BackendError], what: str) -> Iterator[None]:
    """llama.cpp failures (and stray runtime exceptions) become ``error(model, ...)``; ours pass through."""
    try:
        yield
    except RefsightError:
        raise
    except Exception as e:  # translating is the point
        raise error(model, f"{what}: {type(e).__name__}: {e}") from e


def _bitmap(image: ImageInput, image_id: str, *, placeholder: bool = False, size: tuple[int, int] | None = None) -> Bitmap:
    width, height = size or image.image.size
    return Bitmap(width, height, None if placeholder else image.image.tobytes(), image_id)


class LlamaCppBackend(Backend):
    """A GGUF VLM served by llama.cpp. Build it with :func:`refsight.backends.llamacpp.load_llamacpp_backend`."""

    supports_constrained_decoding: ClassVar[bool] = True
    #: Every Sampling field: llama.cpp's chain has temperature, top-p, a seeded draw and OpenAI-style penalties,
    #: llama-server's token constraints (logit bias, ignore_eos, a GBNF grammar) and each token's log probabilities.
    sampling_fields: ClassVar[frozenset[str]] = frozenset((*SAMPLING_FIELDS, *WINDOW_FIELDS, *TOKEN_FIELDS, *OUTPUT_FIELDS))
    #: llama-server's sampler defaults (llama.cpp's ``common_params_sampling``): a served request that samples
    #: and sets none of these draws as it would from llama-server. Greedy decoding never reads them.
    sampling_defaults = MappingProxyType({"top_k": 40, "top_p": 0.95, "min_p": 0.05})
    #: Each token's text leaves the token loop as soon as it is sampled.
    supports_streaming: ClassVar[bool] = True
    #: Conversations render in the GGUF's own chat template (system, user and assistant turns), ended as asked
    #: (a continued final assistant turn: llama-server's prefill); the prompt's evaluation is reported as it runs.
    supports_turns: ClassVar[bool] = True
    prompt_ends: ClassVar[frozenset[str]] = frozenset(PROMPT_ENDS)
    renders_template_variables: ClassVar[bool] = True
    supports_prompt_progress: ClassVar[bool] = True
    #: Raw prompts (llama-server's ``/completion``): the text as given, after a BOS when the GGUF asks for one.
    supports_raw_prompt: ClassVar[bool] = True
    #: Tools render in the GGUF's template as llama-server's ``--jinja`` renders them.
    supports_tools: ClassVar[bool] = True

    def __init__(self, name: str, *, model_path: Path, mmproj_path: Path, settings: RuntimeSettings,
                 model_id: str | None = None, random_weights: bool = False) -> None:
        super().__init__(name)
        # Images are encoded one at a time (mtmd encodes one chunk per call).
        self.batch_size = 1
        self.random_weights = bool(random_weights)
        #: Where llama.cpp runs the model ("cpu", or "gpu" when layers are offloaded).
        self.device = "gpu" if settings.use_gpu else "cpu"
        self.model_path, self.mmproj_path = Path(model_path), Path(mmproj_path)
        self._lock = threading.RLock()
        self.runtime = LlamaRuntime(self.model_path, self.mmproj_path, settings)
        try:
            self.arch = self.runtime.meta("general.architecture") or "unknown"
            self.model_id = model_id or self.runtime.meta("general.name") or self.model_path.stem
            self._template = self.runtime.chat_template()
            self.weights = fmt.weights_of(self.runtime.n_params, self.runtime.meta("general.file_type"))
            self._fingerprint = fmt.make_fingerprint(
                arch=self.arch,
                model_id=self.model_id,
                model_sha256=fmt.file_sha256(self.model_path),
                mmproj_sha256=fmt.file_sha256(self.mmproj_path),
                runtime_version=llama_cpp_version(),
                settings={
                    "image_min_tokens": settings.image_min_tokens,
                    "image_max_tokens": settings.image_max_tokens,
                    "flash_attn_type": self.runtime.flash_attn_type,
                    "device": "gpu" if settings.use_gpu else "cpu",
                    "n_embd_inp": self.runtime.n_embd_inp,
                    "media_marker": self.runtime.marker,
                },
            )
        except BaseException:
            self.runtime.close()
            raise
        #: With ``settings.n_seq > 1``, the scheduler decoding that many requests together (:mod:`.slots`).
        self.slots = None
        if settings.n_seq > 1:
            from .slots import Slots

            self.slots = Slots(name, self.runtime, self._lock, settings.n_seq)

    # ---------------------------------------------------------------- Backend

    @property
    def encode_calls(self) -> int:
        """How many image chunks went through the vision encoder so far (explicit or pixel-path)."""
        return self.runtime.encode_calls

    def fingerprint_sources(self) -> list[Path]:
        """The GGUF and the mmproj: their content hashes are in the fingerprint."""
        return [self.model_path, self.mmproj_path]

    def fingerprint(self) -> EncoderFingerprint:
        """GGUF + mmproj content hashes, llama-cpp-python version and every chunk-changing setting."""
        return self._fingerprint

    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        """One package per image: every image chunk's embeddings plus the chunk layout."""
        images = list(images)
        for i, image in enumerate(images):
            if not isinstance(image, ImageInput):
                raise InvalidInputError(f"images[{i}]", f"expected an ImageInput (use refsight.inputs.images.load_image), got {type(image).__name__}")
        packages = []
        for image in images:
            began = time.perf_counter()
            with self._lock, _native_errors(self.name, BackendError, "encode failed"):
                tensors, metadata = self._encode_one(image)
            packages.append(
                VisualPackage(
                    tensors=tensors,
                    metadata=metadata,
                    image_sha256=image.sha256,
                    fingerprint=self._fingerprint,
                    encode_ms=(time.perf_counter() - began) * 1000,
                )
            )
        return packages

    def _encode_one(self, image: ImageInput) -> tuple[dict[str, Any], dict[str, Any]]:
        import torch

        bitmap = _bitmap(image, "0")
        try:
            # The marker alone: mtmd's own expansion of one image, text between tiles included.
            with self.runtime.tokenized(self.runtime.marker, [bitmap]) as chunks:
                infos = [self.runtime.chunk_info(c) for c in chunks]
                tensors = {}
                for chunk, meta in zip(chunks, fmt.chunks_metadata(infos)):
                    if meta["type"] == "image":
                        embd = self.runtime.encode_chunk(chunk, meta["n_tokens"])
                        tensors[meta["tensor"]] = torch.from_numpy(embd)
                metadata = {
                    "runtime": "llama.cpp",
                    "image_size": list(image.image.size),
                    "n_embd": self.runtime.n_embd_inp,
                    "chunks": fmt.chunks_metadata(infos),
                }
        finally:
            bitmap.free()
        return tensors, metadata

    def check_package(self, package: VisualPackage) -> None:
        """Tensors that agree with the chunk metadata (the fingerprint was checked by the base class)."""
        fmt.check_package(package, self.runtime.n_embd_inp)

    # ------------------------------------------------------- the template's core

    def execute(self, batch: list[PreparedRequest], execution: Execution) -> list[Generation]:
        """Each request as its ``sampling`` says (default: greedy): in turn, or together in the slots.

        A stream hands each sampled token's text to ``on_text`` from inside the token loop
        (the same prompt and sampler chain, so a greedy stream equals the non-streamed
        text); a set stop event ends the loop before the next token. With parallel slots
        the batch's requests, and other callers' requests, share decode steps.
        """
        if self.slots is not None:
            from .runs import GenerateJob

            return self.slots.run([GenerateJob(self, prepared, execution) for prepared in batch])
        return [self._generate_one(prepared, execution) for prepared in batch]

    def check_batch(self, requests: list[GenerationRequest]) -> list[Any]:
        """The base checks, then each request's token constraints: the logit bias's token ids in the
        vocabulary, and a GBNF ``grammar`` (never beside a JSON schema) checked against the vocabulary and
        parsed once by llama.cpp (:func:`.grammar.check_grammar`); it is then the request's grammar, as a
        schema's would be."""
        grammars = super().check_batch(requests)
        for i, request in enumerate(requests):
            sampling = request.sampling
            n_vocab = self.runtime.n_vocab
            outside = [token for token, _ in sampling.logit_bias if token >= n_vocab]
            if outside:
                raise InvalidInputError("logit_bias", f"token {outside[0]} is not in the vocabulary (0 to {n_vocab - 1})")
            if sampling.grammar is None:
                continue
            if request.json_schema is not None:
                raise InvalidInputError("grammar", "give a GBNF grammar or a JSON schema, not both")
            with self._lock:
                grammars[i] = check_grammar(self.runtime, sampling.grammar)
        return grammars

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        """The schema's GBNF grammar (:mod:`.grammar`), checked as a caller's grammar is (but for the caller's
        size bounds: the schema's own bounded it) and parsed once by llama.cpp before any decoding."""
        with self._lock:
            try:
                return check_grammar(self.runtime, schema_to_gbnf(schema), "json_schema", bounded=False)
            except InvalidInputError as e:  # a const "\u0000" or a pattern's \x00 becomes a NUL to match
                raise InvalidInputError("json_schema", f"its grammar cannot run on llama.cpp: {e.reason}") from None

    def runtime_info(self) -> dict[str, Any]:
        """llama.cpp's threads (``--threads``/``-t``, else every core: it runs one thread team at a time)."""
        return {"llama_threads": self.runtime.settings.threads()}

    def count_text_tokens(self, text: str) -> int:
        """The exact number of tokens the model's own vocabulary makes of ``text`` (special tokens not parsed)."""
        with self._lock, _native_errors(self.name, BackendError, "cannot tokenize"):
            return len(self.runtime.tokenize(text, False)) if text else 0

    def image_token_count(self, image: VisualPackage | ImageInput) -> int | None:
        """A package's tokens in a prompt: its image chunks and the text mtmd lays around them (Qwen's
        ``<|vision_start|>``/``<|vision_end|>``, text between tiles), from its saved layout. Pixels: None."""
        if not isinstance(image, VisualPackage):
            return None
        chunks = image.metadata.get("chunks", ())
        text = sum(len(c.get("tokens", ())) for c in chunks if c.get("type") == "text")
        return text + sum(n_tokens for n_tokens, *_ in fmt.image_chunk_layout(chunks))

    @property
    def media_marker(self) -> str:
        """mtmd's media marker: where each image goes in a raw prompt."""
        return self.runtime.marker

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (``add_special``: a BOS when the vocabulary wants one)."""
        with self._lock, _native_errors(self.name, BackendError, "cannot tokenize"):
            return self.runtime.tokenize(text, parse_special, add_special)

    def token_piece(self, token: int) -> bytes:
        """One token's bytes, special tokens rendered (llama-server's ``common_token_to_piece``)."""
        (token,) = self.check_token_ids([token], self.runtime.n_vocab)
        with self._lock:
            return self.runtime.piece(token, special=True)

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The tokens' pieces joined, as llama-server's ``/detokenize`` joins them."""
        tokens = self.check_token_ids(tokens, self.runtime.n_vocab)
        with self._lock:
            return b"".join(self.runtime.piece(t, special=True) for t in tokens).decode("utf-8", "replace")

    def template_text(
        self, texts: Sequence[str], turns: list[tuple[str, int]] | None = None, *, generation_prompt: bool = True,
        tools: Any = None, variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The GGUF's chat template around ``texts`` (:meth:`prompt_text`)."""
        ending = "generation_prompt" if generation_prompt else "none"
        return self.prompt_text(list(texts), turns, prompt_end=ending, tools=tools, variables=variables)

    def prompt_text_of(self, request: GenerationRequest) -> str:
        """The GGUF's chat template over ``request`` as generation renders it (:meth:`prompt_text`); a raw prompt's
        text as given (without the BOS, which is no text of the caller's)."""
        if request.raw_prompt:
            return super().prompt_text_of(request)
        return self.prompt_text(request.segments, request.turns, prompt_end=request.prompt_end,
                                tools=request.chat_tools, variables=request.template_variables)

    def prepare(self, requests: list[GenerationRequest], grammars: list[Any]) -> list[PreparedRequest]:
        """The base's, then each request's prompt rendered and its prefix planned: here, before the runtime's lock
        is taken, so a chat template's render (bounded, in a worker process) never holds the model."""
        prepared = super().prepare(requests, grammars)
        for one in prepared:
            request = one.request
            one.prompt = self.prompt_text(one.segments, request.turns, raw=request.raw_prompt,
                                          prompt_end=request.prompt_end, tools=request.chat_tools,
                                          variables=request.template_variables)
            one.prefix = self.prefix_plan(request)
        return prepared

    def check_raw_text(self, text: str, where: str) -> None:
        """A raw prompt's text may spell special tokens, but not the media marker (it would shift the images)."""
        if self.runtime.marker in text:
            raise InvalidInputError(where, f"text may not contain the media marker {self.runtime.marker}")

    @property
    def context_size(self) -> int:
        """The context in tokens (``n_ctx``): the prompt and the answer together."""
        return int(self.runtime.settings.n_ctx)

    def end_tokens(self) -> tuple[int, ...]:
        """The vocabulary's end-of-generation tokens: what ``ignore_eos`` bans (llama-server's list)."""
        return eog_tokens(self.runtime)

    def chat_template_source(self) -> str:
        """The GGUF's chat template, or its family's known one when the GGUF carries none."""
        return chat_template(self._template, self.arch)

    def use_chat_template(self, template: str) -> None:
        """Render chats in ``template`` instead of the GGUF's own, once it passes :meth:`probe_chat_template`:
        :meth:`prompt_text` (fresh and cached paths alike) and the prefix keys (:meth:`prefix_plan` hashes it) read it."""
        previous, self._template = self._template, template
        try:
            self.probe_chat_template()
        except BaseException:
            self._template = previous
            raise

    def chat_template_reads(self, variable: str) -> bool:
        """Whether the GGUF's chat template (or its fallback) names ``variable`` anywhere."""
        import re

        template = self.chat_template_source()
        return re.search(rf"(?<![\w]){re.escape(variable)}(?![\w])", template) is not None

    def check_text(self, text: str, where: str) -> None:
        """Refuse text holding the media marker or a special token of the model."""
        # User text must stay text: a media marker or a special token in it would
        # shift the images or end the turn early.
        if self.runtime.marker in text:
            raise InvalidInputError(where, f"text may not contain the media marker {self.runtime.marker}")
        with self._lock:
            if self.runtime.tokenize(text, True) != self.runtime.tokenize(text, False):
                raise InvalidInputError(where, "text may not contain the model's special tokens")

    def prompt_text(
        self, segments: Sequence[Any], turns: list[tuple[str, int]] | None = None, *, raw: bool = False,
        prompt_end: str = "generation_prompt", tools: Any = None, variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The rendered prompt of ``segments`` (each image a media marker), as mtmd will tokenize it.

        ``turns`` (``(role, count)`` pairs over the segments) renders a conversation in the GGUF's
        own chat template; without it the segments are one user turn. ``raw``: the segments are
        the whole prompt, after a BOS when the vocabulary wants one (as llama-server's ``/completion``).
        ``prompt_end`` (:data:`refsight.requests.PROMPT_ENDS`): ``none`` leaves out the opening of the answer's turn;
        ``continue`` renders the turns before the final one with it, then the final turn's text (llama-server's).
        ``tools``: the request's :class:`~refsight.tools.ChatTools`, rendered as llama-server renders them;
        ``variables``: the template's own variables (``GenerationRequest.template_variables``).
        """
        if raw:
            import llama_cpp

            bos = self._special("bos")
            opening = self.runtime.piece(bos, special=True).decode("utf-8", "replace") if (
                bos >= 0 and llama_cpp.llama_vocab_get_add_bos(self.runtime.vocab)
            ) else ""
            return opening + "".join(s if isinstance(s, str) else self.runtime.marker for s in segments)
        if prompt_end == "continue":
            head, head_turns, tail = split_final_turn(segments, turns or [])
            return self.prompt_text(head, head_turns, tools=tools, variables=variables) + tail
        request = GenerationRequest(list(segments), turns=turns)
        content = [
            (role, "".join(s if isinstance(s, str) else self.runtime.marker for s in part))
            for role, part in request.turn_segments()
        ]
        return render_prompt(self._template, self.arch, content, bos=self._special_text("bos"), tools=tools,
                             eos=self._special_text("eos"), generation_prompt=prompt_end == "generation_prompt",
                             variables=variables)

    def prefix_plan(self, request: GenerationRequest) -> Any:
        """The :class:`~.prefix.PromptPrefix` of ``request``'s reference prefix, or None (:func:`~.prefix.plan_prefix`;
        keyed by the template given, else by the architecture whose fallback renders)."""
        from .prefix import plan_prefix

        return plan_prefix(self, request, self._template or self.arch)

    def prompt_token_ids(self, prompt: str) -> list[int]:
        """The token ids of the prompt's text: mtmd tokenizes the text between media markers exactly so."""
        return [t for piece in prompt.split(self.runtime.marker) for t in self.runtime.tokenize(piece, True)]

    def _special(self, which: str) -> int:
        import llama_cpp

        fn = llama_cpp.llama_vocab_bos if which == "bos" else llama_cpp.llama_vocab_eos
        return int(fn(self.runtime.vocab))

    def _special_text(self, which: str) -> str:
        token = self._special(which)
        return self.runtime.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

    def _generate_one(self, prepared: PreparedRequest, execution: Execution) -> Generation:
        from .runs import start_run

        with self._lock, _native_errors(self.name, GenerationError, "generation failed"):
            run = start_run(self, prepared, execution, seq=0)
            run.decode_alone()
            return run.generation()

    # ----------------------------------------------------------------- scoring

    def answer_token_ids(self, yes: str = "yes", no: str = "no") -> tuple[int, int]:
        """The token ids whose logits stand for "yes" and "no": each word's first token (the HF backend's rule)."""
        with self._lock:
            ids = [self.runtime.tokenize(word, False) for word in (yes, no)]
        if not ids[0] or not ids[1] or ids[0][0] == ids[1][0]:
            raise BackendError(self.name, f"the vocabulary cannot tell {yes!r} from {no!r} by their first token")
        return ids[0][0], ids[1][0]

    def score(self, batch: list[PreparedRequest]) -> list[float]:
        """P("yes") per request from the next-token logits after its prompt: no decoding.

        Each prompt is evaluated exactly as :meth:`generate` evaluates it (cached packages
        from their saved embeddings, fresh images through llama.cpp's pixel path, the
        reference-prefix KV state restored when the request names a prefix and one is
        stored); the score is the softmax over the "yes"/"no" logits at the answer
        position, as in the HF backend.
        """
        from .runs import ScoreJob, score_prompt

        answer_ids = self.answer_token_ids()
        if self.slots is not None:
            return self.slots.run([ScoreJob(self, prepared, answer_ids) for prepared in batch])
        with self._lock, _native_errors(self.name, GenerationError, "scoring failed"):
            return [score_prompt(self, prepared, 0, answer_ids) for prepared in batch]

    def close(self) -> None:
        """Stop the slots (after their jobs), then free llama.cpp's model and contexts. Idempotent."""
        if self.slots is not None:
            self.slots.close()
        with self._lock:
            self.runtime.close()
