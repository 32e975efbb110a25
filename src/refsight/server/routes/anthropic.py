"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as llama-server serves it.

A request is translated into the OpenAI chat route's messages (:mod:`..intake.messages`) and runs the
same service call: the same images (a ``base64`` source is a data URL; a ``url`` source is fetched
only where the operator allows remote media, else a 400), references, prefix states and limits.
``system`` (a string or text blocks) opens the conversation; a final ``assistant`` message is
continued (Anthropic's prefill, rendered as llama-server renders its assistant prefill: the earlier turns
with the opening of the answer's turn, then that message's text; a backend that cannot is a 400 naming
``messages``). ``max_tokens`` is required (Anthropic's rule); ``stop_sequences``,
``temperature``, ``top_p`` and ``top_k`` are honoured as on the chat route (greedy unless a
temperature is given); ``metadata`` and blocks' ``cache_control`` are hints. Tool use (``tools``,
``tool_choice`` other than ``none``/``auto``, ``tool_use``/``tool_result`` blocks), extended
``thinking`` and any other field are refused by name, in Anthropic's error shape
(``{"type": "error", "error": {"type": "invalid_request_error", "message"}}``,
:func:`~..edge.http_errors.anthropic_error_body`).

``stream: true`` answers with Anthropic's events: ``message_start``, ``content_block_start``,
``content_block_delta`` (``text_delta``), ``content_block_stop``, ``message_delta`` (the
``stop_reason`` and the usage) and ``message_stop``. ``message_start`` counts the prompt's text as
the template renders it (images are counted once they are encoded: ``message_delta`` has the
whole prompt). ``count_tokens`` is :mod:`..intake.input_tokens`' count (llama-server's ``/chat/completions/input_tokens``
too): a fresh image on llama.cpp, whose layout mtmd decides as it encodes, is not counted (then a lower bound).
``usage``: ``input_tokens`` the prompt tokens evaluated, ``cache_read_input_tokens`` those served from a stored
reference-prefix state, ``output_tokens`` the answer's.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any, AsyncIterator, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ... import InvalidInputError
from ..replies.answers import Answer
from ..intake.bodies import Integer, Number
from ..intake.completion_parts import stop_type, with_stopping_word
from ..deps import ConfigDep, MediaUuidsDep, Namespace, PoolDep, ServiceDep
from ..edge.disconnect import run_watched
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from ..intake.generation_body import GenerationBody, check_generation
from ..intake.messages import chat_prompt_end, prompt_end_of
from ..intake.input_tokens import input_tokens, template_tokens
from ..intake.messages import ContentPart, ImageURL, Message, PartResolver, messages_to_segments
from ..intake.prompt_limit import check_prompt_chars, check_prompt_tokens, prompt_texts
from ..replies.streaming import EventStreamResponse, answer_events, open_stream

__all__ = ["router"]

router = APIRouter(tags=["anthropic"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}
#: Fields accepted that change nothing here.
_HINTS = frozenset({"metadata", "service_tier"})
#: Block types refused by name, with the reason.
_REFUSED_BLOCKS = {
    "tool_use": "tool use is not supported", "tool_result": "tool use is not supported",
    "thinking": "extended thinking is not supported", "redacted_thinking": "extended thinking is not supported",
    "document": "document blocks are not supported; send the pages as images",
}


class Block(BaseModel):
    """One content block: ``text``, or ``image`` with its ``source`` (other types are refused by name)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    source: dict[str, Any] | None = None


class AnthropicMessage(BaseModel):
    """A message of the conversation."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[Block]


class CountBody(BaseModel):
    """``POST /v1/messages/count_tokens``: the conversation alone."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1, max_length=256)
    system: str | list[Block] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None

    def check_fields(self) -> None:
        """400 naming the first field refsight cannot honour (tool use, extended thinking, an unknown field)."""
        for name in sorted(self.model_extra or {}):
            if name not in _HINTS and name not in MessagesBody.model_fields:
                raise ApiError(400, "unsupported", f"{name}: this field is not supported by refsight", param=name)
        if self.tools:
            raise ApiError(400, "unsupported", "tools: tool use is not supported", param="tools")
        if self.tool_choice is not None and self.tool_choice.get("type") not in ("none", "auto"):
            raise ApiError(400, "unsupported", "tool_choice: tool use is not supported", param="tool_choice")
        if self.thinking is not None and self.thinking.get("type") != "disabled":
            raise ApiError(400, "unsupported", "thinking: extended thinking is not supported", param="thinking")

    def chat_messages(self) -> list[Message]:
        """The conversation as the OpenAI chat route's messages (``system`` first)."""
        out = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(
                _text_block(block, f"system[{j}]") for j, block in enumerate(self.system)
            )
            out.append(Message(role="system", content=system))
        for i, message in enumerate(self.messages):
            content = message.content
            if not isinstance(content, str):
                content = [_part(block, f"messages[{i}].content[{j}]") for j, block in enumerate(content)]
            out.append(Message(role=message.role, content=content))
        return out


class MessagesBody(CountBody):
    """``POST /v1/messages``."""

    max_tokens: Integer = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Integer | None = None
    stream: bool | None = None


def _text_block(block: Block, where: str) -> str:
    if block.type != "text":
        raise ApiError(400, "invalid_input", f"{where}: the system prompt takes text blocks only", param="system")
    return block.text or ""


def _part(block: Block, where: str) -> ContentPart:
    """A block as the chat route's part; 400 naming the block for what is not an image or text."""
    if block.type == "text":
        return ContentPart(type="text", text=block.text or "")
    if block.type in _REFUSED_BLOCKS:
        raise ApiError(400, "unsupported", f"{where}: {block.type} blocks: {_REFUSED_BLOCKS[block.type]}", param=where)
    if block.type != "image":
        raise ApiError(400, "invalid_input", f"{where}: unknown block type {block.type[:40]!r}", param=where)
    source = block.source or {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type") or "image/jpeg"
        if not isinstance(media_type, str) or not media_type.startswith("image/"):
            raise ApiError(400, "invalid_input", f"{where}.source.media_type: an image type", param=where)
        return ContentPart(type="image_url", image_url=ImageURL(url=f"data:{media_type};base64,{source['data']}"))
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return ContentPart(type="image_url", image_url=ImageURL(url=source["url"]))  # the remote-media policy decides
    raise ApiError(400, "invalid_input", f"{where}.source: a base64 source (media_type, data) or a url source",
                   param=where)


class _Generation(GenerationBody):
    """The chat route's generation fields, as Anthropic's request spells them."""

    model: str | None = None


def _generation(body: MessagesBody, service: Any, limit: int) -> tuple[int, Any]:
    """The token bound and the sampling (the chat route's checks); 400s name Anthropic's fields."""
    fields = _Generation(model=body.model, max_tokens=body.max_tokens, temperature=body.temperature,
                         top_p=body.top_p, top_k=body.top_k, stop=body.stop_sequences)
    try:
        return check_generation(fields, service, None, limit)
    except ApiError as e:
        if e.param == "stop":
            raise ApiError(e.status, e.code, e.message.replace("stop:", "stop_sequences:", 1),
                           param="stop_sequences") from None
        raise


def _checked(body: MessagesBody, service: Any, config: Any) -> tuple[int, Any, list[Message], str, list[str]]:
    """The checks against the served model, in the work pool (they tokenize): the token bound and the sampling, the
    conversation as chat messages, how its prompt ends (a final assistant message: Anthropic's prefill, continued)
    and its texts, within the prompt limit."""
    max_new_tokens, sampling = _generation(body, service, config.max_new_tokens)
    chat = body.chat_messages()
    prompt_end = chat_prompt_end(service, chat)
    texts = prompt_texts(chat)
    check_prompt_chars(texts, config.max_prompt_tokens)
    check_prompt_tokens(texts, config.max_prompt_tokens, service.count_text_tokens)
    return max_new_tokens, sampling, chat, prompt_end, texts


def _opening_count(service: Any, messages: list[Message], texts: list[str]) -> int:
    """``message_start``'s ``input_tokens``: the template's tokens, or the texts' where a backend renders none."""
    try:
        return template_tokens(service, messages, prompt_end_of(messages)[0])  # a prefill continued
    except InvalidInputError:
        return service.count_text_tokens("\n".join(texts))


@router.post("/v1/messages/count_tokens", responses=_ERRORS)
async def count_tokens(
    request: Request, body: CountBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> dict[str, int]:
    """The prompt's tokens (``input_tokens``), images included: nothing is generated."""
    body.check_fields()
    messages = body.chat_messages()
    check_prompt_chars(prompt_texts(messages), config.max_prompt_tokens)
    resolver = PartResolver.for_request(request, service, namespace, uuids, config)

    ending = prompt_end_of(messages)[0]
    return {"input_tokens": await pool.run(input_tokens, service, messages, ending, resolver, namespace)}


@router.post("/v1/messages", responses=_ERRORS)
async def messages(
    request: Request, body: MessagesBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """Anthropic's Messages API over the served model: the chat route's work, Anthropic's shapes."""
    body.check_fields()
    max_new_tokens, sampling, chat, prompt_end, texts = await pool.run(_checked, body, service, config)
    resolver = PartResolver.for_request(request, service, namespace, uuids, config)
    message_id = f"msg_{uuidlib.uuid4().hex}"

    def work(on_text=None, stop_event=None) -> Answer:
        segments, turns = messages_to_segments(chat, resolver)
        result = service.chat(segments, namespace=namespace, turns=turns, max_new_tokens=max_new_tokens,
                              sampling=sampling, on_text=on_text, stop_event=stop_event, prompt_end=prompt_end)
        answer = Answer.of(result, media_uuids=[use.to_dict() for use in resolver.commit()])
        return with_stopping_word(answer, sampling.stop, service)

    def ending(result: Answer) -> tuple[str, str | None]:
        if result.finish_reason == "length":
            return "max_tokens", None
        kind, word = stop_type(result)
        return ("stop_sequence", word) if kind == "word" else ("end_turn", None)

    def message(result: Answer) -> dict[str, Any]:
        reason, sequence = ending(result)
        return {"id": message_id, "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": result.text}] if result.text else [],
                "model": service.served_model, "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(result)}

    if not body.stream:
        return message(await run_watched(pool, request, work))  # a client that leaves frees its worker
    prompt_tokens = await pool.run(_opening_count, service, chat, texts)
    first, source, stop = await open_stream(pool, work, request)
    start = {"id": message_id, "type": "message", "role": "assistant", "content": [], "model": service.served_model,
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": prompt_tokens, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
                       "output_tokens": 0}}
    return EventStreamResponse(_events(start, first, source, ending), stop)


def _usage(result: Answer) -> dict[str, int]:
    cached = int(result.prefix_tokens_reused or 0)
    return {"input_tokens": max(int(result.prompt_tokens) - cached, 0), "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0, "output_tokens": len(result.tokens)}


def _event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event (Anthropic's ``event:`` line, then its ``data:``)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _events(start: dict[str, Any], first: Any, source: AsyncIterator[Any], ending: Any) -> AsyncIterator[bytes]:
    """Anthropic's stream: the message, one text block opened at the first text and closed at the end, the
    stop reason and usage, the end; an error after the headers is Anthropic's ``error`` event."""
    yield _event("message_start", {"type": "message_start", "message": start})
    opened = False

    def piece(text: str) -> bytes:
        nonlocal opened
        delta = _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": str(text)}})
        if opened:
            return delta
        opened = True
        return _event("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": {"type": "text", "text": ""}}) + delta

    def finish(result: Answer) -> list[bytes]:
        reason, sequence = ending(result)
        close = [_event("content_block_stop", {"type": "content_block_stop", "index": 0})] if opened else []
        return [*close,
                _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                         "usage": _usage(result)}),
                _event("message_stop", {"type": "message_stop"})]

    def error(body: dict[str, Any]) -> bytes:
        return _event("error", {"type": "error", "error": {"type": "api_error", "message": body.get("message", "")}})

    async for event in answer_events(first, source, piece, finish, error):
        yield event
