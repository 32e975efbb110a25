"""The :class:`Backend` interface every model runtime implements, as one template.

A backend gives its :class:`~refsight.package.EncoderFingerprint`, encodes a batch of images into
:class:`~refsight.package.VisualPackage` objects, and generates text from prompts whose images are any
mix of cached packages and fresh images. Capability flags tell the engine what it may ask for.

The base class owns the request plumbing every runtime shares, in this order:

1. **check** (:meth:`Backend.check_batch`, request by request: :meth:`Backend.check_request`): what this
   runtime adds to the checks each :class:`~refsight.requests.GenerationRequest` made of its own fields
   when it was built: the segment kinds, the packages (:meth:`Backend.validate_package`), the JSON
   schema's grammar (:meth:`Backend.compile_schema`), then the prompt's rules (:meth:`Backend.check_prompt`:
   the forms it renders, its rule for user text, the sampling fields, the prompt's size), all before any
   model work;
2. **cancel**: a stream whose caller already went away ends here, with nothing run;
3. **prepare** (:meth:`Backend.prepare`, the step a backend tailors): what each request
   becomes for the runtime, a :class:`PreparedRequest`. The default encodes, in one
   batch with :meth:`Backend.encode`, the fresh images of every request for which
   :meth:`Backend.encodes_fresh_images` says so, and leaves the others to the runtime;
4. **execute** (:meth:`Backend.execute`, the narrow core a backend implements, after
   simonw/llm's single ``execute``): the prepared batch and one :class:`Execution` (logits
   wanted? text callback? stop event?) in, one :class:`Generation` per request out.
   :meth:`Backend.score` is the same core for ``score_yes_no``.
"""

from __future__ import annotations

import abc
import os
import threading
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping, Sequence, Union

from ..errors import BackendError, CorruptPackageError, InvalidInputError, RefsightError
from ..inputs.images import ImageInput
from ..package import EncoderFingerprint, VisualPackage
from ..inputs.prompt_size import check_prompt_size
from ..requests import GenerationRequest
from ..sampling import Sampling, check_supported
from .text_access import TextAccess, check_prompt_text
from .turns import check_prompt_form, plan_turns, tool_texts

__all__ = ["Backend", "Execution", "Generation", "PreparedRequest", "Segment", "Sampling", "TextCallback"]

#: Called with each new piece of answer text, in order, as a backend produces it.
TextCallback = Callable[[str], None]

#: One piece of a prompt, in order: text, a cached package, or a fresh image.
Segment = Union[str, VisualPackage, ImageInput]


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
    tokens served from a reused prefix state (no prefill ran over them). ``logprobs``: one
    :class:`~refsight.results.TokenLogprob` per token when ``Sampling.logprobs`` asked for them.
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
    logprobs: list[Any] | None = None


@dataclass
class PreparedRequest:
    """One checked request as the runtime takes it (what :meth:`Backend.prepare` makes of it).

    ``segments`` are the request's segments in order, each text, a package, or a fresh image
    left for the runtime's own pixel path (the default :meth:`Backend.prepare` puts the
    packages it encoded in place of the images it encoded). ``encode_ms`` is the time this
    request's images took to encode here; ``grammar`` its compiled JSON constraint
    (:meth:`Backend.compile_schema`), None without a schema. A backend that tailors
    :meth:`Backend.prepare` may put its own objects in ``segments`` (its ``execute`` reads them),
    and what it renders before the runtime runs: ``prompt``, the prompt's text, and ``prefix``, its
    plan for the reference prefix (llama.cpp: rendered before its runtime's lock is taken).
    """

    request: GenerationRequest
    segments: list[Any]
    encode_ms: float = 0.0
    grammar: Any = None
    prompt: str | None = None
    prefix: Any = None

    @property
    def packages(self) -> list[VisualPackage]:
        """The packages among the prepared segments, in order."""
        return [s for s in self.segments if isinstance(s, VisualPackage)]


@dataclass(frozen=True)
class Execution:
    """How one batch runs: logits wanted (equivalence tests), text handed out as it comes, a stop event.

    ``on_text`` is set only for a backend with ``supports_streaming`` (the base class hands
    the whole text over afterwards for the others); ``stop_event`` set means the caller went
    away: a backend ends generation early with ``finish_reason="cancelled"``. ``on_prompt(total, cached, processed)``
    hears of the prompt's tokens as its evaluation starts (``processed == cached``: from a prefix state) and ends.
    """

    return_logits: bool = False
    on_text: TextCallback | None = None
    stop_event: threading.Event | None = None
    on_prompt: Callable[[int, int, int], None] | None = None

    @property
    def cancelled(self) -> bool:
        """True once the stop event is set."""
        return self.stop_event is not None and self.stop_event.is_set()


class Backend(TextAccess, abc.ABC):
    """A model runtime behind refsight. Subclasses set the flags, implement :meth:`fingerprint`,
    :meth:`encode` and the core :meth:`execute` (and :meth:`score` when they can score)."""

    #: Honours ``GenerationRequest.json_schema``.
    supports_constrained_decoding: ClassVar[bool] = False
    #: The :class:`Sampling` fields this backend honours; callers refuse a request setting any other.
    sampling_fields: ClassVar[frozenset[str]] = frozenset()
    #: Renders ``GenerationRequest.turns`` in its chat template; otherwise the engine labels turns in text.
    supports_turns: ClassVar[bool] = False
    #: :meth:`generate_stream` yields text as it is generated (not once at the end).
    supports_streaming: ClassVar[bool] = False
    #: :meth:`generate_stream` reports the prompt's evaluation to ``on_prompt`` (:class:`Execution`).
    supports_prompt_progress: ClassVar[bool] = False
    #: The ``GenerationRequest.prompt_end`` values this backend renders.
    prompt_ends: ClassVar[frozenset[str]] = frozenset({"generation_prompt"})
    #: Hands ``GenerationRequest.template_variables`` to the chat template it renders (a backend without one refuses).
    renders_template_variables: ClassVar[bool] = False
    #: Special tokens a user's text may not contain (they would shift the image placeholders).
    reserved_tokens: tuple[str, ...] = ()
    #: Images encoded per forward pass.
    batch_size: int = 4
    #: True when the weights are random (test and benchmark models).
    random_weights: bool = False
    #: What a served request gets for the sampling fields it leaves unset: its runtime's server defaults (llama.cpp:
    #: llama-server's; an Ollama model: Ollama's under its params). A library :class:`Sampling` is as written.
    sampling_defaults: Mapping[str, Any] = MappingProxyType({})
    #: What its weights are, as Ollama's model endpoints report them (``/api/show``): ``parameter_count`` and
    #: ``quantization`` (``F32``, ``BF16``, ``Q4_K_M`` ...), where known.
    weights: Mapping[str, Any] = MappingProxyType({})

    def __init__(self, name: str) -> None:
        self.name = name

    @abc.abstractmethod
    def fingerprint(self) -> EncoderFingerprint:
        """Everything that changes this backend's visual features."""

    def fingerprint_sources(self) -> Sequence[str | os.PathLike] | None:
        """The files and directories that, with the model name, options and runtime versions, decide :meth:`fingerprint`
        (recorded at load and read back while they are unchanged: :mod:`.fingerprint_record`); None: more does."""
        return None

    @abc.abstractmethod
    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        """Encode images into packages (one per image, same order), batching internally."""

    # ------------------------------------------------------------------ the template

    def generate(
        self, requests: Sequence[GenerationRequest], *, return_logits: bool = False,
        stop_event: threading.Event | None = None,
    ) -> list[Generation]:
        """Generation for a batch of requests (one result per request, same order).

        Greedy unless a request's ``sampling`` says otherwise; a backend honours only the
        fields in :attr:`sampling_fields` (callers refuse the others before asking). A set
        ``stop_event`` ends it early (the caller went away), as in :meth:`generate_stream`.
        """
        return self._serve(requests, Execution(return_logits=return_logits, stop_event=stop_event))

    def generate_stream(
        self, request: GenerationRequest, *, on_text: TextCallback, stop_event: threading.Event | None = None,
        on_prompt: Callable[[int, int, int], None] | None = None,
    ) -> Generation:
        """Generate one request, calling ``on_text`` with each new piece of text as it is produced.

        Generation ends early, with ``finish_reason="cancelled"``, once ``stop_event`` is set
        (the caller went away); set before the call, nothing runs past the checks. The pieces
        joined equal the returned ``Generation.text``. A backend without ``supports_streaming``
        streams late: the whole text is handed over at the end. ``on_prompt``: see :class:`Execution`.
        """
        self.check_progress(on_text, on_prompt)
        streaming = self.supports_streaming
        execution = Execution(on_text=on_text if streaming else None, stop_event=stop_event, on_prompt=on_prompt)
        generation = self._serve([request], execution)[0]
        if not streaming and generation.text:
            on_text(generation.text)
        return generation

    def generate_one(
        self, request: GenerationRequest, *, on_text: TextCallback | None = None,
        stop_event: threading.Event | None = None, on_prompt: Callable[[int, int, int], None] | None = None,
    ) -> Generation:
        """One request's generation: streamed through ``on_text`` when given (:meth:`generate_stream`, with
        ``on_prompt``), else whole (:meth:`generate`); either way ended early once ``stop_event`` is set."""
        self.check_progress(on_text, on_prompt)
        if on_text is not None:
            # Only a given on_prompt is passed: a plugin backend's generate_stream may not take the keyword.
            progress = {} if on_prompt is None else {"on_prompt": on_prompt}
            return self.generate_stream(request, on_text=on_text, stop_event=stop_event, **progress)
        # Only a set stop_event is passed: a plugin backend that overrides generate() may not take the keyword.
        watched = {} if stop_event is None else {"stop_event": stop_event}
        return self.generate([request], **watched)[0]

    def check_progress(self, on_text: TextCallback | None, on_prompt: Callable[[int, int, int], None] | None) -> None:
        """Refuse an ``on_prompt`` that would never be called: a prompt's evaluation is reported while streaming
        (with ``on_text``), by a backend with :attr:`supports_prompt_progress`."""
        if on_prompt is not None and not (on_text is not None and self.supports_prompt_progress):
            raise InvalidInputError("on_prompt", f"{self.name} does not report a prompt's evaluation (streamed only)")

    def score_yes_no(self, requests: Sequence[GenerationRequest]) -> list[float]:
        """P("yes") per request from the next-token logits after its prompt (no decoding).

        The reranker's one call (Qwen3-VL-Reranker style): one forward pass per request,
        softmax over the logits of the "yes" and "no" tokens at the answer position. A
        backend that cannot score raises :class:`~refsight.errors.BackendError` saying so.
        """
        if type(self).score is Backend.score:
            return self.score([])  # a backend that cannot score says so whatever it is asked
        requests = list(requests)
        grammars = self.check_batch(requests)
        return self.score(self.prepare(requests, grammars))

    def _serve(self, requests: Sequence[GenerationRequest], execution: Execution) -> list[Generation]:
        requests = list(requests)
        grammars = self.check_batch(requests)
        if execution.cancelled:  # the caller went away: not even the images are encoded
            return [self.cancelled_generation() for _ in requests]
        return self.execute(self.prepare(requests, grammars), execution)

    def check_batch(self, requests: list[GenerationRequest]) -> list[Any]:
        """Every check before model work, request by request (:meth:`check_request`); their grammars.

        Returns each request's compiled grammar (:meth:`compile_schema`; None without a schema).
        """
        if not requests:
            raise InvalidInputError("requests", "at least one GenerationRequest is needed")
        grammars = []
        for i, request in enumerate(requests):
            grammars.append(self.check_request(i, request))
        return grammars

    def _grammar(self, schema: dict[str, Any] | None) -> Any:
        if schema is None:
            return None
        if not self.supports_constrained_decoding:
            raise InvalidInputError("json_schema", f"{self.name} does not support constrained decoding")
        try:
            return self.compile_schema(schema)
        except RefsightError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the compiler says, the schema is at fault
            raise InvalidInputError("json_schema", f"cannot be compiled into a grammar: {type(e).__name__}: {e}") from None

    def prepare(self, requests: list[GenerationRequest], grammars: list[Any]) -> list[PreparedRequest]:
        """Checked requests as the runtime takes them: the step a backend tailors.

        This default encodes the fresh images of every request :meth:`encodes_fresh_images`
        picks, all in one :meth:`encode` batch (the references' code, so a fresh image and a
        stored package of it are the same tensors), and puts the packages in their place;
        each request carries its images' share of the encode time.
        """
        chosen = [self.encodes_fresh_images(r) for r in requests]
        fresh = [image for r, take in zip(requests, chosen) if take for image in r.fresh_images]
        began = time.perf_counter()
        encoded = iter(self.encode(fresh) if fresh else ())
        per_image = (time.perf_counter() - began) * 1000 / len(fresh) if fresh else 0.0
        prepared = []
        for request, take, grammar in zip(requests, chosen, grammars):
            if not take:
                prepared.append(PreparedRequest(request, list(request.segments), grammar=grammar))
                continue
            segments = [next(encoded) if isinstance(s, ImageInput) else s for s in request.segments]
            prepared.append(PreparedRequest(request, segments, per_image * len(request.fresh_images), grammar))
        return prepared

    def encodes_fresh_images(self, request: GenerationRequest) -> bool:
        """Whether :meth:`prepare` encodes ``request``'s fresh images here; default: no, the runtime takes pixels."""
        return False

    def execute(self, batch: list[PreparedRequest], execution: Execution) -> list[Generation]:
        """The core: run a prepared batch as ``execution`` says; one :class:`Generation` per request, in order.

        Every check has passed and the batch is prepared. A backend that overrides
        :meth:`generate` itself (a test double) need not implement this.
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither execute() nor generate()")

    def score(self, batch: list[PreparedRequest]) -> list[float]:
        """The scoring core: P("yes") per prepared request. This default says scoring is not supported."""
        raise BackendError(self.name, "yes/no scoring is not supported by this backend (use the embedding reranker)")

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        """The runtime's grammar for a checked JSON schema (any exception: the schema is refused by name)."""
        return schema

    def cancelled_generation(self) -> Generation:
        """What a request whose caller went away before any model work returns."""
        return Generation(text="", token_ids=[], model=self.name, random_weights=self.random_weights,
                          finish_reason="cancelled")

    # -------------------------------------------------------------------- checks

    def chat_template_reads(self, variable: str) -> bool:
        """Whether the chat template could read ``variable`` (a ``chat_template_kwargs`` key).

        A key the template never reads changes nothing, so front ends may accept it. This
        default cannot tell and says True; backends whose template is known answer exactly.
        """
        return True

    def count_text_tokens(self, text: str) -> int:
        """How many tokens ``text`` becomes in a prompt (images not counted).

        Used to refuse an over-long prompt before any model work. This default is a
        cheap estimate (about four UTF-8 bytes a token, rounded up); backends with a
        tokenizer count exactly.
        """
        return -(-len(text.encode("utf-8", "surrogatepass")) // 4)

    def image_token_count(self, image: VisualPackage | ImageInput) -> int | None:
        """Prompt tokens ``image`` takes (a package by its layout, pixels by their size), or None where this
        backend cannot tell before running the model: the prompt limit counts images with it."""
        return None

    def plan_prompt(self, request: GenerationRequest) -> GenerationRequest:
        """``request`` as this runtime lays it out: its segments in chat turns (:func:`~.turns.plan_turns`: turns this
        runtime cannot render are labelled in the text), then :meth:`check_prompt` and its JSON schema compiled. The
        engine asks before it resolves or encodes any image, so a prompt this runtime cannot render, fit or constrain
        costs no encode."""
        segments, turns = plan_turns(list(request.segments), request.turns, self.supports_turns)
        planned = replace(request, segments=segments, turns=turns)
        self.check_prompt(planned)
        # Compiled here to be refused before the images are encoded; the generation compiles it again (a cost bounded
        # by the schema's size: the transformers backends cache the grammar, the others rebuild a grammar text).
        self._grammar(planned.json_schema)
        return planned

    def check_prompt(self, request: GenerationRequest, i: int = 0) -> None:
        """This runtime's rules for a request, in this order: its rule for user text (:meth:`check_text`,
        :meth:`check_raw_text`), the prompt forms it renders (:func:`~.turns.check_prompt_form`), the :class:`Sampling`
        fields it honours (:attr:`sampling_fields`), the prompt's size against ``max_prompt_tokens`` and
        :attr:`context_size` (:func:`~refsight.inputs.prompt_size.check_prompt_size`), and the prompt as this runtime reads it
        (:meth:`prompt_text_of`: :func:`~.text_access.check_prompt_text` refuses one that is nothing to generate from,
        whichever route, dialect or caller made it, before any runtime sees it). None needs the images resolved: asked
        before any is encoded (:meth:`plan_prompt`, new images counted by their size), the size is asked again with
        every image a package (:meth:`check_request`, for every caller, before any prefill)."""
        check = self.check_raw_text if request.raw_prompt else self.check_text
        for j, segment in enumerate(request.segments):
            if isinstance(segment, str):
                check(segment, f"requests[{i}].segments[{j}]")
        check_prompt_form(self, i, request)  # a raw prompt, or how the chat template's prompt ends
        check_supported(request.sampling, self.sampling_fields, self.name)
        counted = [*request.segments, *tool_texts(self, request)]  # the tools' definitions and calls are text too
        check_prompt_size(self, counted, request.max_prompt_tokens, request.raw_prompt)
        images = sum(1 for s in request.segments if not isinstance(s, str))
        check_prompt_text(self.prompt_text_of(request), images, self.media_marker, raw=request.raw_prompt)

    def prompt_text_of(self, request: GenerationRequest) -> str:
        """The text of ``request``'s prompt as this runtime reads it, each image as the media marker: what
        :meth:`check_prompt` holds to :func:`~.text_access.check_prompt_text`. This default is the segments as given
        (a raw prompt; a runtime that adds no chat template); a backend that renders one renders it."""
        return "".join(s if isinstance(s, str) else self.media_marker for s in request.segments)

    def check_request(self, i: int, request: GenerationRequest) -> Any:
        """Raise :class:`~refsight.errors.InvalidInputError` (or :class:`CorruptPackageError`) naming what of request
        ``i`` this runtime cannot serve; else its compiled grammar (None without a schema).

        What the backend adds to the request's own checks, in this order: the segment kinds it takes, the reference
        keys among its packages, each package (:meth:`validate_package`), the schema's grammar, then its rules for
        the prompt (:meth:`check_prompt`), whose size counts only packages found sound.
        """
        if not isinstance(request, GenerationRequest):
            raise InvalidInputError(f"requests[{i}]", f"expected a GenerationRequest, got {type(request).__name__}")
        for j, segment in enumerate(request.segments):
            if not isinstance(segment, (str, VisualPackage, ImageInput)):
                raise InvalidInputError(
                    f"requests[{i}].segments[{j}]",
                    f"a segment is text, a VisualPackage or an ImageInput, not {type(segment).__name__}",
                )
        if request.reference_keys is not None and not (
            isinstance(request.reference_keys, (set, frozenset, tuple, list))
            and set(request.reference_keys) <= {p.key for p in request.packages}
        ):
            raise InvalidInputError(f"requests[{i}].reference_keys", "must name packages among the segments")
        for package in request.packages:
            self.validate_package(package)
        grammar = self._grammar(request.json_schema)
        self.check_prompt(request, i)
        return grammar

    def check_text(self, text: str, where: str) -> None:
        """Refuse user text holding one of :attr:`reserved_tokens` (it would shift the placeholders)."""
        for token in self.reserved_tokens:
            if token in text:
                raise InvalidInputError(where, f"text may not contain the special token {token}")

    def validate_package(self, package: VisualPackage) -> None:
        """Raise :class:`~refsight.errors.CorruptPackageError` if ``package`` cannot serve this model.

        The fingerprint must match (the error names the fields that differ); then
        :meth:`check_package` runs the backend's shape checks, any malformed metadata or
        tensor becoming a :class:`CorruptPackageError` too.
        """
        if not isinstance(package, VisualPackage):
            raise InvalidInputError(repr(package)[:80], "expected a VisualPackage")
        mine = self.fingerprint()
        if package.fingerprint != mine:
            raise CorruptPackageError(package.key, f"made by another encoder than {self.name} (differs in: "
                                                   f"{', '.join(package.fingerprint.difference(mine))})")
        try:
            self.check_package(package)
        except CorruptPackageError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise CorruptPackageError(package.key, f"malformed metadata or tensors: {type(e).__name__}: {e}") from None

    def check_package(self, package: VisualPackage) -> None:
        """Shape checks of a package whose fingerprint matches; raise :class:`CorruptPackageError`. Default: none."""

    def runtime_info(self) -> dict[str, Any]:
        """How this backend runs, for people (``/v1/models``, ``/props``, the serve start-up line). Default: nothing."""
        return {}


    def close(self) -> None:
        """Release resources (models, threads). Idempotent."""
