"""What the raw-prompt routes share (llama-server's ``/completion``, OpenAI's ``/v1/completions``).

A raw prompt is the whole prompt as the model reads it (no chat template added:
:mod:`refsight.backends.text_access`). Images go where the prompt has the media marker
(``GET /props`` says which), one ``multimodal_data`` item each, in order: base64 bytes
(or a ``data:`` URL), or a stored reference by ``refsight://ref/<id>`` or by this
server's ``/v1/references/<id>/image`` URL.

A ``/completion`` prompt may also be token ids, alone or mixed with text
(``[12, 34, "text", 56]``, llama-server's form): :func:`mixed_prompt_text` takes it where
the text of those ids, read back by the served model's tokenizer, gives exactly the tokens
llama-server would evaluate, and refuses it by name where it would not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ... import ContextLengthError, InvalidInputError
from ...results import GenerateResult

from ..replies.answers import Answer
from .bodies import decode_image_field
from ..edge.http_errors import ApiError
from .messages import REF_URL_PREFIX, ContentPart, ImageURL, PartResolver
from .prompt_limit import check_prompt_chars, check_prompt_tokens

__all__ = [
    "RawPrompt", "raw_prompt", "media_segment", "check_raw_prompt", "stop_type", "with_stopping_word", "fill_context",
    "mixed_prompt_text", "with_piece_tokens", "MAX_PROMPT_IDS", "MAX_PROMPTS",
]

#: The most token ids one prompt may give (a context's worth; longer prompts are text).
MAX_PROMPT_IDS = 1 << 17
#: The prompts one completion request may hold (``/completion``, ``/v1/completions``), each answered in turn.
MAX_PROMPTS = 16
#: The longest item read as a reference name when its base64 decodes to ``refsight://ref/<id>``.
_MAX_NAMED = 512


@dataclass
class RawPrompt:
    """A raw prompt split at its media markers: texts and media items alternate (``len(texts) == len(media) + 1``)."""

    texts: list[str]
    media: list[str]
    field: str

    def segments(self, resolver: PartResolver) -> list[Any]:
        """The engine's segments: each text, each media item resolved (decoded bytes or a reference)."""
        out: list[Any] = [self.texts[0]] if self.texts[0] else []
        for i, (item, text) in enumerate(zip(self.media, self.texts[1:])):
            out.append(media_segment(item, f"multimodal_data[{i}]", resolver))
            if text:
                out.append(text)
        return out or [""]


def raw_prompt(prompt: str, media: list[str] | None, marker: str, field: str = "prompt") -> RawPrompt:
    """``prompt`` split at ``marker``; 400 when the markers and ``media`` disagree in number."""
    media = list(media or [])
    if not prompt and not media:
        # Nothing to start generating from: the runtimes fail on an empty prompt (a 0-element tensor).
        raise ApiError(400, "invalid_input", f"{field}: is empty; give the text to continue", param=field)
    texts = prompt.split(marker)
    if len(texts) - 1 != len(media):
        raise ApiError(
            400, "invalid_input",
            f"multimodal_data: {len(media)} item(s) for {len(texts) - 1} media marker(s) {marker} in the {field}",
            param="multimodal_data",
        )
    return RawPrompt(texts, media, field)


def media_segment(item: str, where: str, resolver: PartResolver) -> Any:
    """One image item: a stored reference (``refsight://ref/<id>`` or this server's URL, as text or as the
    base64 of that text: clients that base64-encode every image can name a reference too), else base64 bytes."""
    if item.startswith(("refsight://", "http://", "https://", "file://")):
        return resolver.image(ContentPart(type="image_url", image_url=ImageURL(url=item)), where)
    data = decode_image_field(item, where)
    if len(data) <= _MAX_NAMED and data.startswith(REF_URL_PREFIX.encode()):
        return resolver.image(ContentPart(type="image_url", image_url=ImageURL(url=data.decode("utf-8", "replace"))), where)
    return resolver.decode_bytes(data, where)


def mixed_prompt_text(items: list[Any], service: Any) -> str:
    """The text of a prompt given as token ids and strings, as llama-server's ``tokenize_mixed`` reads it.

    llama-server evaluates the first string's tokens after a BOS (when the vocabulary wants one), the
    other strings' tokens as they are, and the ids as given. refsight's raw prompts are text: the ids'
    pieces (special tokens written out) joined with the strings. That text is taken only when the
    served tokenizer reads it back as exactly llama-server's tokens; else a 400 says so (send the text).
    """
    if not items:
        raise ApiError(400, "invalid_input", "prompt: is empty; give the text or tokens to continue", param="prompt")
    ids = sum(1 for item in items if isinstance(item, int))
    if ids > MAX_PROMPT_IDS:
        raise ApiError(400, "invalid_input", f"prompt: at most {MAX_PROMPT_IDS} token ids", param="prompt")
    expected: list[int] = []
    parts: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            expected += service.tokenize(item, add_special=not expected and i == 0, parse_special=True)
            parts.append(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            expected.append(item)
            parts.append(_piece(item, service, f"prompt[{i}]"))
        else:
            raise ApiError(400, "invalid_input", f"prompt[{i}]: a token id or a string", param="prompt")
    text = "".join(parts)
    if service.tokenize(text, add_special=True, parse_special=True) != expected:
        raise ApiError(
            400, "unsupported", "prompt: these token ids do not read back as the same tokens from their text "
            "(a split word, a byte piece, or no BOS where the vocabulary adds one); send the prompt as text",
            param="prompt",
        )
    return text


def _piece(token: int, service: Any, where: str) -> str:
    """One token's text (special tokens written out); 400 naming ``where`` for an id outside the vocabulary."""
    try:
        return service.token_piece(token).decode("utf-8", "replace")
    except InvalidInputError as e:
        raise ApiError(400, "invalid_input", f"{where}: {e.reason}", param="prompt") from None


def check_raw_prompt(prompt: RawPrompt, limit: int, service: Any) -> None:
    """The prompt-token limit, before the generation: characters first, then tokens (the tokenizer: call it in the
    work pool, as every tokenizing is)."""
    check_prompt_chars(prompt.texts, limit, prompt.field)
    check_prompt_tokens(prompt.texts, limit, service.count_text_tokens, prompt.field)


def with_stopping_word(answer: Answer, stop: tuple[str, ...], service: Any) -> Answer:
    """``answer`` with llama-server's ``stopping_word``: the stop string its tokens' text holds, where it did not
    run out of tokens (the tokens are read back: call it in the work pool, beside the generation)."""
    if answer.finish_reason != "length" and stop:
        text = service.detokenize(answer.tokens)
        answer.stopping_word = next((word for word in stop if word in text), "")
    return answer


def stop_type(answer: Answer) -> tuple[str, str]:
    """llama-server's ``stop_type`` and ``stopping_word``: ``limit``, ``word`` (a stop string) or ``eos``
    (the word found by :func:`with_stopping_word`)."""
    if answer.finish_reason == "length":
        return "limit", ""
    return ("word", answer.stopping_word) if answer.stopping_word else ("eos", "")


class _TokenPiece(str):
    """A streamed piece of text with its token ids in the served vocabulary, read in the worker."""

    tokens: list[int]


def with_piece_tokens(on_text: Callable[[str], None] | None, service: Any) -> Callable[[str], None] | None:
    """``on_text`` handed each piece with its ``tokens`` (llama-server's stream sends them; a piece with log
    probabilities carries its own), read in the worker as the piece is made: tokenizing is model work, never the
    event loop's."""
    if on_text is None:
        return None

    def send(text: str) -> None:
        if not getattr(text, "logprobs", ()):
            piece = _TokenPiece(text)
            piece.tokens = service.tokenize(text, add_special=False, parse_special=False)
            text = piece
        on_text(text)

    return send


def fill_context(generate: Callable[[int], GenerateResult], n_ctx: int | None, limit: int) -> Answer:
    """llama-server's ``n_predict: -1``: generate until the end of text or of the context.

    ``generate(max_new_tokens)`` runs the model. Where the context is bounded, the answer takes all of
    the room the prompt leaves: the backend names that room when asked for more (the prompt length is
    only known once its images are tokenized), and the request runs again with it (the prompt's prefix
    is then served by the prefix cache where one is kept). ``truncated`` says the context ran out, as
    llama-server says it. Without a context bound, ``limit`` (the server's largest answer) bounds it.
    """
    if not n_ctx:
        return Answer.of(generate(limit))
    try:
        return Answer.of(generate(n_ctx))
    except ContextLengthError as e:
        room = e.n_ctx - e.n_prompt_tokens
        if e.input != "max_new_tokens" or room < 1:
            raise
    result = generate(room)
    return Answer.of(result, truncated=result.finish_reason == "length")
