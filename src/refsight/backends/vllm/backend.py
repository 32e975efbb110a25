"""The ``vllm:`` backend: a vLLM OpenAI server generates, and (with a vision encoder) encodes too.

``--model vllm:http://HOST:PORT`` points refsight at a running vLLM server
(``refsight vllm-serve`` starts one here; a CUDA server elsewhere works the same).
refsight loads the *same weights'* processor and tokenizer through its own Hugging Face
backend, the **encoder** (the HF backend of the served family, found from the server's
``/v1/models`` ``root``, or given with ``encoder=DIR|NAME``: :mod:`.loading`). :class:`VLLMBackend` is
then a transport: the base class checks and prepares each request, :mod:`.messages`
writes the OpenAI body, :mod:`.client` carries it. Two ways to send images, chosen once
when the backend loads (the server is asked whether it takes pixels):

* **the server has a vision encoder** (the default: :attr:`VLLMBackend.encodes_images`):
  refsight runs no vision tower. Its packages are *pixel packages* (:mod:`.pixels`: for
  Qwen the image on its grid, for every other family the image as decoded, under a
  fingerprint of its own), every image is an ``image_url``
  part, the candidate as pixels, each reference by ``uuid`` = ``refsight-`` + its package
  key, uuid-only when this backend already gave the server its pixels, pixels + uuid
  otherwise and again after a ``Cache miss`` (one retry per request, counted in
  :meth:`VLLMBackend.uuid_stats`). vLLM's caches, and refsight's encoder-cache connector
  (:mod:`.connector`: vLLM's encoder outputs kept in refsight's store), serve references
  by that uuid, so a reference is encoded once, by vLLM;
* **the server has none** (``--limit-mm-per-prompt`` image 0; Qwen families only): packages are the HF
  encoder's (the same keys as ``hf:``), each travels as ``image_embeds`` with its
  ``image_grid_thw`` (Qwen3-VL's deepstack maps beside the features), and a fresh image
  next to a package is encoded here (:meth:`VLLMBackend.encodes_fresh_images`): vLLM
  refuses to mix pixels and embeddings in one request.

Greedy tokens equal vLLM's all-pixels path (tests/backends/vllm prove it on tiny
Qwen2-VL, Qwen2.5-VL and Qwen3-VL, and with source pixels on Gemma 3, LLaVA, InternVL,
Mistral 3 and SmolVLM: ``test_vllm_families.py``). JSON constraints use vLLM's structured output
(``structured_outputs.grammar``: refsight's own grammar for the schema, as in the HF
backend). ``return_logits`` fills a ``[steps, vocab]`` tensor of vLLM's top-k
*log-probabilities* (``logprobs``), ``-inf`` elsewhere: an OpenAI server does not return
full logits. A stream relays vLLM's own SSE events; a set stop event closes the
connection, which makes vLLM abort the request. ``prompt_tokens`` is vLLM's usage;
``image_tokens`` is prod(grid) / merge² per image (Qwen), else the family processor's
placeholder count for the image's size (:class:`~.pixels.ImageTokenCounter`). The prompt limit
counts each image's prompt tokens as the transformers backend of the same weights counts them, before
anything is sent (:meth:`VLLMBackend.image_token_count`): a prompt over it never reaches vLLM.

The reference-prefix KV cache is vLLM's own automatic prefix caching: references come
first with uuids derived from their package keys, so a later rubric over the same
references reuses their KV blocks inside the server (:meth:`VLLMBackend.prefix_cache_stats`
reads the hit rate from ``/metrics``). :meth:`VLLMBackend.score` (the reranker) reads
P("yes") from vLLM's raw log-probabilities of the next token.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence, TypeVar

from ...errors import GenerationError
from ...families import FAMILIES
from ...inputs.images import ImageInput
from ...package import EncoderFingerprint, VisualPackage
from ..base import Backend, Execution, Generation, PreparedRequest
from ..hf.grid import grid_tokens
from ...sampling import SAMPLING_FIELDS
from ...requests import PROMPT_ENDS, GenerationRequest
from . import messages
from .client import VLLMClient
from .pixels import (
    GRID_PIXELS, SOURCE_PIXELS, HeldUuids, ImageParts, ImageTokenCounter, PixelUrls, encode_pixels, encode_source_pixels,
    is_cache_miss, pixel_fingerprint, validate_pixels, validate_source_pixels,
)

if TYPE_CHECKING:  # the encoder is a transformers backend: imported only when one is loaded
    from ..hf.base import HFBackend

#: The model types whose pixel packages are the image on its grid and that take ``image_embeds`` (their family
#: entries' ``vllm.image_embeds``).
EMBEDS_MODEL_TYPES = tuple(t for t, f in FAMILIES.items() if f.vllm.image_embeds)

__all__ = ["VLLMBackend", "TOP_LOGPROBS"]

TOP_LOGPROBS = messages.TOP_LOGPROBS
#: Requests sent to the server at once (it batches them itself).
_CONCURRENT = 8
_Sent = TypeVar("_Sent")


class VLLMBackend(Backend):
    """Generation (and, with ``encodes_images``, encoding) on a vLLM OpenAI server.

    With ``encodes_images`` the packages are pixel packages under :func:`~.pixels.pixel_fingerprint`
    and vLLM encodes every image; without, the fingerprint is the encoder's own, so packages
    made by ``hf:DIR`` (or a built-in model of the same weights) and by ``vllm:URL`` share
    keys: they are the same tensors, and either backend can serve the other's.
    """

    supports_constrained_decoding: ClassVar[bool] = True
    #: Every :class:`~refsight.sampling.Sampling` field, passed to vLLM under its OpenAI name.
    sampling_fields: ClassVar[frozenset[str]] = frozenset(SAMPLING_FIELDS)
    #: Streams relay vLLM's own token stream (SSE) as it arrives.
    supports_streaming: ClassVar[bool] = True
    #: Conversations go to vLLM as one message per turn, rendered in the model's own chat template, ended as asked.
    supports_turns: ClassVar[bool] = True
    prompt_ends: ClassVar[frozenset[str]] = frozenset(PROMPT_ENDS)
    renders_template_variables: ClassVar[bool] = True

    def __init__(
        self, name: str, *, client: VLLMClient, served_model: str, encoder: HFBackend, encodes_images: bool = False,
        keeps_uuids: bool = True,
    ) -> None:
        super().__init__(name)
        self.client = client
        self.served_model = served_model
        self.encoder = encoder
        #: True when the server runs its own vision encoder: pixel packages, images as ``image_url`` parts.
        self.encodes_images = bool(encodes_images)
        self.random_weights = bool(encoder.random_weights)
        self.batch_size = encoder.batch_size
        #: Whether the server serves an image by uuid alone (not with ``--mm-processor-cache-gb 0``).
        self.keeps_uuids = bool(keeps_uuids) and self.encodes_images
        #: What the server holds by uuid (nothing, for a server that keeps no processed inputs: never uuid-only).
        self.held = HeldUuids() if keeps_uuids else HeldUuids(limit=0)
        self.urls = PixelUrls()
        #: Pixel packages on the Qwen grid, or the decoded image (every other family: :mod:`.pixels`).
        self.pixel_kind = GRID_PIXELS if getattr(encoder, "family", None) in EMBEDS_MODEL_TYPES else SOURCE_PIXELS
        self._count_tokens = ImageTokenCounter(encoder)
        self._fingerprint = pixel_fingerprint(encoder.fingerprint(), self.pixel_kind) if encodes_images else encoder.fingerprint()
        self._stats = {"uuid_only": 0, "with_pixels": 0, "cache_miss_retries": 0}
        self._stats_lock = threading.Lock()
        # One pool for the backend's life: a new one per generate cost ~3 ms of thread start-up per request.
        self._pool = ThreadPoolExecutor(max_workers=_CONCURRENT, thread_name_prefix="refsight-vllm")

    def runtime_info(self) -> dict[str, Any]:
        """The image mode found (or forced) at load: ``vllm_images`` pixels|embeds, and whether uuids are kept."""
        return {"vllm_images": "pixels" if self.encodes_images else "embeds", "vllm_keeps_uuids": self.keeps_uuids}

    # ------------------------------------------------------------------ encoder side

    def fingerprint(self) -> EncoderFingerprint:
        """Pixel packages' fingerprint (``encodes_images``), else the encoder's: same keys as ``hf:``."""
        return self._fingerprint

    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        """Pixel packages (no vision tower: on the grid, or as decoded), or the HF encoder's packages."""
        if self.encodes_images and self.pixel_kind == SOURCE_PIXELS:
            return encode_source_pixels(images, self._fingerprint, self._count_tokens)
        if self.encodes_images:
            return encode_pixels(self.encoder, images, self._fingerprint)
        return self.encoder.encode(images)

    def validate_package(self, package: VisualPackage) -> None:
        """A pixel package's checks, or the encoder's (fingerprint, tensor names and shapes against the grid)."""
        if self.encodes_images and self.pixel_kind == SOURCE_PIXELS:
            validate_source_pixels(package, self._fingerprint)
        elif self.encodes_images:
            validate_pixels(package, self._fingerprint, int(self.encoder.image_processor.patch_size))
        else:
            self.encoder.validate_package(package)

    def uuid_stats(self) -> dict[str, int]:
        """References sent uuid-only, sent with pixels + uuid, and requests retried after a "Cache miss"."""
        with self._stats_lock:
            return dict(self._stats)

    @property
    def reserved_tokens(self) -> tuple[str, ...]:  # type: ignore[override]
        """The encoder family's special tokens: in user text they would shift vLLM's placeholder expansion."""
        return tuple(self.encoder.reserved_tokens)

    @property
    def vocab_size(self) -> int:
        """Rows of the language model's output layer (the width of ``return_logits``)."""
        return self.encoder.vocab_size

    def prompt_text_of(self, request: GenerationRequest) -> str:
        """The prompt as the encoder's processor renders it (the checkpoint's chat template, which vLLM renders
        too, bounded here), so an empty one is refused before anything is sent."""
        return self.encoder.prompt_text_of(request)

    def image_tokens(self, segments: Sequence[Any]) -> list[int]:
        """Prompt tokens of each image in order: prod(grid) / merge² (a fresh image: the grid of its resized size),
        or the family processor's count for the image's size."""
        return [
            int(s.metadata["num_tokens"]) if isinstance(s, VisualPackage)
            else grid_tokens(self.encoder, *s.image.size) if self.pixel_kind == GRID_PIXELS else self._count_tokens(s.image.size)
            for s in segments if not isinstance(s, str)
        ]

    def image_token_count(self, image: VisualPackage | ImageInput) -> int | None:
        """Prompt tokens ``image`` takes in vLLM's prompt, before anything is sent (the prompt limit counts them).

        Either way the transformers backend's count of the same weights: Qwen (pixels or embeddings)
        by the encoder's own rule (a package by its grid, pixels by the grid of their resized size);
        any other family by its processor's placeholder for the image's size (a source-pixel package
        keeps that size). None only where that processor cannot be asked.
        """
        grid = self.pixel_kind == GRID_PIXELS
        if isinstance(image, VisualPackage):
            # Grid pixel and embeddings packages carry num_tokens; a source-pixel package keeps its size.
            if grid:
                return int(image.metadata["num_tokens"])
            size = image.metadata.get("size")
        elif isinstance(image, ImageInput):
            if grid:
                return grid_tokens(self.encoder, *image.size)
            size = image.size
        else:
            return None  # not an image this backend can count (a reference not yet resolved to its package)
        if not size:
            return None
        return self._count_tokens.prompt_tokens(size) or None  # 0: a processor this counter cannot ask

    # ------------------------------------------------------------ the template's core

    def encodes_fresh_images(self, request: GenerationRequest) -> bool:
        """Only beside an embeddings package: vLLM takes pixels or embeddings in one request, never both."""
        return bool(request.packages) and not self.encodes_images

    def compile_schema(self, schema: dict[str, Any]) -> str:
        """refsight's EBNF grammar of the schema (constraining as the HF backend does: :mod:`.grammar`)."""
        from .grammar import json_schema_ebnf

        try:
            return json_schema_ebnf(schema)
        except ImportError as e:  # the deployment lacks xgrammar: not the caller's schema at fault
            raise GenerationError(self.name, str(e)) from None

    def chat_body(
        self, request: GenerationRequest | PreparedRequest, *, return_logits: bool = False, parts: ImageParts | None = None,
    ) -> dict[str, Any]:
        """The OpenAI body :meth:`generate` sends for ``request`` (checked and prepared first unless it already is).

        ``parts`` writes the images (default: a first attempt's :meth:`image_parts`)."""
        if isinstance(request, GenerationRequest):
            (request,) = self.prepare([request], self.check_batch([request]))
        return messages.chat_body(
            self.served_model, request.segments, request.request, parts or self.image_parts(request),
            grammar=request.grammar, return_logits=return_logits,
        )

    def image_parts(self, prepared: PreparedRequest, *, resend: bool = False) -> ImageParts:
        """How one attempt at ``prepared`` writes its images: the references' packages go by uuid.

        The references are the request's ``reference_keys`` (the reranker's), else the packages of
        its reference prefix.
        """
        request = prepared.request
        if request.reference_keys is not None:
            references = frozenset(request.reference_keys)
        else:
            references = frozenset(s.key for s in prepared.segments[:request.prefix_segments] if isinstance(s, VisualPackage))
        return ImageParts(self.encoder, references, self.held, self.urls, resend=resend, to_grid=self.pixel_kind == GRID_PIXELS)

    def execute(self, batch: list[PreparedRequest], execution: Execution) -> list[Generation]:
        """Each request to vLLM (concurrently: the server batches them), or one relayed stream."""
        if execution.on_text is not None or execution.stop_event is not None:
            return [self._stream(prepared, execution) for prepared in batch]

        def one(prepared: PreparedRequest) -> tuple[dict[str, Any], float]:
            return self._send(prepared, lambda parts: self._timed_chat(
                self.chat_body(prepared, return_logits=execution.return_logits, parts=parts)))

        answers = self._concurrently(one, batch)
        return [
            self._generation(answer, ms, prepared, execution.return_logits)
            for (answer, ms), prepared in zip(answers, batch)
        ]

    def _send(self, prepared: PreparedRequest, attempt: Callable[[ImageParts], _Sent]) -> _Sent:
        """``attempt`` with a first attempt's parts; once more with every reference's pixels after a "Cache miss".

        vLLM answers HTTP 400 ``Cache miss for image ...`` to a uuid-only part it no longer
        holds (its caches forgot it, or it restarted): the retry sends the pixels with the
        same uuids, so the server's encoder cache (and the connector behind it) still serve
        what they have.
        """
        parts = self.image_parts(prepared)
        try:
            result = attempt(parts)
        except GenerationError as error:
            if not parts.uuid_only or not is_cache_miss(str(error)):
                raise
            self.held.forget(parts.uuid_only)
            self._count(cache_miss_retries=1)
            parts = self.image_parts(prepared, resend=True)
            result = attempt(parts)
        parts.succeeded()
        self._count(uuid_only=len(parts.uuid_only), with_pixels=len(parts.sent))
        return result

    def _count(self, **amounts: int) -> None:
        with self._stats_lock:
            for name, amount in amounts.items():
                self._stats[name] += amount

    def score(self, batch: list[PreparedRequest]) -> list[float]:
        """P("yes") per request from vLLM's next-token log-probabilities: one token, no decoding loop.

        vLLM returns *raw* log-probabilities (log-softmax of the model's logits over the
        whole vocabulary, before any logits processor), so ``log p(yes)`` and ``log p(no)``
        at the answer position give the HF backend's score exactly:
        ``softmax([l_yes, l_no])[0] = 1 / (1 + exp(log p(no) - log p(yes)))``
        (:func:`~.messages.yes_probability`). Requests run concurrently.
        """
        yes_id, no_id = self.answer_token_ids()

        def one(prepared: PreparedRequest) -> float:
            plain = GenerationRequest(prepared.segments, max_new_tokens=1, turns=prepared.request.turns)
            score = self._send(prepared, lambda parts: messages.yes_probability(
                self.client.chat, messages.chat_body(self.served_model, prepared.segments, plain, parts), yes_id, no_id))
            if score is None:
                raise GenerationError(self.name, f"vLLM server at {self.client.base_url} returned no log-probability for yes/no")
            return score

        return self._concurrently(one, batch)

    def answer_token_ids(self, yes: str = "yes", no: str = "no") -> tuple[int, int]:
        """The "yes" / "no" token ids: the encoder's (same tokenizer as the served model, same rule as HF)."""
        return self.encoder.answer_token_ids(yes, no)

    # ------------------------------------------------------------------- transport

    def _concurrently(self, work: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        if len(items) == 1:
            return [work(items[0])]  # the common case: no hand-over to another thread at all
        return list(self._pool.map(work, items))

    def _timed_chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        began = time.perf_counter()
        answer = self.client.chat(body)
        return answer, (time.perf_counter() - began) * 1000

    def _stream(self, prepared: PreparedRequest, execution: Execution) -> Generation:
        """Relay vLLM's token stream: each content delta goes to ``on_text`` as it arrives.

        A "Cache miss" comes before the first event (HTTP 400), so the retry starts a clean stream."""
        answer = messages.StreamedAnswer(execution.on_text or (lambda piece: None))

        def attempt(parts: ImageParts) -> bool:
            body = self.chat_body(prepared, parts=parts)
            body.update(stream=True, stream_options={"include_usage": True})
            return self.client.chat_stream(body, answer, execution.stop_event)

        began = time.perf_counter()
        cancelled = self._send(prepared, attempt)
        generate_ms = (time.perf_counter() - began) * 1000
        return Generation(
            text=answer.text,
            token_ids=answer.tokens,
            model=self.name,
            random_weights=self.random_weights,
            timings_ms=_timings(prepared.encode_ms, generate_ms),
            prompt_tokens=answer.prompt_tokens,
            image_tokens=self.image_tokens(prepared.segments),
            finish_reason="cancelled" if cancelled else answer.finish_reason,
        )

    def _generation(self, answer: dict[str, Any], generate_ms: float, prepared: PreparedRequest, return_logits: bool) -> Generation:
        choice = answer["choices"][0]
        tokens = choice.get("token_ids")
        if tokens is None:
            raise GenerationError(self.name, f"vLLM server at {self.client.base_url} returned no token_ids (too old a vLLM?)")
        return Generation(
            text=(choice.get("message") or {}).get("content") or "",
            token_ids=[int(t) for t in tokens],
            model=self.name,
            random_weights=self.random_weights,
            logits=messages.logprob_matrix(choice, len(tokens), self.vocab_size) if return_logits else None,
            timings_ms=_timings(prepared.encode_ms, generate_ms),
            prompt_tokens=int((answer.get("usage") or {}).get("prompt_tokens") or 0),
            image_tokens=self.image_tokens(prepared.segments),
            finish_reason=messages.finish_reason(choice.get("finish_reason")),
        )

    def prefix_cache_stats(self) -> dict[str, float]:
        """vLLM's automatic prefix cache since the server started: prompt tokens queried, hit, and the hit rate.

        From the server's Prometheus ``/metrics`` (``vllm:prefix_cache_queries`` and
        ``vllm:prefix_cache_hits``, in tokens, summed over engines).
        """
        queries = self.client.metric_sum("vllm:prefix_cache_queries")
        hits = self.client.metric_sum("vllm:prefix_cache_hits")
        return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else 0.0}

    def close(self) -> None:
        """Release the encoder, the pool and the kept connections (the server is not ours to stop)."""
        self._pool.shutdown(wait=False)
        self.client.close()
        self.encoder.close()


def _timings(encode_ms: float, generate_ms: float) -> dict[str, float]:
    return {"encode": encode_ms, "generate": generate_ms, "total": encode_ms + generate_ms}
