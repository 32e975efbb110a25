"""What the server's routes learn about the served model, as small typed records read from its backend.

The routes never hold the backend: :class:`~refsight.server.service.Service` reads it and hands them one
of these. :class:`ModelFacts` is taken once, at load, so the read-only endpoints answer from it while the
model sleeps; :class:`GenerationSupport` and :class:`ModelDetails` are read from the loaded backend when a
route asks (the model is awake then: :mod:`~refsight.server.edge.sleep` loads it before such a request runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .intake.template_variables import THINKING_VARIABLES

__all__ = ["ModelFacts", "GenerationSupport", "ModelDetails"]


@dataclass(frozen=True)
class ModelFacts:
    """What the served model's read-only endpoints report (``/props``, ``/v1/models``), taken at load: they
    answer from it while the model sleeps, without loading it (as llama-server answers from its cache)."""

    name: str
    context_size: int | None
    random_weights: bool
    media_marker: str
    chat_template: str | None
    raw_prompt: bool
    runtime_info: dict[str, Any]
    #: The sampling its requests get for the fields they leave unset (the runtime's server defaults).
    sampling_defaults: dict[str, Any]
    #: Whether its chat template reads a thinking variable (Ollama's ``thinking`` capability).
    thinks: bool = False

    @classmethod
    def of(cls, backend: Any) -> ModelFacts:
        """The facts of a loaded ``backend``."""
        return cls(
            name=backend.name, context_size=getattr(backend, "context_size", None),
            random_weights=bool(backend.random_weights), media_marker=backend.media_marker,
            chat_template=backend.chat_template_source(), raw_prompt=backend.supports_raw_prompt,
            runtime_info=dict(backend.runtime_info()), sampling_defaults=dict(backend.sampling_defaults),
            thinks=any(backend.chat_template_reads(name) for name in THINKING_VARIABLES),
        )


@dataclass(frozen=True)
class GenerationSupport:
    """What the served backend honours in a generation request; the text routes refuse the rest by field name."""

    #: The :class:`~refsight.sampling.Sampling` fields it honours.
    sampling_fields: frozenset[str]
    #: The ways a chat prompt may end that it renders (:data:`refsight.requests.PROMPT_ENDS`).
    prompt_ends: frozenset[str]
    #: Whether it reports its prompt's evaluation (``return_progress``).
    prompt_progress: bool
    #: Whether it renders tools and tool turns in its chat template (tool calling).
    tools: bool = False

    @classmethod
    def of(cls, backend: Any) -> GenerationSupport:
        """What a loaded ``backend`` honours."""
        return cls(sampling_fields=frozenset(backend.sampling_fields), prompt_ends=frozenset(backend.prompt_ends),
                   prompt_progress=bool(backend.supports_prompt_progress), tools=bool(backend.supports_tools))


@dataclass(frozen=True)
class ModelDetails:
    """The served model's origin and files, as Ollama's model endpoints describe it (``/api/tags``, ``/api/show``)."""

    name: str
    #: The digest of its fingerprint (what its stored packages are keyed by).
    digest: str
    #: The GGUF's ``general.architecture`` (a llama.cpp model), else None.
    arch: str | None
    #: Its model and projector files where it runs from files (llama.cpp), else empty.
    files: tuple[Path, ...]
    #: Where it runs: ``"gpu"`` or ``"cpu"`` for llama.cpp, the torch device for transformers.
    device: Any
    #: The chat template it renders prompts in (Jinja), None where it has none.
    chat_template: str | None
    #: An ``ollama:`` model's own facts (read from Ollama's store: digest, size, details, template, params), else None.
    ollama_model: dict[str, Any] | None
    #: What its weights are (:attr:`~refsight.backends.base.Backend.weights`): ``parameter_count``, ``quantization``.
    weights: dict[str, Any]
    #: When its files last changed (seconds since the epoch; the newest of the files its fingerprint hashes), else None.
    modified: float | None

    @classmethod
    def of(cls, backend: Any) -> ModelDetails:
        """The details of a loaded ``backend``."""
        files = (getattr(backend, "model_path", None), getattr(backend, "mmproj_path", None))
        return cls(
            name=backend.name, digest=backend.fingerprint().digest, arch=getattr(backend, "arch", None),
            files=tuple(p for p in files if p is not None), device=getattr(backend, "device", "cpu"),
            chat_template=backend.chat_template_source(), ollama_model=getattr(backend, "ollama_model", None),
            weights=dict(backend.weights), modified=_modified(backend.fingerprint_sources()),
        )


def _modified(sources: Any) -> float | None:
    """The newest modification time of ``sources`` (a backend's fingerprinted files), None when it has none."""
    times = [Path(source).stat().st_mtime for source in sources or () if Path(source).exists()]
    return max(times, default=None)
