"""Ollama's native generation endpoints, ``POST /api/chat`` and ``POST /api/generate``, in Ollama's shapes.

So the ``ollama`` Python and JS libraries, LangChain's ``ChatOllama`` and every other Ollama client work
unchanged against ``refsight serve`` (``--port 11434`` is Ollama's port). The bodies and what each
field means are :mod:`.ollama_bodies`; the generation is the engine's, as on every other text route.

``stream`` defaults to **true**: NDJSON lines (``application/x-ndjson``), one per piece of text with
``done: false``, then the last with ``done: true``, ``done_reason`` and the counts and durations
(nanoseconds): ``total_duration`` (the request), ``load_duration`` (loading cached image packages from
the store; the model itself is loaded at start), ``prompt_eval_count`` / ``prompt_eval_duration`` (the
prompt, images included, up to the first token), ``eval_count`` / ``eval_duration`` (the answer). An
error after the stream began is a last line ``{"error": "..."}``, as Ollama sends it. A request without
a prompt (no messages; an empty prompt and no images) answers at once with ``done_reason: "load"``,
Ollama's way of loading a model (``"unload"`` with ``keep_alive: 0``; the model stays loaded here).
Each answer also carries refsight's own ``refsight`` object (references cached, timings; ``ignored``: the fields
refsight did not use, :mod:`.ollama_bodies`; with ``options.num_ctx`` sent, ``num_ctx``: the context the answer had,
the served one, since the context is fixed when the server starts). A whole answer
(``stream: false``) stops its generation when the client leaves (:func:`..edge.disconnect.run_watched`), as a
stream does.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Callable

from fastapi import APIRouter, Request

from ..intake.completion_parts import RawPrompt, check_raw_prompt, raw_prompt
from ..deps import ConfigDep, MediaUuidsDep, PoolDep, ServiceDep, Namespace
from ..edge.disconnect import run_watched
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from .ollama_bodies import (
    OllamaChatBody, OllamaGenerateBody, OllamaMessage, OllamaOptions, chat_segments, check_refused, check_requested_model,
    generation, ollama_name, ollama_tool_turns, schema_of, thinking,
)
from ..intake.dialect_body import log_ignored
from ..intake.tool_fields import check_tools, openai_tool_use, tool_texts
from ..replies.tool_calls import ollama_calls
from ..replies.answers import Answer, finish_reason, ignored_extra, ignored_object, refsight_extra
from ..intake.messages import PartResolver
from ..intake.prompt_limit import check_prompt_chars, check_prompt_tokens
from ..replies.streaming import NDJSON, EventStreamResponse, answer_events, ndjson_line, open_stream
from .ollama_models import model_facts

__all__ = ["router", "created_at"]

router = APIRouter(tags=["ollama"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}


def created_at() -> str:
    """Now, as Ollama writes ``created_at`` (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(int(seconds * 1e9), 0)


class _Clock:
    """Passes each piece of text on and notes when the first came: the prompt's share of the time ends there."""

    def __init__(self, on_text: Callable[[str], None] | None) -> None:
        self.on_text = on_text
        self.began = time.perf_counter()
        self.first: float | None = None

    def __call__(self, piece: str) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        if self.on_text is not None:
            self.on_text(piece)


class _Answer:
    """One generation request, answered whole or as NDJSON lines; ``key`` is ``message`` (chat) or ``response``."""

    def __init__(self, key: str, service: Any, namespace: str, make_segments: Callable[[], tuple[list[Any], Any]],
                 options: dict[str, Any], note: dict[str, Any] | None = None) -> None:
        self.key, self.service, self.namespace = key, service, namespace
        self.make_segments, self.options = make_segments, options
        #: What the last object's ``refsight`` adds (the context used, when the request sent ``num_ctx``).
        self.note = note or {}
        self.began = time.perf_counter()
        self.model = ollama_name(service)

    def work(self, on_text: Callable[[str], None] | None = None, stop_event: Any = None) -> Answer:
        """The blocking generation (in a pool slot); its result with the clock's marks (a tool call streamed is an
        item of the stream itself)."""
        segments, turns = self.make_segments()
        clock = _Clock(on_text)
        result = self.service.chat(segments, namespace=self.namespace, turns=turns, on_text=clock,
                                   stop_event=stop_event, on_tool_call=on_text, **self.options)
        ended = time.perf_counter()
        first = clock.first or ended
        return Answer.of(result, prompt_s=first - clock.began, eval_s=ended - first)

    def piece(self, text: str) -> dict[str, Any]:
        """One streamed line (``done: false``)."""
        return {"model": self.model, "created_at": created_at(), **self._text(text), "done": False}

    def call(self, call: Any, index: int) -> dict[str, Any]:
        """A streamed line carrying one tool call (``done: false``), the answer's ``index``-th."""
        message = {"role": "assistant", "content": "", "tool_calls": ollama_calls([call], index)}
        return {"model": self.model, "created_at": created_at(), "message": message, "done": False}

    def final(self, result: Answer, text: str, calls: Any = ()) -> dict[str, Any]:
        """The last (or only) object: the text (and the tool calls not streamed), ``done_reason`` (``stop`` after tool
        calls, as Ollama says), the counts and the durations in nanoseconds."""
        said = self._text(text)
        if calls:
            said["message"]["tool_calls"] = ollama_calls(calls)
        return {
            "model": self.model, "created_at": created_at(), **said, "done": True,
            "done_reason": "stop" if result.finish_reason == "tool_calls" else finish_reason(result),
            "total_duration": _ns(time.perf_counter() - self.began),
            "load_duration": _ns(result.timings_ms.get("reference_load", 0.0) / 1000),
            "prompt_eval_count": result.prompt_tokens, "prompt_eval_duration": _ns(result.prompt_s),
            "eval_count": len(result.tokens), "eval_duration": _ns(result.eval_s),
            "refsight": {**refsight_extra(result), **self.note},
        }

    def _text(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}} if self.key == "message" else {"response": text}

    async def reply(self, pool: Any, request: Request, stream: bool) -> Any:
        """The whole answer, or the NDJSON stream of it."""
        if not stream:
            result = await run_watched(pool, request, self.work)  # a client that leaves frees its worker
            return self.final(result, result.text, result.tool_calls)
        first, source, stop = await open_stream(pool, self.work, request)
        return EventStreamResponse(self._lines(first, source), stop, media_type=NDJSON)

    async def _lines(self, first: Any, source: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        def error(shape: dict[str, Any]) -> bytes:
            return ndjson_line({"error": shape["message"], "code": shape["code"]})

        calls = 0

        def call(item: Any) -> bytes:
            nonlocal calls
            calls += 1
            return ndjson_line(self.call(item, calls - 1))

        pieces = answer_events(
            first, source, lambda text: ndjson_line(self.piece(text)),
            lambda result: [ndjson_line(self.final(result, ""))], error, call=call,
        )
        async for line in pieces:
            yield line


def _loaded(service: Any, key: str, keep_alive: Any, ignored: list[str]) -> dict[str, Any]:
    """Ollama's answer to a request without a prompt: the model is loaded (it always is here)."""
    unload = keep_alive in (0, "0", "0s", "0m")
    text = {"message": {"role": "assistant", "content": ""}} if key == "message" else {"response": ""}
    return {"model": ollama_name(service), "created_at": created_at(), **text, "done": True,
            "done_reason": "unload" if unload else "load", **ignored_object(ignored)}


def _note(options: Any, service: Any, ignored: list[str]) -> dict[str, Any]:
    """What the last object's ``refsight`` adds: the fields refsight did not use, and the word on ``options.num_ctx``
    (the context the answer had, the served one; None: the runtime has no fixed window) whenever the request sent
    one: the context is fixed at start."""
    return {**ignored_extra(ignored), **({"num_ctx": service.context_size} if options.num_ctx is not None else {})}


def _resolver(request: Request, service: Any, namespace: str, uuids: Any, config: Any) -> PartResolver:
    return PartResolver.for_request(request, service, namespace, uuids, config)


def _checked(
    options: dict[str, Any] | None, prompt: list[str] | Callable[[], RawPrompt], service: Any, config: Any
) -> tuple[int, Any, OllamaOptions, list[str] | RawPrompt]:
    """The checks against the served model, in the work pool (they tokenize): ``options`` as the token bound, the
    sampling and the options read, then the prompt within the prompt limit, characters then tokens: its texts, or
    its raw prompt (made by ``prompt()``, after the options' checks)."""
    max_new_tokens, sampling, read = generation(options, service, config.max_new_tokens)
    if callable(prompt):
        prompt = prompt()
        check_raw_prompt(prompt, config.max_prompt_tokens, service)
    else:
        check_prompt_chars(prompt, config.max_prompt_tokens)
        check_prompt_tokens(prompt, config.max_prompt_tokens, service.count_text_tokens)
    return max_new_tokens, sampling, read, prompt


@router.post("/api/chat", responses=_ERRORS)
async def chat(
    request: Request, body: OllamaChatBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """Ollama's chat: ``messages`` (with ``images``, tool calls and results) and ``tools`` in the model's chat template;
    NDJSON unless ``stream: false``."""
    check_requested_model(body.model, service)
    check_refused(body)
    system = model_facts(service).get("system")
    tools, tool_turns = openai_tool_use(body.tools), ollama_tool_turns(body.messages, system)  # the model chooses
    check_tools(service, tools, tool_turns)
    texts = [m.content for m in body.messages] + tool_texts(tools, tool_turns, service)
    max_new_tokens, sampling, read, _ = await pool.run(_checked, body.options, texts, service, config)
    variables, unread = thinking(body, read, service)
    ignored = log_ignored(request.url.path, [*body.ignored_fields(), *read.ignored_fields("options."), *unread])
    if not body.messages:
        return _loaded(service, "message", body.keep_alive, ignored)
    options = {"max_new_tokens": max_new_tokens, "sampling": sampling, "json_schema": schema_of(body.format),
               "template_variables": variables, "tools": tools, "tool_turns": tool_turns}
    resolver = _resolver(request, service, namespace, uuids, config)
    answer = _Answer("message", service, namespace, lambda: chat_segments(body.messages, resolver, system), options,
                     _note(read, service, ignored))
    return await answer.reply(pool, request, body.stream)


def _check_generate(body: OllamaGenerateBody) -> None:
    """400 naming the generate fields refsight cannot honour."""
    if body.suffix:
        raise ApiError(400, "unsupported", "suffix: fill-in-the-middle is not supported by refsight", param="suffix")
    if body.template:
        raise ApiError(400, "unsupported", "template: refsight renders the model's own chat template; send raw: true "
                       "with the whole prompt instead", param="template")
    if body.context:
        raise ApiError(400, "unsupported", "context: token contexts are not kept; send the conversation to /api/chat",
                       param="context")
    if body.raw and body.system:
        raise ApiError(400, "invalid_input", "system: a raw prompt takes no system prompt; write it into the prompt",
                       param="system")


@router.post("/api/generate", responses=_ERRORS)
async def generate(
    request: Request, body: OllamaGenerateBody, namespace: Namespace, service: ServiceDep, pool: PoolDep,
    config: ConfigDep, uuids: MediaUuidsDep,
) -> Any:
    """Ollama's completion of ``prompt`` (with ``images`` and ``system``) in the model's chat template, or
    ``raw``: the prompt as given, one media marker per image (``GET /props``' ``media_marker``)."""
    check_requested_model(body.model, service)
    check_refused(body)
    _check_generate(body)

    def raw() -> RawPrompt:
        return raw_prompt(body.prompt or "", body.images, service.media_marker, "prompt")

    loading = not body.prompt and not body.images  # Ollama's load: the options checked, nothing generated
    prompt_of = raw if body.raw and not loading else [body.prompt or "", body.system or ""]
    max_new_tokens, sampling, read, prompt = await pool.run(_checked, body.options, prompt_of, service, config)
    variables, unread = thinking(body, read, service, raw=body.raw)
    ignored = log_ignored(request.url.path, [*body.ignored_fields(), *read.ignored_fields("options."), *unread])
    if loading:
        return _loaded(service, "response", body.keep_alive, ignored)
    options = {"max_new_tokens": max_new_tokens, "sampling": sampling, "json_schema": schema_of(body.format)}
    resolver, note = _resolver(request, service, namespace, uuids, config), _note(read, service, ignored)
    if body.raw:
        answer = _Answer("response", service, namespace, lambda: (prompt.segments(resolver), None),
                         {**options, "raw_prompt": True}, note)
        return await answer.reply(pool, request, body.stream)
    system = body.system or model_facts(service).get("system")
    messages = [OllamaMessage(role="user", content=body.prompt or "", images=body.images)]
    answer = _Answer("response", service, namespace, lambda: chat_segments(messages, resolver, system, ""),
                     {**options, "template_variables": variables}, note)
    return await answer.reply(pool, request, body.stream)
