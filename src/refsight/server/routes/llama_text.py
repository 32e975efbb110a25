"""llama-server's endpoints over the served model's tokenizer and chat template, in llama-server's shapes.

``POST /tokenize`` (``with_pieces``: each token's text, or its bytes), ``/detokenize`` and ``/apply-template`` (the
chat template around chat messages, with the request's template variables and tools, as a chat renders it). The
tokenizer's work runs in the work pool, a render under the renders' own bound; a hint, or a field refsight does not
know, is accepted and named in a ``refsight`` object beside the reply.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from ..deps import ConfigDep, Namespace, PoolDep, ServiceDep
from ..edge.http_errors import ERROR_RESPONSES
from ..edge.responses import TextSafeJSONResponse
from ..intake.dialect_body import DialectBody, log_ignored
from ..intake.messages import Message, prompt_end_of, template_segments
from ..intake.prompt_limit import check_prompt_chars
from ..intake.template_variables import template_variables
from ..intake.tool_fields import chat_tools_of, check_tools, openai_tool_use, tool_texts, tool_turns_of
from ..replies.answers import ignored_object

__all__ = ["router"]

router = APIRouter(tags=["llama-server"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}
#: Most token ids one /detokenize request may carry.
MAX_DETOKENIZE = 1 << 16


class TokenizeBody(DialectBody):
    """``POST /tokenize``."""

    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


def _noting_ignored(request: Request, body: DialectBody) -> dict[str, Any]:
    """The ``refsight`` object of a reply that carries none otherwise: the fields refsight did not use, if any."""
    ignored = log_ignored(request.url.path, body.ignored_fields())
    return ignored_object(ignored)


@router.post("/tokenize", responses=_ERRORS)
async def tokenize(
    request: Request, body: TokenizeBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep
) -> Any:
    """The served model's own tokens of ``content`` (with ``with_pieces``: each token's text, or its bytes)."""
    check_prompt_chars([body.content], config.max_prompt_tokens, "content")

    def work(extra: dict[str, Any]) -> TextSafeJSONResponse:
        ids = service.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
        tokens = _with_pieces(ids, service) if body.with_pieces else ids
        # Rendered here, in the worker: a prompt's worth of pieces is a second of JSON, never the event loop's.
        return TextSafeJSONResponse({"tokens": tokens, **extra})

    extra = _noting_ignored(request, body)  # named here, on the event loop; the reply is rendered in the worker
    return await pool.run(work, extra)


def _with_pieces(ids: list[int], service: Any) -> list[dict[str, Any]]:
    """Each token with its ``piece``; each distinct token's piece read once (a text repeats its tokens)."""
    pieces: dict[int, str | list[int]] = {}
    for token in ids:
        if token not in pieces:
            pieces[token] = _piece(service.token_piece(token))
    return [{"id": token, "piece": pieces[token]} for token in ids]


def _piece(data: bytes) -> str | list[int]:
    """llama-server's ``piece``: the text when it is valid UTF-8, else the list of bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


class DetokenizeBody(DialectBody):
    """``POST /detokenize``."""

    tokens: list[int] = Field(default_factory=list, max_length=MAX_DETOKENIZE)


@router.post("/detokenize", responses=_ERRORS)
async def detokenize(
    request: Request, body: DetokenizeBody, namespace: Namespace, service: ServiceDep, pool: PoolDep
) -> dict[str, Any]:
    """The text of ``tokens`` in the served model's vocabulary."""
    return {"content": await pool.run(service.detokenize, body.tokens), **_noting_ignored(request, body)}


class ApplyTemplateBody(DialectBody):
    """``POST /apply-template``: chat messages as ``/v1/chat/completions`` takes them, and the template's variables."""

    messages: list[Message] = Field(min_length=1, max_length=256)
    # llama-server's fields: false leaves out the opening of the answer's turn; a final assistant message is
    # continued (prefilled) as in a chat; tools rendered as a chat renders them.
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    think: bool | Literal["low", "medium", "high"] | None = None


@router.post("/apply-template", responses=_ERRORS)
async def apply_template(
    request: Request, body: ApplyTemplateBody, namespace: Namespace, service: ServiceDep, pool: PoolDep,
    config: ConfigDep,
) -> dict[str, Any]:
    """The served model's chat template around ``messages`` (with the request's template variables), images as the
    media marker (for ``/completion``), ended as the chat would be: a final assistant message continued
    (llama-server's prefill), its ``tools`` and the messages' tool calls and results rendered as a chat renders
    them."""
    tools = openai_tool_use(body.tools, body.tool_choice, body.parallel_tool_calls)
    tool_turns = tool_turns_of(body.messages)
    check_tools(service, tools, tool_turns)
    variables, unread = template_variables(service, body.chat_template_kwargs, body.reasoning_effort, body.think)
    texts, turns = template_segments(body.messages, service.media_marker)
    check_prompt_chars(texts + tool_texts(tools, tool_turns, service), config.max_prompt_tokens)
    ending, _ = prompt_end_of(body.messages, body.add_generation_prompt, body.continue_final_message)
    ignored = log_ignored(request.url.path, [*body.ignored_fields(), *unread])
    prompt = await pool.run_light(service.render_chat, texts, turns, ending, chat_tools_of(tools, tool_turns),
                                  variables)  # the renders' own bound
    return {"prompt": prompt, **ignored_object(ignored)}
