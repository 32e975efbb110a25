"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), as llama-server serves it.

A request is translated into the OpenAI chat route's messages (:mod:`..intake.messages`) and runs the
same service call: the same images (a ``base64`` source is a data URL; a ``url`` source is fetched
only where the operator allows remote media, else a 400), references, prefix states and limits.
``system`` (a string or text blocks) opens the conversation; a final ``assistant`` message is
continued (Anthropic's prefill, rendered as llama-server renders its assistant prefill: the earlier turns
with the opening of the answer's turn, then that message's text; a backend that cannot is a 400 naming
``messages``). ``max_tokens`` is required (Anthropic's rule); ``stop_sequences``,
``temperature``, ``top_p`` and ``top_k`` are honoured as on the chat route (greedy unless a
temperature is given), and so is ``output_format`` (a ``json_schema`` the answer follows); ``thinking``
``{"type": "disabled"}`` sets the chat template's ``enable_thinking`` false where the template reads it, and
``{"type": "enabled", "budget_tokens": N}`` true, as llama-server sets it: the thinking is then the answer's text (refsight
parses no reasoning out of answers, as llama-server with ``--reasoning-format none``), and ``budget_tokens`` (a
positive integer below ``max_tokens``, Anthropic's rule) bounds nothing ``max_tokens`` does not (Anthropic's budget is
a target, not a limit).
``metadata``, ``service_tier``, ``container``, ``context_management`` and blocks' ``cache_control`` are hints, and
a field or block member refsight does not know is accepted: both are named in the reply's ``refsight.ignored``
(the message's ``refsight`` object, or ``message_start``'s, present when there is one; every type is strict:
``"max_tokens": "5"`` is refused naming it). Tool use as llama-server takes it: ``tools`` (``name``,
``description``, ``input_schema``) rendered by the model's chat template, ``tool_choice`` (``auto``, ``any``,
``tool`` with its ``name``, ``none``; ``disable_parallel_tool_use``), the answer's calls as ``tool_use`` blocks with
``stop_reason: "tool_use"``, and a conversation's ``tool_use`` blocks (an assistant's calls) and ``tool_result``
blocks (each a tool message, before the rest of its user message) rendered on the next turn
(:mod:`..intake.tool_fields`). Remote ``mcp_servers``, another ``thinking`` type and ``thinking`` blocks in the
conversation are refused by name, in Anthropic's
error shape (``{"type": "error", "error": {"type": "invalid_request_error", "message"}}``,
:func:`~..edge.http_errors.anthropic_error_body`).

``stream: true`` answers with Anthropic's events: ``message_start``, ``content_block_start``,
``content_block_delta`` (``text_delta``; a ``tool_use`` block's arguments in one ``input_json_delta``),
``content_block_stop``, ``message_delta`` (the ``stop_reason`` and the usage) and ``message_stop``.
``message_start`` counts the prompt's text as the template renders it (images are counted once they are encoded:
``message_delta`` has the whole prompt). ``count_tokens`` is :mod:`..intake.input_tokens`' count (llama-server's
``/chat/completions/input_tokens`` too): a fresh image on llama.cpp, whose layout mtmd decides as it encodes, is not counted (then a lower bound).
``usage``: ``input_tokens`` the prompt tokens evaluated, ``cache_read_input_tokens`` those served from a stored
reference-prefix state, ``output_tokens`` the answer's.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any, AsyncIterator, ClassVar, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from ... import InvalidInputError
from ..replies.answers import Answer, ignored_object
from ..intake.dialect_body import DialectBody, log_ignored
from ..intake.completion_parts import stop_type, with_stopping_word
from ..deps import ConfigDep, MediaUuidsDep, Namespace, PoolDep, ServiceDep
from ..edge.disconnect import run_watched
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from ..intake.generation_body import GenerationBody, check_generation, check_schema
from ..intake.template_variables import template_variables
from ..intake.messages import chat_prompt_end, prompt_end_of
from ..intake.input_tokens import input_tokens, template_tokens
from ..intake.messages import (
    CalledFunction, ContentPart, HistoryCall, ImageURL, Message, PartResolver, messages_to_segments,
)
from ..intake.tool_fields import anthropic_tool_use, chat_tools_of, check_tools, tool_texts, tool_turns_of
from ..replies.tool_calls import anthropic_block
from ..intake.prompt_limit import check_prompt_chars, check_prompt_tokens, prompt_texts
from ..replies.streaming import EventStreamResponse, answer_events, open_stream

__all__ = ["router"]

router = APIRouter(tags=["anthropic"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}
#: Block types refused by name, with the reason.
_REFUSED_BLOCKS = {
    "thinking": "extended thinking is not supported", "redacted_thinking": "extended thinking is not supported",
    "document": "document blocks are not supported; send the pages as images",
}


class Block(DialectBody):
    """One content block: ``text``, ``image`` with its ``source``, ``tool_use`` (``id``, ``name``, ``input``) or
    ``tool_result`` (``tool_use_id``, ``content``); other types are refused by name."""

    hints: ClassVar[frozenset[str]] = frozenset({"cache_control"})
    type: str
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list["Block"] | None = None
    cache_control: dict[str, Any] | None = None


class AnthropicMessage(DialectBody):
    """A message of the conversation."""

    role: Literal["user", "assistant"]
    content: str | list[Block]


class CountBody(DialectBody):
    """``POST /v1/messages/count_tokens``: the conversation alone."""

    hints: ClassVar[frozenset[str]] = frozenset({"metadata", "service_tier", "container", "context_management"})
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1, max_length=256)
    system: str | list[Block] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    container: str | dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None

    def check_fields(self) -> None:
        """400 naming the first field refsight cannot honour (remote MCP servers, a thinking type but enabled and
        disabled, a budget that is not a positive integer below ``max_tokens``)."""
        if self.mcp_servers:
            raise ApiError(400, "unsupported", "mcp_servers: remote MCP servers are not supported; send tools",
                           param="mcp_servers")
        kind = None if self.thinking is None else self.thinking.get("type")
        if self.thinking is not None and kind not in ("enabled", "disabled"):
            raise ApiError(400, "unsupported", f"thinking.type: {kind!r} is not supported (enabled or disabled)",
                           param="thinking.type")
        if kind == "enabled":
            budget = self.thinking.get("budget_tokens")
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise ApiError(400, "invalid_input", "thinking.budget_tokens: give a positive integer of tokens",
                               param="thinking.budget_tokens")
            if budget >= getattr(self, "max_tokens", budget + 1):
                raise ApiError(400, "invalid_input", "thinking.budget_tokens: must be below max_tokens",
                               param="thinking.budget_tokens")

    def tool_use(self) -> Any:
        """The tools offered and ``tool_choice`` (:func:`~..intake.tool_fields.anthropic_tool_use`)."""
        return anthropic_tool_use(self.tools, self.tool_choice)

    def variables(self, service: Any, route: str) -> tuple[dict[str, Any], list[str]]:
        """The chat template's variables (``thinking``: ``enable_thinking``, where it is read) and the fields named in
        ``refsight.ignored`` (logged)."""
        think = None if self.thinking is None else self.thinking.get("type") == "enabled"
        variables, unread = template_variables(service, think=think)
        return variables, log_ignored(route, [*self.ignored_fields(), *("thinking" for _ in unread)])

    def chat_messages(self) -> list[Message]:
        """The conversation as the OpenAI chat route's messages (``system`` first; an assistant's ``tool_use`` blocks
        its ``tool_calls``, a user's ``tool_result`` blocks tool messages before the rest of it)."""
        out = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(
                _text_block(block, f"system[{j}]") for j, block in enumerate(self.system)
            )
            out.append(Message(role="system", content=system))
        for i, message in enumerate(self.messages):
            content = message.content
            if isinstance(content, str):
                out.append(Message(role=message.role, content=content))
                continue
            blocks = [(f"messages[{i}].content[{j}]", block) for j, block in enumerate(content)]
            out += [_tool_result(block, where) for where, block in blocks if block.type == "tool_result"]
            calls = [_call(block, where) for where, block in blocks if block.type == "tool_use"]
            if calls and message.role != "assistant":
                raise ApiError(400, "invalid_input", f"messages[{i}]: tool_use blocks are the assistant's",
                               param=f"messages[{i}]")
            parts = [_part(block, where) for where, block in blocks if block.type not in ("tool_use", "tool_result")]
            if parts or calls or not content:
                out.append(Message(role=message.role, content=parts, tool_calls=calls or None))
        return out


class OutputFormat(DialectBody):
    """``output_format``: ``{"type": "json_schema", "schema": {...}}``, the JSON schema the answer follows."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class MessagesBody(CountBody):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    output_format: OutputFormat | None = None


def _text_block(block: Block, where: str) -> str:
    if block.type != "text":
        raise ApiError(400, "invalid_input", f"{where}: the system prompt takes text blocks only", param="system")
    return block.text or ""


def _call(block: Block, where: str) -> HistoryCall:
    """A ``tool_use`` block of the conversation as the chat route's tool call."""
    if not block.id or not block.name:
        raise ApiError(400, "invalid_input", f"{where}: a tool_use block has an id and a name", param=where)
    arguments = json.dumps(block.input if block.input is not None else {}, ensure_ascii=False)
    return HistoryCall(id=block.id, function=CalledFunction(name=block.name, arguments=arguments))


def _tool_result(block: Block, where: str) -> Message:
    """A ``tool_result`` block as a tool message answering its call (its text; an image is refused, as in any
    message but a user's)."""
    if not block.tool_use_id:
        raise ApiError(400, "invalid_input", f"{where}.tool_use_id: a tool_result answers a tool_use by its id",
                       param=where)
    content = block.content
    if isinstance(content, list):
        if any(part.type != "text" for part in content):
            raise ApiError(400, "unsupported", f"{where}.content: a tool result takes text blocks here", param=where)
        content = "".join(part.text or "" for part in content)
    return Message(role="tool", content=content or "", tool_call_id=block.tool_use_id)


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


def _checked(body: MessagesBody, tools: Any, service: Any, config: Any) -> tuple[int, Any, list[Message], str, list[str], Any]:
    """The checks against the served model, in the work pool (they tokenize): the token bound and the sampling, the
    conversation as chat messages, how its prompt ends (a final assistant message: Anthropic's prefill, continued),
    its tool turns (with ``tools``, checked against the backend) and its texts, within the prompt limit."""
    max_new_tokens, sampling = _generation(body, service, config.max_new_tokens)
    chat = body.chat_messages()
    prompt_end = chat_prompt_end(service, chat)
    tool_turns = tool_turns_of(chat)
    check_tools(service, tools, tool_turns)
    texts = prompt_texts(chat) + tool_texts(tools, tool_turns, service)
    check_prompt_chars(texts, config.max_prompt_tokens)
    check_prompt_tokens(texts, config.max_prompt_tokens, service.count_text_tokens)
    return max_new_tokens, sampling, chat, prompt_end, texts, tool_turns


def _opening_count(service: Any, messages: list[Message], texts: list[str], tools: Any,
                   variables: dict[str, Any]) -> int:
    """``message_start``'s ``input_tokens``: the template's tokens, or the texts' where a backend renders none."""
    try:
        return template_tokens(service, messages, prompt_end_of(messages)[0], tools, variables)  # a prefill continued
    except InvalidInputError:
        return service.count_text_tokens("\n".join(texts))


@router.post("/v1/messages/count_tokens", responses=_ERRORS)
async def count_tokens(
    request: Request, body: CountBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> dict[str, Any]:
    """The prompt's tokens (``input_tokens``), images included: nothing is generated."""
    body.check_fields()
    variables, ignored = body.variables(service, request.url.path)
    messages = body.chat_messages()
    tools, tool_turns = body.tool_use(), tool_turns_of(messages)
    check_tools(service, tools, tool_turns)
    check_prompt_chars(prompt_texts(messages) + tool_texts(tools, tool_turns, service), config.max_prompt_tokens)
    resolver = PartResolver.for_request(request, service, namespace, uuids, config)

    ending = prompt_end_of(messages)[0]
    count = await pool.run(input_tokens, service, messages, ending, resolver, namespace,
                           chat_tools_of(tools, tool_turns), variables)
    return {"input_tokens": count, **ignored_object(ignored)}


@router.post("/v1/messages", responses=_ERRORS)
async def messages(
    request: Request, body: MessagesBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """Anthropic's Messages API over the served model: the chat route's work, Anthropic's shapes."""
    body.check_fields()
    variables, ignored = body.variables(service, request.url.path)
    extra = ignored_object(ignored)
    schema = check_schema(body.output_format.schema_, "output_format.schema") if body.output_format else None
    tools = body.tool_use()
    max_new_tokens, sampling, chat, prompt_end, texts, tool_turns = await pool.run(_checked, body, tools, service, config)
    resolver = PartResolver.for_request(request, service, namespace, uuids, config)
    message_id = f"msg_{uuidlib.uuid4().hex}"

    def work(on_text=None, stop_event=None) -> Answer:
        segments, turns = messages_to_segments(chat, resolver)
        result = service.chat(segments, namespace=namespace, turns=turns, max_new_tokens=max_new_tokens,
                              sampling=sampling, on_text=on_text, stop_event=stop_event, prompt_end=prompt_end,
                              json_schema=schema, template_variables=variables, tools=tools, tool_turns=tool_turns,
                              on_tool_call=on_text)
        answer = Answer.of(result, media_uuids=[use.to_dict() for use in resolver.commit()])
        return with_stopping_word(answer, sampling.stop, service)

    def ending(result: Answer) -> tuple[str, str | None]:
        if result.tool_calls:
            return "tool_use", None
        if result.finish_reason == "length":
            return "max_tokens", None
        kind, word = stop_type(result)
        return ("stop_sequence", word) if kind == "word" else ("end_turn", None)

    def message(result: Answer) -> dict[str, Any]:
        reason, sequence = ending(result)
        text = [{"type": "text", "text": result.text}] if result.text else []
        return {"id": message_id, "type": "message", "role": "assistant",
                "content": text + [anthropic_block(call) for call in result.tool_calls],
                "model": service.served_model, "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(result),
                **extra}

    if not body.stream:
        return message(await run_watched(pool, request, work))  # a client that leaves frees its worker
    prompt_tokens = await pool.run(_opening_count, service, chat, texts, chat_tools_of(tools, tool_turns), variables)
    first, source, stop = await open_stream(pool, work, request)
    start = {"id": message_id, "type": "message", "role": "assistant", "content": [], "model": service.served_model,
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": prompt_tokens, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
                       "output_tokens": 0}, **extra}
    return EventStreamResponse(_events(start, first, source, ending), stop)


def _usage(result: Answer) -> dict[str, int]:
    cached = int(result.prefix_tokens_reused or 0)
    return {"input_tokens": max(int(result.prompt_tokens) - cached, 0), "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0, "output_tokens": len(result.tokens)}


def _event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event (Anthropic's ``event:`` line, then its ``data:``)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _events(start: dict[str, Any], first: Any, source: AsyncIterator[Any], ending: Any) -> AsyncIterator[bytes]:
    """Anthropic's stream: the message, one text block opened at the first text and closed at its end (a tool
    call's, or the answer's), a ``tool_use`` block per call, the stop reason and usage, the end; an error after the
    headers is Anthropic's ``error`` event."""
    yield _event("message_start", {"type": "message_start", "message": start})
    blocks, opened = 0, False  # blocks started so far; whether the last one (a text block) is still open

    def piece(text: str) -> bytes:
        nonlocal blocks, opened
        opening = b""
        if not opened:
            blocks, opened = blocks + 1, True
            opening = _event("content_block_start", {"type": "content_block_start", "index": blocks - 1,
                                                     "content_block": {"type": "text", "text": ""}})
        return opening + _event("content_block_delta", {"type": "content_block_delta", "index": blocks - 1,
                                                      "delta": {"type": "text_delta", "text": str(text)}})

    def close() -> list[bytes]:
        nonlocal opened
        was, opened = opened, False
        return [_event("content_block_stop", {"type": "content_block_stop", "index": blocks - 1})] if was else []

    def call(item: Any) -> bytes:
        nonlocal blocks
        events, blocks = close(), blocks + 1
        block = anthropic_block(item)
        events += [_event("content_block_start", {"type": "content_block_start", "index": blocks - 1,
                                                  "content_block": {**block, "input": {}}}),
                   _event("content_block_delta", {"type": "content_block_delta", "index": blocks - 1, "delta": {
                       "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}}),
                   _event("content_block_stop", {"type": "content_block_stop", "index": blocks - 1})]
        return b"".join(events)

    def finish(result: Answer) -> list[bytes]:
        reason, sequence = ending(result)
        return [*close(),
                _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                         "usage": _usage(result)}),
                _event("message_stop", {"type": "message_stop"})]

    def error(body: dict[str, Any]) -> bytes:
        return _event("error", {"type": "error", "error": {"type": "api_error", "message": body.get("message", "")}})

    async for event in answer_events(first, source, piece, finish, error, call=call):
        yield event
