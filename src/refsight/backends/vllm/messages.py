"""The OpenAI chat request the vLLM backend sends, and what it reads back from the answers.

:func:`chat_body` turns one prepared request into ``/v1/chat/completions`` JSON: one
message per turn whose content parts keep the segments' order. Each image's part comes
from the backend's ``image_part`` callable (:class:`~.pixels.ImageParts`): ``image_url``
parts (pixels, a reference's uuid) for a server with a vision encoder, or
:func:`embeds_part` (an ``image_embeds`` part: the encoder family's flat layout, with
``image_grid_thw`` and ``uuid`` = the package key) for one without. The rest reads
answers: token ids, finish reasons, log-probabilities, and the events of a stream
(:class:`StreamedAnswer`).
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ...package import VisualPackage
from ...requests import GenerationRequest
from ..hf.grid import flat_embeddings
from ...sampling import Sampling

__all__ = [
    "TOP_LOGPROBS", "StreamedAnswer", "answer_logprobs", "chat_body", "content_part", "embeds_part", "finish_reason",
    "logprob_matrix", "png_data_url", "sampling_fields", "yes_probability",
]

#: How many log-probabilities per step ``return_logits`` asks for (vLLM's default cap is 20).
TOP_LOGPROBS = 20


def png_data_url(image: Any) -> str:
    """A PIL image as a lossless PNG data URL: vLLM decodes exactly these pixels."""
    buffer = io.BytesIO()
    # zlib level 1: a 448² image encodes 4-5x faster than at PNG's default 6, for 7 % more bytes.
    image.save(buffer, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def embeds_part(package: VisualPackage, encoder: Any) -> dict[str, Any]:
    """An ``image_embeds`` part: the package's features in ``encoder``'s flat layout, its grid, its key as uuid."""
    import torch

    buffer = io.BytesIO()
    torch.save(flat_embeddings(encoder, package).contiguous(), buffer)
    return {
        "type": "image_embeds",
        "image_embeds": {
            "image_embeds": base64.b64encode(buffer.getvalue()).decode(),
            # The processor's image_grid_thw for this one image (its only row).
            "image_grid_thw": [int(x) for x in package.metadata["layout"]["image_grid_thw"][0]],
        },
        # Content-addressed, so vLLM's multimodal cache may key on it safely.
        "uuid": package.key,
    }


def content_part(segment: Any, image_part: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """One OpenAI content part: text as is, an image (a package or a fresh image) as ``image_part`` writes it."""
    if isinstance(segment, str):
        return {"type": "text", "text": segment}
    return image_part(segment)


def sampling_fields(sampling: Sampling) -> dict[str, Any]:
    """vLLM's request fields for ``sampling`` (the same OpenAI names): temperature always, greedy by default.

    Only fields set away from their defaults are sent besides ``temperature``, so a request
    naming nothing is exactly the greedy request this backend always sent. A temperature
    below the greedy threshold is sent as 0 (vLLM would raise it to 0.01 and sample), and
    ``top_p`` as :attr:`Sampling.runtime_top_p` (the same tokens kept, never rounded to 0).
    """
    fields: dict[str, Any] = {"temperature": 0.0 if sampling.greedy else float(sampling.temperature)}
    for name in sampling.non_default():
        value = getattr(sampling, name)
        if name == "stop":
            fields["stop"] = list(value)
        elif name in ("seed", "top_k"):
            fields[name] = int(value)
        elif name == "top_p":
            fields["top_p"] = sampling.runtime_top_p
        elif name != "temperature":
            fields[name] = float(value)
    return fields


def chat_body(
    served_model: str, segments: list[Any], request: GenerationRequest, image_part: Callable[[Any], dict[str, Any]], *,
    grammar: str | None = None, return_logits: bool = False,
) -> dict[str, Any]:
    """The OpenAI chat request of ``segments`` (the prepared request's): one message per turn; vLLM renders
    them in the model's chat template, ended as the request's ``prompt_end`` asks (vLLM's own
    ``add_generation_prompt`` and ``continue_final_message``), with its ``template_variables`` (``chat_template_kwargs``). ``image_part`` writes each image's part;
    ``grammar`` is the EBNF of the request's JSON schema."""
    messages = []
    for role, turn in GenerationRequest(segments, turns=request.turns).turn_segments():
        parts = [content_part(segment, image_part) for segment in turn]
        if role != "user" and all(part["type"] == "text" for part in parts):
            # System and assistant turns as plain strings: every chat template takes those.
            messages.append({"role": role, "content": "".join(part["text"] for part in parts)})
        else:
            messages.append({"role": role, "content": parts})
    body: dict[str, Any] = {
        "model": served_model,
        "messages": messages,
        "max_tokens": request.max_new_tokens,
        "return_token_ids": True,
        **sampling_fields(request.sampling),
    }
    if request.prompt_end != "generation_prompt":
        body["add_generation_prompt"] = False
        body["continue_final_message"] = request.prompt_end == "continue"
    if request.template_variables:  # vLLM's own field: the template reads them (it ignores those it does not)
        body["chat_template_kwargs"] = dict(request.template_variables)
    if grammar is not None:
        # vLLM's structured output, given refsight's own grammar for the schema (the one
        # the HF backend uses): compact, with strict strings. A plain json_schema would
        # let a weak model emit whitespace until max_tokens unless the *server* was
        # started with disable_any_whitespace (a per-request flag is ignored).
        body["structured_outputs"] = {"grammar": grammar}
    if return_logits:
        body.update(logprobs=True, top_logprobs=TOP_LOGPROBS, return_tokens_as_token_ids=True)
    return body


def finish_reason(reason: Any) -> str | None:
    """refsight's finish reason for vLLM's (``stop``, ``length``; ``abort`` is a cancel)."""
    if reason in ("stop", "length"):
        return str(reason)
    if reason == "abort":
        return "cancelled"
    return None if reason is None else "stop"


def _token_id(item: dict[str, Any]) -> int | None:
    token = str(item.get("token", ""))
    return int(token.split(":", 1)[1]) if token.startswith("token_id:") else None


def logprob_matrix(choice: dict[str, Any], steps: int, vocab_size: int) -> Any:
    """``[steps, vocab]`` float tensor: vLLM's top-k log-probabilities, ``-inf`` elsewhere."""
    import torch

    matrix = torch.full((steps, vocab_size), float("-inf"))
    content = ((choice.get("logprobs") or {}).get("content")) or []
    for step, entry in enumerate(content[:steps]):
        for item in entry.get("top_logprobs") or []:
            token = _token_id(item)
            if token is not None:
                matrix[step, token] = float(item["logprob"])
    return matrix


def answer_logprobs(answer: dict[str, Any]) -> dict[int, float]:
    """token id → log-probability at the first generated position (the chosen token and the top list)."""
    content = ((answer["choices"][0].get("logprobs") or {}).get("content")) or []
    out: dict[int, float] = {}
    if not content:
        return out
    entry = content[0]
    for item in [entry, *(entry.get("top_logprobs") or [])]:
        token = _token_id(item)
        if token is not None and item.get("logprob") is not None:
            out.setdefault(token, float(item["logprob"]))
    return out


def yes_probability(chat: Callable[[dict[str, Any]], dict[str, Any]], body: dict[str, Any], yes_id: int, no_id: int) -> float | None:
    """P("yes") = softmax over the two answer tokens' raw log-probabilities at the answer position.

    The request allows only the two tokens and asks for the top log-probabilities; a token
    outside that list is read by a second one-token request allowing only it (the prompt is
    then a prefix-cache hit). None when vLLM gives no log-probability for one of them.
    """
    body = {**body, "max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": TOP_LOGPROBS,
            "return_tokens_as_token_ids": True}
    found = answer_logprobs(chat({**body, "allowed_token_ids": [yes_id, no_id]}))
    for token in (yes_id, no_id):
        if token not in found:
            answer = chat({**body, "allowed_token_ids": [token], "top_logprobs": 0})
            found.update({t: v for t, v in answer_logprobs(answer).items() if t == token})
    if yes_id not in found or no_id not in found:
        return None
    return 1.0 / (1.0 + math.exp(found[no_id] - found[yes_id]))


@dataclass
class StreamedAnswer:
    """What a vLLM stream has said so far: text pieces (each handed to ``on_text``), tokens, usage, finish."""

    on_text: Callable[[str], None]
    pieces: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    finish_reason: str | None = None

    def __call__(self, chunk: dict[str, Any]) -> None:
        """Take one parsed SSE event."""
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
            self.prompt_tokens = int(usage["prompt_tokens"])
        if chunk.get("prompt_token_ids") and not self.prompt_tokens:
            self.prompt_tokens = len(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or ():
            self.tokens.extend(int(t) for t in choice.get("token_ids") or ())
            if choice.get("finish_reason"):
                self.finish_reason = finish_reason(choice["finish_reason"])
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                self.pieces.append(piece)
                self.on_text(piece)

    @property
    def text(self) -> str:
        """The pieces joined."""
        return "".join(self.pieces)
