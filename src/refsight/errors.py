"""Every error refsight raises, in one tree.

::

    RefsightError
    ├── InvalidInputError (also ValueError)     bad input named with the reason
    │   ├── ImageError                          an image that cannot be taken in
    │   ├── InvalidReferenceIdError             an id with path tricks or bad characters
    │   └── RubricError                         an unusable rubric
    ├── NotFoundError (also KeyError)
    │   ├── ReferenceNotFoundError
    │   ├── PackageNotFoundError                a cache miss that the caller asked to fail
    │   └── UnknownModelError                   no backend registered under that name
    ├── CorruptPackageError                     a stored package failed its checks
    ├── StoreError                              the store itself cannot work
    │   ├── StoreUnavailableError               its disk is full or read-only, its catalog or bucket unreachable (retry later)
    │   └── StoreConfigError                    its settings are wrong (credentials, a missing bucket)
    └── BackendError                            a model runtime failed
        ├── ModelLoadError                      weights/config could not be loaded
        └── GenerationError                     generation failed

Errors carry the data that explains them (the input, the key, the reason) as
attributes, so callers never need to parse messages.
"""

from __future__ import annotations

from typing import Sequence

__all__ = [
    "RefsightError",
    "InvalidInputError",
    "ImageError",
    "ContextLengthError",
    "InvalidReferenceIdError",
    "RubricError",
    "NotFoundError",
    "ReferenceNotFoundError",
    "PackageNotFoundError",
    "UnknownModelError",
    "CorruptPackageError",
    "StoreError",
    "StoreUnavailableError",
    "StoreConfigError",
    "BackendError",
    "ModelLoadError",
    "GenerationError",
]


class RefsightError(Exception):
    """Base class of every error refsight raises on purpose."""


class InvalidInputError(RefsightError, ValueError):
    """An input was rejected; ``input`` names it and ``reason`` says why."""

    def __init__(self, input: object, reason: str) -> None:
        self.input = input
        self.reason = reason
        super().__init__(f"{_describe(input)}: {reason}")


class ImageError(InvalidInputError):
    """An image could not be decoded, or breaks a limit."""


class ContextLengthError(InvalidInputError):
    """A prompt (or its prompt plus the tokens asked for) does not fit the model's context.

    ``n_prompt_tokens`` and ``n_ctx`` are the figures llama-server reports with its
    ``exceed_context_size_error``; :attr:`details` carries them to the error body.
    """

    def __init__(self, input: object, reason: str, *, n_prompt_tokens: int, n_ctx: int) -> None:
        self.n_prompt_tokens = int(n_prompt_tokens)
        self.n_ctx = int(n_ctx)
        super().__init__(input, reason)

    @property
    def details(self) -> dict[str, int]:
        """The fields an HTTP error body adds beside the message (``type`` as llama-server names this error)."""
        return {"type": "exceed_context_size_error", "n_prompt_tokens": self.n_prompt_tokens, "n_ctx": self.n_ctx}


class InvalidReferenceIdError(InvalidInputError):
    """A reference id is empty, too long, or could escape a directory."""

    def __init__(self, input: object, reason: str) -> None:
        super().__init__(input, reason)
        self.args = (f"reference id {_describe(input)!r}: {reason}",)


class RubricError(InvalidInputError):
    """A rubric is empty, too large, or holds invalid criteria."""


class NotFoundError(RefsightError, KeyError):
    """Something asked for by name does not exist."""

    def __init__(self, name: str, what: str = "item") -> None:
        self.name = name
        self.what = what
        super().__init__(name)

    def __str__(self) -> str:
        return f"{self.what} not found: {self.name!r}"


class ReferenceNotFoundError(NotFoundError):
    """No reference has this id (in this namespace); ``close`` holds the namespace's ids that look like it."""

    def __init__(self, ref_id: str, close: Sequence[str] = ()) -> None:
        self.close = list(close)
        super().__init__(ref_id, "reference")

    def __str__(self) -> str:
        # A typo's fix first, then where every id is listed: the message says what to run next.
        guess = f"; did you mean {' or '.join(repr(c) for c in self.close)}?" if self.close else ""
        return f"reference not found: {self.name!r}{guess} ('refsight list' shows the store's references)"


class PackageNotFoundError(NotFoundError):
    """No stored package has this key."""

    def __init__(self, key: str) -> None:
        super().__init__(key, "package")


class UnknownModelError(NotFoundError):
    """No backend is registered under this model name; ``known`` lists those that are."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.known = sorted(known)
        super().__init__(name, "model")

    def __str__(self) -> str:
        import difflib  # only when an error is shown: every command imports this module

        # A long list on one line hides the near miss the user meant: name that first, the count after.
        close = difflib.get_close_matches(self.name, self.known, n=1, cutoff=0.6)
        if close:
            return f"unknown model {self.name!r}; did you mean {close[0]!r}? ('refsight models' lists all {len(self.known)})"
        if len(self.known) <= 8:
            return f"unknown model {self.name!r}; known models: {', '.join(self.known)}"
        return f"unknown model {self.name!r}; 'refsight models' lists the {len(self.known)} known models"


class CorruptPackageError(RefsightError):
    """A stored package failed its checksum or shape checks; it is never served."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"package {key} is corrupt: {reason}")


class StoreError(RefsightError):
    """The store cannot be opened or written."""


class StoreUnavailableError(StoreError):
    """The store cannot be used for now: its disk is full, over quota, or read-only; its catalog or bucket unreachable.

    Nothing stored is lost; the call can succeed once space is freed or the service is back. ``reason`` is
    the condition in words (e.g. ``"no space left on device"``); ``retry_after``, when known, the seconds until
    the store tries the unreachable service again (a bucket's back-off).
    """

    def __init__(self, message: str, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class StoreConfigError(StoreError):
    """The store cannot work as configured (credentials refused, a bucket that does not exist): the message
    names the setting to fix; retrying never helps (the command line's exit code 2)."""


class BackendError(RefsightError):
    """A model runtime raised; ``model`` names the model."""

    def __init__(self, model: str, reason: str) -> None:
        self.model = model
        self.reason = reason
        super().__init__(f"{model}: {reason}")


class ModelLoadError(BackendError):
    """A model could not be loaded (offline, missing files, unsupported architecture)."""


class GenerationError(BackendError):
    """Generation failed inside the runtime."""


def _describe(input: object) -> str:
    if isinstance(input, (bytes, bytearray, memoryview)):
        return f"<{len(input)} bytes>"
    text = str(input)
    return text if len(text) <= 200 else text[:197] + "..."
