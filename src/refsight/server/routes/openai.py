"""``POST /v1/chat/completions`` in the shape the OpenAI Python SDK sends and parses.

Messages carry ``text`` and ``image_url`` parts (:mod:`..intake.messages`). An image is a
base64 ``data:`` URL (with vLLM's ``uuid`` beside it: also remembered under that uuid;
``image_url: null`` with a ``uuid``: the image sent before under it), or a stored
reference named without its bytes: ``refsight://ref/<id>`` or this server's
``http://HOST:PORT/v1/references/<id>/image``. References and uuids resolve in the
caller's namespace only, so another tenant's id is a 404 exactly like an absent one.
Other ``http(s)`` (and ``file://``) URLs are refused unless the operator opted in
(:mod:`..intake.remote_media`): by default the server makes no request on a client's behalf. The reply's
``refsight.media_uuids`` says what each uuid did.

Conversations: ``system``/``developer``, ``user`` and ``assistant`` messages, in any
number, with images in any user turn, are rendered in the model's own chat template. A final
``assistant`` message is continued, as llama-server's assistant prefill does it (its default): the
earlier turns with the opening of the answer's turn, then that message's text, which the answer
goes on from; ``continue_final_message: true`` with ``add_generation_prompt: false`` asks for it as
vLLM and llama-server take it, and ``add_generation_prompt: false`` alone ends the prompt after
the turns. ``stream: true`` with ``return_progress: true`` sends llama-server's ``prompt_progress``
(``total``, ``cache``: tokens from a stored reference-prefix state, ``processed``, ``time_ms``) as
the prompt's evaluation starts and once it is done, before the first token.

``stream: true`` answers with server-sent ``chat.completion.chunk`` events as tokens are
generated (:mod:`..replies.streaming`); a client that disconnects stops generation. ``model`` is
optional and, as llama-server ignores it, any name is served by the one model (the reply's
``model`` says which) unless ``strict_model_names`` makes another name a 404. Sampling
(:mod:`..intake.generation_body`): ``temperature`` (default 0: greedy, unlike OpenAI's 1, so answers are
reproducible), ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` (``repeat_penalty``), ``seed``, ``stop``,
``frequency_penalty``, ``presence_penalty``, ``repeat_last_n`` where the served backend honours them, and a field
it cannot honour is a 400 naming it; hints (``cache_prompt``, ``id_slot``, Ollama's ``num_ctx`` ... at the top level,
as Open WebUI sends them) and fields refsight does not know are accepted and named in the reply's
``refsight.ignored``. The template's variables (``chat_template_kwargs``, ``reasoning_effort``, ``think``:
:mod:`..intake.template_variables`) reach the chat template where it reads them. ``usage`` counts the
real prompt (text and image tokens), with ``prompt_tokens_details.cached_tokens`` = image
tokens served from cached packages.

``response_format`` ``json_schema`` (or ``json_object``; llama-server's top-level
``json_schema``) is passed to the engine's constrained decoding. ``tools``, ``tool_choice`` and
``parallel_tool_calls`` are llama-server's ``--jinja`` tool calling (:mod:`..intake.tool_fields`): the tools rendered
by the model's chat template, its answer read into ``tool_calls`` (:mod:`..replies.tool_calls`; ``required`` and a
named function constrained to their JSON schema, as vLLM does), ``tool`` messages and an assistant's ``tool_calls``
rendered on the next turn. The answer is a standard ``chat.completion`` plus a
``refsight`` object (``random_weights``, ``references_cached``, ``timings_ms``, ``ignored``); text
from a random-weight model is labelled there, since it carries no meaning. Errors use
OpenAI's error shape (:func:`refsight.server.edge.http_errors.openai_error_body`).
"""

from __future__ import annotations

import time
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, AsyncIterator, ClassVar, Mapping

from fastapi import APIRouter, Request
from pydantic import Field

from ... import InvalidInputError, Sampling
from ..replies.answers import SYSTEM_FINGERPRINT, Answer, finish_reason, ignored_object, refsight_extra, usage
from ..deps import ConfigDep, MediaUuidsDep, PoolDep, ServiceDep, Namespace
from ..intake.bodies import StreamOptions
from ..intake.dialect_body import log_ignored
from ..intake.generation_body import GenerationBody, check_generation
from ..intake.generation_fields import HINTS, NEUTRAL, Neutral
from ..intake.template_variables import template_variables
from ..intake.input_tokens import input_tokens
from ..replies.logprob_fields import chat_logprobs, piece_logprobs
from ..edge.http_errors import ERROR_RESPONSES, ApiError, inputs_as_fields
from ..edge.disconnect import run_watched
from ..edge.sleep import needs_no_model
from ..intake.completion_parts import stop_type, with_stopping_word
from ..intake.messages import Message, PartResolver, chat_prompt_end, messages_to_segments, template_segments
from ..intake.prompt_limit import check_prompt_chars, check_prompt_tokens, prompt_texts
from ..intake.tool_fields import chat_tools_of, check_tools, openai_tool_use, tool_texts, tool_turns_of
from ..replies.streaming import (
    SSE_DONE, EventStreamResponse, PromptProgress, answer_events, open_stream, progress_hook, sse_event,
)
from ..replies.timings import TokenClock
from ..replies.tool_calls import openai_delta, openai_message

__all__ = ["router", "ChatBody"]

router = APIRouter(tags=["openai"])


class ChatBody(GenerationBody):
    """The OpenAI chat body (and the vLLM, llama-server and Open WebUI fields, :mod:`..intake.generation_body`).

    The service builds the :class:`refsight.requests.GenerationRequest` the engine takes from what it holds."""

    # The template's variables and verbose are honoured here; return_tokens is /completion's.
    hints: ClassVar[frozenset[str]] = frozenset({*HINTS, "return_tokens"})
    # How the prompt ends and the tools offered are honoured here (the other routes take them at a neutral value).
    neutral: ClassVar[Mapping[str, Neutral]] = {name: rule for name, rule in NEUTRAL.items() if name not in (
        "add_generation_prompt", "continue_final_message", "tools", "tool_choice", "parallel_tool_calls")}

    model: str | None = Field(None, description="the served model (optional, as llama-server has it)")
    messages: list[Message] = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    logprobs: bool | None = Field(None, description="each answer token's log probability (honoured where the backend lists it)")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="with logprobs: the N most likely alternatives per token")
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    add_generation_prompt: bool | None = Field(None, description="false: the prompt ends after the turns")
    continue_final_message: bool | None = Field(
        None, description="true (with add_generation_prompt false): the answer continues the final assistant message "
        "(a final assistant message is continued anyway: llama-server's assistant prefill)"
    )
    tools: list[Any] | None = Field(None, description="functions the model may call, rendered by its chat template")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="auto (default), none, required, or {\"type\": \"function\", \"function\": {\"name\"}}"
    )
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call in an answer")

    def tool_use(self) -> Any:
        """The request's tools (:func:`..intake.tool_fields.openai_tool_use`); 400 naming what tools cannot go with:
        a GBNF ``grammar`` (llama-server's rule) and streamed log probabilities."""
        use = openai_tool_use(self.tools, self.tool_choice, self.parallel_tool_calls)
        if use is not None and use.choice != "none" and self.grammar:
            raise ApiError(400, "invalid_input", "grammar: cannot be used with tools", param="grammar")
        if use is not None and self.stream and (self.logprobs or self.n_probs):
            raise ApiError(400, "unsupported", "logprobs: not supported with tools and stream", param="logprobs")
        return use

    def requested_logprobs(self) -> tuple[int | None, str]:
        """OpenAI's ``logprobs`` (with ``top_logprobs`` alternatives, 0 unless given), else llama-server's ``n_probs``."""
        if self.logprobs:
            return (self.top_logprobs or 0), "logprobs"
        if self.top_logprobs is not None:
            raise ApiError(400, "invalid_input", "top_logprobs: requires logprobs: true", param="top_logprobs")
        return super().requested_logprobs()

    def check_choices(self) -> None:
        """400 naming what one answer cannot honour: several choices, the stream's own options,
        two token bounds that differ (how the prompt ends: :func:`..intake.messages.prompt_end_of`)."""
        if self.n not in (None, 1):
            raise ApiError(400, "unsupported", "n: only one choice (n=1) is supported", param="n")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "invalid_input", "stream_options: only allowed with stream=true", param="stream_options")
        if self.max_tokens is not None and self.max_completion_tokens is not None and self.max_tokens != self.max_completion_tokens:
            raise ApiError(400, "invalid_input", "max_tokens: differs from max_completion_tokens; give one", param="max_tokens")


@dataclass(frozen=True)
class _Checked:
    """What the checks of a chat body make of it: the token bound, the sampling, the prompt's end, the template's
    variables and the fields named in ``refsight.ignored``."""

    max_new_tokens: int
    sampling: Sampling
    prompt_end: str
    variables: dict[str, Any]
    ignored: list[str]
    json_schema: Any
    tools: Any
    tool_turns: Any


def _check_request(body: ChatBody, service: Any, config: Any, route: str) -> _Checked:
    """Refuse what cannot be honoured (400 naming the field); what the chat makes of the rest. Then the prompt's text
    (the tools' too) within the prompt limit: characters, then tokens. In the work pool: it reads the served model's
    template and tokenizer."""
    body.check_choices()
    prompt_end = chat_prompt_end(service, body.messages, body.add_generation_prompt, body.continue_final_message)
    variables, unread = template_variables(service, body.chat_template_kwargs, body.reasoning_effort, body.think)
    max_new_tokens, sampling = check_generation(body, service, body.max_completion_tokens, config.max_new_tokens)
    json_schema, tools, tool_turns = body.schema(), body.tool_use(), tool_turns_of(body.messages)
    check_tools(service, tools, tool_turns)
    texts = prompt_texts(body.messages) + tool_texts(tools, tool_turns, service)
    check_prompt_chars(texts, config.max_prompt_tokens)
    check_prompt_tokens(texts, config.max_prompt_tokens, service.count_text_tokens)
    ignored = log_ignored(route, [*body.ignored_fields(), *unread])
    return _Checked(max_new_tokens, sampling, prompt_end, variables, ignored, json_schema, tools, tool_turns)


@router.post("/v1/chat/completions", responses={k: ERROR_RESPONSES[k] for k in (400, 404)})
# llama-server answers its OpenAI routes without the /v1 prefix too, and many clients call them so.
@router.post("/chat/completions", responses={k: ERROR_RESPONSES[k] for k in (400, 404)}, include_in_schema=False)
async def chat_completions(
    request: Request, body: ChatBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """OpenAI-compatible chat with images; reference packages come from the store, never re-encoded.

    With ``stream: true`` the answer is ``text/event-stream`` of ``chat.completion.chunk``
    events, ``data: [DONE]`` last.
    """
    checked = await pool.run(_check_request, body, service, config, request.url.path)
    completion_id, created = f"chatcmpl-{uuidlib.uuid4().hex}", int(time.time())
    resolver = PartResolver.for_request(request, service, namespace, uuids, config)
    clock = TokenClock()
    verbose = await _verbose_of(body, service, pool, checked, clock, config.verbose)

    def closing(result: Answer) -> dict[str, Any]:  # what the answer's last object (or finishing chunk) adds
        return {"refsight": refsight_extra(result, checked.ignored), **({"__verbose": verbose(result)} if verbose else {})}

    def work(on_text=None, stop_event=None) -> Answer:
        segments, turns = messages_to_segments(body.messages, resolver)
        clock.begin()
        try:
            result = service.chat(
                segments, namespace=namespace, turns=turns, max_new_tokens=checked.max_new_tokens,
                json_schema=checked.json_schema, sampling=checked.sampling, on_text=clock.wrap(on_text),
                stop_event=stop_event, prompt_end=checked.prompt_end, template_variables=checked.variables,
                on_prompt=progress_hook(on_text, body.return_progress), tools=checked.tools, tool_turns=checked.tool_turns,
                on_tool_call=on_text,  # the stream's own channel: each call an item of it
            )
        finally:
            clock.stop()
        answer = Answer.of(result, media_uuids=[use.to_dict() for use in resolver.commit()])
        return with_stopping_word(answer, checked.sampling.stop, service) if verbose else answer

    if body.stream:
        first, source, stop = await open_stream(pool, work, request)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStreamResponse(
            _chunks(first, source, completion_id, created, service.served_model, include_usage, clock,
                    bool(body.timings_per_token), closing), stop
        )
    result = await run_watched(pool, request, work)  # a client that leaves frees its worker
    choice = {"index": 0, "message": openai_message(result.text, result.tool_calls),
              "finish_reason": finish_reason(result), "logprobs": chat_logprobs(result.logprobs)}
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": service.served_model,
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": [choice], "usage": usage(result),
            "timings": clock.final(result), **closing(result)}


async def _verbose_of(body: ChatBody, service: Any, pool: Any, checked: _Checked, clock: TokenClock,
                      server_verbose: bool) -> Any:
    """With ``verbose`` (by default the server's ``--verbose``, as llama-server's), what makes llama-server's
    ``__verbose`` of an answer: the answer as ``/completion`` gives it, with the prompt as rendered in the chat
    template (images as the media marker, with the tools), less its ``generation_settings``; None without
    ``verbose``, or with the server's alone on a backend that shows no template as text."""
    if not (server_verbose if body.verbose is None else body.verbose):
        return None
    texts, turns = template_segments(body.messages, service.media_marker)
    tools = chat_tools_of(checked.tools, checked.tool_turns)
    try:
        with inputs_as_fields(messages="verbose"):  # a backend without its template as text: a 400 naming verbose
            prompt = await pool.run_light(service.render_chat, texts, turns, checked.prompt_end, tools,
                                          checked.variables)  # the renders' own bound
    except InvalidInputError as e:
        if body.verbose or e.input != "verbose":
            raise
        return None

    def of(result: Answer) -> dict[str, Any]:
        kind, word = stop_type(result)
        return {
            "index": 0, "content": result.text, "tokens": [], "id_slot": 0, "stop": True, "model": service.served_model,
            "tokens_predicted": len(result.tokens), "tokens_evaluated": result.prompt_tokens,
            "tokens_cached": result.prefix_tokens_reused, "prompt": prompt, "has_new_line": "\n" in result.text,
            "truncated": result.truncated, "stop_type": kind, "stopping_word": word, "timings": clock.final(result),
        }

    return of


async def _chunks(
    first: Any, source: AsyncIterator[Any], completion_id: str, created: int, model: str, include_usage: bool,
    clock: TokenClock, per_token: bool, closing: Any,
) -> AsyncIterator[bytes]:
    """The SSE events of one streamed answer, in the order the OpenAI SDK expects (``timings`` as llama-server
    adds them: on every chunk but the first (the role's) with ``timings_per_token``, on the last ones always);
    ``closing(result)``: what the finishing chunk adds (``refsight``, llama-server's ``__verbose``)."""

    def chunk(
        delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None, timed: bool = True, **more: Any
    ) -> bytes:
        data = {
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
            **more,
        }
        if include_usage:
            data.setdefault("usage", None)  # OpenAI: null on every chunk but the last
        if per_token and timed:
            data.setdefault("timings", clock.partial())
        return sse_event(data)

    def finish(result: Answer) -> list[bytes]:
        final = clock.final(result)
        events = [chunk({}, finish_reason(result), timings=final, **closing(result))]
        if include_usage:
            events.append(sse_event({
                "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": SYSTEM_FINGERPRINT, "choices": [], "usage": usage(result), "timings": final,
            }))
        return [*events, SSE_DONE]

    if not isinstance(first, PromptProgress):  # (llama-server's progress chunks carry the role themselves)
        # llama-server's (and OpenAI's) first chunk: the role, content null; no timings (llama-server's has none).
        yield chunk({"role": "assistant", "content": None}, timed=False)

    def piece(text: str) -> bytes:
        logprobs = piece_logprobs(text)  # the piece's tokens' log probabilities, when asked for
        return chunk({"content": str(text)}, logprobs=chat_logprobs(logprobs) if logprobs else None)

    def progress(item: PromptProgress) -> bytes:  # llama-server's: a role chunk carrying the prompt's progress
        return chunk({"role": "assistant", "content": None}, prompt_progress=item.to_dict())

    calls = 0

    def call(item: Any) -> bytes:  # one whole tool call per chunk, numbered in the answer
        nonlocal calls
        calls += 1
        return chunk(openai_delta(item, calls - 1))

    async for event in answer_events(first, source, piece, finish, progress=progress, call=call):
        yield event


def model_card(service: Any) -> dict[str, Any]:
    """The served model in OpenAI's model shape (plus vLLM's ``max_model_len``, refsight's ``random_weights`` and
    ``embedder``: the name ``/v1/embeddings`` also answers to, the retrieval embedder)."""
    card = {"id": service.served_model, "object": "model", "created": 0, "owned_by": "refsight",
            "random_weights": service.random_weights, "embedder": service.embedder_name}
    # How the runtime runs (a vllm: backend's image mode: pixels|embeds, uuids kept or not), where it says.
    card.update(service.facts.runtime_info if service.facts is not None else {})
    context = service.context_size
    return {**card, "max_model_len": context} if context else card


def llama_server_card(service: Any) -> dict[str, Any]:
    """The served model as llama-server lists it beside OpenAI's ``data`` (its ``models`` entry)."""
    # Every model refsight serves takes images (an mmproj is required on llama.cpp): always multimodal.
    capabilities = ["completion", "multimodal"]
    return {"name": service.served_model, "model": service.served_model, "modified_at": "", "size": "", "digest": "",
            "type": "model", "description": "", "tags": [""], "capabilities": capabilities, "parameters": "",
            "details": {"parent_model": "", "format": "gguf" if service.model.startswith("llamacpp:") else "",
                        "family": "", "families": [""], "parameter_size": "", "quantization_level": ""}}


@router.post("/v1/chat/completions/input_tokens", responses={400: ERROR_RESPONSES[400]})
@router.post("/chat/completions/input_tokens", responses={400: ERROR_RESPONSES[400]}, include_in_schema=False)
async def chat_input_tokens(
    request: Request, body: ChatBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> dict[str, Any]:
    """llama-server's count of a chat's prompt tokens (``input_tokens``), images included, in the template with the
    request's variables; nothing is generated (:mod:`~refsight.server.intake.input_tokens`: a fresh image on
    llama.cpp counts once encoded, so not here)."""
    prompt_end = chat_prompt_end(service, body.messages, body.add_generation_prompt, body.continue_final_message)
    tools, tool_turns = body.tool_use(), tool_turns_of(body.messages)
    check_tools(service, tools, tool_turns)
    variables, unread = template_variables(service, body.chat_template_kwargs, body.reasoning_effort, body.think)
    ignored = log_ignored(request.url.path, [*body.ignored_fields(), *unread])
    check_prompt_chars(prompt_texts(body.messages) + tool_texts(tools, tool_turns, service), config.max_prompt_tokens)
    resolver = PartResolver.for_request(request, service, namespace, uuids, config)
    count = await pool.run(input_tokens, service, body.messages, prompt_end, resolver, namespace,
                           chat_tools_of(tools, tool_turns), variables)
    return {"input_tokens": count, **ignored_object(ignored)}


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)  # llama-server's path without /v1
@needs_no_model
async def list_models(namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """The served model, in the OpenAI ``/v1/models`` shape with llama-server's ``models`` list beside ``data``
    (its ``data`` entry with llama-server's ``aliases`` and ``tags``); answered from the facts taken at load, so
    asking never wakes a sleeping model."""
    # llama-server's: the --alias names (comma-separated or repeated), sorted, and the --tags; the served name
    # when no alias was given, so ``id`` is always among the aliases.
    aliases = sorted(service.config.served_model_names) or [service.served_model]
    listed = {**model_card(service), "aliases": aliases, "tags": sorted(service.config.model_tags)}
    return {"models": [llama_server_card(service)], "object": "list", "data": [listed]}


@router.get("/v1/models/{model_id:path}", responses={404: ERROR_RESPONSES[404]})
@needs_no_model
async def retrieve_model(model_id: str, namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """One model (the SDK's ``models.retrieve``): the served one by any of its names, else 404 ``model_not_found``."""
    if model_id not in service.model_names:
        raise ApiError(
            404, "model_not_found", f"model {model_id!r} is not served here; this server serves {service.served_model!r}",
            param="model",
        )
    return model_card(service)
