"""The typed requests of refsight's public API: each built once by a front door, checked once, taken whole.

A front door (the Python keywords, the CLI's arguments, an HTTP body) builds ONE request
value; its ``__post_init__`` checks every rule of that request in one place (vLLM's
``SamplingParams._verify_args`` style) and raises :class:`~refsight.errors.InvalidInputError`
naming the field and the reason; the engine takes the value whole and never checks it again.

- :class:`CompareRequest`: one compare (the candidate, the rubric, recall / rerank / judge
  knobs, the cache switches, the model and the namespace);
- :class:`GenerationRequest`: one generation (the prompt's segments, the token bound, the JSON schema,
  the sampling, the chat turns, a raw prompt, the prompt limit, the cache switches, the model and
  the namespace), the one shape of it from the front door down to the backend (the engine puts the
  resolved segments and the prefix in place);
- :class:`SearchRequest`: one recall by text or by image (``k``, the ``where`` filter, the ids
  it is restricted to, the namespace);
- :class:`AddRequest`: one reference to add (the image, its id and metadata, the attribute
  records to compute now, the model and the namespace);
- :class:`~refsight.sampling.Sampling`: how tokens are picked, with the one merge of a
  request's fields over the served model's defaults (:meth:`Sampling.merged`) and the one rule of
  what a backend honours (:meth:`Sampling.unsupported`). It is defined in :mod:`refsight.sampling`
  (the backends read it there) and re-exported here with its declared ranges (``SAMPLING_RANGES``, for a schema)
  and its most ``logit_bias`` pairs (``MAX_LOGIT_BIAS``, for a front end to bound a request before tokenizing it);
- :func:`~refsight.inputs.json_schema.check_json_schema`: the one check of a JSON schema before any
  grammar is built (re-exported so a front door can name the field that carried it).

The requests sit on the ground floor: they import only ground-floor rooms (the errors, image intake, the
hostile-input checks of :mod:`refsight.inputs`, :mod:`refsight.inputs.rubric`, :mod:`refsight.sampling`), and the
checks of the fields the rooms above also apply live here (:func:`check_search`, :func:`check_recall_mode`,
:func:`check_sources`, :func:`check_prompt_end`, :func:`check_template_variables`, the reranker names).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidInputError
from .inputs.images import ImageInput, ImageSource
from .inputs.json_schema import check_json_schema
from .inputs.ref_ids import validate_ref_id
from .inputs.text import check_text, check_texts
from .package import VisualPackage
from .inputs.rubric import Rubric, parse_rubric
from .sampling import MAX_LOGIT_BIAS
from .sampling import RANGES as SAMPLING_RANGES
from .sampling import Sampling
from .tools import ChatTools, ToolTurn, ToolUse, checked_tool_turns

__all__ = [
    "CompareRequest", "GenerationRequest", "SearchRequest", "AddRequest", "Sampling", "SAMPLING_RANGES",
    "MAX_LOGIT_BIAS", "MAX_SHORTLIST", "MAX_K", "PROMPT_ENDS", "RECALL_MODES", "RECORD_SOURCES", "RERANKERS",
    "check_json_schema", "check_prompt_end", "check_query_text", "check_recall_mode", "check_search", "check_sources",
    "check_template_variables", "RESERVED_TEMPLATE_VARIABLES",
]

#: The chat template variables refsight's render sets itself from the request: a request's own may not name them.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools",
                                         "documents"})

#: Most references one compare may recall, rerank or judge.
MAX_SHORTLIST = 1000

#: Most references one search returns.
MAX_K = 1000

#: How a compare may build its recall query.
RECALL_MODES = ("image", "text", "both")

#: The attribute records a comparison may ask for.
RECORD_SOURCES = ("imagenet", "vlm")

#: The rerankers a compare may name (or it gives a :class:`refsight.compare.rerank.Reranker` itself).
RERANKERS = ("vlm", "embedding")

#: How a chat prompt ends after its turns: the opening of the answer's turn (the default); ``continue``: the
#: final assistant turn left open, its text the start of the answer (llama-server's assistant prefill, vLLM's
#: ``continue_final_message``); ``none``: nothing after the turns (``add_generation_prompt: false``).
PROMPT_ENDS = ("generation_prompt", "continue", "none")


@dataclass(frozen=True)
class CompareRequest:
    """One compare (see :meth:`refsight.Engine.compare`), checked once when it is built.

    ``criteria`` is the rubric (text, JSON, YAML or data; parsed here into :attr:`rubric`);
    ``ref_ids`` the references, or the ``top_k`` recalled (within ``ref_ids`` when both are
    given) by ``recall`` (``"image"``, ``"text"``, ``"both"``; resolved into :attr:`mode`) with
    the ``query`` text; ``rerank``, ``recall_k`` and ``reranker`` the shortlist's depth and
    scorer; ``attributes`` the attribute records used (none with ``force_vlm``);
    ``evidence_max_chars`` bounds each evidence string. ``use_cache`` / ``prefix_states``,
    ``model`` and ``namespace`` become the request context at the engine's front door.
    """

    candidate: ImageSource
    criteria: Any
    ref_ids: Sequence[str] = ()
    top_k: int | None = None
    query: str | None = None
    recall: str | None = None
    rerank: int | None = None
    #: references recalled (default: ``rerank``, else ``top_k``); with more than ``rerank``, the best
    #: ``rerank`` by recall score (after the prefilter) are reranked, the rest reported as ``recalled``
    recall_k: int | None = None
    #: a name in :data:`RERANKERS` or a :class:`refsight.compare.rerank.Reranker`
    reranker: Any = "vlm"
    force_vlm: bool = False
    attributes: Sequence[str] = ("imagenet",)
    evidence_max_chars: int | None = None
    use_cache: bool = True
    prefix_states: bool = True
    model: str | None = None
    namespace: str | None = None
    #: the parsed ``criteria``
    rubric: Rubric = field(init=False, repr=False, compare=False)
    #: the attribute records used (none with ``force_vlm``)
    sources: tuple[str, ...] = field(init=False, repr=False, compare=False)
    #: the recall query's mode (``recall``, else ``text`` with a query, else ``both``)
    mode: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The order errors are found in: the reference ids, the rubric, the sources, the counts, the recall mode.
        self._set("ref_ids", tuple(self.ref_ids))
        for ref_id in self.ref_ids:
            validate_ref_id(ref_id)
        self._set("rubric", parse_rubric(self.criteria))  # a bad rubric fails before any model work
        sources = check_sources(self.attributes)
        self._set("attributes", sources)
        self._set("sources", () if self.force_vlm else sources)
        self._check_counts()
        self._set("mode", check_recall_mode(self.recall, query=self.query))

    @classmethod
    def of(cls, request: CompareRequest | ImageSource, options: Mapping[str, Any]) -> CompareRequest:
        """``request`` itself, or the request of a candidate and keywords (the keyword form of the Python API)."""
        return request if _given(cls, request, options) else cls(request, **options)

    @property
    def recall_depth(self) -> int | None:
        """How many references recall returns (None: no recall, the given ids are the shortlist)."""
        return None if self.top_k is None else self.recall_k or self.rerank or self.top_k

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_counts(self) -> None:
        """The counts that cannot work together, and an empty ``query``: every cross-field rule of a compare."""
        if self.query is not None:
            check_query_text(self.query, "query")  # the rule search's text follows too
            if self.top_k is None:  # query only steers recall: without top_k it would be silently ignored
                raise InvalidInputError("query", "recalls references by text, so it needs top_k")
        for name in ("top_k", "rerank", "recall_k"):
            _count(name, getattr(self, name))
        self._check_depths()
        if not self.ref_ids and self.top_k is None:  # said before any model loads, not after it
            raise InvalidInputError("ref_ids", "no reference to compare with: give reference ids (ref_ids), "
                                    "or recall them with top_k")
        # A reranker given as an object is anything that scores (refsight.compare.rerank.Reranker's one call): the request
        # names no class above the ground floor.
        if not callable(getattr(self.reranker, "score", None)) and self.reranker not in RERANKERS:
            raise InvalidInputError("reranker", f"use 'vlm', 'embedding' or a Reranker, not {self.reranker!r}")

    def _check_depths(self) -> None:
        """``rerank`` and ``recall_k`` deepen a recall: they need ``top_k``, and at least what goes on after them."""
        if self.rerank is not None:
            if self.top_k is None:
                raise InvalidInputError("rerank", "reranks a recalled shortlist: give top_k (the references to judge) too")
            if self.rerank < self.top_k:
                raise InvalidInputError("rerank", f"recalls {self.rerank} to rerank, fewer than top_k={self.top_k} to judge")
        if self.recall_k is not None:
            if self.top_k is None:
                raise InvalidInputError("recall_k", "is the depth of recall: give top_k too")
            if self.recall_k < (self.rerank or self.top_k):
                raise InvalidInputError("recall_k", f"recalls {self.recall_k}, fewer than the {self.rerank or self.top_k} that go on")


def _count(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHORTLIST):
        raise InvalidInputError(name, f"must be an integer in 1..{MAX_SHORTLIST}, not {value!r}")


@dataclass(frozen=True)
class GenerationRequest:
    """One generation (see :meth:`refsight.Engine.chat`), checked once when it is built, taken whole down to the backend.

    ``segments`` in order: text (``str``), a :class:`~refsight.references.ReferenceSegment`, or an
    image; the engine resolves references and images into packages (or pixels for the runtime's own
    path) and hands the same request on with them in place. ``turns`` splits the segments into chat
    turns (``(role, count)`` pairs whose counts add up to ``len(segments)``; None: one user turn);
    ``raw_prompt``: the segments are the whole prompt, no chat template added. ``sampling`` (default
    greedy) is a :class:`Sampling`; ``json_schema`` constrains the answer (a backend with
    ``supports_constrained_decoding``; kept in 2020-12's form, draft-07's tuple ``items`` as
    ``prefixItems``); ``max_prompt_tokens`` bounds the prompt (text and image tokens); ``prompt_end``
    how the chat prompt ends after its turns (:data:`PROMPT_ENDS`: ``continue`` continues a final
    assistant turn); ``template_variables`` the chat template's variables beside the conversation
    (``enable_thinking``, ``reasoning_effort``: vLLM's and llama-server's ``chat_template_kwargs``), honoured where the
    backend renders a template (:attr:`~refsight.backends.base.Backend.renders_template_variables`). ``tools`` (a
    :class:`~refsight.tools.ToolUse`) offers the model functions, rendered by its chat template, the answer read into
    calls (a forced call, ``tool_choice`` ``required`` or named, is its ``json_schema``); ``tool_turns`` has each
    turn's tool fields (an assistant turn's calls, a tool result's call id; None: none).
    ``use_cache`` / ``prefix_states``, ``model`` and ``namespace`` become the request context at the engine's front
    door.

    What the engine (or a pipeline) sets as it resolves the prompt: ``prefix_segments``, how many
    leading segments depend only on the references (0: none), and ``prefix_cache``, where a backend
    that implements it (HF, llama.cpp) keeps and reuses the language model's state after that prefix
    (a :class:`~refsight.backends.prefix.PrefixCache`; the answer is the same either way);
    ``reference_keys`` names the packages that are stored references when they are not the prefix (the
    reranker puts the candidate first; None: those of the reference prefix). A runtime that keeps
    images by a durable id (vLLM's ``uuid``) gives one to these only, never to a candidate.
    """

    segments: Sequence[Any]
    max_new_tokens: int = 64
    json_schema: dict[str, Any] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    turns: Sequence[tuple[str, int]] | None = None
    raw_prompt: bool = False
    max_prompt_tokens: int | None = None
    use_cache: bool = True
    prefix_states: bool = True
    model: str | None = None
    namespace: str | None = None
    prompt_end: str = "generation_prompt"
    template_variables: Mapping[str, Any] = field(default_factory=dict)
    prefix_segments: int = 0
    prefix_cache: Any = None
    reference_keys: frozenset[str] | None = None
    tools: ToolUse | None = None
    tool_turns: Sequence[ToolTurn | None] | None = None

    def __post_init__(self) -> None:
        # The order errors are found in: the token bound, the prompt's end, its texts, the tools, the schema, the
        # sampling.
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidInputError("max_new_tokens", f"must be a positive integer, not {self.max_new_tokens!r}")
        check_prompt_end(self.prompt_end, self.raw_prompt)
        object.__setattr__(self, "template_variables", check_template_variables(self.template_variables, self.raw_prompt))
        object.__setattr__(self, "segments", _checked_segments(self.segments))
        _check_tools(self)
        if self.json_schema is not None:
            check_texts(self.json_schema, "json_schema")
            # Kept in 2020-12's form, the one every grammar compiler takes: written once, here, not by each backend.
            object.__setattr__(self, "json_schema", check_json_schema(self.json_schema))
        sampling = Sampling() if self.sampling is None else self.sampling
        if not isinstance(sampling, Sampling):
            raise InvalidInputError("sampling", f"expected a Sampling, got {type(sampling).__name__}")
        object.__setattr__(self, "sampling", sampling)
        prefix = self.prefix_segments
        if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix <= len(self.segments):
            raise InvalidInputError("prefix_segments", "must be an integer in 0..len(segments)")

    @classmethod
    def of(cls, request: GenerationRequest | Sequence[Any], options: Mapping[str, Any]) -> GenerationRequest:
        """``request`` itself, or the request of segments and keywords (the keyword form of the Python API)."""
        return request if _given(cls, request, options) else cls(request, **options)

    def turn_segments(self) -> list[tuple[str, list[Any]]]:
        """``(role, segments)`` per turn (one user turn when :attr:`turns` is None)."""
        if self.turns is None:
            return [("user", list(self.segments))]
        out, start = [], 0
        for role, count in self.turns:
            out.append((role, list(self.segments[start:start + count])))
            start += count
        return out

    @property
    def chat_tools(self) -> ChatTools | None:
        """What the chat template is given about tools (its ``tools`` variable, the turns' tool fields); None:
        nothing."""
        if self.tools is None and not self.tool_turns:
            return None
        return ChatTools(self.tools, tuple(self.tool_turns or ()))

    @property
    def packages(self) -> list[VisualPackage]:
        """The cached packages among the segments, in order."""
        return [s for s in self.segments if isinstance(s, VisualPackage)]

    @property
    def fresh_images(self) -> list[ImageInput]:
        """The fresh images among the segments, in order."""
        return [s for s in self.segments if isinstance(s, ImageInput)]


def _check_tools(request: GenerationRequest) -> None:
    """The tools' types and the turns they belong to; a forced call's schema becomes the request's ``json_schema`` (the
    same schema again is no conflict: a request replaced is checked again)."""
    if request.tools is not None and not isinstance(request.tools, ToolUse):
        raise InvalidInputError("tools", f"expected a ToolUse, got {type(request.tools).__name__}")
    if request.tool_turns is not None:
        object.__setattr__(request, "tool_turns", checked_tool_turns(request.tool_turns, request.turns))
    forced = request.tools.forced_schema() if request.tools is not None else None
    if forced is None:
        return
    forced = check_json_schema(forced, "tool_choice")
    if request.json_schema is not None and check_json_schema(request.json_schema) != forced:
        raise InvalidInputError("tool_choice", "a forced tool call constrains the answer itself: give no JSON schema "
                                "beside it")
    object.__setattr__(request, "json_schema", forced)


def _checked_segments(segments: Sequence[Any]) -> list[Any]:
    """A prompt's segments as a list: at least one, every text valid Unicode (a backend request encodes it, and so
    would a log)."""
    segments = list(segments)
    if not segments:
        raise InvalidInputError("segments", "a request needs at least one segment")
    for i, segment in enumerate(segments):
        if isinstance(segment, str):
            check_text(segment, f"segments[{i}]")
    return segments


@dataclass(frozen=True)
class SearchRequest:
    """One search (see :meth:`refsight.Engine.search`), checked once when it is built: exactly one of
    ``text`` or ``image``, ``k`` in range, valid text in ``where`` and ``restrict_to``."""

    text: str | None = None
    image: ImageSource | None = None
    k: int = 10
    where: Mapping[str, Any] | None = None
    restrict_to: Sequence[str] | None = None
    namespace: str | None = None

    def __post_init__(self) -> None:
        check_search(self.text, self.image, self.k, self.where, self.restrict_to)

    @classmethod
    def of(cls, request: SearchRequest | str | None, options: Mapping[str, Any]) -> SearchRequest:
        """``request`` itself, or the request of a text (or none) and keywords (the keyword form of the Python API)."""
        if _given(cls, request, options):
            return request
        return cls(**options) if request is None else cls(request, **options)


@dataclass(frozen=True)
class AddRequest:
    """One reference to add (see :meth:`refsight.Engine.add`), checked once when it is built.

    ``source`` is the image, ``ref_id`` its id (default: from the image hash), ``metadata`` stored
    with it; ``attributes`` (``"imagenet"``, ``"vlm"``) the attribute records computed now. The
    checks of the reference itself (its id, image and metadata) stay the reference book's, which
    reports each input's failure on its own as :meth:`refsight.Engine.add_many` does.
    """

    source: ImageSource
    ref_id: str | None = None
    metadata: Mapping[str, Any] | None = None
    model: str | None = None
    namespace: str | None = None
    attributes: Sequence[str] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attributes", check_sources(self.attributes))

    @classmethod
    def of(cls, request: AddRequest | ImageSource | None, options: Mapping[str, Any]) -> AddRequest:
        """``request`` itself, or the request of an image and keywords (the keyword form of the Python API;
        the image may come as ``source=``, as it did before requests were typed)."""
        if _given(cls, request, options):
            return request
        return cls(**options) if request is None else cls(request, **options)


def _given(kind: type, request: Any, options: Mapping[str, Any]) -> bool:
    """Whether ``request`` is already a ``kind`` (then no keywords may come with it: they would be ignored)."""
    if not isinstance(request, kind):
        return False
    if options:
        raise InvalidInputError(", ".join(sorted(options)), f"give a {kind.__name__} or keywords, not both")
    return True


def check_query_text(text: object, name: str) -> str:
    """A query text as given, or InvalidInputError naming ``name``: the one rule for search's ``text``
    and compare's ``query`` (a string of valid Unicode with something in it)."""
    if not isinstance(text, str):
        raise InvalidInputError(name, f"the query text must be a string, not {type(text).__name__}")
    check_text(text, name)
    if not text.strip():
        raise InvalidInputError(name, "the query text is empty")
    return text


def check_search(text: str | None, image: object | None, k: object, where: object = None, restrict_to: object = None) -> None:
    """The rules of one search: exactly one of ``text`` (see :func:`check_query_text`) or ``image``, ``k`` in
    1..1000, and valid text in the ``where`` filter and the ``restrict_to`` ids."""
    check_texts(where, "where")
    check_texts(restrict_to, "restrict_to")
    if (text is None) == (image is None):
        raise InvalidInputError("query", "give exactly one of a text query or an image")
    if text is not None:
        check_query_text(text, "text")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidInputError("k", f"must be an integer in 1..{MAX_K}, not {k!r}")


def check_recall_mode(mode: str | None, *, query: str | None) -> str:
    """The recall mode to use: ``mode``, else ``text`` when an explicit query is given, else ``both``."""
    if mode is None:
        return "text" if query else "both"
    if mode not in RECALL_MODES:
        raise InvalidInputError("recall", f"must be one of {', '.join(RECALL_MODES)}, not {mode!r}")
    return mode


def check_prompt_end(prompt_end: Any, raw_prompt: bool) -> None:
    """InvalidInputError naming ``prompt_end`` unless it is one of :data:`PROMPT_ENDS` (a raw prompt has no chat
    template to end: only the default)."""
    if prompt_end not in PROMPT_ENDS:
        raise InvalidInputError("prompt_end", f"must be one of {', '.join(PROMPT_ENDS)}, not {prompt_end!r}")
    if raw_prompt and prompt_end != "generation_prompt":
        raise InvalidInputError("prompt_end", "a raw prompt is the whole prompt: no chat template to end")


def check_template_variables(variables: Any, raw_prompt: bool = False) -> dict[str, Any]:
    """``variables`` as a dict of the chat template's variables (names, not :data:`RESERVED_TEMPLATE_VARIABLES`; values
    of valid text); a raw prompt has no template, so it takes none. InvalidInputError naming ``template_variables``."""
    if not isinstance(variables, Mapping) or any(not isinstance(name, str) or not name for name in variables):
        raise InvalidInputError("template_variables", "give a mapping of variable names to values")
    if variables and raw_prompt:
        raise InvalidInputError("template_variables", "a raw prompt is the whole prompt: no chat template to read them")
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES & set(variables))
    if reserved:
        raise InvalidInputError("template_variables", f"refsight's render sets {reserved[0]} itself")
    check_texts(dict(variables), "template_variables")
    return dict(variables)


def check_sources(sources: Sequence[str], what: str = "attributes") -> tuple[str, ...]:
    """``sources`` as a tuple, or InvalidInputError naming the unknown ones."""
    if isinstance(sources, str):
        sources = [sources]
    unknown = sorted(set(sources) - set(RECORD_SOURCES))
    if unknown:
        raise InvalidInputError(what, f"unknown sources {unknown}; use {', '.join(RECORD_SOURCES)}")
    return tuple(sources)
