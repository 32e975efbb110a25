"""The :class:`Backend` interface every model runtime implements.

A backend gives its :class:`~refsight.package.EncoderFingerprint`, encodes a batch
of images into :class:`~refsight.package.VisualPackage` objects, and generates
text from prompts whose images are any mix of cached packages and fresh images.
Capability flags tell the engine what it may ask for.
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence, Union

from ..images import ImageInput
from ..package import EncoderFingerprint, VisualPackage
from .prefix import PrefixCache
from .sampling import Sampling

__all__ = ["Backend", "Generation", "GenerationRequest", "Segment", "Sampling", "TextCallback", "ROLES"]

#: Called with each new piece of answer text, in order, as a backend produces it.
TextCallback = Callable[[str], None]
#: The chat roles a turn may have.
ROLES = ("system", "user", "assistant")

#: One piece of a prompt, in order: text, a cached package, or a fresh image.
Segment = Union[str, VisualPackage, ImageInput]


@dataclass
class GenerationRequest:
    """One prompt: segments in order (the backend wraps them in its chat template).

    ``json_schema``, when set, asks a backend with ``supports_constrained_decoding``
    to constrain its output to that schema. ``sampling`` (default: greedy) picks tokens.
    ``turns``, when set, splits ``segments`` into chat turns: ``(role, count)`` pairs whose
    counts add up to ``len(segments)``; ``None`` is one user turn (the prompt every
    single-turn request has always had).

    ``prefix_segments`` says how many leading segments depend only on the references (the
    judge's and ``generate``'s reference prefix; 0: none). With a ``prefix_cache`` a backend
    that can (``supports_prefix_cache``) reuses the language model's state after that prefix
    (see :mod:`refsight.backends.prefix`); the answer is the same either way.
    """

    segments: list[Segment]
    max_new_tokens: int = 64
    json_schema: dict[str, Any] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    turns: list[tuple[str, int]] | None = None
    prefix_segments: int = 0
    prefix_cache: PrefixCache | None = None

    def turn_segments(self) -> list[tuple[str, list[Segment]]]:
        """``(role, segments)`` per turn (one user turn when :attr:`turns` is None)."""
        if self.turns is None:
            return [("user", list(self.segments))]
        out, start = [], 0
        for role, count in self.turns:
            out.append((role, list(self.segments[start:start + count])))
            start += count
        return out

    @property
    def packages(self) -> list[VisualPackage]:
        """The cached packages among the segments, in order."""
        return [s for s in self.segments if isinstance(s, VisualPackage)]

    @property
    def fresh_images(self) -> list[ImageInput]:
        """The fresh images among the segments, in order."""
        return [s for s in self.segments if isinstance(s, ImageInput)]


@dataclass
class Generation:
    """What a backend produced for one request.

    ``logits`` (a ``[steps, vocab]`` float tensor) is filled only when asked for,
    for equivalence tests. ``random_weights`` is True when the model's weights are
    random, so its text means nothing. ``prompt_tokens`` counts the whole prompt (text
    and image tokens; 0 when the backend cannot tell) and ``image_tokens`` the tokens of
    each image in prompt order. ``finish_reason`` is ``"stop"`` (end of text or a stop
    string), ``"length"`` (``max_new_tokens`` reached) or ``"cancelled"`` (the stop event
    was set); ``None`` when the backend does not say. ``prefix_tokens_reused`` counts the prompt
    tokens served from a reused prefix state (no prefill ran over them).
    """

    text: str
    token_ids: list[int]
    model: str
    random_weights: bool
    logits: Any = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    prompt_tokens: int = 0
    image_tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prefix_tokens_reused: int = 0


class Backend(abc.ABC):
    """A model runtime behind refsight. Subclasses set the flags and implement three methods."""

    #: Can generate from cached packages without pixels.
    supports_cached_features: ClassVar[bool] = True
    #: Honours ``GenerationRequest.json_schema``.
    supports_constrained_decoding: ClassVar[bool] = False
    #: The :class:`Sampling` fields this backend honours; callers refuse a request setting any other.
    sampling_fields: ClassVar[frozenset[str]] = frozenset()
    #: Renders ``GenerationRequest.turns`` in its chat template; otherwise the engine labels turns in text.
    supports_turns: ClassVar[bool] = False
    #: :meth:`generate_stream` yields text as it is generated (not once at the end).
    supports_streaming: ClassVar[bool] = False
    #: Reuses ``GenerationRequest.prefix_cache`` states for the reference prefix.
    supports_prefix_cache: ClassVar[bool] = False
    #: Images encoded per forward pass.
    batch_size: int = 4
    #: True when the weights are random (test and benchmark models).
    random_weights: bool = False

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    def fingerprint(self) -> EncoderFingerprint:
        """Everything that changes this backend's visual features."""

    @abc.abstractmethod
    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        """Encode images into packages (one per image, same order), batching internally."""

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], *, return_logits: bool = False) -> list[Generation]:
        """Generation for a batch of requests (one result per request, same order).

        Greedy unless a request's ``sampling`` says otherwise; a backend honours only the
        fields in :attr:`sampling_fields` (callers refuse the others before asking).
        """

    def generate_stream(
        self, request: GenerationRequest, *, on_text: TextCallback, stop_event: threading.Event | None = None
    ) -> Generation:
        """Generate one request, calling ``on_text`` with each new piece of text as it is produced.

        Generation ends early, with ``finish_reason="cancelled"``, once ``stop_event`` is set
        (the caller went away). The pieces joined equal the returned ``Generation.text``.
        This default runs :meth:`generate` and hands over the whole text at once, so
        every backend streams (late); backends with ``supports_streaming`` override it.
        """
        if stop_event is not None and stop_event.is_set():
            return Generation(text="", token_ids=[], model=self.name, random_weights=self.random_weights,
                              finish_reason="cancelled")
        generation = self.generate([request])[0]
        if generation.text:
            on_text(generation.text)
        return generation

    def score_yes_no(self, requests: Sequence[GenerationRequest]) -> list[float]:
        """P("yes") per request from the next-token logits after its prompt (no decoding).

        The reranker's one call (Qwen3-VL-Reranker style): one forward pass per request,
        softmax over the logits of the "yes" and "no" tokens at the answer position. A
        backend that cannot score raises :class:`~refsight.errors.BackendError` saying so.
        """
        from ..errors import BackendError

        raise BackendError(self.name, "yes/no scoring is not supported by this backend (use the embedding reranker)")

    def count_text_tokens(self, text: str) -> int:
        """How many tokens ``text`` becomes in a prompt (images not counted).

        Used to refuse an over-long prompt before any model work. This default is a
        cheap estimate (about four UTF-8 bytes a token, rounded up); backends with a
        tokenizer count exactly.
        """
        return -(-len(text.encode("utf-8", "surrogatepass")) // 4)

    def check_requests(self, requests: Sequence[GenerationRequest]) -> None:
        """Raise :class:`~refsight.errors.InvalidInputError` naming the first request no runtime could serve.

        Every backend calls this before any model work; :meth:`check_text` adds the
        runtime's own rule for user text.
        """
        from ..errors import InvalidInputError

        if not requests:
            raise InvalidInputError("requests", "at least one GenerationRequest is needed")
        for i, request in enumerate(requests):
            if not isinstance(request, GenerationRequest):
                raise InvalidInputError(f"requests[{i}]", f"expected a GenerationRequest, got {type(request).__name__}")
            if not isinstance(request.max_new_tokens, int) or request.max_new_tokens < 1:
                raise InvalidInputError(f"requests[{i}].max_new_tokens", "must be a positive integer")
            if not request.segments:
                raise InvalidInputError(f"requests[{i}].segments", "a request needs at least one segment")
            if (
                isinstance(request.prefix_segments, bool) or not isinstance(request.prefix_segments, int)
                or not 0 <= request.prefix_segments <= len(request.segments)
            ):
                raise InvalidInputError(f"requests[{i}].prefix_segments", "must be an integer in 0..len(segments)")
            if request.json_schema is not None and not isinstance(request.json_schema, dict):
                raise InvalidInputError(f"requests[{i}].json_schema", "a JSON schema must be a dict")
            for j, segment in enumerate(request.segments):
                where = f"requests[{i}].segments[{j}]"
                if isinstance(segment, str):
                    self.check_text(segment, where)
                elif not isinstance(segment, (VisualPackage, ImageInput)):
                    raise InvalidInputError(
                        where, f"a segment is text, a VisualPackage or an ImageInput, not {type(segment).__name__}"
                    )

    def check_text(self, text: str, where: str) -> None:
        """Refuse user text this runtime cannot take as plain text (e.g. its special tokens); default: any."""

    def validate_package(self, package: VisualPackage) -> None:
        """Raise :class:`~refsight.errors.CorruptPackageError` if ``package`` cannot serve this model.

        The default checks that the fingerprint matches; families add shape checks.
        """
        from ..errors import CorruptPackageError

        if package.fingerprint != self.fingerprint():
            raise CorruptPackageError(package.key, f"made by another encoder than {self.name}")

    def close(self) -> None:
        """Release resources (models, threads). Idempotent."""
