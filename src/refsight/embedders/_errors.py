"""The one place where a model runtime's exceptions become refsight errors, for every embedder.

Like ``runtime_errors`` in :mod:`refsight.backends.hf.base` (which backends use): torch,
transformers, tokenizers and numpy raise their own exception types; callers of refsight
catch :class:`~refsight.errors.RefsightError` only. Torch-free, so the registry can use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from refsight.errors import BackendError, RefsightError

__all__ = ["embedder_errors"]


@contextlib.contextmanager
def embedder_errors(model: str, error: type[BackendError] = BackendError, what: str = "") -> Iterator[None]:
    """Turn any non-refsight exception raised inside into ``error(model, reason)``.

    refsight's own errors (an :class:`~refsight.errors.InvalidInputError` for a bad input, a
    :class:`~refsight.errors.ModelLoadError` with a precise reason) pass through unchanged.
    """
    try:
        yield
    except RefsightError:
        raise
    except Exception as exc:  # noqa: BLE001 - translating is the point
        prefix = f"{what}: " if what else ""
        raise error(model, f"{prefix}{type(exc).__name__}: {exc}") from exc
