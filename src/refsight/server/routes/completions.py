"""``POST /v1/completions``: OpenAI's (legacy) text completion, as the openai SDK's ``completions.create`` sends it.

The prompt is raw text (no chat template added); a list of prompts is answered one after the
other, a choice each (``index`` in the list's order, the usage summed). The generation
fields are the chat endpoint's (:mod:`..intake.generation_body`: OpenAI's, vLLM's and
llama-server's names; fields refsight does not use, the chat template's variables among them, named in the
``refsight.ignored`` of the reply, or of each choice of several). ``stream: true`` answers one prompt with ``text_completion`` chunks, then
``data: [DONE]``. Images are not taken here (use ``/v1/chat/completions`` or llama-server's
``/completion``): a prompt holding the media marker is a 400.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from typing import Any, AsyncIterator, ClassVar

from fastapi import APIRouter, Request
from pydantic import Field

from ...results import GenerateResult
from ..replies.answers import SYSTEM_FINGERPRINT, finish_reason, refsight_extra, usage
from ..intake.completion_parts import MAX_PROMPTS, check_raw_prompt, raw_prompt
from ..edge.disconnect import run_watched
from ..deps import ConfigDep, PoolDep, ServiceDep, Namespace
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from ..intake.bodies import StreamOptions
from ..intake.dialect_body import log_ignored
from ..intake.generation_body import GenerationBody, check_generation
from ..replies.logprob_fields import completion_logprobs, piece_logprobs
from ..replies.streaming import SSE_DONE, EventStreamResponse, PromptProgress, answer_events, open_stream, progress_hook, sse_event

__all__ = ["router"]

router = APIRouter(tags=["openai"])


class CompletionsBody(GenerationBody):
    """OpenAI's completions request."""

    hints: ClassVar[frozenset[str]] = GenerationBody.hints | {"timings_per_token"}

    model: str | None = None
    prompt: str | list[str] = Field(description="the raw prompt, or a list of prompts (a choice each)")
    n: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0, description="each token's log probability and the N most likely alternatives")
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    def requested_logprobs(self) -> tuple[int | None, str]:
        """OpenAI's ``logprobs`` (0: the chosen tokens' alone), else llama-server's ``n_probs``."""
        if self.logprobs is not None:
            return self.logprobs, "logprobs"
        return super().requested_logprobs()

    def texts(self) -> list[str]:
        """The prompts, in order; 400 for none, more than :data:`MAX_PROMPTS`, or several streamed."""
        texts = [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        if not texts or len(texts) > MAX_PROMPTS:
            raise ApiError(400, "invalid_input", f"prompt: give 1 to {MAX_PROMPTS} prompts, not {len(texts)}", param="prompt")
        if len(texts) > 1 and self.stream:
            raise ApiError(400, "unsupported", f"stream: {len(texts)} prompts are answered as choices of one response; "
                           "stream one prompt per request", param="stream")
        return texts


@router.post("/v1/completions", responses={k: ERROR_RESPONSES[k] for k in (400, 404)})
async def completions(request: Request, body: CompletionsBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep) -> Any:
    """A text completion of the raw prompt (OpenAI's ``text_completion`` shape)."""
    if body.n not in (None, 1):
        raise ApiError(400, "unsupported", "n: only one choice (n=1) is supported", param="n")
    max_new_tokens, sampling, schema, prompts = await pool.run(_checked, body, service, config)
    ignored = log_ignored(request.url.path, body.ignored_fields())
    completion_id, created = f"cmpl-{uuidlib.uuid4().hex}", int(time.time())

    def work_of(text: str) -> Any:
        def work(on_text=None, stop_event=None) -> GenerateResult:
            return service.chat(
                [text], namespace=namespace, max_new_tokens=max_new_tokens, json_schema=schema,
                sampling=sampling, on_text=on_text, stop_event=stop_event, raw_prompt=True,
                on_prompt=progress_hook(on_text, body.return_progress),
            )

        return work

    def choice(text: str, finish: str | None, logprobs: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
        return {"text": str(text), "index": index, "logprobs": logprobs, "finish_reason": finish}

    def response(*choices: dict[str, Any]) -> dict[str, Any]:
        return {"id": completion_id, "object": "text_completion", "created": created, "model": service.served_model,
                "system_fingerprint": SYSTEM_FINGERPRINT, "choices": list(choices)}

    if not body.stream:
        results = [await run_watched(pool, request, work_of(p.texts[0])) for p in prompts]  # a client that leaves frees its worker
        return {**response(*_choices(results, choice, ignored)), **_answers_usage(results, ignored)}
    first, source, stop = await open_stream(pool, work_of(prompts[0].texts[0]), request)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return EventStreamResponse(_chunks(first, source, lambda *a: response(choice(*a)), include_usage, ignored), stop)


def _checked(body: CompletionsBody, service: Any, config: Any) -> tuple[int, Any, Any, list[Any]]:
    """The checks against the served model, in the work pool (they tokenize): the token bound, the sampling, the
    JSON schema and the prompts, each within the prompt limit."""
    max_new_tokens, sampling = check_generation(body, service, None, config.max_new_tokens)
    schema = body.schema()
    prompts = [raw_prompt(text, [], service.media_marker) for text in body.texts()]
    for prompt in prompts:
        check_raw_prompt(prompt, config.max_prompt_tokens, service)
    return max_new_tokens, sampling, schema, prompts


def _choices(results: list[GenerateResult], choice: Any, ignored: list[str]) -> list[dict[str, Any]]:
    """One choice per answer, in order; with several, each carries its own answer's ``refsight`` object."""
    choices = [choice(r.text, finish_reason(r), completion_logprobs(r.logprobs), i) for i, r in enumerate(results)]
    if len(results) == 1:
        return choices
    return [{**c, "refsight": refsight_extra(r, ignored)} for c, r in zip(choices, results)]


def _answers_usage(results: list[GenerateResult], ignored: list[str]) -> dict[str, Any]:
    """The response's ``usage``, summed over the answers (and, for one answer, its ``refsight`` object)."""
    counts = [usage(r) for r in results]
    total = {k: sum(u[k] for u in counts) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    total["prompt_tokens_details"] = {"cached_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in counts)}
    return {"usage": total, **({"refsight": refsight_extra(results[0], ignored)} if len(results) == 1 else {})}


async def _chunks(
    first: Any, source: AsyncIterator[Any], chunk: Any, include_usage: bool, ignored: list[str]
) -> AsyncIterator[bytes]:
    """The SSE events of one streamed answer; ``chunk(text, finish, logprobs)`` is one ``text_completion`` chunk."""
    def finish(result: GenerateResult) -> list[bytes]:
        events = [sse_event({**chunk("", finish_reason(result)), "refsight": refsight_extra(result, ignored)})]
        if include_usage:
            events.append(sse_event({**chunk("", None), "choices": [], "usage": usage(result)}))
        return [*events, SSE_DONE]

    sent = 0  # the answer's characters so far: the text_offset of a piece's first token

    def piece(text: str) -> bytes:
        nonlocal sent
        logprobs = piece_logprobs(text)
        event = sse_event(chunk(text, None, completion_logprobs(logprobs, sent) if logprobs else None))
        sent += len(text)
        return event

    def progress(item: PromptProgress) -> bytes:  # llama-server's: a chunk with no text, the prompt's progress
        return sse_event({**chunk("", None), "prompt_progress": item.to_dict()})

    async for event in answer_events(first, source, piece, finish, progress=progress):
        yield event
