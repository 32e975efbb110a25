"""Prompt evaluation and the decoding loop of one llama.cpp request.

:func:`decode_prompt` tokenizes the rendered prompt with mtmd (a placeholder bitmap
per cached package, the real pixels per fresh image), checks that each package's
saved chunks are exactly the chunks mtmd laid out for its placeholder, and fills the
KV cache: text chunks and fresh images through mtmd's helpers (llama.cpp's own
path), cached images from their saved embeddings. A :class:`TokenLoop` then samples
one token at a time through llama.cpp's sampler chain, handing each token's text on as
it comes (:class:`TextStream`: stop strings and incomplete UTF-8 held back).

The prompt goes into the sequence given (``seq``): with parallel slots each request has
its own, and a loop samples from its own row of a decode step shared with others
(:mod:`.runs` drives one request alone, :mod:`.slots` several together).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import ContextLengthError, CorruptPackageError
from ...inputs.images import ImageInput
from ...package import VisualPackage
from ...results import TextPiece, TokenLogprob
from ..logprobs import chain_logprob, token_logprob
from ...sampling import Sampling, StopText
from . import package_format as fmt
from .grammar_stacks import CheckedGrammar
from .native import Bitmap, LlamaRuntime
from .prefix import PromptPrefix
from .sampler import Sampler

__all__ = ["TextStream", "TokenLoop", "decode_prompt"]


def _bitmaps(segments: Sequence[Any]) -> tuple[list[Bitmap], dict[str, VisualPackage]]:
    """One bitmap per image segment, in order, with ids "0", "1", ...; and id → package for cached ones."""
    bitmaps: list[Bitmap] = []
    cached: dict[str, VisualPackage] = {}
    try:
        for segment in segments:
            if isinstance(segment, str):
                continue
            image_id = str(len(bitmaps))
            if isinstance(segment, VisualPackage):
                width, height = (int(v) for v in segment.metadata["image_size"])
                bitmaps.append(Bitmap(width, height, None, image_id))
                cached[image_id] = segment
            elif isinstance(segment, ImageInput):
                width, height = segment.image.size
                bitmaps.append(Bitmap(width, height, segment.image.tobytes(), image_id))
    except BaseException:
        for b in bitmaps:
            b.free()
        raise
    return bitmaps, cached


def decode_prompt(
    runtime: LlamaRuntime, text: str, segments: Sequence[Any], prefix: PromptPrefix | None = None, seq: int = 0,
    on_prompt: Callable[[int, int, int], None] | None = None,
) -> tuple[int, dict[str, float], list[int]]:
    """Evaluate the whole prompt into sequence ``seq``'s cleared KV cache.

    With a ``prefix`` plan (:mod:`.prefix`), the prompt's reference prefix is restored
    from a saved KV state when one matches, or evaluated and offered for saving, and
    only the rest is evaluated. Returns ``n_past``, ``{"encode": ms}`` and the prompt's
    token counts: the total first, then each image's tokens in prompt order (for the
    OpenAI ``usage``). ``on_prompt(total, cached, processed)`` is told once the prefix state
    is restored (``processed == cached``) and once the whole prompt is evaluated (llama-server's
    ``prompt_progress``).
    """
    bitmaps, cached = _bitmaps(segments)
    try:
        runtime.clear(seq)
        with runtime.tokenized(text, bitmaps) as chunks:
            infos = [runtime.chunk_info(c) for c in chunks]
            saved = {image_id: _saved_chunks(package, image_id, infos) for image_id, package in cached.items()}
            counts = _token_counts(runtime, infos)
            first, n_past, cached_tokens, split = _restored_prefix(runtime, prefix, infos, bitmaps, saved, seq)
            if on_prompt is not None:
                on_prompt(counts[0], cached_tokens, cached_tokens)
            encode_ms = 0.0
            if split is not None:  # the prefix is evaluated on its own, to be saved before the rest
                n_past, encode_ms = _evaluate(runtime, chunks[:first], infos[:first], saved, n_past, False, seq)
                prefix.save(runtime, split, seq)
            n_past, ms = _evaluate(runtime, chunks[first:], infos[first:], saved, n_past, True, seq)
            encode_ms += ms
            if on_prompt is not None:
                on_prompt(counts[0], cached_tokens, counts[0])
    finally:
        for b in bitmaps:
            b.free()
    return n_past, {"encode": encode_ms}, counts


def _token_counts(runtime: LlamaRuntime, infos: Sequence[Any]) -> list[int]:
    """The prompt's token count, then each image's in prompt order; ContextLengthError when the prompt does not fit
    the context."""
    per_image: dict[str, int] = {}
    for info in infos:
        if info.kind == "image":  # an image may span several chunks (SmolVLM tiles)
            per_image[info.image_id] = per_image.get(info.image_id, 0) + info.n_tokens
    counts = [sum(info.n_tokens for info in infos), *per_image.values()]
    # Each token takes a KV cell: with M-RoPE an image has fewer positions than tokens, so both must fit.
    total = max(sum(info.n_pos for info in infos), counts[0])
    if total >= runtime.settings.n_ctx:
        raise ContextLengthError(
            "prompt", f"needs {total} positions; the context holds {runtime.settings.n_ctx}",
            n_prompt_tokens=total, n_ctx=runtime.settings.n_ctx,
        )
    return counts


def _restored_prefix(
    runtime: LlamaRuntime, prefix: PromptPrefix | None, infos: Sequence[Any], bitmaps: list[Bitmap],
    saved: dict[str, list[np.ndarray]], seq: int,
) -> tuple[int, int, int, Any]:
    """Where evaluation starts: ``(first chunk, n_past, cached tokens, split)``, the prefix's saved KV state restored
    where one matches; ``split`` is the prefix still to evaluate and offer for saving (None: nothing to save)."""
    split = prefix.split(runtime, infos, bitmaps) if prefix is not None else None
    if split is None:
        return 0, 0, 0, None
    if not prefix.restore(runtime, split, seq):
        return split.chunk, 0, 0, split
    for info in infos[:split.chunk]:  # restored, not decoded: their saved features go unused
        if info.kind == "image" and info.image_id in saved:
            saved[info.image_id].pop(0)
    return split.chunk, split.n_past, prefix.prefix_tokens, None


def _evaluate(
    runtime: LlamaRuntime, chunks: Sequence[Any], infos: Sequence[Any], saved: dict[str, list[np.ndarray]],
    n_past: int, logits_last: bool, seq: int,
) -> tuple[int, float]:
    """Evaluate chunks in order from ``n_past`` (logits for the very last one when asked): ``(n_past, encode ms)``."""
    encode_ms = 0.0
    for i, (chunk, info) in enumerate(zip(chunks, infos)):
        last = logits_last and i == len(chunks) - 1
        if info.kind == "text":
            n_past = runtime.eval_chunk(chunk, n_past, last, image=False, seq=seq)
        elif info.image_id in saved:
            n_past = runtime.decode_image(chunk, saved[info.image_id].pop(0), n_past, seq)
        else:
            began = time.perf_counter()
            n_past = runtime.eval_chunk(chunk, n_past, last, image=True, seq=seq)
            encode_ms += (time.perf_counter() - began) * 1000
    return n_past, encode_ms


def _saved_chunks(package: VisualPackage, image_id: str, infos: list) -> list[np.ndarray]:
    """The package's embeddings, after checking mtmd laid out the same image chunks for its placeholder."""
    mine = [info for info in infos if info.kind == "image" and info.image_id == image_id]
    expected = fmt.image_chunk_layout(package.metadata["chunks"])
    got = fmt.image_chunk_layout(mine)
    if got != expected:
        raise CorruptPackageError(
            package.key,
            f"mtmd lays this image out as {got} (n_tokens, n_pos, nx, ny) per chunk, the package holds {expected}",
        )
    return fmt.embeddings(package)


class TextStream:
    """The answer text of a token loop: bytes joined as tokens come, cut at a stop string.

    :meth:`add` takes each sampled token's bytes and hands ``on_text`` every piece that
    can no longer change: a tail that could still grow into a stop string, or that ends
    in an incomplete UTF-8 character, is held back until it cannot. :meth:`finish` sends
    what was held back, so the pieces joined always equal :attr:`text`. With log probabilities
    asked for, each piece is a :class:`~refsight.results.TextPiece` carrying those of the tokens
    added since the last piece (the last piece, empty if need be, carries the rest).
    """

    def __init__(self, stop: Sequence[str] = (), on_text: Callable[[str], None] | None = None) -> None:
        self.tracker = StopText(tuple(stop))
        self.on_text = on_text
        self.data = b""
        self.sent = 0
        self.pending: list[TokenLogprob] = []  # the tokens' log probabilities not yet handed out

    @property
    def text(self) -> str:
        """The text so far (cut before the stop string once one appeared)."""
        return self.tracker.text

    @property
    def stopped(self) -> bool:
        """True once a stop string appeared."""
        return self.tracker.stopped

    def add(self, piece: bytes, logprob: TokenLogprob | None = None) -> bool:
        """Append one token's bytes (and its log probability); True when a stop string has appeared."""
        if logprob is not None:
            self.pending.append(logprob)
        if self.tracker.stopped or not piece:
            return self.tracker.stopped
        self.data += piece
        self.tracker.update(self.data.decode("utf-8", "replace"))
        self._flush(final=False)
        return self.tracker.stopped

    def finish(self) -> str:
        """Send what was held back; the final text."""
        self._flush(final=True)
        return self.tracker.text

    def _flush(self, final: bool) -> None:
        if self.on_text is None:
            return
        text = self.tracker.text
        safe = self.tracker.safe_length(final)
        if not final and not self.tracker.stopped:
            # A token may end inside a multi-byte character: it decodes to U+FFFD until it completes.
            while safe > self.sent and text[safe - 1] == "\ufffd":
                safe -= 1
        if safe > self.sent or (final and self.pending):
            piece, self.sent = text[self.sent:safe], max(safe, self.sent)
            if self.pending:
                piece, self.pending = TextPiece(piece, tuple(self.pending)), []
            self.on_text(piece)


class TokenLoop:
    """One request's decoding: its sampler chain, its text stream, the tokens so far.

    :meth:`step` samples the next token from a decode's output and says whether the
    request is finished; when it is not, :attr:`token` goes into the next decode at
    :attr:`n_past` (:meth:`advance`). The end-of-generation token is kept in ``tokens``,
    then decoding stops (``"stop"``), as it does at a stop string (the text is cut before
    it) and at a complete grammar nothing may follow, after ``max_new_tokens`` (``"length"``)
    or once ``stop_event`` is set (``"cancelled"``, checked before every token). Logits are the
    model's raw logits at each step, before penalties and the grammar change them; so are the log probabilities
    ``sampling.logprobs`` asks for (:attr:`logprobs`, one per token), unless
    ``sampling.post_sampling_probs`` asks for the sampler chain's.
    """

    def __init__(
        self, runtime: LlamaRuntime, n_past: int, max_new_tokens: int, *, grammar: CheckedGrammar | None, sampling: Sampling,
        return_logits: bool, on_text: Callable[[str], None] | None = None,
        stop_event: threading.Event | None = None, prompt_tokens: Sequence[int] = (), prompt_cells: int = 0,
    ) -> None:
        # Each token takes a KV cell and a position; with M-RoPE an image has fewer positions than tokens, so
        # the prompt's cells (``prompt_cells``: its token count) can fill the context before its positions do.
        taken = max(n_past, prompt_cells)
        room = runtime.settings.n_ctx - taken
        if room < max_new_tokens:
            raise ContextLengthError(
                "max_new_tokens", f"{max_new_tokens} does not fit: the prompt takes {taken} of the context's "
                f"{runtime.settings.n_ctx} positions, {room} are left", n_prompt_tokens=taken, n_ctx=runtime.settings.n_ctx,
            )
        self.runtime, self.n_past, self.max_new_tokens = runtime, n_past, max_new_tokens
        self.return_logits, self.stop_event = return_logits, stop_event
        self.stream = TextStream(sampling.stop, on_text)
        self.sampler = Sampler(runtime, grammar, sampling, max_new_tokens, prompt_tokens)
        self.tokens: list[int] = []
        self.rows: list[np.ndarray] = []
        self.n_probs = sampling.logprobs  # None: no log probabilities
        self.post_sampling = sampling.post_sampling_probs and self.n_probs is not None
        self.logprobs: list[TokenLogprob] = []
        self.finish = "length"
        self.token = -1  # the token the next decode appends

    def step(self, output: int = -1) -> bool:
        """Sample from the last decode's ``output``; True when the request is finished."""
        if self.stop_event is not None and self.stop_event.is_set():
            self.finish = "cancelled"
            return True
        token, logprob = self._sample(output)
        if token is None:  # the grammar is complete and its end-of-generation tokens are banned: it ends here
            self.finish = "stop"
            return True
        self.token = token
        self.tokens.append(token)
        if logprob is not None:
            self.logprobs.append(logprob)
        if self.runtime.is_eog(token):
            self.stream.add(b"", logprob)  # no text; its log probability still goes out with the last piece
            self.finish = "stop"
            return True
        if self.stream.add(self.runtime.piece(token), logprob):
            self.finish = "stop"
            return True
        return len(self.tokens) >= self.max_new_tokens

    def _sample(self, output: int) -> tuple[int | None, TokenLogprob | None]:
        """The next token (None: the grammar is complete) and its log probability where asked: the raw logits', or
        the sampler chain's with ``post_sampling_probs``; the logits row kept where asked."""
        row = self.runtime.last_logits(output) if self.return_logits or self.n_probs is not None else None
        if self.return_logits:
            self.rows.append(row)
        if self.post_sampling:
            token, ids, probs = self.sampler.sample_with_probs(row)
            if token is None:
                return None, None
            return token, chain_logprob(token, ids, probs, self.n_probs, self.runtime.piece)
        token = self.sampler.sample(output)
        if self.n_probs is None or token is None:
            return token, None
        return token, token_logprob(row, token, self.n_probs, self.runtime.piece)

    def advance(self) -> None:
        """Note that :attr:`token` was decoded at :attr:`n_past`."""
        self.n_past += 1

    def close(self) -> None:
        """Free the sampler chain. Idempotent."""
        self.sampler.free()

    def result(self) -> tuple[list[int], str, str, np.ndarray | None]:
        """``(tokens, text, finish_reason, logits)``, the held-back text sent; the sampler freed."""
        self.close()
        text = self.stream.finish()
        return self.tokens, text, self.finish, (np.stack(self.rows) if self.return_logits and self.rows else None)
