"""Result records the engine returns; each has ``to_dict()`` giving the CLI's/HTTP API's JSON."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = [
    "FieldRecord",
    "AddResult",
    "AddFailure",
    "VerifyReport",
    "GenerateResult",
    "TokenLogprob",
    "TextPiece",
    "MAX_LOGPROBS",
    "finite_logprob",
    "CompareResult",
    "PackageState",
    "SearchHit",
    "SearchResult",
    "IndexReport",
    "StoreStats",
    "QuotaReport",
    "PruneReport",
    "ForgetReport",
    "COMPARE_STAGES",
]

#: The compare pipeline's stages in order, one name from the CLI to the metrics: each stage that
#: ran is timed under its name in :attr:`CompareResult.timings_ms` (beside the sub-timings
#: ``candidate_encode``, ``reference_load``, ``attributes`` and ``total``; and ``startup``, the model's
#: first load in the process, when this compare was the one that loaded it).
COMPARE_STAGES = ("recall", "prefilter", "rerank", "judge")


class FieldRecord:
    """A dataclass whose JSON is its fields as they are: ``to_dict()`` by :func:`dataclasses.asdict`.

    The records with nothing to leave out or reshape take their ``to_dict`` from here.
    """

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, in their declared order."""
        return asdict(self)


@dataclass
class AddResult(FieldRecord):
    """One stored reference, as ``refsight add --json`` prints it."""

    ref_id: str
    image_sha256: str
    package_key: str
    model: str
    cached: bool
    encode_ms: float
    bytes: int


@dataclass
class AddFailure(FieldRecord):
    """An input that could not be added; nothing was stored for it."""

    input: str
    error: str


@dataclass
class VerifyReport:
    """What ``verify`` found: keys checked, corrupt keys, keys repaired, keys left unrepairable."""

    checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    unrepairable: dict[str, str] = field(default_factory=dict)
    #: ``namespace/ref_id`` → why its kept image cannot be read (missing or damaged bytes).
    missing_images: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no corruption remains and every reference has its kept image."""
        return len(self.repaired) == len(self.corrupt) and not self.missing_images

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``repaired`` as a count, the keys beside it)."""
        return {
            "checked": self.checked,
            "corrupt": self.corrupt,
            "repaired": len(self.repaired),
            "repaired_keys": self.repaired,
            "unrepairable": self.unrepairable,
            "missing_images": self.missing_images,
        }


#: The most alternatives a generation reports per token (``Sampling.logprobs``): OpenAI's chat allows 20,
#: llama-server's ``n_probs`` any; a bound keeps an answer's size in proportion to its tokens.
MAX_LOGPROBS = 100


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log probability, and the ``top`` most likely tokens at its step.

    Probabilities are the model's own, over its raw logits (before penalties, a bias, a grammar or
    the temperature change them: llama-server's ``n_probs`` and vLLM's default), or the sampler
    chain's where the request asked for them (``Sampling.post_sampling_probs``). ``piece`` is the
    token's bytes (a special token's are empty); ``top`` holds ``(token, piece, logprob)``, most
    likely first, the chosen token among them when it is one of the most likely.
    """

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()
    #: The sampler chain's probabilities (``Sampling.post_sampling_probs``), not the model's own.
    post_sampling: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (pieces as text, U+FFFD for bytes that are not UTF-8 alone; -inf as the lowest float)."""
        return {
            "token": self.token, "text": self.piece.decode("utf-8", "replace"), "logprob": finite_logprob(self.logprob),
            "top": [{"token": t, "text": p.decode("utf-8", "replace"), "logprob": finite_logprob(lp)} for t, p, lp in self.top],
            **({"post_sampling": True} if self.post_sampling else {}),
        }


def finite_logprob(logprob: float) -> float:
    """A log probability JSON can carry: ``-inf`` (a banned token) as the lowest float, as llama-server writes it."""
    return logprob if math.isfinite(logprob) else -3.4028234663852886e38


class TextPiece(str):
    """A piece of streamed text that carries the :class:`TokenLogprob` of the tokens it completes
    (``logprobs``: empty unless the request asked for them). It is a ``str``: every text callback
    takes it unchanged."""

    logprobs: tuple[TokenLogprob, ...]

    def __new__(cls, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> TextPiece:
        piece = super().__new__(cls, text)
        piece.logprobs = tuple(logprobs)
        return piece


@dataclass
class GenerateResult:
    """The answer of ``generate``: text, tokens and where the time went.

    ``prompt_tokens`` counts the prompt (text and image tokens; 0 when the backend cannot
    tell), ``cached_tokens`` the image tokens among them served from cached packages,
    ``prefix_tokens_reused`` the prompt tokens served from a stored reference-prefix (KV) state.
    ``finish_reason``: ``"stop"``, ``"length"``, ``"cancelled"``, or ``"tool_calls"`` when the answer called tools.
    ``logprobs``: one :class:`TokenLogprob` per token of ``tokens`` when the request's ``Sampling.logprobs`` asked for
    them. ``tool_calls``: the :class:`~refsight.tools.ToolCall` values read out of the answer (``text`` is then what
    it says besides them), when the request offered tools.
    """

    text: str
    tokens: list[int]
    model: str
    random_weights: bool
    references_cached: list[bool]
    timings_ms: dict[str, float]
    prompt_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str = "stop"
    prefix_tokens_reused: int = 0
    logprobs: list[TokenLogprob] | None = None
    tool_calls: tuple[Any, ...] = ()

    @classmethod
    def of(
        cls, generation: Any, *, model: str, random_weights: bool, references_cached: list[bool],
        timings_ms: dict[str, float], max_new_tokens: int, text: str | None = None, tool_calls: tuple[Any, ...] = (),
    ) -> GenerateResult:
        """The result of a backend's ``Generation`` (duck-typed: this module imports no backend); ``text`` and
        ``tool_calls``: the answer as it was read, where the request offered tools."""
        finish = generation.finish_reason or ("length" if len(generation.token_ids) >= max_new_tokens else "stop")
        if tool_calls and finish != "cancelled":
            finish = "tool_calls"  # vLLM's rule: an answer that called tools says so, whatever ended it
        # Image tokens pair with the images in order; a backend that does not count them reports none.
        image_tokens = list(generation.image_tokens)
        paired = len(image_tokens) == len(references_cached)
        return cls(
            text=generation.text if text is None else text,
            tokens=list(generation.token_ids),
            model=model,
            random_weights=bool(generation.random_weights or random_weights),
            references_cached=references_cached,
            timings_ms=timings_ms,
            prompt_tokens=int(generation.prompt_tokens),
            cached_tokens=sum(n for n, hit in zip(image_tokens, references_cached) if hit) if paired else 0,
            finish_reason=finish,
            prefix_tokens_reused=int(getattr(generation, "prefix_tokens_reused", 0) or 0),
            logprobs=getattr(generation, "logprobs", None),
            tool_calls=tuple(tool_calls),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``logprobs`` by :meth:`TokenLogprob.to_dict`, and only when the request asked for them;
        ``tool_calls`` only when the answer made some: ``id``, ``name``, ``arguments``)."""
        data = asdict(replace(self, logprobs=None, tool_calls=()))
        del data["logprobs"], data["tool_calls"]
        if self.logprobs is not None:
            data["logprobs"] = [lp.to_dict() for lp in self.logprobs]
        if self.tool_calls:
            data["tool_calls"] = [asdict(call) for call in self.tool_calls]
        return data


@dataclass
class CompareResult:
    """A candidate judged against references, as ``refsight compare --json`` prints it.

    ``results`` holds one entry per reference of the shortlist, sorted (see
    :func:`refsight.compare.sort_results`): a judged one as
    :meth:`refsight.judge.ReferenceResult.to_dict` plus ``reference_cached``; every one with
    ``stage`` (filtered / recalled / reranked / judged), ``recall_score`` and ``rerank_score``
    (None when that stage did not score it), and ``filtered_by`` when filtered;
    ``recalled`` lists the shortlist retrieval picked (empty without ``top_k``); ``timings_ms`` has
    one entry per stage that ran (:data:`COMPARE_STAGES`), the sub-timings and ``total``.
    """

    candidate_sha256: str
    model: str
    random_weights: bool
    results: list[dict[str, Any]]
    timings_ms: dict[str, float]
    recalled: list[dict[str, Any]] = field(default_factory=list)
    vlm_calls: int = 0
    #: references each stage took in: ``recalled``, ``filtered``, ``reranked``, ``judged``
    stages: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``recalled`` only when retrieval ran)."""
        data = asdict(self)
        if not self.recalled:
            data.pop("recalled")
        return data


@dataclass(frozen=True)
class PackageState:
    """Where a reference's package for the current model is: on disk (``cached``) and/or in memory."""

    cached: bool
    in_memory: bool


@dataclass(frozen=True)
class SearchHit(FieldRecord):
    """One recalled reference and its similarity score (higher is closer)."""

    ref_id: str
    score: float


@dataclass(frozen=True)
class SearchResult:
    """What ``search`` recalled, best first, and with which embedder."""

    embedder: str
    hits: list[SearchHit]

    @property
    def ref_ids(self) -> list[str]:
        """The recalled ids, best first."""
        return [hit.ref_id for hit in self.hits]

    def to_dict(self) -> dict[str, Any]:
        """``{"embedder", "results": [{"ref_id", "score"}]}`` as ``refsight search --json`` prints it."""
        return {"embedder": self.embedder, "results": [hit.to_dict() for hit in self.hits]}


@dataclass(frozen=True)
class IndexReport(FieldRecord):
    """What bringing the retrieval index up to date did."""

    embedder: str
    indexed: int  # entries in the namespace now
    embedded_now: int
    removed_now: int
    revision: int  # the catalog revision the index reflects


@dataclass(frozen=True)
class StoreStats:
    """Cache statistics: references of the namespace, packages and bytes on disk, and the counters.

    ``bytes`` and ``prefix_bytes`` are what the store keeps (compressed by its codec: what the quota counts);
    ``raw_bytes`` and ``prefix_raw_bytes`` the same entries before compression.

    The counters span the whole store (every namespace); a tenant-scoped view leaves them
    out (``None``), since they would tell one tenant about another's traffic.
    """

    references: int
    packages: int
    bytes: int
    hits: int | None
    misses: int | None
    evictions: int | None
    encode_ms_saved: float | None
    memory_bytes: int = 0
    scope: str = "store"
    #: The byte quota on packages (None: none); packages it evicted and their bytes, and packages
    #: ``prune`` removed (store-wide counters; None in a tenant view).
    max_package_bytes: int | None = None
    quota_evictions: int | None = None
    quota_evicted_bytes: int | None = None
    pruned: int | None = None
    #: This process's figures per tier, fastest first (``memory``, ``redis`` when configured,
    #: ``disk``): hits, misses, bytes served, and the tier's own state; None in a tenant view.
    tiers: dict[str, dict[str, Any]] | None = None
    #: This process's own counts since it opened the store (hits, misses, evictions,
    #: encode_ms_saved, and hits per tier: ``memory_hits``, ``disk_hits``): with replicas
    #: sharing one catalog, what THIS replica did.
    replica: dict[str, float] | None = None
    #: The KV prefix-state cache: states served, states built, bytes of states on disk, prefill time saved.
    prefix_hits: int | None = None
    prefix_misses: int | None = None
    prefix_bytes: int | None = None
    prefix_ms_saved: float | None = None
    #: Packages and prefix states found corrupt on a read (each deleted, then re-encoded or rebuilt).
    corrupt: int | None = None
    prefix_corrupt: int | None = None
    #: A runtime's own prefix cache, per loaded backend that keeps one (vLLM: prompt tokens queried, hit, hit rate).
    runtime_prefix_cache: dict[str, dict[str, float]] | None = None
    #: Time the cache hits spent loading their packages (beside ``encode_ms_saved``, the encodes they avoided).
    load_ms: float | None = None
    #: Prompt tokens served from stored prefix states (no prefill ran over them).
    prefix_tokens_reused: int | None = None
    #: Per model (fingerprint), most hits first: ``{"model", "fingerprint", "hits", "encode_ms_saved", "load_ms"}``.
    models: list[dict[str, Any]] | None = None
    #: refsight's vLLM encoder-cache connector on this store (store-wide: hits, misses, saves,
    #: corrupt, evictions, bytes on disk); None when no vLLM server ever used the store that way.
    vllm_encoder_cache: dict[str, int] | None = None
    #: Remembered images (images sent inline and kept, apart from references: :mod:`refsight.settings.remembering`):
    #: how many and their packages' bytes (the store's view counts them in ``packages`` and ``bytes`` too; a
    #: tenant's view: its own, apart from its references' packages).
    remembered: int = 0
    remembered_bytes: int = 0
    #: The packages' bytes before the store's codec compressed them (``bytes``: after, on disk).
    raw_bytes: int = 0
    #: The prefix states' bytes before compression (``prefix_bytes``: after, on disk); None in a tenant view.
    prefix_raw_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``runtime_prefix_cache`` and ``vllm_encoder_cache`` only when there is one)."""
        out = asdict(self)
        for optional in ("runtime_prefix_cache", "vllm_encoder_cache"):
            if out[optional] is None:
                del out[optional]
        return out


@dataclass
class QuotaReport(FieldRecord):
    """One quota pass: packages evicted and their bytes, vLLM encoder outputs evicted and their bytes,
    what was skipped because in use, the result (bytes of both under the one quota)."""

    max_bytes: int
    before: int
    after: int
    evicted: list[str] = field(default_factory=list)
    evicted_bytes: int = 0
    skipped_in_use: int = 0
    encoder_outputs_evicted: int = 0
    encoder_outputs_evicted_bytes: int = 0


@dataclass
class ForgetReport(FieldRecord):
    """Remembered images listed (``dry_run``) or forgotten: ``refsight prune --remembered``, ``DELETE /v1/remembered``.

    ``images`` are the remembered images concerned (each ``RememberedImage.to_dict()``); forgetting drops their
    rows and deletes the ``packages`` (``bytes``) nothing else names; one a reference links, or another
    namespace still remembers, stays.
    """

    images: list[dict[str, Any]]
    packages: int
    bytes: int
    dry_run: bool


@dataclass
class PruneReport(FieldRecord):
    """What ``prune`` removed (or, with ``dry_run``, would remove)."""

    fingerprints: list[dict[str, Any]]
    packages: int
    bytes: int
    links: int
    dry_run: bool
    keys: list[str] = field(default_factory=list)
