"""What front ends that speak a model's own text need: tokens, the chat template as text, raw prompts.

llama-server's native endpoints (``/tokenize``, ``/detokenize``, ``/apply-template``,
``/completion``) work on this level. :class:`TextAccess` is part of every
:class:`~refsight.backends.base.Backend`; its defaults say "not supported" (an
:class:`~refsight.errors.InvalidInputError` naming the input), and backends with a
tokenizer and a known template (transformers, llama.cpp) implement it.

A **raw prompt** (``GenerationRequest.raw_prompt``) is the whole prompt as the model
reads it: no chat template is added, special tokens the text spells (``<|im_start|>``)
are parsed as such, and each image stands where the caller put it. Only the text that
stands for an image itself (:attr:`TextAccess.media_tokens`) is refused in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..errors import InvalidInputError
from ..tools import ChatTools, ToolFormat, format_of
from .templates import TemplateRaised
from .turns import split_final_turn

__all__ = ["TextAccess", "MEDIA_MARKER", "PROBE_TEXT", "check_prompt_text"]

#: Where an image goes in a prompt's text (mtmd's default marker, as llama-server uses it).
MEDIA_MARKER = "<__media__>"
#: The one user message a chat template is tried on when it is set (:meth:`TextAccess.probe_chat_template`).
PROBE_TEXT = "hi"


def check_prompt_text(text: str, images: int, marker: str, *, raw: bool = False) -> str:
    """``text``, the whole prompt a runtime would read (each of its ``images`` written as ``marker``), unless it is
    nothing to generate from: empty or only whitespace, with no image (a runtime fed no tokens aborts: llama.cpp's
    ``GGML_ASSERT``), or a chat template's that dropped some of the images. InvalidInputError naming the input
    (``prompt`` for a raw prompt, ``messages`` for a chat) and why."""
    placed = text.count(marker) if marker else images
    if placed < images:
        raise InvalidInputError("messages", f"the chat template renders {placed} of their {images} image(s)")
    if placed or text.strip():
        return text
    if raw:
        raise InvalidInputError("prompt", "is empty (or only whitespace): give the text to continue")
    raise InvalidInputError("messages", "the prompt they make is empty (or only whitespace) after the chat template: "
                            "nothing to generate from")


class TextAccess:
    """Tokens and template text of a model; the defaults refuse, naming what is missing."""

    #: Serves ``GenerationRequest.raw_prompt`` (no chat template added).
    supports_raw_prompt: ClassVar[bool] = False
    #: Text that stands for an image in the model's vocabulary: refused in any text, raw prompts included.
    media_tokens: ClassVar[tuple[str, ...]] = ()
    #: Renders a request's tools and tool turns in its chat template (``tools``, ``tool_calls``, ``tool_call_id``).
    supports_tools: ClassVar[bool] = False
    name: str

    @property
    def media_marker(self) -> str:
        """The text that marks an image in a raw prompt or a rendered template."""
        return MEDIA_MARKER

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """``text``'s token ids (``add_special``: the BOS the model wants; ``parse_special``: special tokens as such)."""
        raise InvalidInputError("tokenize", f"{self.name} does not expose its tokenizer")

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (special tokens included)."""
        raise InvalidInputError("detokenize", f"{self.name} does not expose its tokenizer")

    def token_piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens included)."""
        raise InvalidInputError("detokenize", f"{self.name} does not expose its tokenizer")

    def template_text(
        self, texts: Sequence[str], turns: list[tuple[str, int]] | None = None, *, generation_prompt: bool = True,
        tools: ChatTools | None = None, variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat template around ``texts`` (``turns`` as in a request), images already written as the marker;
        ``generation_prompt=False``: without the opening of the answer's turn; ``tools``: what it is given of them;
        ``variables``: the template's own."""
        raise InvalidInputError("messages", f"{self.name} does not expose its chat template as text")

    def chat_text(self, texts: Sequence[str], turns: Sequence[tuple[str, int]] | None = None,
                  prompt_end: str = "generation_prompt", tools: ChatTools | None = None,
                  variables: Mapping[str, Any] | None = None) -> str:
        """The whole prompt a chat of ``texts`` (images already written as the marker) renders to: the chat template
        over ``turns`` (None: one user turn) ended as ``prompt_end`` says (``continue``: the turns before the final one
        with the opening of the answer's turn, then the final turn's text, as llama-server renders a prefill), given
        ``tools`` and the template's ``variables`` (``GenerationRequest.template_variables``). InvalidInputError when
        that prompt is nothing to generate from (:func:`check_prompt_text`)."""
        texts = list(texts)
        turns = list(turns or [("user", len(texts))])
        if prompt_end == "continue":
            head, head_turns, tail = split_final_turn(texts, turns)
            text = self.template_text(head, head_turns, tools=tools, variables=variables) + tail
        else:
            text = self.template_text(texts, turns, generation_prompt=prompt_end == "generation_prompt", tools=tools,
                                      variables=variables)
        return check_prompt_text(text, sum(t.count(self.media_marker) for t in texts), self.media_marker)

    def probe_chat_template(self) -> None:
        """Try the chat template on one user message (:data:`PROBE_TEXT`), as it is set: InvalidInputError naming
        ``chat_template`` when it does not compile, breaks a render's bounds or deadline, or renders an empty
        prompt. An error the template raises itself is left to the chats it refuses (some want a system message)."""
        try:
            text = self.template_text([PROBE_TEXT])
        except TemplateRaised:
            return
        if not text.strip():
            raise InvalidInputError("chat_template", f"renders an empty prompt (for one user message {PROBE_TEXT!r})")

    def chat_template_source(self) -> str | None:
        """The chat template's own source (Jinja), where the model carries one; None otherwise."""
        return None

    def tool_format(self) -> ToolFormat | None:
        """The tool-call format the chat template teaches the model (:func:`refsight.tools.format_of`): how a tool
        call is read out of its answers; None where its answers are text (a template that teaches no format, or a
        backend that renders no template here)."""
        return format_of(self.chat_template_source()) if self.supports_tools else None

    def use_chat_template(self, template: str) -> None:
        """Render chats in ``template`` (Jinja) instead of the model's own (``refsight serve --chat-template``);
        a backend that does not render its chats itself refuses, naming the option."""
        raise InvalidInputError("chat_template", f"{self.name} does not render its chats here; its runtime's own "
                                "chat template is used (set the template where that runtime is started)")

    def check_raw_text(self, text: str, where: str) -> None:
        """Refuse raw-prompt text that holds an image's own tokens (they would shift the images)."""
        for token in self.media_tokens:
            if token in text:
                raise InvalidInputError(where, f"text may not contain the image token {token}")

    def check_token_ids(self, tokens: Sequence[int], vocab_size: int) -> list[int]:
        """``tokens`` as ints, each a token of the vocabulary; else an error naming the first bad one."""
        out = []
        for i, token in enumerate(tokens):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                raise InvalidInputError(f"tokens[{i}]", f"must be a token id from 0 to {vocab_size - 1}, not {token!r}")
            out.append(token)
        return out
