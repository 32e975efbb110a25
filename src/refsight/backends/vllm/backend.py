"""The ``vllm:`` backend: refsight encodes, a vLLM OpenAI server generates.

``--model vllm:http://HOST:PORT`` points refsight at a running vLLM server
(``refsight vllm-serve`` starts one here; a CUDA server elsewhere works the same).
refsight loads the *same weights* through its own Hugging Face backend, the
**encoder** (found from the server's ``/v1/models`` ``root``, or given with
``encoder=DIR|NAME``), and uses it for every encode. Generation goes to vLLM:

* a cached package travels as an OpenAI ``image_embeds`` content part with its
  ``image_grid_thw`` (Qwen3-VL: ``[features | deepstack.0 | deepstack.1 ...]``
  concatenated on the hidden axis, the layout vLLM expects) and ``uuid`` = the
  package key, so vLLM runs no vision encoder for it;
* a request with no package at all (the ``--no-cache`` path, where the engine
  passes every image as an :class:`~refsight.images.ImageInput`) sends every image
  as pixels (a PNG data URL, already resized to its grid: see :meth:`VLLMBackend._on_grid`)
  and vLLM runs its own processor and encoder;
* vLLM refuses to mix pixels and embeddings in one request, so a fresh image next
  to a package is encoded here and sent as embeddings too.

Greedy tokens are the same on both paths (tests/backends/vllm prove it on tiny
Qwen2-VL, Qwen2.5-VL and Qwen3-VL). JSON constraints use vLLM's structured output
(``structured_outputs.grammar``: refsight's own grammar for the schema, as in the HF backend). ``return_logits`` fills a ``[steps, vocab]``
tensor of vLLM's top-k *log-probabilities* (``logprobs``), ``-inf`` elsewhere: an
OpenAI server does not return full logits.

:meth:`VLLMBackend.generate_stream` relays vLLM's own SSE stream (``"stream": true``):
each content delta goes to ``on_text`` as it arrives, and a set stop event closes the
connection, which makes vLLM abort the request. Every :class:`~refsight.backends.sampling.Sampling`
field passes through under its OpenAI name (greedy, ``temperature`` 0, by default).
``prompt_tokens`` is vLLM's usage; ``image_tokens`` is prod(grid) / merge² per image.

The reference-prefix KV cache is vLLM's own automatic prefix caching: references come
first with their package keys as uuids, so a later rubric over the same references
reuses their KV blocks inside the server (:meth:`VLLMBackend.prefix_cache_stats` reads
the hit rate from ``/metrics``). :meth:`VLLMBackend.score_yes_no` (the reranker) reads
P("yes") from vLLM's raw log-probabilities of the next token.
"""

from __future__ import annotations

import base64
import io
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Sequence

from ...errors import GenerationError, InvalidInputError, ModelLoadError
from ...images import ImageInput
from ...package import EncoderFingerprint, VisualPackage
from ..base import Backend, Generation, GenerationRequest, TextCallback
from ..sampling import SAMPLING_FIELDS
from .client import DEFAULT_TIMEOUT_S, VLLMClient

__all__ = ["VLLMBackend", "load_vllm_backend", "VLLM_PREFIX", "TOP_LOGPROBS"]

VLLM_PREFIX = "vllm:"
#: How many log-probabilities per step ``return_logits`` asks for (vLLM's default cap is 20).
TOP_LOGPROBS = 20
#: Options passed on to the encoder (refsight's HF backend for the same weights).
_ENCODER_OPTIONS = ("dtype", "device", "batch_size", "revision", "attn")
#: Options that would make refsight's preprocessing differ from the server's.
_SERVER_SIDE = ("min_pixels", "max_pixels", "processor_kwargs")
_QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


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
    #: :meth:`generate_stream` relays vLLM's own token stream (SSE) as it arrives.
    supports_streaming: ClassVar[bool] = True
    #: Conversations go to vLLM as one message per turn, rendered in the model's own chat template.
    supports_turns: ClassVar[bool] = True

    def __init__(self, name: str, *, client: VLLMClient, served_model: str, encoder: Backend) -> None:
        super().__init__(name)
        self.client = client
        self.served_model = served_model
        self.encoder = encoder
        self.random_weights = bool(encoder.random_weights)
        self.batch_size = encoder.batch_size
        self.deepstack_layers = int(getattr(encoder, "deepstack_layers", 0) or 0) if encoder.family == "qwen3_vl" else 0

    # ----------------------------------------------------------------- encoder side

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
    def vocab_size(self) -> int:
        """Rows of the language model's output layer (the width of ``return_logits``)."""
        return int(self.encoder.model.get_output_embeddings().weight.shape[0])

    # -------------------------------------------------------------------- generate

    def generate(self, requests: Sequence[GenerationRequest], *, return_logits: bool = False) -> list[Generation]:
        """Send each request to vLLM (concurrently: the server batches them); one result each.

        Fresh images in a request that also holds packages are encoded here first,
        in one batch for all requests.
        """
        requests = list(requests)
        rows = self._prepare(requests)
        bodies = [self._body(segments, r, return_logits) for (segments, _), r in zip(rows, requests)]
        workers = max(1, min(8, len(bodies)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="refsight-vllm") as pool:
            answers = list(pool.map(self._timed_chat, bodies))
        return [
            self._finish(answer, ms, row_encode_ms, return_logits, segments)
            for (answer, ms), (segments, row_encode_ms) in zip(answers, rows)
        ]

    def generate_stream(
        self, request: GenerationRequest, *, on_text: TextCallback, stop_event: threading.Event | None = None
    ) -> Generation:
        """Relay vLLM's token stream: each content delta goes to ``on_text`` as it arrives.

        The request is the one :meth:`generate` sends, with ``"stream": true``. Once
        ``stop_event`` is set the connection is closed (vLLM aborts the request) and the
        text so far comes back with ``finish_reason="cancelled"``.
        """
        if stop_event is not None and stop_event.is_set():
            return Generation(text="", token_ids=[], model=self.name, random_weights=self.random_weights,
                              finish_reason="cancelled")
        ((segments, encode_ms),) = self._prepare([request])
        body = self._body(segments, request, False)
        body.update(stream=True, stream_options={"include_usage": True})
        pieces: list[str] = []
        tokens: list[int] = []
        state: dict[str, Any] = {"finish_reason": None, "prompt_tokens": 0}

        def on_chunk(chunk: dict[str, Any]) -> None:
            usage = chunk.get("usage")
            if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
                state["prompt_tokens"] = int(usage["prompt_tokens"])
            if chunk.get("prompt_token_ids") and not state["prompt_tokens"]:
                state["prompt_tokens"] = len(chunk["prompt_token_ids"])
            for choice in chunk.get("choices") or ():
                tokens.extend(int(t) for t in choice.get("token_ids") or ())
                if choice.get("finish_reason"):
                    state["finish_reason"] = _finish_reason(choice["finish_reason"])
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    pieces.append(piece)
                    on_text(piece)

        began = time.perf_counter()
        cancelled = self.client.chat_stream(body, on_chunk, stop_event)
        generate_ms = (time.perf_counter() - began) * 1000
        return Generation(
            text="".join(pieces),
            token_ids=tokens,
            model=self.name,
            random_weights=self.random_weights,
            timings_ms={"encode": encode_ms, "generate": generate_ms, "total": encode_ms + generate_ms},
            prompt_tokens=state["prompt_tokens"],
            image_tokens=self._image_tokens(segments),
            finish_reason="cancelled" if cancelled else state["finish_reason"],
        )

    def _prepare(self, requests: list[GenerationRequest]) -> list[tuple[list[Any], float]]:
        """Checked requests as (segments to send, encode ms): fresh images beside packages encoded here, in one batch."""
        self.check_requests(requests)
        for request in requests:
            for package in request.packages:
                self.validate_package(package)
        mixed = [image for r in requests if r.packages for image in r.fresh_images]
        began = time.perf_counter()
        encoded = iter(self.encode(mixed)) if mixed else iter(())
        encode_ms = (time.perf_counter() - began) * 1000
        per_image = encode_ms / len(mixed) if mixed else 0.0
        rows = []
        for r in requests:
            if r.packages:
                rows.append(([next(encoded) if isinstance(s, ImageInput) else s for s in r.segments], per_image * len(r.fresh_images)))
            else:
                rows.append((list(r.segments), 0.0))
        return rows

    def check_text(self, text: str, where: str) -> None:
        """Refuse text holding a special token of the encoder's family (it would shift vLLM's placeholder expansion)."""
        for token in getattr(self.encoder, "reserved_tokens", ()):
            if token in text:
                raise InvalidInputError(where, f"text may not contain the special token {token}")

    def _body(self, segments: list[Any], request: GenerationRequest, return_logits: bool) -> dict[str, Any]:
        """The OpenAI chat request: one message per turn (one user turn without ``request.turns``),
        whose parts keep the segments' order; vLLM renders them in the model's chat template."""
        messages = []
        for role, turn in GenerationRequest(segments, turns=request.turns).turn_segments():
            parts = []
            for segment in turn:
                if isinstance(segment, str):
                    parts.append({"type": "text", "text": segment})
                elif isinstance(segment, VisualPackage):
                    parts.append(self._embeds_part(segment))
                else:
                    parts.append({"type": "image_url", "image_url": {"url": _png_data_url(self._on_grid(segment.image))}})
            if role != "user" and all(part["type"] == "text" for part in parts):
                # System and assistant turns as plain strings: every chat template takes those.
                messages.append({"role": role, "content": "".join(part["text"] for part in parts)})
            else:
                messages.append({"role": role, "content": parts})
        body: dict[str, Any] = {
            "model": self.served_model,
            "messages": messages,
            "max_tokens": request.max_new_tokens,
            "return_token_ids": True,
        }
        body.update(_sampling_fields(request))
        if request.json_schema is not None:
            # vLLM's structured output, given refsight's own grammar for the schema (the one
            # the HF backend uses): compact, with strict strings. A plain json_schema would
            # let a weak model emit whitespace until max_tokens unless the *server* was
            # started with disable_any_whitespace (a per-request flag is ignored).
            body["structured_outputs"] = {"grammar": _schema_grammar(request.json_schema)}
        if return_logits:
            body.update(logprobs=True, top_logprobs=TOP_LOGPROBS, return_tokens_as_token_ids=True)
        return body

    def _on_grid(self, image: Any) -> Any:
        """``image`` resized with PIL to the size the processor would give it (a no-op there).

        refsight's encoder resizes with PIL, vLLM's processor with torchvision, and the two
        bicubic kernels differ in the last bits. Sending the image already at its
        target size makes vLLM's resize a no-op, so the pixel path sees exactly the pixels
        refsight's encoder would (the same target: same smart_resize, same settings).
        """
        width, height = self._grid_size(image)
        if (width, height) == image.size:
            return image
        return image.resize((width, height), resample=int(self.encoder.image_processor.resample))

    def _grid_size(self, image: Any) -> tuple[int, int]:
        """(width, height) the processor resizes ``image`` to (multiples of patch × merge)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        processor = self.encoder.image_processor
        size = processor.size
        low = getattr(size, "shortest_edge", None) or getattr(processor, "min_pixels", None)
        high = getattr(size, "longest_edge", None) or getattr(processor, "max_pixels", None)
        height, width = smart_resize(
            image.height, image.width, factor=processor.patch_size * processor.merge_size, min_pixels=low, max_pixels=high
        )
        return width, height

    def _embeds_part(self, package: VisualPackage) -> dict[str, Any]:
        """An ``image_embeds`` part: features (+ deepstack on the hidden axis), grid, uuid = key."""
        import torch

        tensors = [package.tensors["features"]]
        tensors += [package.tensors[f"deepstack.{layer}"] for layer in range(self.deepstack_layers)]
        embeds = torch.cat(tensors, dim=-1) if len(tensors) > 1 else tensors[0]
        buffer = io.BytesIO()
        torch.save(embeds.contiguous(), buffer)
        return {
            "type": "image_embeds",
            "image_embeds": {
                "image_embeds": base64.b64encode(buffer.getvalue()).decode(),
                "image_grid_thw": [int(x) for x in package.metadata["image_grid_thw"]],
            },
            # Content-addressed, so vLLM's multimodal cache may key on it safely.
            "uuid": package.key,
        }

    def _timed_chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        began = time.perf_counter()
        answer = self.client.chat(body)
        return answer, (time.perf_counter() - began) * 1000

    def _image_tokens(self, segments: list[Any]) -> list[int]:
        """Prompt tokens of each image in order: prod(grid) / merge² (a fresh image: the grid of its resized size)."""
        merge = int(self.encoder.merge_size)
        counts = []
        for segment in segments:
            if isinstance(segment, VisualPackage):
                counts.append(math.prod(int(x) for x in segment.metadata["image_grid_thw"]) // merge**2)
            elif not isinstance(segment, str):
                width, height = self._grid_size(segment.image)
                patch = int(self.encoder.image_processor.patch_size)
                counts.append((height // patch) * (width // patch) // merge**2)
        return counts

    def _finish(
        self, answer: dict[str, Any], generate_ms: float, encode_ms: float, return_logits: bool, segments: list[Any]
    ) -> Generation:
        choice = answer["choices"][0]
        tokens = choice.get("token_ids")
        if tokens is None:
            raise GenerationError(self.name, f"vLLM server at {self.client.base_url} returned no token_ids (too old a vLLM?)")
        text = (choice.get("message") or {}).get("content") or ""
        logits = self._logprob_matrix(choice, len(tokens)) if return_logits else None
        return Generation(
            text=text,
            token_ids=[int(t) for t in tokens],
            model=self.name,
            random_weights=self.random_weights,
            logits=logits,
            timings_ms={"encode": encode_ms, "generate": generate_ms, "total": encode_ms + generate_ms},
            prompt_tokens=int((answer.get("usage") or {}).get("prompt_tokens") or 0),
            image_tokens=self._image_tokens(segments),
            finish_reason=_finish_reason(choice.get("finish_reason")),
        )

    def _logprob_matrix(self, choice: dict[str, Any], steps: int) -> Any:
        """``[steps, vocab]`` float tensor: vLLM's top-k log-probabilities, ``-inf`` elsewhere."""
        import torch

        matrix = torch.full((steps, self.vocab_size), float("-inf"))
        content = ((choice.get("logprobs") or {}).get("content")) or []
        for step, entry in enumerate(content[:steps]):
            for item in entry.get("top_logprobs") or []:
                token = str(item.get("token", ""))
                if token.startswith("token_id:"):
                    matrix[step, int(token.split(":", 1)[1])] = float(item["logprob"])
        return matrix

    # --------------------------------------------------------------------- scoring

    def answer_token_ids(self, yes: str = "yes", no: str = "no") -> tuple[int, int]:
        """The "yes" / "no" token ids: the encoder's (same tokenizer as the served model, same rule as HF)."""
        return self.encoder.answer_token_ids(yes, no)

    def score_yes_no(self, requests: Sequence[GenerationRequest]) -> list[float]:
        """P("yes") per request from vLLM's next-token log-probabilities: one token, no decoding loop.

        vLLM returns *raw* log-probabilities (log-softmax of the model's logits over the
        whole vocabulary, before any logits processor), so ``log p(yes)`` and ``log p(no)``
        at the answer position give the HF backend's score exactly:
        ``softmax([l_yes, l_no])[0] = 1 / (1 + exp(log p(no) - log p(yes)))``. The request
        allows only the two answer tokens (``allowed_token_ids``) and asks for the top
        log-probabilities; when the token not chosen is outside that top list, a second
        one-token request allowing only it reads its log-probability (the prompt is then a
        prefix-cache hit). Requests run concurrently (the server batches them).
        """
        requests = list(requests)
        rows = self._prepare(requests)
        yes_id, no_id = self.answer_token_ids()

        def one(segments: list[Any], request: GenerationRequest) -> float:
            body = self._body(segments, GenerationRequest(segments, max_new_tokens=1, turns=request.turns), False)
            body.update(temperature=0.0, logprobs=True, top_logprobs=TOP_LOGPROBS, return_tokens_as_token_ids=True)
            found = _answer_logprobs(self.client.chat({**body, "allowed_token_ids": [yes_id, no_id]}))
            for token in (yes_id, no_id):
                if token not in found:
                    answer = self.client.chat({**body, "allowed_token_ids": [token], "top_logprobs": 0})
                    found.update({t: v for t, v in _answer_logprobs(answer).items() if t == token})
            if yes_id not in found or no_id not in found:
                raise GenerationError(self.name, f"vLLM server at {self.client.base_url} returned no log-probability for yes/no")
            return 1.0 / (1.0 + math.exp(found[no_id] - found[yes_id]))

        workers = max(1, min(8, len(rows)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="refsight-vllm") as pool:
            return list(pool.map(lambda pair: one(pair[0][0], pair[1]), zip(rows, requests)))

    def prefix_cache_stats(self) -> dict[str, float]:
        """vLLM's automatic prefix cache since the server started: prompt tokens queried, hit, and the hit rate.

        From the server's Prometheus ``/metrics`` (``vllm:prefix_cache_queries`` and
        ``vllm:prefix_cache_hits``, in tokens, summed over engines).
        """
        text = self.client.metrics()
        queries = _metric_sum(text, "vllm:prefix_cache_queries")
        hits = _metric_sum(text, "vllm:prefix_cache_hits")
        return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else 0.0}

    def close(self) -> None:
        """Release the encoder (the server is not ours to stop)."""
        self.encoder.close()


def _sampling_fields(request: GenerationRequest) -> dict[str, Any]:
    """vLLM's request fields for ``request.sampling`` (the same OpenAI names): temperature always, greedy by default.

    Only fields set away from their defaults are sent besides ``temperature``, so a request
    naming nothing is exactly the greedy request this backend always sent.
    """
    sampling = request.sampling
    fields: dict[str, Any] = {"temperature": float(sampling.temperature)}
    for name in sampling.non_default():
        value = getattr(sampling, name)
        if name == "stop":
            fields["stop"] = list(value)
        elif name == "seed":
            fields["seed"] = int(value)
        elif name != "temperature":
            fields[name] = float(value)
    return fields


def _answer_logprobs(answer: dict[str, Any]) -> dict[int, float]:
    """token id → log-probability at the first generated position (the chosen token and the top list)."""
    content = ((answer["choices"][0].get("logprobs") or {}).get("content")) or []
    out: dict[int, float] = {}
    if not content:
        return out
    entry = content[0]
    for item in [entry, *(entry.get("top_logprobs") or [])]:
        token = str(item.get("token", ""))
        if token.startswith("token_id:") and item.get("logprob") is not None:
            out.setdefault(int(token.split(":", 1)[1]), float(item["logprob"]))
    return out


def _metric_sum(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples (``name_total{...} v`` or ``name{...} v``) in ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "_total{", name + "{", name + "_total ", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _finish_reason(reason: Any) -> str | None:
    """refsight's finish reason for vLLM's (``stop``, ``length``; ``abort`` is a cancel)."""
    if reason in ("stop", "length"):
        return str(reason)
    if reason == "abort":
        return "cancelled"
    return None if reason is None else "stop"


def _schema_grammar(schema: dict[str, Any]) -> str:
    from ..hf.constrained import json_schema_ebnf

    try:
        return json_schema_ebnf(schema)
    except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses for bad schemas
        raise InvalidInputError("json_schema", f"cannot compile into a grammar: {e}") from None


def _png_data_url(image: Any) -> str:
    """A PIL image as a lossless PNG data URL: vLLM decodes exactly these pixels."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _encoder_name(encoder: str) -> str:
    """A refsight model name for ``encoder``: a registered name, ``hf:...``, or a folder."""
    from ..registry import HF_PREFIX, available_models

    if encoder.startswith(HF_PREFIX) or encoder in available_models():
        return encoder
    if os.path.isdir(os.path.expanduser(encoder)):
        return HF_PREFIX + os.path.abspath(os.path.expanduser(encoder))
    # A hub id, loaded the same way a user would with --model hf:ID.
    return HF_PREFIX + encoder


def load_vllm_backend(
    name: str, *, encoder: str | None = None, timeout: float | None = None, **options: Any
) -> VLLMBackend:
    """Registry factory for ``vllm:http://HOST:PORT``.

    ``encoder``: the refsight model that encodes for this server (a built-in name
    such as ``tiny-qwen2-vl-vllm``, ``hf:DIR``, a folder or a hub id); default: the
    server's model ``root`` from ``/v1/models``. ``timeout``: seconds per request.
    ``dtype``, ``device``, ``batch_size``, ``revision``, ``attn`` go to the encoder;
    preprocessing options are refused (the server's processor decides, and the
    ``--no-cache`` pixel path must see the same images).
    """
    from ..registry import resolve_factory

    url = name[len(VLLM_PREFIX):] if name.startswith(VLLM_PREFIX) else name
    if not url.startswith(("http://", "https://")):
        raise InvalidInputError(name, "expected vllm:http://HOST:PORT")
    for key in options:
        if key in _SERVER_SIDE:
            raise InvalidInputError(key, "not supported by the vllm backend: preprocessing is the vLLM server's (start it with --mm-processor-kwargs)")
        if key not in _ENCODER_OPTIONS:
            raise InvalidInputError(key, f"not supported by the vllm backend; accepted: encoder, timeout, {', '.join(_ENCODER_OPTIONS)}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise InvalidInputError(f"timeout={timeout!r}", "must be a positive number of seconds")
    client = VLLMClient(name, url, timeout=timeout or DEFAULT_TIMEOUT_S)
    served = client.models()[0]
    encoder_name = _encoder_name(encoder or str(served.get("root") or served.get("id")))
    backend = resolve_factory(encoder_name)(encoder_name, **{k: v for k, v in options.items() if v is not None})
    family = getattr(backend, "family", None)
    if family not in _QWEN_FAMILIES:
        backend.close()
        raise ModelLoadError(name, f"encoder {encoder_name} is {family or type(backend).__name__}; the vllm backend serves {', '.join(_QWEN_FAMILIES)}")
    try:
        _check_same_model(name, str(served.get("root") or served.get("id")), encoder_name, backend)
    except Exception:
        backend.close()
        raise
    return VLLMBackend(name, client=client, served_model=str(served["id"]), encoder=backend)


def _embedding_width(config: Any) -> tuple[str, int]:
    """(model type, width of one image-embedding row vLLM expects) from a Qwen-VL config."""
    text = getattr(config, "text_config", config)
    deepstack = len(getattr(getattr(config, "vision_config", None), "deepstack_visual_indexes", None) or [])
    return str(getattr(config, "model_type", "")), int(text.hidden_size) * (1 + deepstack)


def _check_same_model(name: str, root: str, encoder_name: str, encoder: Backend) -> None:
    """Refuse an encoder whose embeddings the served model cannot take.

    vLLM does not check the width of ``image_embeds``: a wrong one kills its engine
    (HTTP 500, then every request fails). So the served model's config is read, when
    refsight can read it (a local folder, or a hub id in the local cache), and its type
    and embedding width are compared with the encoder's before anything is sent.
    """
    from transformers import AutoConfig

    try:
        served = AutoConfig.from_pretrained(root, local_files_only=True)
    except Exception:  # noqa: BLE001 - a remote server's model may not be readable here
        return
    theirs = _embedding_width(served)
    ours = _embedding_width(encoder.model.config)
    if theirs != ours:
        raise ModelLoadError(
            name,
            f"encoder {encoder_name} ({ours[0]}, embeddings {ours[1]} wide) does not fit the served model "
            f"{root} ({theirs[0]}, {theirs[1]} wide); give encoder= with the server's weights",
        )

