"""refsight: compare new images against fixed references with a VLM, encoding each reference once.

The public API is small: :class:`Engine` ties the store, the model backend, retrieval
and the judge together; :func:`open_store` opens a store directly; the typed requests, the
prompt pieces a chat takes (:class:`ImageInput`, :class:`ReferenceSegment`, :class:`Sampling`),
the results and the error tree are re-exported here. The rest lives in its own public module:
image intake in :mod:`refsight.inputs.images`, the package type in :mod:`refsight.package`, the
backends' options and the model registry in :mod:`refsight.backends.options` and
:mod:`refsight.backends.registry`, the rules a caller may check ahead in their owners
(:func:`refsight.inputs.ref_ids.validate_ref_id`, :func:`refsight.retrieval.vectors.validate_where`,
:data:`refsight.inputs.jsonlimits.MAX_JSON_DEPTH`); the hostile-input primitives every front end
applies in :mod:`refsight.inputs`. Importing refsight imports no torch.
"""

from .errors import *  # noqa: F401,F403  (the error tree is part of the public API)
from .errors import __all__ as _error_names
from .inputs.images import ImageInput
from .results import (
    AddFailure,
    AddResult,
    CompareResult,
    GenerateResult,
    IndexReport,
    SearchHit,
    SearchResult,
    StoreStats,
    VerifyReport,
)
from .support.torchvision_cpu import register_stand_in
from .version import __version__

# Before anything imports transformers: PyPI's (CUDA) torchvision beside a CPU torch breaks every transformers
# model module unless one empty module stands in first (torchvision_cpu). Nothing happens without torchvision.
register_stand_in()

def __getattr__(name: str):
    # Engine and open_store pull in the store (and numpy); load them on first use.
    if name == "Engine":
        from .engine import Engine

        return Engine
    if name == "ReferenceSegment":
        from .references import ReferenceSegment

        return ReferenceSegment
    if name == "Sampling":
        from .sampling import Sampling

        return Sampling
    if name in ("CompareRequest", "GenerationRequest", "SearchRequest", "AddRequest"):
        from . import requests

        return getattr(requests, name)
    if name == "open_store":
        from .store import open_store

        return open_store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Engine",
    "open_store",
    "CompareRequest",
    "GenerationRequest",
    "SearchRequest",
    "AddRequest",
    "ImageInput",
    "ReferenceSegment",
    "Sampling",
    "AddResult",
    "AddFailure",
    "CompareResult",
    "GenerateResult",
    "IndexReport",
    "SearchHit",
    "SearchResult",
    "StoreStats",
    "VerifyReport",
    "__version__",
    *_error_names,
]
