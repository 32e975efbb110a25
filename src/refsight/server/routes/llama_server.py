"""llama-server's own endpoints, in llama-server's shapes, so its clients work unchanged.

``GET /health`` (and ``/v1/health``; no key: 503 ``Loading model`` until the model is
loaded, then ``{"status": "ok"}``), ``GET /props`` (the model, its context size, the
modalities and the media marker ``/completion`` prompts use), ``GET /slots`` (one per
model worker) and ``POST /completion`` (and ``/completions``, as llama-server): a raw prompt (no chat template added) with a media
marker per image and the images in ``multimodal_data`` (base64, or a stored reference:
:mod:`..intake.completion_parts`), the sampling fields of :mod:`..intake.generation_body`, ``stream``.
Every field is honoured, or refused with a 400 naming it, or (a hint, or a field refsight does not know) accepted
and named in the reply's ``refsight.ignored``. The tokenizer's and the chat template's endpoints: :mod:`.llama_text`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, AsyncIterator, ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, ValidationError

from ... import __version__
from ...results import GenerateResult
from ...settings import torch_threads
from ..replies.answers import Answer, ignored_extra
from ..intake.completion_parts import (
    MAX_PROMPTS, RawPrompt, check_raw_prompt, fill_context, mixed_prompt_text, raw_prompt, stop_type,
    with_piece_tokens, with_stopping_word,
)
from ..deps import ConfigDep, MediaUuidsDep, PoolDep, ServiceDep, Namespace
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from ..intake.dialect_body import DialectBody, log_ignored
from ..intake.generation_body import GenerationBody, check_generation
from ..replies.logprob_fields import piece_logprobs, token_entries
from ..edge.disconnect import run_watched
from ..edge.sleep import needs_no_model
from ..intake.messages import PartResolver
from ..replies.streaming import EventStreamResponse, PromptProgress, answer_events, open_stream, progress_hook, sse_event
from ..replies.timings import TokenClock

__all__ = ["router"]

router = APIRouter(tags=["llama-server"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}


@router.get("/health", responses={503: ERROR_RESPONSES[503]})
@router.get("/v1/health", responses={503: ERROR_RESPONSES[503]})
@needs_no_model
async def health(service: ServiceDep) -> Any:
    """llama-server's readiness check (no key): 503 while the model loads, then 200 ``{"status": "ok"}``."""
    if not service.is_ready:
        body = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        return JSONResponse(body, status_code=503)
    return {"status": "ok"}


@router.get("/props")
@needs_no_model
async def props(namespace: Namespace, service: ServiceDep, config: ConfigDep, pool: PoolDep) -> dict[str, Any]:
    """The server's properties as llama-server reports them (read-only, from the facts taken at load: asking
    never wakes a sleeping model); ``refsight.threads``: the thread budget, and torch's threads as a worker
    thread sees them."""
    facts = service.facts
    threads = {"per_worker": config.threads, "workers": config.workers, "torch": await pool.run_light(torch_threads)}
    n_ctx = service.context_size
    return {
        "default_generation_settings": {
            "id": 0, "n_ctx": n_ctx, "is_processing": False,
            # What a request that sets nothing gets: one truth for /props, /slots and the README.
            "params": _settings(GenerationBody().sampling(service.sampling_defaults), config.n_predict, n_ctx),
        },
        "total_slots": config.workers,
        "model_alias": service.served_model,
        "model_path": service.model,
        "modalities": {"vision": True, "video": False, "audio": False},
        "media_marker": facts.media_marker,
        # Current llama-server's switches, at what refsight serves: /slots unless --no-slots, /props and /metrics always,
        # the page unless --no-webui, no CORS proxy, no web-UI settings or template capabilities to report.
        "endpoint_slots": config.slots_endpoint, "endpoint_props": True, "endpoint_metrics": True, "ui": config.webui,
        "ui_settings": {}, "chat_template_caps": {}, "cors_proxy_enabled": False,
        "chat_template": facts.chat_template,
        "build_info": f"refsight {__version__}",
        "is_sleeping": service.is_sleeping,
        "refsight": {"random_weights": service.random_weights, "raw_prompt": facts.raw_prompt,
                     "threads": threads, **facts.runtime_info},
    }


@router.get("/cors-proxy", include_in_schema=False)
@router.post("/cors-proxy", include_in_schema=False)
@needs_no_model
async def cors_proxy(namespace: Namespace) -> None:
    """llama-server's web UI's CORS proxy: never served here (refsight's page needs none, and a proxy to any URL the
    server reaches is a door into its network): 403, llama-server's answer while its ``--ui-mcp-proxy`` is off."""
    raise ApiError(403, "cors_proxy_disabled", "the web UI's CORS proxy is not served by refsight "
                   "(llama-server's --ui-mcp-proxy)")


@router.get("/slots")
@needs_no_model
async def slots(
    request: Request, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep
) -> list[dict[str, Any]]:
    """One slot per model worker (``--workers``, llama-server's ``--parallel``), busy ones first; no per-slot state.

    As llama-server, a slot that has not run a task shows only its id, context and state; the others
    (as many as generations ran, first slots first) show the task fields too, ``params`` the server's
    defaults. With API keys the slots never show as busy: the workers are shared, so ``is_processing``
    would tell one tenant that another is generating.
    """
    if not config.slots_endpoint:
        # llama-server's --no-slots answer: 501, "not_supported_error".
        raise ApiError(501, "not_supported", "This server does not support slots endpoint. Start it with `--slots`")
    params = _settings(GenerationBody().sampling(service.sampling_defaults), config.n_predict, service.context_size)
    busy = 0 if request.app.state.tenants.enabled else min(pool.pending, config.workers)
    if request.query_params.get("fail_on_no_slot") and pool.pending >= config.workers:
        # llama-server's ?fail_on_no_slot=1: 503 when every slot is busy (a load balancer's probe).
        raise ApiError(503, "unavailable", "no slot available")
    ran = service.generations.count
    return [
        {"id": i, "n_ctx": service.context_size, "speculative": False, "is_processing": i < busy,
         **({"id_task": -1, "params": params} if i < ran else {})}
        for i in range(config.workers)
    ]


class PromptObject(DialectBody):
    """llama-server's JSON prompt: ``{"prompt_string": ..., "multimodal_data": [base64, ...]}``."""

    prompt_string: str
    multimodal_data: list[str] | None = Field(None, max_length=64)


class CompletionBody(GenerationBody):
    """``POST /completion``: a raw prompt, its images, and the generation fields."""

    hints: ClassVar[frozenset[str]] = GenerationBody.hints - {"return_tokens"}

    prompt: str | PromptObject | list[Any]
    multimodal_data: list[str] | None = Field(None, max_length=64, description="base64 images, one per media marker")
    stream: bool | None = None
    model: str | None = None
    logprobs: int | None = Field(None, ge=0, description="llama-server's alias of n_probs (read when n_probs is not given)")
    response_fields: list[str] | None = Field(
        None, max_length=256, description="llama-server: answer only these fields ('a/b': field b of object a)"
    )

    def requested_logprobs(self) -> tuple[int | None, str]:
        """``n_probs``, else its alias ``logprobs`` (0: none)."""
        if self.n_probs is None and self.logprobs is not None:
            return (self.logprobs or None), "logprobs"
        return super().requested_logprobs()

    def raw_prompts(self, marker: str, service: Any) -> list[RawPrompt]:
        """Each prompt split at the media markers, with its images (token ids read as their text:
        :func:`~..intake.completion_parts.mixed_prompt_text`). Runs the tokenizer: call it in the work pool."""
        prompts = _prompts(self.prompt, service)
        if len(prompts) > 1 and self.multimodal_data is not None:
            raise ApiError(400, "invalid_input", "multimodal_data: with several prompts, give each its own in a prompt "
                           "object", param="multimodal_data")
        raws = []
        for index, prompt in enumerate(prompts):
            if isinstance(prompt, PromptObject):
                if self.multimodal_data is not None:
                    raise ApiError(400, "invalid_input", "multimodal_data: give it inside the prompt object or beside it, "
                                   "not both", param="multimodal_data")
                field = "prompt.prompt_string" if len(prompts) == 1 else f"prompt[{index}].prompt_string"
                raws.append(raw_prompt(prompt.prompt_string, prompt.multimodal_data, marker, field))
            else:
                raws.append(raw_prompt(prompt, self.multimodal_data, marker))
        return raws


def _prompts(prompt: Any, service: Any) -> list[str | PromptObject]:
    """llama-server's prompts: a string, a prompt object, token ids mixed with strings (one prompt), or a list of
    prompts, each a string, a prompt object or token ids (mixed with strings)."""
    if not isinstance(prompt, list):
        return [prompt]
    if any(isinstance(item, int) for item in prompt):  # llama-server: any number makes the list one prompt
        return [mixed_prompt_text(prompt, service)]
    if not prompt:
        raise ApiError(400, "invalid_input", "prompt: an empty list holds no prompt", param="prompt")
    if len(prompt) > MAX_PROMPTS:
        raise ApiError(400, "invalid_input", f"prompt: {len(prompt)} prompts in one request, over the limit of "
                       f"{MAX_PROMPTS}", param="prompt")
    return [_one_prompt(item, index, service) for index, item in enumerate(prompt)]


def _one_prompt(item: Any, index: int, service: Any) -> str | PromptObject:
    """The list's prompt ``index``: a string, token ids (mixed with strings) or a prompt object."""
    if isinstance(item, list):
        return mixed_prompt_text(item, service)
    if isinstance(item, dict):
        try:
            return PromptObject.model_validate(item)
        except ValidationError as e:
            raise ApiError(400, "invalid_input", f"prompt[{index}]: not a prompt object ({e.errors()[0]['msg']})",
                           param="prompt") from None
    if not isinstance(item, str):
        raise ApiError(400, "invalid_input", f"prompt[{index}]: give a string, token ids or a prompt object", param="prompt")
    return item


def _checked(body: CompletionBody, service: Any, config: Any) -> tuple[int, Any, Any, list[RawPrompt], tuple[int, ...]]:
    """The checks of a completion against the served model, in the work pool (they tokenize): the token bound, the
    sampling, the JSON schema, the prompts (each within the prompt limit; 400 for several streamed: they are one JSON
    array) and, with ``ignore_eos``, the end tokens it bans (their first ask walks the vocabulary)."""
    max_new_tokens, sampling = check_generation(body, service, None, config.max_new_tokens)
    schema = body.schema()
    prompts = body.raw_prompts(service.media_marker, service)
    if len(prompts) > 1 and body.stream:
        raise ApiError(400, "unsupported", f"stream: {len(prompts)} prompts are answered as one JSON array; stream "
                       "one prompt per request", param="stream")
    for prompt in prompts:
        check_raw_prompt(prompt, config.max_prompt_tokens, service)
    return max_new_tokens, sampling, schema, prompts, service.end_tokens() if sampling.ignore_eos else ()


@router.post("/completion", responses=_ERRORS)
@router.post("/completions", responses=_ERRORS, include_in_schema=False)  # llama-server's alias of /completion
async def completion(
    request: Request, body: CompletionBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """llama-server's native completion: the prompt as given (no chat template), images at its media markers.
    Several prompts are answered one after the other, as a JSON array in their order (not streamed)."""
    max_new_tokens, sampling, schema, prompts, ends = await pool.run(_checked, body, service, config)
    ignored = ignored_extra(log_ignored(request.url.path, body.ignored_fields()))
    resolver = PartResolver.for_request(request, service, namespace, uuids, config)
    fill = body.until_the_limit()

    def work_of(prompt: RawPrompt, clock: TokenClock) -> Any:
        def work(on_text=None, stop_event=None) -> Answer:
            def generate(limit: int) -> GenerateResult:
                return service.chat(
                    prompt.segments(resolver), namespace=namespace, max_new_tokens=limit, json_schema=schema,
                    sampling=sampling, on_text=clock.wrap(with_piece_tokens(on_text, service)), stop_event=stop_event,
                    raw_prompt=True, on_prompt=progress_hook(on_text, body.return_progress),
                )

            clock.begin()
            try:
                if fill:  # n_predict -1: the rest of the context
                    answer = fill_context(generate, service.context_size, max_new_tokens)
                else:
                    answer = Answer.of(generate(max_new_tokens))
                return with_stopping_word(answer, sampling.stop, service)
            finally:
                clock.stop()

        return work

    def final(prompt: RawPrompt, clock: TokenClock, index: int, result: Answer, streamed: bool = False) -> dict[str, Any]:
        kind, word = stop_type(result)
        # Streamed, each event carried its tokens' probabilities already (llama-server sends none at the end).
        probs = {} if streamed or result.logprobs is None else {"completion_probabilities": token_entries(result.logprobs)}
        return _fields({
            "index": index, "content": "" if streamed else result.text,
            "tokens": result.tokens if body.return_tokens else [],
            "id_slot": 0, "stop": True, "model": service.served_model, "tokens_predicted": len(result.tokens),
            "tokens_evaluated": result.prompt_tokens, "tokens_cached": result.prefix_tokens_reused,
            "generation_settings": {**_settings(sampling, -1 if fill else max_new_tokens, service.context_size, ends),
                                    "model": service.served_model, "stream": bool(body.stream),
                                    "timings_per_token": bool(body.timings_per_token)},
            "prompt": service.media_marker.join(prompt.texts), "has_new_line": "\n" in result.text, "truncated": result.truncated,
            "stop_type": kind, "stopping_word": word, "timings": clock.final(result),
            "refsight": {"random_weights": result.random_weights, "references_cached": result.references_cached, **ignored},
            **probs,
        }, body.response_fields)

    clocks = [TokenClock() for _ in prompts]
    if not body.stream:  # a client that leaves frees its worker
        answers = [final(p, c, i, await run_watched(pool, request, work_of(p, c))) for i, (p, c) in enumerate(zip(prompts, clocks))]
        return answers if len(answers) > 1 else answers[0]
    (prompt,), (clock,) = prompts, clocks
    first, source, stop = await open_stream(pool, work_of(prompt, clock), request)
    per_token = clock.partial if body.timings_per_token else None
    return EventStreamResponse(_events(first, source, functools.partial(final, prompt, clock, 0), per_token), stop)


async def _events(first: Any, source: AsyncIterator[Any], final: Any, per_token: Any = None) -> AsyncIterator[bytes]:
    """llama-server's stream: one event per piece (``stop: false``) with its ``tokens`` (and, with
    ``timings_per_token``, the ``timings`` so far), then the final object (``stop: true``). With ``n_probs``
    each token has its own event, as in llama-server: a piece of several tokens (a character split over
    them, text held back for a stop string) is sent as its last token's event, the others before it with
    no content (llama-server drops the probabilities of a character's first tokens; here they are kept)."""

    def piece_event(content: str, tokens: list[int], logprobs: Any = ()) -> bytes:
        data = {"index": 0, "content": content, "tokens": tokens, "stop": False, "id_slot": 0}
        if logprobs:
            data["completion_probabilities"] = token_entries(logprobs)
        if per_token is not None:
            data["timings"] = per_token()
        return sse_event(data)

    def piece(text: str) -> bytes:
        logprobs = piece_logprobs(text)
        if not logprobs:  # its ids: its text in the served vocabulary, read in the worker (with_piece_tokens)
            return piece_event(str(text), list(getattr(text, "tokens", ())))
        *before, last = logprobs
        return b"".join([*(piece_event("", [lp.token], [lp]) for lp in before),
                         piece_event(str(text), [last.token], [last])])

    def progress(item: PromptProgress) -> bytes:  # llama-server's: an event with no text, the prompt's progress
        return sse_event({"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": 0, "tokens_predicted": 0,
                          "tokens_evaluated": item.total, "prompt_progress": item.to_dict(),
                          **({"timings": item.timings()} if per_token is not None else {})})

    async for event in answer_events(first, source, piece, lambda result: [sse_event(final(result, True))],
                                     progress=progress):
        yield event


def _fields(answer: dict[str, Any], paths: list[str] | None) -> dict[str, Any]:
    """llama-server's ``response_fields``: only the fields named, each under its path as given (``a/b``: field
    ``b`` of object ``a``); a path that names nothing is left out. None or []: the whole answer."""
    if not paths:
        return answer
    picked = {}
    for path in paths:
        value: Any = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


def _settings(sampling: Any, n_predict: int, n_ctx: int | None, end_tokens: Sequence[int] = ()) -> dict[str, Any]:
    """llama-server's ``generation_settings`` of a request. With ``ignore_eos`` its ``logit_bias`` lists a -inf bias on
    each of ``end_tokens`` after the request's own, as llama-server fills and shows it (the sampler applies them)."""
    banned = [(token, -math.inf) for token in end_tokens] if sampling.ignore_eos else []
    return {
        "n_ctx": n_ctx, "n_predict": n_predict, "temperature": sampling.temperature, "top_k": sampling.top_k,
        "top_p": sampling.top_p, "min_p": sampling.min_p, "repeat_penalty": sampling.repetition_penalty,
        "presence_penalty": sampling.presence_penalty, "frequency_penalty": sampling.frequency_penalty,
        "seed": -1 if sampling.seed is None else sampling.seed, "stop": list(sampling.stop),
        # The rest of llama-server's fields, at the values refsight always uses (any other is refused by name).
        "max_tokens": n_predict, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "typical_p": 1.0,
        "xtc_probability": 0.0, "xtc_threshold": 0.1, "repeat_last_n": sampling.repeat_last_n, "dry_multiplier": 0.0,
        "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
        "n_keep": 0, "n_discard": 0, "ignore_eos": sampling.ignore_eos, "n_probs": sampling.logprobs or 0, "min_keep": 0,
        # llama-server's shape; a banned token's -inf is JSON's null, as llama-server writes it.
        "logit_bias": [{"bias": bias if math.isfinite(bias) else None, "token": token} for token, bias in [*sampling.logit_bias, *banned]],
        "grammar": sampling.grammar or "", "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"], "lora": [],
        "post_sampling_probs": sampling.post_sampling_probs, "stream": False, "timings_per_token": False,
        # Fields of later llama-server builds, at their "off" values: no top-n-sigma, adaptive-p, lazy grammar,
        # reasoning split (the answer is the content as generated), speculative decoding or backend sampling.
        "top_n_sigma": -1.0, "dry_sequence_breakers": ["\n", ":", "\"", "*"], "adaptive_target": -1.0,
        "adaptive_decay": 0.9, "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
        "chat_format": "Content-only", "reasoning_format": "none", "reasoning_in_content": False,
        "generation_prompt": "", "speculative.types": "none", "backend_sampling": False,
    }
