"""refsight: compare new images against fixed references with a VLM, encoding each reference once.

The public API is small: :class:`Engine` ties the store, the model backend, retrieval
and the judge together; :func:`open_store` opens a store directly; the core types, the
request and result types and the error tree are re-exported here, with the rules a caller
may check ahead (reference ids, ``where`` filters, JSON depth). The hostile-input primitives
every front end applies live in :mod:`refsight.inputs`. Importing refsight imports no torch.
"""

from .errors import *  # noqa: F401,F403  (the error tree is part of the public API)
from .errors import __all__ as _error_names
from .images import ImageInput, IntakeLimits, load_image
from .inputs.jsonlimits import MAX_JSON_DEPTH
from .package import EncoderFingerprint, VisualPackage, package_key
from .results import (
    AddFailure,
    AddResult,
    CompareResult,
    GenerateResult,
    IndexReport,
    PackageState,
    SearchHit,
    SearchResult,
    StoreStats,
    VerifyReport,
)
from .version import __version__

def __getattr__(name: str):
    # Engine and open_store pull in the store (and numpy); load them on first use.
    if name == "Engine":
        from .engine import Engine

        return Engine
    if name == "ReferenceSegment":
        from .references import ReferenceSegment

        return ReferenceSegment
    if name == "available_models":
        from .backends.registry import available_models

        return available_models
    if name in ("family_rows", "FAMILY_RUNTIMES"):
        from .backends.family_table import RUNTIMES, family_rows

        return family_rows if name == "family_rows" else RUNTIMES
    if name == "BackendOptions":
        from .backends.options import BackendOptions

        return BackendOptions
    if name == "Sampling":
        from .backends.sampling import Sampling

        return Sampling
    if name in ("CompareRequest", "ChatRequest", "SearchRequest", "AddRequest"):
        from . import requests

        return getattr(requests, name)
    if name == "open_store":
        from .store import open_store

        return open_store
    if name == "validate_ref_id":
        from .store.base import validate_ref_id

        return validate_ref_id
    if name in ("validate_where", "MAX_WHERE_KEYS"):
        from .retrieval import vectors

        return getattr(vectors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Engine",
    "ReferenceSegment",
    "PackageState",
    "BackendOptions",
    "Sampling",
    "CompareRequest",
    "ChatRequest",
    "SearchRequest",
    "AddRequest",
    "available_models",
    "family_rows",
    "FAMILY_RUNTIMES",
    "open_store",
    "AddResult",
    "AddFailure",
    "CompareResult",
    "GenerateResult",
    "IndexReport",
    "SearchHit",
    "SearchResult",
    "StoreStats",
    "VerifyReport",
    "ImageInput",
    "IntakeLimits",
    "load_image",
    "EncoderFingerprint",
    "VisualPackage",
    "package_key",
    "validate_ref_id",
    "validate_where",
    "MAX_WHERE_KEYS",
    "MAX_JSON_DEPTH",
    "__version__",
    *_error_names,
]
