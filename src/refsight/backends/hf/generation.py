"""Generation and yes/no scoring of a prepared batch on a transformers model (``HFBackend``'s core).

:func:`generate_batch` is one ``model.generate`` call over the whole batch (or over each of its parts,
when reference prefixes of a sliding-window model need them), top to bottom:
the prompt inputs (:func:`prompt_inputs`: the padded token ids and the packages' features
through ``mm_encoder_outputs``, or the reference prefixes' stored states through
:mod:`.prefix_cache`), the controls (:class:`Controls`: the JSON constraint, sampling, stop
strings, streaming and cancellation as logits processors and stopping criteria, see
:mod:`.decoding`), the call itself, and one :class:`RowOutput` per row. ``generate`` itself
stays greedy, so a request that asks for nothing decodes exactly as it always did.

:func:`score_batch` is one forward pass over the batch: P("yes") from the last position's
"yes"/"no" logits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ...errors import GenerationError, InvalidInputError
from ...package import VisualPackage
from ..base import Execution, Generation, PreparedRequest
from ...requests import GenerationRequest
from ..logprobs import token_logprob
from .runtime import runtime_errors, to_device

__all__ = ["Controls", "PromptInputs", "RowOutput", "generate_batch", "prompt_inputs", "score_batch"]


@dataclass
class PromptInputs:
    """What ``generate`` gets for the prompts: padded ids and mask, the multimodal kwargs, the prefix plan."""

    encoded: dict[str, Any]
    extra: dict[str, Any]
    plan: Any = None  # a prefix_cache.PrefixBatch when reference prefixes come from stored states
    #: The batch rows these inputs hold, in order (a sliding-window model may run a batch in parts).
    rows: list[int] = field(default_factory=list)

    @property
    def width(self) -> int:
        """The padded prompt length: generated tokens start after it."""
        return int(self.encoded["input_ids"].shape[1])


@dataclass
class Controls:
    """The logits processors and stopping criteria of one ``generate`` call (empty for plain greedy)."""

    processors: list[Any] = field(default_factory=list)
    criteria: list[Any] = field(default_factory=list)
    streamer: Any = None
    stops: Any = None  # decoding.StopStrings when some row has stop strings (and no streamer)
    cancel: Any = None  # decoding.CancelOnEvent when a stop event was given

    def tracker(self, row: int) -> Any:
        """The stop-string tracker of ``row`` (None when nothing tracks it)."""
        if self.streamer is not None:
            return self.streamer.tracker
        return self.stops.trackers[row] if self.stops is not None else None


@dataclass
class RowOutput:
    """One row's result: the new tokens (through EOS), their logits, the text and why it ended."""

    tokens: list[int]
    logits: Any
    text: str
    finish_reason: str
    prompt_tokens: int
    prefix_tokens_reused: int = 0
    logprobs: list[Any] | None = None


def _decoder(backend: Any) -> Any:
    return lambda tokens: backend.tokenizer.decode(tokens, skip_special_tokens=True)


def prompt_inputs(backend: Any, rows: list[list[Any]], requests: list[GenerationRequest]) -> list[PromptInputs]:
    """The batch's prompts, left-padded; packages join on the model's device (they are stored on the CPU).
    One part per ``generate`` call: the whole batch, unless reference prefixes of a sliding-window model
    need parts (:meth:`.prefix_cache.PrefixBatch.parts`)."""
    texts = [backend.prompt_of(row, request) for row, request in zip(rows, requests)]
    if any(r.prefix_cache is not None for r in requests):
        from .prefix_cache import plan_prefixes

        plan = plan_prefixes(backend, rows, requests, texts)
        if plan is not None:
            # Reference prefixes from their stored states: only the suffixes are prefilled.
            parts = plan.parts(max(r.max_new_tokens for r in requests))
            return [PromptInputs(*part.inputs(), part, members) for members, part in parts]
    encoded = backend.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    encoded = {k: to_device(v, backend.device) for k, v in encoded.items()}
    packages = [s for row in rows for s in row if isinstance(s, VisualPackage)]
    extra = to_device(backend.multimodal_inputs(packages, encoded["input_ids"]), backend.device) if packages else {}
    return [PromptInputs(encoded, extra, rows=list(range(len(rows))))]


def controls(backend: Any, batch: list[PreparedRequest], execution: Execution, width: int) -> Controls:
    """The processors and criteria the batch needs; ``width`` is the padded prompt length."""
    from .decoding import CancelOnEvent, SamplingProcessor

    requests = [p.request for p in batch]
    out = Controls()
    grammars = [p.grammar for p in batch]
    if any(g is not None for g in grammars):
        # One processor for the whole batch, row by row (None leaves a row free).
        out.processors.append(backend.json_constraint(grammars))
    # Only when some row asks for it: greedy rows without penalties keep the plain path (log probabilities
    # change no token).
    if any(set(r.sampling.non_default()) - {"logprobs"} for r in requests):
        out.processors.append(SamplingProcessor([r.sampling for r in requests], width, backend.device, backend.pad_id(),
                                                backend.image_token_ids))
    _text_controls(out, backend, requests, execution, width)
    if execution.stop_event is not None:
        out.cancel = CancelOnEvent(execution.stop_event)
        out.criteria.append(out.cancel)
    return out


def _text_controls(out: Controls, backend: Any, requests: list[Any], execution: Execution, width: int) -> None:
    """What watches the answer's text: the streamer of a streamed request, else the batch's stop strings."""
    from .decoding import StopStrings, StreamerStopped, TextStreamer

    if execution.on_text is not None:
        if len(requests) != 1:
            raise InvalidInputError("requests", "text is streamed for one request at a time")
        if requests[0].sampling.logprobs is not None:
            # generate() hands a streamer tokens, never their logits: they come with the whole answer.
            raise InvalidInputError("logprobs", "a transformers model returns log probabilities with the whole "
                                    "answer only; ask for them without streaming")
        out.streamer = TextStreamer(_decoder(backend), execution.on_text, requests[0].sampling.stop)
        out.criteria.append(StreamerStopped(out.streamer))
    elif any(r.sampling.stop for r in requests):
        out.stops = StopStrings(_decoder(backend), [r.sampling.stop for r in requests], width)
        out.criteria.append(out.stops)


def _call_generate(backend: Any, inputs: PromptInputs, ctl: Controls, max_new_tokens: int, return_logits: bool) -> Any:
    from transformers import GenerationMixin, LogitsProcessorList, StoppingCriteriaList

    eos_ids = backend.eos_ids()
    generate = backend.model.generate
    if type(backend.model).generate is not GenerationMixin.generate:
        # Janus overrides generate and, for text, drops the logits processors (sampling and JSON
        # constraints would silently do nothing): the mixin's own is the text path of every family.
        generate = partial(GenerationMixin.generate, backend.model)
    return generate(
        input_ids=inputs.encoded["input_ids"],
        attention_mask=inputs.encoded["attention_mask"],
        **inputs.extra,
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        pad_token_id=backend.pad_id(),
        eos_token_id=eos_ids or None,
        output_logits=return_logits,
        return_dict_in_generate=True,
        logits_processor=LogitsProcessorList(ctl.processors) if ctl.processors else None,
        stopping_criteria=StoppingCriteriaList(ctl.criteria) if ctl.criteria else None,
        streamer=ctl.streamer,
        guidance_scale=None,  # a text answer: no classifier-free guidance (Janus' image mode uses it)
    )


def _row_output(backend: Any, output: Any, inputs: PromptInputs, ctl: Controls, row: int, limit: int,
                return_logits: bool, n_probs: int | None = None) -> RowOutput:
    """Row ``row`` of the ``generate`` output, cut after its EOS (a finished row is padded) or stop string."""
    import torch

    new, finish = _cut_at_eos(output.sequences[row, inputs.width:].tolist()[:limit], limit, backend.eos_ids())
    text = _decoder(backend)(new)
    tracker = ctl.tracker(row)
    # The stop string and what follows it are not part of the answer.
    if tracker is not None and tracker.stop and (tracker.update(text) or tracker.stopped):
        text, finish = tracker.text, "stop"
    if ctl.cancel is not None and ctl.cancel.cancelled:
        finish = "cancelled"
    rows = torch.stack([step[row] for step in output.logits[: len(new)]]).float().cpu() if output.logits else None
    logprobs = _logprobs(backend, rows, new, n_probs) if n_probs is not None else None
    return RowOutput(
        tokens=new, logits=rows if return_logits else None, text=text, finish_reason=finish,
        prompt_tokens=int(inputs.encoded["attention_mask"][row].sum()),
        prefix_tokens_reused=inputs.plan.reused_tokens(row) if inputs.plan is not None else 0, logprobs=logprobs,
    )


def _logprobs(backend: Any, rows: Any, tokens: list[int], n_probs: int) -> list[Any]:
    """Each new token's log probability and the ``n_probs`` likeliest at its step, over the raw logits of each
    step, as llama.cpp's are read."""
    piece = partial(_token_bytes, backend)
    return [token_logprob(step.numpy(), token, n_probs, piece) for step, token in zip(rows, tokens)]


def _cut_at_eos(new: list[int], limit: int, eos_ids: Any) -> tuple[list[int], str]:
    """A row's new tokens up to and with its first EOS, and why it ended ("stop", or "length" at ``limit``)."""
    for k, token in enumerate(new):
        if token in eos_ids:
            return new[: k + 1], "stop"
    return new, "length" if len(new) >= limit else "stop"


def _token_bytes(backend: Any, token: int) -> bytes:
    """One token's text as bytes (a special token's are empty, as the answer's text leaves them out)."""
    return backend.tokenizer.decode([token], skip_special_tokens=True).encode("utf-8")


def _generation(backend: Any, out: RowOutput, lm_ms: float, prepared: PreparedRequest, prefix_ms: dict[str, float]) -> Generation:
    timings = {"encode": prepared.encode_ms, "generate": lm_ms, "total": prepared.encode_ms + lm_ms, **prefix_ms}
    return Generation(
        text=out.text, token_ids=out.tokens, model=backend.name, random_weights=backend.random_weights,
        logits=out.logits, timings_ms=timings, prompt_tokens=out.prompt_tokens,
        image_tokens=[backend.image_token_count(p) for p in prepared.packages],
        finish_reason=out.finish_reason, prefix_tokens_reused=out.prefix_tokens_reused, logprobs=out.logprobs,
    )


def _report_prompt(on_prompt: Any, inputs: PromptInputs, streamer: Any) -> None:
    """A streamed row's prompt progress (:class:`~..base.Execution`): its tokens as generate starts (those from a
    stored prefix state processed), then all of them as the first new token comes (the prefill is behind it)."""
    total = int(inputs.encoded["attention_mask"][0].sum())
    cached = inputs.plan.reused_tokens(0) if inputs.plan is not None else 0
    on_prompt(total, cached, cached)
    streamer.on_first = lambda: on_prompt(total, cached, total)


def generate_batch(backend: Any, batch: list[PreparedRequest], execution: Execution) -> list[Generation]:
    """One ``model.generate`` call over the prepared batch (one per part, when it has parts); one
    :class:`Generation` per request."""
    import torch

    requests = [p.request for p in batch]
    outputs: dict[int, RowOutput] = {}  # by batch row, filled part by part
    prefix_ms: dict[str, float] = {}
    began = time.perf_counter()
    with runtime_errors(
        backend.name, GenerationError, "generation failed", device=backend.device, dtype=backend.dtype_name
    ), torch.inference_mode():
        for inputs in prompt_inputs(backend, [p.segments for p in batch], requests):
            _generate_part(backend, batch, inputs, execution, outputs)
            if inputs.plan is not None:
                prefix_ms["prefix_build"] = prefix_ms.get("prefix_build", 0.0) + inputs.plan.build_ms
                prefix_ms["prefix_load"] = prefix_ms.get("prefix_load", 0.0) + inputs.plan.load_ms
    lm_ms = (time.perf_counter() - began) * 1000
    return [_generation(backend, outputs[b], lm_ms, p, prefix_ms) for b, p in enumerate(batch)]


def _generate_part(
    backend: Any, batch: list[PreparedRequest], inputs: PromptInputs, execution: Execution, outputs: dict[int, RowOutput],
) -> None:
    """One ``model.generate`` call over one part of the batch (its rows: ``inputs.rows``); each row's output into
    ``outputs`` under its batch row."""
    requests = [batch[b].request for b in inputs.rows]
    ctl = controls(backend, [batch[b] for b in inputs.rows], execution, inputs.width)
    if execution.on_prompt is not None and ctl.streamer is not None:
        _report_prompt(execution.on_prompt, inputs, ctl.streamer)
    n_probs = [r.sampling.logprobs for r in requests]
    wants_logits = execution.return_logits or any(n is not None for n in n_probs)
    output = _call_generate(backend, inputs, ctl, max(r.max_new_tokens for r in requests), wants_logits)
    for row, b in enumerate(inputs.rows):
        outputs[b] = _row_output(
            backend, output, inputs, ctl, row, requests[row].max_new_tokens, execution.return_logits, n_probs[row]
        )


def score_batch(backend: Any, batch: list[PreparedRequest]) -> list[float]:
    """P("yes") per request: ONE forward pass over the left-padded batch, no decoding.

    Every row's answer position is the last one; the score is the softmax over that
    position's "yes"/"no" logits. Cached packages take the same ``mm_encoder_outputs`` seam
    as generation.
    """
    import torch

    yes_id, no_id = backend.answer_token_ids()
    texts = [backend.build_prompt(p.segments) for p in batch]
    packages = [s for p in batch for s in p.packages]
    with runtime_errors(
        backend.name, GenerationError, "scoring failed", device=backend.device, dtype=backend.dtype_name
    ), torch.inference_mode():
        encoded = backend.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        encoded = {k: to_device(v, backend.device) for k, v in encoded.items()}
        extra = to_device(backend.multimodal_inputs(packages, encoded["input_ids"]), backend.device) if packages else {}
        output = backend.model(
            input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], **extra, use_cache=False
        )
        pair = output.logits[:, -1, [yes_id, no_id]].float()
        scores = torch.softmax(pair, dim=-1)[:, 0]
    return [float(s) for s in scores.cpu()]
