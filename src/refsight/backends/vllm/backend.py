"""The ``vllm:`` backend: refsight encodes, a vLLM OpenAI server generates.

``--model vllm:http://HOST:PORT`` points refsight at a running vLLM server
(``refsight vllm-serve`` starts one here; a CUDA server elsewhere works the same).
refsight loads the *same weights* through its own Hugging Face backend, the
**encoder** (a Qwen family backend, found from the server's ``/v1/models`` ``root``, or
given with ``encoder=DIR|NAME``: :mod:`.loading`), and uses it for every encode.
:class:`VLLMBackend` is then a transport: the base class checks and prepares each
request, :mod:`.messages` writes the OpenAI body, :mod:`.client` carries it.

* a cached package travels as an ``image_embeds`` part with its ``image_grid_thw`` (the
  family's flat layout: Qwen3-VL's deepstack maps beside the features) and ``uuid`` = the
  package key, so vLLM runs no vision encoder for it;
* a request with no package at all (the ``--no-cache`` path, where the engine passes
  every image as an :class:`~refsight.images.ImageInput`) sends every image as pixels (a
  PNG, already resized onto its grid by the encoder family) and vLLM runs its own
  processor and encoder;
* vLLM refuses to mix pixels and embeddings in one request, so a fresh image next to a
  package is encoded here (the prepare step: :meth:`VLLMBackend.encodes_fresh_images`)
  and sent as embeddings too.

Greedy tokens are the same on both paths (tests/backends/vllm prove it on tiny
Qwen2-VL, Qwen2.5-VL and Qwen3-VL). JSON constraints use vLLM's structured output
(``structured_outputs.grammar``: refsight's own grammar for the schema, as in the HF
backend). ``return_logits`` fills a ``[steps, vocab]`` tensor of vLLM's top-k
*log-probabilities* (``logprobs``), ``-inf`` elsewhere: an OpenAI server does not return
full logits. A stream relays vLLM's own SSE events; a set stop event closes the
connection, which makes vLLM abort the request. ``prompt_tokens`` is vLLM's usage;
``image_tokens`` is prod(grid) / merge² per image.

The reference-prefix KV cache is vLLM's own automatic prefix caching: references come
first with their package keys as uuids, so a later rubric over the same references
reuses their KV blocks inside the server (:meth:`VLLMBackend.prefix_cache_stats` reads
the hit rate from ``/metrics``). :meth:`VLLMBackend.score` (the reranker) reads P("yes")
from vLLM's raw log-probabilities of the next token.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from ...errors import GenerationError
from ...images import ImageInput
from ...package import EncoderFingerprint, VisualPackage
from ..base import Backend, Execution, Generation, GenerationRequest, PreparedRequest
from ..sampling import SAMPLING_FIELDS
from . import messages
from .client import VLLMClient

if TYPE_CHECKING:  # the encoder is a transformers backend: imported only when one is loaded
    from ..hf.qwen2_vl import QwenFamilyBackend

__all__ = ["VLLMBackend", "TOP_LOGPROBS"]

TOP_LOGPROBS = messages.TOP_LOGPROBS
#: Requests sent to the server at once (it batches them itself).
_CONCURRENT = 8


class VLLMBackend(Backend):
    """Generation on a vLLM OpenAI server; encoding with refsight's HF backend for the same weights.

    The fingerprint is the encoder's own (:meth:`fingerprint`), so packages made
    by ``hf:DIR`` (or a built-in model of the same weights) and by ``vllm:URL``
    share keys: they are the same tensors, and either backend can serve the other's.
    """

    supports_cached_features: ClassVar[bool] = True
    supports_constrained_decoding: ClassVar[bool] = True
    #: Every :class:`~refsight.backends.sampling.Sampling` field, passed to vLLM under its OpenAI name.
    sampling_fields: ClassVar[frozenset[str]] = frozenset(SAMPLING_FIELDS)
    #: Streams relay vLLM's own token stream (SSE) as it arrives.
    supports_streaming: ClassVar[bool] = True
    #: Conversations go to vLLM as one message per turn, rendered in the model's own chat template.
    supports_turns: ClassVar[bool] = True

    def __init__(self, name: str, *, client: VLLMClient, served_model: str, encoder: QwenFamilyBackend) -> None:
        super().__init__(name)
        self.client = client
        self.served_model = served_model
        self.encoder = encoder
        self.random_weights = bool(encoder.random_weights)
        self.batch_size = encoder.batch_size

    # ------------------------------------------------------------------ encoder side

    def fingerprint(self) -> EncoderFingerprint:
        """The encoder's fingerprint: same weights and preprocessing as ``hf:`` ⇒ same package keys."""
        return self.encoder.fingerprint()

    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        """Encoded here, by the HF encoder (vLLM has no endpoint that returns embeddings)."""
        return self.encoder.encode(images)

    def validate_package(self, package: VisualPackage) -> None:
        """The encoder's checks: fingerprint, tensor names and shapes against the grid."""
        self.encoder.validate_package(package)

    @property
    def reserved_tokens(self) -> tuple[str, ...]:  # type: ignore[override]
        """The encoder family's special tokens: in user text they would shift vLLM's placeholder expansion."""
        return tuple(self.encoder.reserved_tokens)

    @property
    def vocab_size(self) -> int:
        """Rows of the language model's output layer (the width of ``return_logits``)."""
        return self.encoder.vocab_size

    def image_tokens(self, segments: Sequence[Any]) -> list[int]:
        """Prompt tokens of each image in order: prod(grid) / merge² (a fresh image: the grid of its resized size)."""
        return [
            int(s.metadata["num_tokens"]) if isinstance(s, VisualPackage) else self.encoder.grid_tokens(s.image)
            for s in segments if not isinstance(s, str)
        ]

    # ------------------------------------------------------------ the template's core

    def encodes_fresh_images(self, request: GenerationRequest) -> bool:
        """Only beside a package: vLLM takes pixels or embeddings in one request, never both."""
        return bool(request.packages)

    def compile_schema(self, schema: dict[str, Any]) -> str:
        """refsight's EBNF grammar of the schema (the one the HF backend constrains with)."""
        from ..hf.constrained import json_schema_ebnf

        return json_schema_ebnf(schema)

    def chat_body(self, request: GenerationRequest | PreparedRequest, *, return_logits: bool = False) -> dict[str, Any]:
        """The OpenAI body :meth:`generate` sends for ``request`` (checked and prepared first unless it already is)."""
        if isinstance(request, GenerationRequest):
            (request,) = self.prepare([request], self.check_batch([request]))
        return messages.chat_body(
            self.served_model, request.segments, request.request, self.encoder,
            grammar=request.grammar, return_logits=return_logits,
        )

    def execute(self, batch: list[PreparedRequest], execution: Execution) -> list[Generation]:
        """Each request to vLLM (concurrently: the server batches them), or one relayed stream."""
        if execution.on_text is not None or execution.stop_event is not None:
            return [self._stream(prepared, execution) for prepared in batch]
        bodies = [self.chat_body(p, return_logits=execution.return_logits) for p in batch]
        answers = self._concurrently(self._timed_chat, bodies)
        return [
            self._generation(answer, ms, prepared, execution.return_logits)
            for (answer, ms), prepared in zip(answers, batch)
        ]

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
            body = messages.chat_body(self.served_model, prepared.segments, plain, self.encoder)
            score = messages.yes_probability(self.client.chat, body, yes_id, no_id)
            if score is None:
                raise GenerationError(self.name, f"vLLM server at {self.client.base_url} returned no log-probability for yes/no")
            return score

        return self._concurrently(one, batch)

    def answer_token_ids(self, yes: str = "yes", no: str = "no") -> tuple[int, int]:
        """The "yes" / "no" token ids: the encoder's (same tokenizer as the served model, same rule as HF)."""
        return self.encoder.answer_token_ids(yes, no)

    # ------------------------------------------------------------------- transport

    def _concurrently(self, work: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        workers = max(1, min(_CONCURRENT, len(items)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="refsight-vllm") as pool:
            return list(pool.map(work, items))

    def _timed_chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        began = time.perf_counter()
        answer = self.client.chat(body)
        return answer, (time.perf_counter() - began) * 1000

    def _stream(self, prepared: PreparedRequest, execution: Execution) -> Generation:
        """Relay vLLM's token stream: each content delta goes to ``on_text`` as it arrives."""
        body = self.chat_body(prepared)
        body.update(stream=True, stream_options={"include_usage": True})
        answer = messages.StreamedAnswer(execution.on_text or (lambda piece: None))
        began = time.perf_counter()
        cancelled = self.client.chat_stream(body, answer, execution.stop_event)
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
        """Release the encoder (the server is not ours to stop)."""
        self.encoder.close()


def _timings(encode_ms: float, generate_ms: float) -> dict[str, float]:
    return {"encode": encode_ms, "generate": generate_ms, "total": encode_ms + generate_ms}
