"""transformers pieces that carry :class:`~refsight.sampling.Sampling`, stop strings,
cancellation and streaming into ``model.generate``.

``generate`` itself always runs greedy (``do_sample=False``): :class:`SamplingProcessor`,
applied last, draws each sampled row's token with that row's own ``torch.Generator`` and
leaves only that token finite, so argmax picks it. A per-request generator (seeded from
``Sampling.seed``) makes a seeded answer repeatable without touching torch's global RNG,
which concurrent requests on other worker threads share.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

import torch
from transformers import LogitsProcessor, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from ...sampling import WHOLE_CONTEXT, Sampling, StopText

__all__ = ["SamplingProcessor", "StopStrings", "CancelOnEvent", "StreamerStopped", "TextStreamer", "row_generator"]


def row_generator(sampling: Sampling, device: Any) -> torch.Generator | None:
    """The random generator of one sampled row (None for a greedy row)."""
    if sampling.greedy:
        return None
    generator = torch.Generator(device=device)
    seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    generator.manual_seed(seed)
    return generator


class SamplingProcessor(LogitsProcessor):
    """Per-row penalties, temperature, top-k, top-p, min-p and a seeded draw, after every other processor.

    ``prompt_length`` is the (padded) prompt width: tokens after it are the generated ones
    the OpenAI penalties count. ``pad_id``: the left padding a repetition penalty skips (a
    padded row counts the tokens an unpadded one would). ``image_ids``: the tokens that stand for
    images, which a windowed repetition penalty (``repeat_last_n``) skips as llama.cpp's does (its window
    counts the prompt's text and the answer).
    """

    def __init__(self, samplings: Sequence[Sampling], prompt_length: int, device: Any, pad_id: int | None = None,
                 image_ids: Sequence[int] = ()) -> None:
        self.samplings = list(samplings)
        self.prompt_length = prompt_length
        self.pad_id = pad_id
        self.image_ids = torch.tensor(sorted(image_ids), dtype=torch.long, device=device)
        self.generators = [row_generator(s, device) for s in self.samplings]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        for row, sampling in enumerate(self.samplings):
            logits = self._penalised(scores[row].float(), input_ids[row], sampling)
            if sampling.greedy:
                scores[row] = logits.to(scores.dtype)
                continue
            token = torch.multinomial(_distribution(logits, sampling), 1, generator=self.generators[row]).item()
            chosen = torch.full_like(scores[row], float("-inf"))
            chosen[token] = 0.0
            scores[row] = chosen
        return scores

    def _penalised(self, logits: torch.Tensor, ids: torch.Tensor, sampling: Sampling) -> torch.Tensor:
        if sampling.repetition_penalty != 1.0:
            # transformers' and vLLM's rule, over the prompt and the answer (or its last repeat_last_n text tokens,
            # llama.cpp's window): each token seen once is enough.
            seen = torch.unique(self._window(self._unpadded(ids), sampling.repeat_last_n))
            seen = seen[seen < logits.shape[0]]
            picked = logits[seen]
            logits = logits.clone()
            logits[seen] = torch.where(picked > 0, picked / sampling.repetition_penalty, picked * sampling.repetition_penalty)
        if not (sampling.frequency_penalty or sampling.presence_penalty):
            return logits
        generated = ids[self.prompt_length:]
        if not generated.numel():
            return logits
        counts = torch.bincount(generated, minlength=logits.shape[0])[: logits.shape[0]].to(logits)
        return logits - sampling.frequency_penalty * counts - sampling.presence_penalty * (counts > 0).to(logits)


    def _window(self, ids: torch.Tensor, window: int) -> torch.Tensor:
        """The tokens a repetition penalty counts: all of ``ids``, or the last ``window`` that are no image's."""
        if window == WHOLE_CONTEXT:
            return ids
        if self.image_ids.numel():
            ids = ids[~torch.isin(ids, self.image_ids.to(ids.device))]
        return ids[ids.numel() - window:] if window else ids[:0]

    def _unpadded(self, ids: torch.Tensor) -> torch.Tensor:
        """The row without its left padding (the pads before the prompt's first real token)."""
        if self.pad_id is None:
            return ids
        real = (ids[: self.prompt_length] != self.pad_id).nonzero()
        return ids[int(real[0]) if real.numel() else self.prompt_length:]


def _distribution(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The row's sampling distribution after temperature, top-k, top-p and min-p, in float64.

    The largest logit is subtracted before dividing (it becomes exactly 0, the others at most
    0), so no temperature in range overflows, and float64 keeps the tiniest temperature and
    ``top_p`` what they are (float32 would round 1e-300 to 0). ``top_p`` always keeps the most
    likely token, however small it is.
    """
    logits = logits.double()
    finite = torch.isfinite(logits)
    shifted = torch.where(finite, logits - logits[finite].max(), torch.full_like(logits, float("-inf")))
    probs = torch.softmax(shifted / sampling.temperature, dim=-1)
    if 0 < sampling.top_k < probs.shape[0]:
        # Keep the k most likely tokens (ties at the k-th kept too, as a threshold keeps them).
        probs = torch.where(probs >= torch.topk(probs, sampling.top_k).values[-1], probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    if sampling.top_p < 1.0:
        # Keep the smallest set of most likely tokens whose mass reaches top_p (at least one).
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop = before >= sampling.top_p
        drop[0] = False
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if sampling.min_p > 0:
        # Tokens at least min_p times as likely as the most likely one (always kept).
        probs = torch.where(probs >= sampling.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs


class StopStrings(StoppingCriteria):
    """Ends each row once its decoded generated text contains one of its stop strings."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[tuple[str, ...]], prompt_length: int) -> None:
        self.decode = decode
        self.trackers = [StopText(s) for s in stops]
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = []
        for row, tracker in enumerate(self.trackers):
            if tracker.stop and not tracker.stopped:
                tracker.update(self.decode(input_ids[row, self.prompt_length:].tolist()))
            done.append(tracker.stopped)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class CancelOnEvent(StoppingCriteria):
    """Ends every row once ``event`` is set (the client went away); checked after each token."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self.cancelled = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        self.cancelled = self.event.is_set()
        return torch.full((input_ids.shape[0],), self.cancelled, dtype=torch.bool, device=input_ids.device)


class StreamerStopped(StoppingCriteria):
    """Ends generation once the streamer saw a stop string (it decodes anyway, so it decides)."""

    def __init__(self, streamer: "TextStreamer") -> None:
        self.streamer = streamer

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.streamer.stopped, dtype=torch.bool, device=input_ids.device)


class TextStreamer(BaseStreamer):
    """Hands each new piece of one row's text to ``on_text`` as ``generate`` produces tokens.

    Runs on the generating thread (no extra thread or queue). Text that could still turn
    into a stop string, or ends in an incomplete UTF-8 character, is held back until it
    cannot. ``stopped`` tells the matching stopping criterion that a stop string appeared. ``on_first``, when
    set, is called once as the first new token comes: the prompt's evaluation is behind it.
    """

    def __init__(self, decode: Callable[[list[int]], str], on_text: Callable[[str], None], stop: Sequence[str] = ()) -> None:
        self.decode = decode
        self.on_text = on_text
        self.tracker = StopText(tuple(stop))
        self.tokens: list[int] = []
        self.sent = 0
        self._prompt_seen = False
        self.on_first: Callable[[], None] | None = None

    @property
    def stopped(self) -> bool:
        """True once a stop string appeared in the text."""
        return self.tracker.stopped

    def put(self, value: torch.Tensor) -> None:
        """Called by ``generate``: first with the prompt (skipped), then with each new token."""
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self.on_first is not None:
            first, self.on_first = self.on_first, None
            first()
        if self.tracker.stopped:
            return
        self.tokens.extend(int(t) for t in value.reshape(-1).tolist())
        self.tracker.update(self.decode(self.tokens))
        self._flush(final=False)

    def end(self) -> None:
        """Called by ``generate`` when it finishes: send what was held back."""
        self._flush(final=True)

    def _flush(self, final: bool) -> None:
        text = self.tracker.text
        safe = self.tracker.safe_length(final)
        if not final:
            # A token may end inside a multi-byte character: decode shows U+FFFD until it completes.
            while safe > self.sent and text[safe - 1] == "\ufffd":
                safe -= 1
        if safe > self.sent:
            piece, self.sent = text[self.sent:safe], safe
            self.on_text(piece)
